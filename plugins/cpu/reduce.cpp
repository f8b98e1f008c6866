// Reductions (sum mean prod max min, var_mean), arg-reductions, softmax,
// log_softmax, cumsum and layer_norm.
//
// One engine serves every dims-list reduction. The input is split into kept
// dims (one output each) and reduced dims, then one of three schedules runs:
//  - column: the innermost kept dim is unit-stride, so a tile of outputs is
//    accumulated side by side while walking the reduced dims (vectorises;
//    this is "sum over dim 0" of a row-major matrix);
//  - row: one output per step, the reduced run accumulated in 8 lanes
//    (a single accumulator keeps strict order and runs at ~5 GB/s);
//  - split: few outputs but a long reduction, so the reduced range itself is
//    cut into fixed chunks whose partials are merged in order (deterministic).
// f32 and the half types accumulate in double, integers in wrapping uint64.
#include "kernels.hpp"
#include "rowops.hpp"
#include "vecmath.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace backplane::cpu {
namespace {

// ---------------------------------------------------------------------------
// Reducers: init(first element or NULL), ident(acc) = a neutral lane start,
// step(acc, x), merge(acc, other), finish(acc, count, output index).

template <bp_dtype D> using sum_acc_t = std::conditional_t<is_float(D), double, uint64_t>;
template <bp_dtype D> inline sum_acc_t<D> widen(st_t<D> v) {
  if constexpr (is_float(D)) return static_cast<double>(ld(v));
  else return static_cast<uint64_t>(static_cast<int64_t>(v));
}
template <bp_dtype D> inline st_t<D> narrow(sum_acc_t<D> a) {
  using T = st_t<D>;
  if constexpr (is_float(D)) return st<T>(static_cast<comp_t<T>>(a));
  else return static_cast<T>(a);  // modular: integers wrap
}

// Which rows:: primitive serves a reducer on contiguous f32 runs.
enum class Fast { none, sum, moments };

template <bp_dtype D> struct SumR {
  using T = st_t<D>;
  using A = sum_acc_t<D>;
  static constexpr Fast fast = D == BP_DTYPE_F32 ? Fast::sum : Fast::none;
  T* y;
  A init(const T*) const { return A(0); }
  A ident(const A&) const { return A(0); }
  void step(A& a, T v) const { a += widen<D>(v); }
  void merge(A& a, const A& b) const { a += b; }
  void finish(const A& a, int64_t, int64_t o) const { y[o] = narrow<D>(a); }
};

template <bp_dtype D> struct MeanR : SumR<D> {
  void finish(const typename SumR<D>::A& a, int64_t n, int64_t o) const {
    this->y[o] = narrow<D>(a / static_cast<double>(n));  // n == 0: NaN, as NumPy/PyTorch
  }
};

template <bp_dtype D> struct ProdR {
  using T = st_t<D>;
  using A = sum_acc_t<D>;
  static constexpr Fast fast = Fast::none;
  T* y;
  A init(const T*) const { return A(1); }
  A ident(const A&) const { return A(1); }
  void step(A& a, T v) const { a *= widen<D>(v); }
  void merge(A& a, const A& b) const { a *= b; }
  void finish(const A& a, int64_t, int64_t o) const { y[o] = narrow<D>(a); }
};

template <bp_dtype D, bool Max> struct ExtremeR {
  using T = st_t<D>;
  using A = comp_t<T>;
  static constexpr Fast fast = Fast::none;
  T* y;
  A init(const T* first) const { return first ? ld(*first) : A(0); }
  A ident(const A& a) const { return a; }
  void merge(A& a, const A& v) const {
    if constexpr (is_float(D)) {
      // Once a is NaN nothing replaces it; a NaN v always does.
      if (Max ? (v > a || v != v) : (v < a || v != v)) a = v;
    } else {
      if (Max ? v > a : v < a) a = v;
    }
  }
  void step(A& a, T v) const { merge(a, ld(v)); }
  void finish(const A& a, int64_t, int64_t o) const { y[o] = st<T>(a); }
};

// var and mean from sums shifted by the reduction's first element K, which
// keeps the one-pass formula well conditioned when |mean| >> std.
struct Moments {
  double s1, s2, k;
};
template <bp_dtype D> struct VarMeanR {
  using T = st_t<D>;
  using A = Moments;
  static constexpr Fast fast = D == BP_DTYPE_F32 ? Fast::moments : Fast::none;
  T* var;
  T* mean;
  double correction;
  // An infinite or NaN first element is no shift at all (inf - inf is NaN).
  A init(const T* first) const {
    const double k = first ? static_cast<double>(ld(*first)) : 0.0;
    return {0, 0, std::isfinite(k) ? k : 0.0};
  }
  A ident(const A& a) const { return {0, 0, a.k}; }
  void step(A& a, T v) const {
    const double d = static_cast<double>(ld(v)) - a.k;
    a.s1 += d;
    a.s2 += d * d;
  }
  void merge(A& a, const A& b) const {
    a.s1 += b.s1;
    a.s2 += b.s2;
  }
  void finish(const A& a, int64_t n, int64_t o) const {
    const double dn = static_cast<double>(n);
    const double m = a.s1 / dn;
    double ss = a.s2 - a.s1 * m;
    if (ss < 0) ss = 0;  // rounding; NaN (an inf or NaN in the row) stays NaN
    const double div = std::max(0.0, dn - correction);  // PyTorch: max(0, N - correction)
    var[o] = st<T>(static_cast<comp_t<T>>(ss / div));
    mean[o] = st<T>(static_cast<comp_t<T>>(a.k + m));
  }
};

// ---------------------------------------------------------------------------
// The engine

template <class R> void accumulate_run(const R& r, typename R::A& acc, const typename R::T* p, int64_t n, int64_t s) {
  using A = typename R::A;
  if constexpr (R::fast != Fast::none) {
    if (s == 1 && rows::enabled()) {
      if constexpr (R::fast == Fast::sum) acc += rows::sum(p, n);
      else rows::moments(p, n, acc.k, &acc.s1, &acc.s2);
      return;
    }
  }
  if (s == 1 && n >= 32) {
    A lanes[8];
    for (auto& l : lanes) l = r.ident(acc);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j) r.step(lanes[j], p[i + j]);
    for (; i < n; ++i) r.step(lanes[0], p[i]);
    for (const auto& l : lanes) r.merge(acc, l);
  } else {
    for (int64_t i = 0; i < n; ++i) r.step(acc, p[i * s]);
  }
}

template <class R>
void reduce_engine(const Call& c, const bp_layout& in, const bool* is_red, const R& r, const typename R::T* x) {
  using A = typename R::A;
  const uint32_t rank = in.rank;
  bp_layout kept = in, red = in;
  red.offset = 0;
  int64_t n_out = 1, n_red = 1;
  for (uint32_t i = 0; i < rank; ++i) {
    if (is_red[i]) {
      kept.shape[i] = 1;
      n_red *= in.shape[i];
    } else {
      red.shape[i] = 1;
      n_out *= in.shape[i];
    }
  }
  if (n_out == 0) return;
  if (n_red == 0) {  // empty reduction: the identity, without touching x (it may be NULL)
    for (int64_t o = 0; o < n_out; ++o) r.finish(r.init(nullptr), 0, o);
    return;
  }
  const sdk::StridedWalker<1> rw(rank, red.shape, {&red});
  const uint32_t threads = num_threads(c);

  int kd = -1;  // innermost kept dim of size > 1
  for (int i = static_cast<int>(rank) - 1; i >= 0; --i)
    if (!is_red[i] && in.shape[i] > 1) {
      kd = i;
      break;
    }

  if (kd >= 0 && in.strides[kd] == 1 && in.shape[kd] >= 4 && n_red > 1) {
    // Column schedule: tiles of the unit-stride kept dim, each accumulated
    // over the reduced dims. With too few tiles to feed every thread, the
    // reduced range is cut into fixed chunks too, merged in order after.
    constexpr int64_t kTile = 1024;
    const int64_t S = in.shape[kd];
    bp_layout outer = kept;
    outer.shape[kd] = 1;
    const sdk::StridedWalker<1> ow(rank, outer.shape, {&outer});
    const int64_t tiles = (S + kTile - 1) / kTile;
    const int64_t base_tasks = (n_out / S) * tiles;
    int64_t chunks = 1;
    if (threads > 1 && base_tasks < 2 * static_cast<int64_t>(threads) && n_red >= 64)
      chunks = std::min<int64_t>((2 * threads + base_tasks - 1) / base_tasks, n_red / 32);
    const int64_t chunk = (n_red + chunks - 1) / chunks;
    chunks = (n_red + chunk - 1) / chunk;
    std::vector<A> part(chunks > 1 ? static_cast<size_t>(chunks * n_out) : 0);
    auto tile_base = [&](int64_t bt, int64_t& o, int64_t& j0, int64_t& tn) {
      o = bt / tiles;
      j0 = (bt % tiles) * kTile;
      tn = std::min(kTile, S - j0);
      int64_t base = 0;
      ow.run(o, o + 1, [&](const int64_t* off, int64_t, const int64_t*) { base = off[0]; });
      return x + base + j0;
    };
    const int64_t per_task = std::min(kTile, S) * chunk;
    pfor(c, base_tasks * chunks, kGrain / std::max<int64_t>(1, per_task), [&](int64_t b, int64_t e) {
      std::vector<A> acc(static_cast<size_t>(std::min(kTile, S)));
      for (int64_t t = b; t < e; ++t) {
        const int64_t ch = t % chunks;
        int64_t o, j0, tn;
        const typename R::T* p0 = tile_base(t / chunks, o, j0, tn);
        for (int64_t j = 0; j < tn; ++j) acc[j] = chunks == 1 ? r.init(p0 + j) : r.ident(r.init(p0 + j));
        rw.run(ch * chunk, std::min(n_red, (ch + 1) * chunk), [&](const int64_t* off, int64_t n, const int64_t* st) {
          if constexpr (R::fast == Fast::sum) {
            if (rows::enabled()) {
              rows::add_rows_to(acc.data(), p0 + off[0], st[0], n, tn);
              return;
            }
          }
          for (int64_t i = 0; i < n; ++i) {
            const typename R::T* p = p0 + off[0] + i * st[0];
            A* a = acc.data();
            for (int64_t j = 0; j < tn; ++j) r.step(a[j], p[j]);
          }
        });
        if (chunks == 1) {
          for (int64_t j = 0; j < tn; ++j) r.finish(acc[j], n_red, o * S + j0 + j);
        } else {
          std::copy(acc.begin(), acc.begin() + tn, part.begin() + (ch * n_out + o * S + j0));
        }
      }
    });
    if (chunks > 1) {
      pfor(c, base_tasks, kGrain / std::max<int64_t>(1, std::min(kTile, S) * chunks), [&](int64_t b, int64_t e) {
        for (int64_t bt = b; bt < e; ++bt) {
          int64_t o, j0, tn;
          const typename R::T* p0 = tile_base(bt, o, j0, tn);
          for (int64_t j = 0; j < tn; ++j) {
            A a = r.init(p0 + j);
            for (int64_t ch = 0; ch < chunks; ++ch) r.merge(a, part[static_cast<size_t>(ch * n_out + o * S + j0 + j)]);
            r.finish(a, n_red, o * S + j0 + j);
          }
        }
      });
    }
    return;
  }

  const sdk::StridedWalker<1> kw(rank, kept.shape, {&kept});
  if (threads > 1 && n_out < 2 * static_cast<int64_t>(threads) && n_red >= 4 * kGrain) {
    // Split schedule: fixed chunks so the merge order never depends on timing.
    const int64_t chunk = std::max<int64_t>(kGrain, (n_red + 4 * threads - 1) / (4 * threads));
    const int64_t n_chunks = (n_red + chunk - 1) / chunk;
    std::vector<A> part(static_cast<size_t>(n_chunks));
    for (int64_t o = 0; o < n_out; ++o) {
      int64_t base = 0;
      kw.run(o, o + 1, [&](const int64_t* off, int64_t, const int64_t*) { base = off[0]; });
      const A first = r.init(x + base);
      pfor(c, n_chunks, 1, [&](int64_t b, int64_t e) {
        for (int64_t ch = b; ch < e; ++ch) {
          A& acc = part[static_cast<size_t>(ch)];
          acc = r.ident(first);
          rw.run(ch * chunk, std::min(n_red, (ch + 1) * chunk), [&](const int64_t* off, int64_t n, const int64_t* st) {
            accumulate_run(r, acc, x + base + off[0], n, st[0]);
          });
        }
      });
      A acc = first;
      for (const A& p : part) r.merge(acc, p);
      r.finish(acc, n_red, o);
    }
    return;
  }

  // Row schedule.
  pfor(c, n_out, kGrain / std::max<int64_t>(1, n_red), [&](int64_t b, int64_t e) {
    int64_t o = b;
    kw.run(b, e, [&](const int64_t* off, int64_t n, const int64_t* st) {
      for (int64_t i = 0; i < n; ++i, ++o) {
        const typename R::T* p0 = x + off[0] + i * st[0];
        A acc = r.init(n_red ? p0 : nullptr);
        rw.run_all([&](const int64_t* roff, int64_t rn, const int64_t* rst) { accumulate_run(r, acc, p0 + roff[0], rn, rst[0]); });
        r.finish(acc, n_red, o);
      }
    });
  });
}

// Marks the reduced dims; n_dims == 0 means every dim. Returns the output
// element count.
int64_t reduced_dims(const Call& c, const bp_layout& in, uint32_t n_dims, const int32_t* dims, bool* is_red,
                     int64_t* n_red) {
  BP_SDK_CHECK(n_dims <= BP_MAX_RANK, BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": too many dims");
  for (uint32_t i = 0; i < BP_MAX_RANK; ++i) is_red[i] = n_dims == 0;
  for (uint32_t k = 0; k < n_dims; ++k) {
    BP_SDK_CHECK(dims[k] >= 0 && static_cast<uint32_t>(dims[k]) < in.rank, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": dim " + std::to_string(dims[k]) + " out of range for rank " + std::to_string(in.rank));
    is_red[dims[k]] = true;
  }
  int64_t n_out = 1;
  *n_red = 1;
  for (uint32_t i = 0; i < in.rank; ++i) (is_red[i] ? *n_red : n_out) *= in.shape[i];
  return n_out;
}

template <template <bp_dtype> class R, bool NonEmpty> struct ReduceK {
  template <bp_dtype D> struct K {
    static void impl(const Call& c) {
      c.expect(1, BP_PARAMS_REDUCE);
      using T = st_t<D>;
      const bp_reduce_params& p = c.params->u.reduce;
      const bp_layout& in = c.in_layout(0);
      bool is_red[BP_MAX_RANK];
      int64_t n_red = 0;
      const int64_t n_out = reduced_dims(c, in, p.n_dims, p.dims, is_red, &n_red);
      expect_numel(c, c.out_layout(), n_out);
      if (NonEmpty && n_red == 0 && n_out > 0)
        sdk::fail(BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": reduction over an empty axis has no identity");
      R<D> r{c.out_data<T>()};
      reduce_engine(c, in, is_red, r, c.in_data<T>(0));
    }
  };
};
template <bp_dtype D> using MaxR = ExtremeR<D, true>;
template <bp_dtype D> using MinR = ExtremeR<D, false>;

template <bp_dtype D> struct VarMeanK {
  static void impl(const Call& c) {
    c.expect(1, BP_PARAMS_VAR_MEAN);
    using T = st_t<D>;
    const bp_var_mean_params& p = c.params->u.var_mean;
    const bp_layout& in = c.in_layout(0);
    bool is_red[BP_MAX_RANK];
    int64_t n_red = 0;
    const int64_t n_out = reduced_dims(c, in, p.n_dims, p.dims, is_red, &n_red);
    expect_numel(c, c.slot(0).layout, n_out, "var");
    expect_numel(c, c.slot(1).layout, n_out, "mean");
    VarMeanR<D> r{c.slot_data<T>(0), c.slot_data<T>(1), p.correction};
    reduce_engine(c, in, is_red, r, c.in_data<T>(0));
  }
};

// ---------------------------------------------------------------------------
// Along one dim

// The output as a dense layout of the input's rank with `dim` of size 1, so
// a row of the input and its output element share one walker position.
bp_layout keepdim_layout(const bp_layout& in, int dim) {
  int64_t sh[BP_MAX_RANK] = {};
  for (uint32_t i = 0; i < in.rank; ++i) sh[i] = in.shape[i];
  sh[dim] = 1;
  return sdk::contiguous_layout(sh, in.rank);
}

int checked_dim(const Call& c, const bp_layout& in, int32_t dim) {
  BP_SDK_CHECK(dim >= 0 && static_cast<uint32_t>(dim) < in.rank, BP_ERR_INVALID_ARGUMENT,
             std::string(c.op) + ": dim " + std::to_string(dim) + " out of range for rank " + std::to_string(in.rank));
  return dim;
}

// Like for_rows, but hands out runs of rows: run(offsets, count, row
// strides). Rows adjacent in memory (row stride 1, the dim itself strided,
// e.g. softmax over dim 0 or over channels of NCHW) are then processed side
// by side, reading whole cache lines, instead of one strided row at a time.
template <size_t N, class MakeRun>
void for_row_runs(const Call& c, const bp_layout& in, int dim, const std::array<const bp_layout*, N>& lays, int64_t row_cost,
                  MakeRun&& make_run) {
  int64_t sh[BP_MAX_RANK] = {};
  for (uint32_t i = 0; i < in.rank; ++i) sh[i] = in.shape[i];
  sh[dim] = 1;
  const sdk::StridedWalker<N> w(in.rank, sh, lays);
  pfor(c, w.numel(), kGrain / std::max<int64_t>(1, row_cost), [&](int64_t b, int64_t e) {
    auto run = make_run();
    w.run(b, e, [&](const int64_t* off, int64_t n, const int64_t* st) { run(off, n, st); });
  });
}

// Rows processed side by side in the column paths.
constexpr int64_t kColumns = 64;

template <bool Max> struct ArgK {
  template <bp_dtype D> struct K {
    static void impl(const Call& c) {
      c.expect(1, BP_PARAMS_ARG_REDUCE);
      using T = st_t<D>;
      using C = comp_t<T>;
      const bp_arg_reduce_params& p = c.params->u.arg_reduce;
      const bp_layout& in = c.in_layout(0);
      const int dim = checked_dim(c, in, p.dim);
      const bp_layout ol = keepdim_layout(in, dim);
      expect_numel(c, c.out_layout(), sdk::numel(ol));
      const int64_t n = in.shape[dim], s = in.strides[dim];
      if (n == 0 && sdk::numel(ol) > 0)
        sdk::fail(BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": reduction over an empty axis");
      const T* x = c.in_data<T>(0);
      int64_t* y = c.out_data<int64_t>();
      const bool last = p.select_last_index;
      auto row_scan = [&](const T* row) {
        C best = ld(row[0]);
        int64_t bi = 0;
        if constexpr (is_float(D)) {
          if (best != best) return bi;
        }
        for (int64_t i = 1; i < n; ++i) {
          const C v = ld(row[i * s]);
          if constexpr (is_float(D)) {
            if (v != v) return i;  // the first NaN wins
          }
          const bool better = Max ? (last ? v >= best : v > best) : (last ? v <= best : v < best);
          if (better) {
            best = v;
            bi = i;
          }
        }
        return bi;
      };
      for_row_runs<2>(c, in, dim, {&in, &ol}, n, [&] {
        return [&](const int64_t* off, int64_t cnt, const int64_t* rs) {
          if (rs[0] != 1 || rs[1] != 1 || s == 1 || cnt < 8) {
            for (int64_t r = 0; r < cnt; ++r) y[off[1] + r * rs[1]] = row_scan(x + off[0] + r * rs[0]);
            return;
          }
          for (int64_t r0 = 0; r0 < cnt; r0 += kColumns) {
            const int64_t R = std::min(kColumns, cnt - r0);
            const T* x0 = x + off[0] + r0;
            C best[kColumns];
            int64_t bi[kColumns];
            bool done[kColumns];
            for (int64_t r = 0; r < R; ++r) {
              best[r] = ld(x0[r]);
              bi[r] = 0;
              done[r] = false;
              if constexpr (is_float(D)) done[r] = best[r] != best[r];
            }
            for (int64_t i = 1; i < n; ++i) {
              const T* p = x0 + i * s;
              for (int64_t r = 0; r < R; ++r) {
                const C v = ld(p[r]);
                if (done[r]) continue;
                if constexpr (is_float(D)) {
                  if (v != v) {
                    bi[r] = i;
                    done[r] = true;
                    continue;
                  }
                }
                if (Max ? (last ? v >= best[r] : v > best[r]) : (last ? v <= best[r] : v < best[r])) {
                  best[r] = v;
                  bi[r] = i;
                }
              }
            }
            for (int64_t r = 0; r < R; ++r) y[off[1] + r0 + r] = bi[r];
          }
        };
      });
    }
  };
};

template <bool Log> struct SoftmaxK {
  template <bp_dtype D> struct K {
    static void impl(const Call& c) {
      c.expect(1, BP_PARAMS_DIM);
      using T = st_t<D>;
      using C = comp_t<T>;
      const bp_layout& in = c.in_layout(0);
      const bp_layout& ol = c.out_layout();
      const int dim = checked_dim(c, in, c.params->u.dim.dim);
      expect_numel(c, ol, sdk::numel(in));
      if (sdk::numel(in) == 0) return;
      const int64_t n = in.shape[dim], s = in.strides[dim], so = ol.strides[dim];
      const T* x = c.in_data<T>(0);
      T* y = c.out_data<T>();
      // Outputs far larger than the cache are written around it (non-temporal).
      [[maybe_unused]] const bool stream = sdk::numel(ol) * static_cast<int64_t>(sizeof(T)) >= (int64_t{8} << 20);
      auto exp_all = [](C* v, int64_t cnt) {
        if constexpr (std::is_same_v<C, float>) {
          exp_shifted(v, 0.0f, v, cnt);
        } else {
          for (int64_t k = 0; k < cnt; ++k) v[k] = std::exp(v[k]);
        }
      };
      // Side by side: up to kColumns adjacent rows, each step along dim reads
      // one contiguous stretch. exp is computed twice rather than stored.
      auto columns = [&](const T* x0, T* y0, int64_t R) {
        C m[kColumns], t[kColumns];
        double sum[kColumns];
        bool nan[kColumns];
        for (int64_t r = 0; r < R; ++r) {
          m[r] = -std::numeric_limits<C>::infinity();
          nan[r] = false;
          sum[r] = 0;
        }
        for (int64_t i = 0; i < n; ++i)
          for (int64_t r = 0; r < R; ++r) {
            const C v = ld(x0[i * s + r]);
            nan[r] |= v != v;
            m[r] = v > m[r] ? v : m[r];
          }
        for (int64_t r = 0; r < R; ++r)
          if (nan[r]) m[r] = std::numeric_limits<C>::quiet_NaN();
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t r = 0; r < R; ++r) t[r] = ld(x0[i * s + r]) - m[r];
          exp_all(t, R);
          for (int64_t r = 0; r < R; ++r) sum[r] += static_cast<double>(t[r]);
        }
        if constexpr (Log) {
          for (int64_t r = 0; r < R; ++r) t[r] = m[r] + static_cast<C>(std::log(sum[r]));
          for (int64_t i = 0; i < n; ++i)
            for (int64_t r = 0; r < R; ++r) y0[i * so + r] = st<T>(ld(x0[i * s + r]) - t[r]);
        } else {
          C inv[kColumns];
          for (int64_t r = 0; r < R; ++r) inv[r] = static_cast<C>(1.0 / sum[r]);
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t r = 0; r < R; ++r) t[r] = ld(x0[i * s + r]) - m[r];
            exp_all(t, R);
            for (int64_t r = 0; r < R; ++r) y0[i * so + r] = st<T>(t[r] * inv[r]);
          }
        }
      };
      for_row_runs<2>(c, in, dim, {&in, &ol}, 4 * n, [&] {
        return [&, buf = std::vector<C>(), ebuf = std::vector<C>()](const int64_t* roff, int64_t cnt, const int64_t* rs) mutable {
          if (rs[0] == 1 && rs[1] == 1 && s != 1 && cnt >= 8) {
            for (int64_t r0 = 0; r0 < cnt; r0 += kColumns)
              columns(x + roff[0] + r0, y + roff[1] + r0, std::min(kColumns, cnt - r0));
            return;
          }
          buf.resize(static_cast<size_t>(n));
          ebuf.resize(static_cast<size_t>(n));
          if constexpr (D == BP_DTYPE_F32) {
            if (s == 1 && so == 1 && rows::enabled()) {
              // Three passes over a row that stays in cache: max, exp (into
              // the output, or scratch for log_softmax) with its sum, scale.
              for (int64_t rr = 0; rr < cnt; ++rr) {
                const float* row = x + roff[0] + rr * rs[0];
                float* out = y + roff[1] + rr * rs[1];
                bool nan = false;
                float m = rows::max(row, n, &nan);
                if (nan) m = std::numeric_limits<float>::quiet_NaN();
                if constexpr (Log) {
                  const float ls = static_cast<float>(std::log(rows::exp_sum(row, m, ebuf.data(), n)));
                  for (int64_t k = 0; k < n; ++k) out[k] = row[k] - m - ls;
                } else if (stream) {  // exp into scratch, then one streamed write of the output
                  const double sum = rows::exp_sum(row, m, ebuf.data(), n);
                  rows::scale_to(out, ebuf.data(), static_cast<float>(1.0 / sum), n, true);
                } else {
                  const double sum = rows::exp_sum(row, m, out, n);
                  rows::scale(out, static_cast<float>(1.0 / sum), n);
                }
              }
              if (stream) rows::fence();
              return;
            }
          }
          for (int64_t rr = 0; rr < cnt; ++rr) {
          const int64_t off[2] = {roff[0] + rr * rs[0], roff[1] + rr * rs[1]};
          const T* row = x + off[0];
          T* out = y + off[1];
          C* bp = buf.data();
          if (s == 1) {
            for (int64_t i = 0; i < n; ++i) bp[i] = ld(row[i]);
          } else {
            for (int64_t i = 0; i < n; ++i) bp[i] = ld(row[i * s]);
          }
          // Max in 8 lanes; NaN is tracked apart (a NaN row is all NaN).
          C lm[8];
          bool nan = false;
          for (C& l : lm) l = -std::numeric_limits<C>::infinity();
          int64_t i = 0;
          for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; ++j) {
              nan |= bp[i + j] != bp[i + j];
              lm[j] = bp[i + j] > lm[j] ? bp[i + j] : lm[j];
            }
          for (; i < n; ++i) {
            nan |= bp[i] != bp[i];
            lm[0] = bp[i] > lm[0] ? bp[i] : lm[0];
          }
          C m = lm[0];
          for (const C l : lm) m = l > m ? l : m;
          if (nan) m = std::numeric_limits<C>::quiet_NaN();
          // All -inf: m is -inf and x - m is NaN, as in PyTorch.
          C* eb = ebuf.data();
          if constexpr (std::is_same_v<C, float>) {
            exp_shifted(bp, m, eb, n);
          } else {
            for (int64_t k = 0; k < n; ++k) eb[k] = std::exp(bp[k] - m);
          }
          double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          for (i = 0; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; ++j) lanes[j] += static_cast<double>(eb[i + j]);
          for (; i < n; ++i) lanes[0] += static_cast<double>(eb[i]);
          const double sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
          if constexpr (Log) {
            const C ls = static_cast<C>(std::log(sum));
            for (int64_t k = 0; k < n; ++k) out[k * so] = st<T>(bp[k] - m - ls);
          } else {
            const C inv = static_cast<C>(1.0 / sum);
            if (so == 1) {
              for (int64_t k = 0; k < n; ++k) out[k] = st<T>(eb[k] * inv);
            } else {
              for (int64_t k = 0; k < n; ++k) out[k * so] = st<T>(eb[k] * inv);
            }
          }
          }
        };
      });
    }
  };
};

template <bp_dtype D> struct CumsumK {
  static void impl(const Call& c) {
    c.expect(1, BP_PARAMS_DIM);
    using T = st_t<D>;
    using A = sum_acc_t<D>;
    const bp_layout& in = c.in_layout(0);
    const bp_layout& ol = c.out_layout();
    const bp_dim_params& p = c.params->u.dim;
    const int dim = checked_dim(c, in, p.dim);
    expect_numel(c, ol, sdk::numel(in));
    if (sdk::numel(in) == 0) return;
    const int64_t n = in.shape[dim], s = in.strides[dim], so = ol.strides[dim];
    const T* x = c.in_data<T>(0);
    T* y = c.out_data<T>();
    const bool excl = p.exclusive, rev = p.reverse;
    for_row_runs<2>(c, in, dim, {&in, &ol}, n, [&] {
      return [&](const int64_t* roff, int64_t cnt, const int64_t* rs) {
        if (rs[0] == 1 && rs[1] == 1 && s != 1 && cnt >= 8) {
          // Side by side over adjacent rows (each step reads a contiguous stretch).
          for (int64_t r0 = 0; r0 < cnt; r0 += kColumns) {
            const int64_t R = std::min(kColumns, cnt - r0);
            const T* x0 = x + roff[0] + r0;
            T* y0 = y + roff[1] + r0;
            A acc[kColumns] = {};
            for (int64_t k = 0; k < n; ++k) {
              const int64_t i = rev ? n - 1 - k : k;
              for (int64_t r = 0; r < R; ++r) {
                const A v = widen<D>(x0[i * s + r]);
                if (excl) {
                  y0[i * so + r] = narrow<D>(acc[r]);
                  acc[r] += v;
                } else {
                  acc[r] += v;
                  y0[i * so + r] = narrow<D>(acc[r]);
                }
              }
            }
          }
          return;
        }
        for (int64_t rr = 0; rr < cnt; ++rr) {
        const T* row = x + roff[0] + rr * rs[0];
        T* out = y + roff[1] + rr * rs[1];
        A acc = 0;
        for (int64_t k = 0; k < n; ++k) {
          const int64_t i = rev ? n - 1 - k : k;
          const A v = widen<D>(row[i * s]);  // read before the write: in-place is fine
          if (excl) {
            out[i * so] = narrow<D>(acc);
            acc += v;
          } else {
            acc += v;
            out[i * so] = narrow<D>(acc);
          }
        }
        }
      };
    });
  }
};

template <bp_dtype D> struct LayerNormK {
  static void impl(const Call& c) {
    c.expect(3, BP_PARAMS_LAYER_NORM);
    using T = st_t<D>;
    const bp_layer_norm_params& p = c.params->u.layer_norm;
    const bp_layout& in = c.in_layout(0);
    BP_SDK_CHECK(p.n_dims >= 1 && p.n_dims <= in.rank, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": cannot normalise " + std::to_string(p.n_dims) + " trailing dims of rank " +
                   std::to_string(in.rank));
    expect_numel(c, c.out_layout(), sdk::numel(in));
    if (sdk::numel(in) == 0) return;
    const uint32_t lead = in.rank - p.n_dims;
    bp_layout rows = in, inner = in;
    inner.offset = 0;
    int64_t n = 1;
    for (uint32_t i = 0; i < in.rank; ++i) (i < lead ? inner.shape[i] : rows.shape[i]) = 1;
    for (uint32_t i = lead; i < in.rank; ++i) n *= in.shape[i];
    // Weight and bias, when given, are the trailing shape: gather them dense.
    auto gather_param = [&](size_t idx, double fallback) {
      std::vector<double> v(static_cast<size_t>(n), fallback);
      if (!c.has_input(idx)) return v;
      const bp_layout& l = c.in_layout(idx);
      BP_SDK_CHECK(sdk::numel(l) == n, BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": " + (idx == 1 ? "weight" : "bias") + " has " + std::to_string(sdk::numel(l)) +
                     " elements, the normalised shape " + std::to_string(n));
      const T* w = c.in_data<T>(idx);
      const sdk::StridedWalker<1> ww(l.rank, l.shape, {&l});
      int64_t k = 0;
      ww.run_all([&](const int64_t* off, int64_t cnt, const int64_t* st) {
        for (int64_t i = 0; i < cnt; ++i) v[static_cast<size_t>(k++)] = ld(w[off[0] + i * st[0]]);
      });
      return v;
    };
    const std::vector<double> weight = gather_param(1, 1.0), bias = gather_param(2, 0.0);
    const T* x = c.in_data<T>(0);
    T* y = c.out_data<T>();
    const sdk::StridedWalker<1> rw(in.rank, rows.shape, {&rows});
    const sdk::StridedWalker<1> iw(in.rank, inner.shape, {&inner});
    const double eps = p.eps;
    if constexpr (D == BP_DTYPE_F32) {
      // Contiguous f32 rows: the mean, then the moments about it, summed in
      // double by the vector row loops; the affine pass in f32.
      bool dense = rows::enabled();
      int64_t want = 1;
      for (uint32_t i = in.rank; dense && i-- > lead;) {
        if (in.shape[i] == 1) continue;
        dense = in.strides[i] == want;
        want *= in.shape[i];
      }
      if (dense) {
        std::vector<float> wf(weight.begin(), weight.end()), bf(bias.begin(), bias.end());
        pfor(c, rw.numel(), kGrain / std::max<int64_t>(1, 3 * n), [&](int64_t b, int64_t e) {
          int64_t r = b;
          rw.run(b, e, [&](const int64_t* off, int64_t cnt, const int64_t* rs) {
            for (int64_t i = 0; i < cnt; ++i, ++r) {
              const float* row = x + off[0] + i * rs[0];
              const double mean = rows::sum(row, n) / static_cast<double>(n);
              double s1 = 0, s2 = 0;
              rows::moments(row, n, mean, &s1, &s2);
              const double d = s1 / static_cast<double>(n);
              const double var = std::max(s2 / static_cast<double>(n) - d * d, 0.0);
              const double m = mean + d;
              const float mh = static_cast<float>(m);
              rows::norm_affine(row, n, mh, static_cast<float>(m - static_cast<double>(mh)),
                                static_cast<float>(1.0 / std::sqrt(var + eps)), wf.data(), bf.data(), y + r * n);
            }
          });
        });
        return;
      }
    }
    pfor(c, rw.numel(), kGrain / std::max<int64_t>(1, 3 * n), [&](int64_t b, int64_t e) {
      std::vector<double> buf(static_cast<size_t>(n));
      int64_t r = b;
      rw.run(b, e, [&](const int64_t* off, int64_t cnt, const int64_t* rs) {
        for (int64_t i = 0; i < cnt; ++i, ++r) {
          const T* row = x + off[0] + i * rs[0];
          double* bp = buf.data();
          iw.run_all([&](const int64_t* io, int64_t in_n, const int64_t* is) {
            for (int64_t k = 0; k < in_n; ++k) *bp++ = ld(row[io[0] + k * is[0]]);
          });
          double l[4] = {0, 0, 0, 0};
          int64_t k = 0;
          for (; k + 4 <= n; k += 4)
            for (int j = 0; j < 4; ++j) l[j] += buf[k + j];
          for (; k < n; ++k) l[0] += buf[k];
          const double mean = ((l[0] + l[1]) + (l[2] + l[3])) / static_cast<double>(n);
          double q[4] = {0, 0, 0, 0};
          for (k = 0; k + 4 <= n; k += 4)
            for (int j = 0; j < 4; ++j) q[j] += (buf[k + j] - mean) * (buf[k + j] - mean);
          for (; k < n; ++k) q[0] += (buf[k] - mean) * (buf[k] - mean);
          const double var = ((q[0] + q[1]) + (q[2] + q[3])) / static_cast<double>(n);
          const double rstd = 1.0 / std::sqrt(var + eps);
          T* out = y + r * n;
          for (k = 0; k < n; ++k)
            out[k] = st<T>(static_cast<comp_t<T>>((buf[k] - mean) * rstd * weight[k] + bias[k]));
        }
      });
    });
  }
};

}  // namespace

void register_reduce(sdk::KernelTable& t) {
  const auto k11 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d}; };
  const auto karg = [](bp_dtype d) { return std::vector<bp_dtype>{d, BP_DTYPE_I64}; };
  const auto kln = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, d, d}; };
  const std::vector<uint8_t> s1{kStrided};
  add_rows<ReduceK<SumR, false>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "sum", k11, s1);
  add_rows<ReduceK<MeanR, false>::K, BP_CPU_FLOAT_DTYPES>(t, "mean", k11, s1);
  add_rows<ReduceK<ProdR, false>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "prod", k11, s1);
  add_rows<ReduceK<MaxR, true>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "max", k11, s1);
  add_rows<ReduceK<MinR, true>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "min", k11, s1);
  add_rows<ArgK<true>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "argmax", karg, s1);
  add_rows<ArgK<false>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "argmin", karg, s1);
  add_rows<SoftmaxK<false>::K, BP_CPU_FLOAT_DTYPES>(t, "softmax", k11, s1);
  add_rows<SoftmaxK<true>::K, BP_CPU_FLOAT_DTYPES>(t, "log_softmax", k11, s1);
  add_rows<CumsumK, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "cumsum", k11, s1);
  add_rows<LayerNormK, BP_CPU_FLOAT_DTYPES>(t, "layer_norm", kln, {kStrided, kStrided, kStrided});
  add_rows<VarMeanK, BP_CPU_FLOAT_DTYPES>(t, "var_mean", k11, s1, 2);
}

}  // namespace backplane::cpu
