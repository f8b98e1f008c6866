// Reductions (sum mean prod max min, var_mean) and arg-reductions. Softmax
// and layer_norm are in norm.cpp, cumsum in scan.cpp.
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
#include "rowwalk.hpp"
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

}  // namespace

void register_reduce(sdk::KernelTable& t) {
  const auto k11 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d}; };
  const auto karg = [](bp_dtype d) { return std::vector<bp_dtype>{d, BP_DTYPE_I64}; };
  const std::vector<uint8_t> s1{kStrided};
  add_rows<ReduceK<SumR, false>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "sum", k11, s1);
  add_rows<ReduceK<MeanR, false>::K, BP_CPU_FLOAT_DTYPES>(t, "mean", k11, s1);
  add_rows<ReduceK<ProdR, false>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "prod", k11, s1);
  add_rows<ReduceK<MaxR, true>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "max", k11, s1);
  add_rows<ReduceK<MinR, true>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "min", k11, s1);
  add_rows<ArgK<true>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "argmax", karg, s1);
  add_rows<ArgK<false>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "argmin", karg, s1);
  norm::register_rows(t);  // softmax, log_softmax, layer_norm (norm.cpp), in the table's order
  scan::register_cumsum(t);  // scan.cpp
  norm::register_layer_norm(t);
  add_rows<VarMeanK, BP_CPU_FLOAT_DTYPES>(t, "var_mean", k11, s1, 2);
}

}  // namespace backplane::cpu
