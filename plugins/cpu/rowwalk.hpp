// Helpers of the CPU kernels that work along one dim (argmax/argmin,
// softmax, cumsum, layer_norm) and of those that sum (reductions, cumsum).
#pragma once

#include "kernels.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <type_traits>

namespace backplane::cpu {

// Sums accumulate f32 and the half types in double, integers in wrapping
// uint64.
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

// The output as a dense layout of the input's rank with `dim` of size 1, so
// a row of the input and its output element share one walker position.
inline bp_layout keepdim_layout(const bp_layout& in, int dim) {
  int64_t sh[BP_MAX_RANK] = {};
  for (uint32_t i = 0; i < in.rank; ++i) sh[i] = in.shape[i];
  sh[dim] = 1;
  return sdk::contiguous_layout(sh, in.rank);
}

inline int checked_dim(const Call& c, const bp_layout& in, int32_t dim) {
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

}  // namespace backplane::cpu
