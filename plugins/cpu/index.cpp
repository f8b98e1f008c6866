// Indexing kernels: gather, index_select, concat, slice_update and topk.
//
// gather/index_select/concat only move elements, so they are instantiated
// per element size, not per dtype. Indices are i64; a negative index counts
// from the end, anything else out of range is an error naming the op, the
// index and the size.
#include "kernels.hpp"
#include "rowwalk.hpp"
#include "rowops.hpp"

#include <algorithm>

namespace backplane::cpu {
namespace {

template <size_t S> using bits_t = std::conditional_t<
    S == 1, uint8_t, std::conditional_t<S == 2, uint16_t, std::conditional_t<S == 4, uint32_t, uint64_t>>>;

inline int64_t checked_index(const Call& c, int64_t idx, int64_t size, int dim) {
  const int64_t i = idx < 0 ? idx + size : idx;
  if (i < 0 || i >= size)
    sdk::fail(BP_ERR_OUT_OF_RANGE, std::string(c.op) + ": index " + std::to_string(idx) + " out of range for dim " +
                                       std::to_string(dim) + " of size " + std::to_string(size));
  return i;
}

template <bp_dtype D> struct GatherK {
  static void impl(const Call& c) {
    c.expect(2, BP_PARAMS_DIM);
    using E = bits_t<sizeof(st_t<D>)>;
    const bp_layout& lx = c.in_layout(0);
    const bp_layout& li = c.in_layout(1);
    const bp_layout& lo = c.out_layout();
    const int dim = checked_dim(c, lx, c.params->u.dim.dim);
    BP_SDK_CHECK(li.rank == lx.rank, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": index rank " + std::to_string(li.rank) + " differs from input rank " + std::to_string(lx.rank));
    for (uint32_t i = 0; i < lx.rank; ++i)
      BP_SDK_CHECK(static_cast<int>(i) == dim || li.shape[i] <= lx.shape[i], BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": index shape " + dims_str(li) + " exceeds input shape " + dims_str(lx));
    expect_numel(c, lo, sdk::numel(li));
    // x seen through the index's shape, with the gathered dim's stride taken
    // out: the walker gives the base, the index adds idx * stride.
    bp_layout xv = lx;
    for (uint32_t i = 0; i < lx.rank; ++i) xv.shape[i] = li.shape[i];
    xv.strides[dim] = 0;
    const int64_t size = lx.shape[dim], xs = lx.strides[dim];
    const E* x = c.in_data<E>(0);
    const int64_t* index = c.in_data<int64_t>(1);
    E* y = c.out_data<E>();
    const sdk::StridedWalker<3> w(li.rank, li.shape, {&xv, &li, &lo});
    pfor(c, w.numel(), kGrain, [&](int64_t b, int64_t e) {
      w.run(b, e, [&](const int64_t* off, int64_t n, const int64_t* s) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t k = checked_index(c, index[off[1] + i * s[1]], size, dim);
          y[off[2] + i * s[2]] = x[off[0] + i * s[0] + k * xs];
        }
      });
    });
  }
};

template <bp_dtype D> struct IndexSelectK {
  static void impl(const Call& c) {
    c.expect(2, BP_PARAMS_DIM);
    using E = bits_t<sizeof(st_t<D>)>;
    const bp_layout& lx = c.in_layout(0);
    const bp_layout& li = c.in_layout(1);
    const bp_layout& lo = c.out_layout();
    const int dim = checked_dim(c, lx, c.params->u.dim.dim);
    const uint32_t ri = li.rank, rank = lx.rank - 1 + ri;
    BP_SDK_CHECK(rank <= BP_MAX_RANK && lo.rank == rank, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": output rank " + std::to_string(lo.rank) + ", expected " + std::to_string(rank));
    // Output dims: x[:dim] | index dims | x[dim+1:]. x and the index are
    // both seen through that shape, with stride 0 on the dims they lack.
    bp_layout xv{}, iv{};
    xv.rank = iv.rank = rank;
    xv.offset = lx.offset;
    iv.offset = li.offset;
    for (uint32_t i = 0; i < rank; ++i) {
      if (i < static_cast<uint32_t>(dim)) {
        xv.shape[i] = lx.shape[i];
        xv.strides[i] = lx.strides[i];
      } else if (i < dim + ri) {
        xv.shape[i] = li.shape[i - dim];
        iv.strides[i] = li.strides[i - dim];
      } else {
        xv.shape[i] = lx.shape[i - ri + 1];
        xv.strides[i] = lx.strides[i - ri + 1];
      }
      iv.shape[i] = xv.shape[i];
      BP_SDK_CHECK(lo.shape[i] == xv.shape[i], BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": output shape " + dims_str(lo) + " does not match input " + dims_str(lx) +
                     " and index " + dims_str(li));
    }
    const int64_t size = lx.shape[dim], xs = lx.strides[dim];
    const E* x = c.in_data<E>(0);
    const int64_t* index = c.in_data<int64_t>(1);
    E* y = c.out_data<E>();
    const sdk::StridedWalker<3> w(rank, xv.shape, {&xv, &iv, &lo});
    pfor(c, w.numel(), kGrain, [&](int64_t b, int64_t e) {
      w.run(b, e, [&](const int64_t* off, int64_t n, const int64_t* s) {
        if (s[1] == 0) {  // one index for the whole run: a slice copy
          const E* src = x + off[0] + checked_index(c, index[off[1]], size, dim) * xs;
          E* dst = y + off[2];
          if (s[0] == 1 && s[2] == 1) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(E));
          else
            for (int64_t i = 0; i < n; ++i) dst[i * s[2]] = src[i * s[0]];
          return;
        }
        for (int64_t i = 0; i < n; ++i) {
          const int64_t k = checked_index(c, index[off[1] + i * s[1]], size, dim);
          y[off[2] + i * s[2]] = x[off[0] + i * s[0] + k * xs];
        }
      });
    });
  }
};

// Copies the elements of layout `src` in `x` to layout `dst` in `y` (same shape).
template <class E> void copy_layout(const Call& c, const E* x, const bp_layout& src, E* y, const bp_layout& dst) {
  const sdk::StridedWalker<2> w(src.rank, src.shape, {&src, &dst});
  pfor(c, w.numel(), kGrain, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const int64_t* off, int64_t n, const int64_t* s) {
      if (s[0] == 1 && s[1] == 1) std::memcpy(y + off[1], x + off[0], static_cast<size_t>(n) * sizeof(E));
      else
        for (int64_t i = 0; i < n; ++i) y[off[1] + i * s[1]] = x[off[0] + i * s[0]];
    });
  });
}

template <bp_dtype D> struct ConcatK {
  static void impl(const Call& c) {
    c.expect(0, BP_PARAMS_DIM);
    using E = bits_t<sizeof(st_t<D>)>;
    const bp_layout& lo = c.out_layout();
    const int dim = checked_dim(c, lo, c.params->u.dim.dim);
    int64_t total = 0;
    for (size_t k = 0; k < c.n_in; ++k) {
      const bp_layout& l = c.in_layout(k);
      bool ok = l.rank == lo.rank;
      for (uint32_t i = 0; ok && i < lo.rank; ++i) ok = static_cast<int>(i) == dim || l.shape[i] == lo.shape[i];
      BP_SDK_CHECK(ok, BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": input " + std::to_string(k) + " shape " + dims_str(l) + " does not fit output " + dims_str(lo));
      total += l.shape[dim];
    }
    BP_SDK_CHECK(total == lo.shape[dim], BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": inputs add up to " + std::to_string(total) + " along dim " + std::to_string(dim) +
                   ", output has " + std::to_string(lo.shape[dim]));
    E* y = c.out_data<E>();
    int64_t at = 0;
    for (size_t k = 0; k < c.n_in; ++k) {
      const bp_layout& l = c.in_layout(k);
      bp_layout dst = lo;
      for (uint32_t i = 0; i < lo.rank; ++i) dst.shape[i] = l.shape[i];
      dst.offset = at * lo.strides[dim];
      at += l.shape[dim];
      copy_layout(c, c.in_data<E>(k), l, y, dst);
    }
  }
};

// y = x with update written at [start, start + len) along dim. When y is x
// (the plan bound the output to the Tensor x is read from: a KV cache), x's
// copy is skipped and only update's elements move.
template <bp_dtype D> struct SliceUpdateK {
  static void impl(const Call& c) {
    c.expect(3, BP_PARAMS_DIM);
    using E = bits_t<sizeof(st_t<D>)>;
    const bp_layout& lx = c.in_layout(0);
    const bp_layout& lu = c.in_layout(1);
    const bp_layout& ls = c.in_layout(2);
    const bp_layout& lo = c.out_layout();
    const int dim = checked_dim(c, lx, c.params->u.dim.dim);
    bool fits = lu.rank == lx.rank && lo.rank == lx.rank;
    for (uint32_t i = 0; fits && i < lx.rank; ++i)
      fits = lo.shape[i] == lx.shape[i] &&
             (static_cast<int>(i) == dim ? lu.shape[i] <= lx.shape[i] : lu.shape[i] == lx.shape[i]);
    BP_SDK_CHECK(fits, BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": update " + dims_str(lu) + " and output " + dims_str(lo) + " do not fit x " +
                     dims_str(lx) + " along dim " + std::to_string(dim));
    expect_numel(c, ls, 1, "start");
    const int64_t start = c.in_data<int64_t>(2)[ls.offset];
    const int64_t len = lu.shape[dim], size = lx.shape[dim];
    if (start < 0 || start > size - len)
      sdk::fail(BP_ERR_OUT_OF_RANGE, std::string(c.op) + ": start " + std::to_string(start) + " with " +
                                         std::to_string(len) + " rows does not fit dim " + std::to_string(dim) +
                                         " of size " + std::to_string(size));
    const E* x = c.in_data<E>(0);
    const E* u = c.in_data<E>(1);
    E* y = c.out_data<E>();
    if (!sdk::same_place(c.in[0], lx, *c.out, lo)) copy_layout(c, x, lx, y, lo);
    bp_layout dst = lo;
    dst.shape[dim] = len;
    dst.offset = lo.offset + start * lo.strides[dim];
    copy_layout(c, u, lu, y, dst);
  }
};

// topk ranks NaN above every number (so last when picking the smallest) and
// breaks ties by the lower index.
template <class C> struct TopkOrder {
  bool largest;
  bool operator()(C a, int64_t ia, C b, int64_t ib) const {  // a before b
    if constexpr (std::is_floating_point_v<C>) {
      const bool an = a != a, bn = b != b;
      if (an != bn) return largest ? an : bn;
      if (an) return ia < ib;
    }
    if (a != b) return largest ? a > b : a < b;
    return ia < ib;
  }
};

template <bp_dtype D> struct TopkK {
  static void impl(const Call& c) {
    c.expect(1, BP_PARAMS_TOPK);
    using T = st_t<D>;
    using C = comp_t<T>;
    const bp_topk_params& p = c.params->u.topk;
    const bp_layout& in = c.in_layout(0);
    const int dim = checked_dim(c, in, p.dim);
    const int64_t n = in.shape[dim], s = in.strides[dim], k = p.k;
    BP_SDK_CHECK(k >= 0 && k <= n, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": k = " + std::to_string(k) + " for a dim of size " + std::to_string(n));
    const bp_bundle_slot& sv = c.slot(0);
    const bp_bundle_slot& si = c.slot(1);
    const int64_t rows = n ? sdk::numel(in) / n : 0;
    expect_numel(c, sv.layout, rows * k, "values");
    expect_numel(c, si.layout, rows * k, "indices");
    BP_SDK_CHECK(sv.layout.rank == in.rank && si.layout.rank == in.rank, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": output slots must keep the input's rank");
    if (k == 0) return;
    const T* x = c.in_data<T>(0);
    T* vals = c.slot_data<T>(0);
    int64_t* idxs = c.slot_data<int64_t>(1);
    const int64_t vs = sv.layout.strides[dim], is = si.layout.strides[dim];
    const TopkOrder<C> before{p.largest};
    // Small k: one pass keeping the best k in insertion order; most
    // elements lose against the current k-th and cost one comparison.
    // Large k: nth_element on the row, then sort the head.
    const bool small = k <= 32;
    [[maybe_unused]] const bool fast = rows::enabled();
    for_rows<3>(c, in.rank, in.shape, dim, {&in, &sv.layout, &si.layout}, n, [&] {
      return [&, bv = std::vector<C>(static_cast<size_t>(small ? k : n)),
              bi = std::vector<int64_t>(static_cast<size_t>(small ? k : n))](const int64_t* off) mutable {
        const T* row = x + off[0];
        if (small) {
          int64_t cnt = 0;
          for (int64_t i = 0; i < n; ++i) {
            if constexpr (D == BP_DTYPE_F32) {
              // Skip, 16 at a time, the elements that lose to the current k-th.
              if (cnt == k && s == 1 && fast) {
                i = rows::find_contender(row, i, n, bv[k - 1], p.largest);
                if (i == n) break;
              }
            }
            const C v = ld(row[i * s]);
            if (cnt == k) {
              // One comparison rejects most elements; NaNs (either side)
              // fail it and take the full ordering.
              const C thr = bv[k - 1];
              if (p.largest ? v <= thr : v >= thr) continue;
              if (!before(v, i, thr, bi[k - 1])) continue;
            }
            int64_t pos = cnt < k ? cnt++ : k - 1;
            while (pos > 0 && before(v, i, bv[pos - 1], bi[pos - 1])) {
              bv[pos] = bv[pos - 1];
              bi[pos] = bi[pos - 1];
              --pos;
            }
            bv[pos] = v;
            bi[pos] = i;
          }
          for (int64_t j = 0; j < k; ++j) {
            vals[off[1] + j * vs] = st<T>(bv[j]);
            idxs[off[2] + j * is] = bi[j];
          }
        } else {
          for (int64_t i = 0; i < n; ++i) {
            bv[i] = ld(row[i * s]);
            bi[i] = i;
          }
          const auto cmp = [&](int64_t a, int64_t b) { return before(bv[a], a, bv[b], b); };
          if (k < n) std::nth_element(bi.begin(), bi.begin() + (k - 1), bi.end(), cmp);
          std::sort(bi.begin(), bi.begin() + k, cmp);
          for (int64_t j = 0; j < k; ++j) {
            vals[off[1] + j * vs] = st<T>(bv[bi[j]]);
            idxs[off[2] + j * is] = bi[j];
          }
        }
      };
    });
  }
};

}  // namespace

void register_index(sdk::KernelTable& t) {
  const auto kidx = [](bp_dtype d) { return std::vector<bp_dtype>{d, BP_DTYPE_I64, d}; };
  const auto k11 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d}; };
  add_rows<GatherK, BP_CPU_ALL_DTYPES>(t, "gather", kidx, {kStrided, kStrided});
  add_rows<IndexSelectK, BP_CPU_ALL_DTYPES>(t, "index_select", kidx, {kStrided, kStrided});
  add_rows<ConcatK, BP_CPU_ALL_DTYPES>(t, "concat", k11, {kStrided}, 0, BP_KERNEL_FLAG_VARIADIC);
  add_rows<SliceUpdateK, BP_CPU_ALL_DTYPES>(
      t, "slice_update", [](bp_dtype d) { return std::vector<bp_dtype>{d, d, BP_DTYPE_I64, d}; },
      {kStrided, kStrided, kStrided});
  add_rows<TopkK, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "topk", k11, {kStrided}, 2);
}

}  // namespace backplane::cpu
