// Indexing kernels: gather, index_select, slice_update (one shader: shaders/index.comp) and
// topk (shaders/topk.comp). i64 indices travel as int32 pairs, so none of
// these needs shaderInt64 unless the data itself is i64.
#include "kernels.hpp"

namespace backplane::vulkan {

namespace {

constexpr int kWG = 256;

// out element r reads x at  sum r_d*xs_d + idx[sum r_d*is_d] * x_dim_stride.
// scatter (slice_update): the walk is over x's shape `ol` and out's strides
// are `os`; element r goes to out at  sum r_d*os_d + idx[0] * x_dim_stride,
// with idx[0] at most x_dim_size.
void gather_dispatch(Call& c, const Operand& x, const Operand& idx, const Operand& o, const bp_layout& ol,
                     const int64_t* xs, const int64_t* is, int64_t x_dim_stride, int64_t x_dim_size,
                     const int64_t* scatter_os = nullptr) {
  const int64_t n = numel(ol);
  if (n == 0) return;
  BP_SDK_CHECK(n < (int64_t{1} << 31), BP_ERR_UNIMPLEMENTED, std::string(c.op()) + ": more than 2^31 elements");
  const auto dense = dense_strides(ol.rank, ol.shape);
  const int64_t* os = scatter_os ? scatter_os : dense.data();
  const Coalesced co = coalesce(ol.rank, ol.shape, {xs, is, os});
  BP_SDK_CHECK(scatter_os || x_dim_size > 0, BP_ERR_OUT_OF_RANGE, std::string(c.op()) + ": index into an empty dim");
  Args a;
  a.i32(co.rank);
  for (int i = 0; i < BP_MAX_RANK; ++i) a.i32(i < co.rank ? co.shape[i] : 1);
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < BP_MAX_RANK; ++i) a.i32(i < co.rank ? co.strides[k][i] : 0);
  a.i32(x.offset);
  a.i32(idx.offset);
  a.i32(o.offset);
  a.i32(x_dim_stride);
  a.i32(x_dim_size);
  a.i32(scatter_os ? 1 : 0);
  const Pipeline& p = c.dev.pipelines.get(shader("index", c.row.dtypes[0]), {}, 3);
  const Binding b[] = {x.binding, idx.binding, o.binding};
  c.dev.exec.dispatch(c.stream, p, b, a.w, static_cast<uint32_t>(n), 0, ceil_div(n, kWG), c.op());
}

void gather_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_layout &xl = c.lin(0), &il = c.lin(1), &ol = c.lout();
  const int dim = c.params_of(BP_PARAMS_DIM).u.dim.dim;
  BP_SDK_CHECK(xl.rank == il.rank && il.rank == ol.rank && dim >= 0 && static_cast<uint32_t>(dim) < xl.rank,
             BP_ERR_INVALID_ARGUMENT, "gather: ranks or dim do not match");
  if (numel(ol) == 0) return;
  Operand x = bind(c, c.in[0], xl, d, false);
  Operand idx = bind(c, c.in[1], il, BP_DTYPE_I64, false);
  Operand o = bind_dense(c, c.out[0], numel(ol), d, true);
  int64_t xs[BP_MAX_RANK] = {};
  for (uint32_t i = 0; i < xl.rank; ++i) xs[i] = static_cast<int>(i) == dim ? 0 : xl.strides[i];
  gather_dispatch(c, x, idx, o, ol, xs, il.strides, xl.strides[dim], xl.shape[dim]);
}

void index_select_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_layout &xl = c.lin(0), &il = c.lin(1), &ol = c.lout();
  const int dim = c.params_of(BP_PARAMS_DIM).u.dim.dim;
  BP_SDK_CHECK(dim >= 0 && static_cast<uint32_t>(dim) < xl.rank && ol.rank == xl.rank - 1 + il.rank,
             BP_ERR_INVALID_ARGUMENT, "index_select: ranks or dim do not match");
  if (numel(ol) == 0) return;
  Operand x = bind(c, c.in[0], xl, d, false);
  Operand idx = bind(c, c.in[1], il, BP_DTYPE_I64, false);
  Operand o = bind_dense(c, c.out[0], numel(ol), d, true);
  int64_t xs[BP_MAX_RANK] = {}, is[BP_MAX_RANK] = {};
  uint32_t od = 0;
  for (uint32_t i = 0; i < xl.rank; ++i) {
    if (static_cast<int>(i) == dim) {
      for (uint32_t j = 0; j < il.rank; ++j) is[od++] = il.strides[j];
    } else {
      xs[od++] = xl.strides[i];
    }
  }
  gather_dispatch(c, x, idx, o, ol, xs, is, xl.strides[dim], xl.shape[dim]);
}

// slice_update: x copied to the output (unless the output is x itself: an
// in-place update), then update scattered at start along dim.
void slice_update_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_layout &xl = c.lin(0), &ul = c.lin(1), &sl = c.lin(2), &ol = c.lout();
  const int dim = c.params_of(BP_PARAMS_DIM).u.dim.dim;
  bool fits = dim >= 0 && static_cast<uint32_t>(dim) < xl.rank && ul.rank == xl.rank && ol.rank == xl.rank &&
              numel(sl) == 1;
  for (uint32_t i = 0; fits && i < xl.rank; ++i)
    fits = ol.shape[i] == xl.shape[i] &&
           (static_cast<int>(i) == dim ? ul.shape[i] <= xl.shape[i] : ul.shape[i] == xl.shape[i]);
  BP_SDK_CHECK(fits, BP_ERR_INVALID_ARGUMENT, "slice_update: shapes, ranks or dim do not match");
  if (!sdk::same_place(c.in[0], xl, c.out[0], ol) && numel(ol) > 0)
    copy_strided(c, c.in[0], xl, c.out[0], ol, d);
  if (numel(ul) == 0) return;
  Operand u = bind(c, c.in[1], ul, d, false);
  Operand start = bind(c, c.in[2], sl, BP_DTYPE_I64, false);
  Operand o = bind(c, c.out[0], ol, d, true);
  const int64_t no_stride[BP_MAX_RANK] = {};
  gather_dispatch(c, u, start, o, ul, ul.strides, no_stride, ol.strides[dim], xl.shape[dim] - ul.shape[dim],
                  ol.strides);
}

void topk_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_layout& in = c.lin(0);
  const auto& tp = c.params_of(BP_PARAMS_TOPK).u.topk;
  const bp_bundle_slot* slots = c.out[0].slots;
  const bp_layout& vl = slots[0].layout;
  BP_SDK_CHECK(slots[0].dtype == d && slots[1].dtype == BP_DTYPE_I64, BP_ERR_INVALID_ARGUMENT,
             "topk: bad bundle slots");
  const uint32_t rank = in.rank;
  const int dim = rank == 0 ? 0 : tp.dim;
  BP_SDK_CHECK(rank == 0 || (dim >= 0 && static_cast<uint32_t>(dim) < rank), BP_ERR_INVALID_ARGUMENT,
             "topk: dim out of range");
  const int64_t n = rank == 0 ? 1 : in.shape[dim];
  BP_SDK_CHECK(tp.k >= 0 && tp.k <= n, BP_ERR_INVALID_ARGUMENT,
             "topk: k = " + std::to_string(tp.k) + " outside [0, " + std::to_string(n) + "]");
  const int64_t n_out = numel(vl);
  BP_SDK_CHECK(numel(slots[1].layout) == n_out, BP_ERR_INVALID_ARGUMENT, "topk: slot shapes differ");
  if (n_out == 0) return;
  const uint32_t mask = rank == 0 ? 0u : 1u << dim;
  // Output strides per input dim: dense over the output shape (dim has k).
  const auto os = dense_strides(vl.rank, vl.shape);
  Operand x = bind(c, c.in[0], in, d, false);
  Operand ov = bind_dense(c, c.out[0], n_out, d, true, slots[0].byte_offset + slots[0].layout.offset * dtype_size(d));
  Operand oi = bind_dense(c, c.out[0], n_out, BP_DTYPE_I64, true, slots[1].byte_offset + slots[1].layout.offset * 8);
  oi.binding.handle = 0;  // same buffer as ov
  std::array<int64_t, BP_MAX_RANK> out_strides = os;
  out_strides[dim] = 0;  // the row position is added per pick
  Args a;
  RowPlan p = row_header(a, in, out_strides.data(), mask, x.offset, 0, false);
  a.i32(tp.k);
  a.i32(tp.largest ? 1 : 0);
  a.i32(ov.offset);
  a.i32(oi.offset);
  a.i32(rank == 0 ? 0 : os[dim]);
  // k <= 16 (specialization constant 3, so the best k live in registers):
  // one pass over each row (shaders/topk.comp), not the k passes of the
  // k-round form. On a CPU device with many rows, one invocation per row
  // (topk_<dt>_onepass, RMODE 1): each lane streams its own row with no
  // barrier. Else (few rows on a CPU device, where that form would leave
  // most lanes idle; every shape on a GPU, which wants a row's elements read
  // by neighbouring lanes together) one workgroup per row
  // (topk_<dt>_wgmerge): each invocation keeps the best k of its strided
  // share, then the workgroup merges them. k > 16 (beyond the register
  // slots): the k-round form, one workgroup per row.
  // Rows shorter than 1024 keep the k-round form too: its k passes over a
  // short row cost little, and the merge form's pipeline takes lavapipe
  // 70-100 ms to compile against ~5 ms (the demo's topk: 128 rows of 32).
  const bool onepass = c.cpu_device() && p.outer_n >= 1024;
  if (tp.k <= 16 && (onepass || n >= 1024)) {
    p.mode = onepass ? 1 : 0;
    p.groups = onepass ? ceil_div(p.outer_n, 256) : p.outer_n;
    // Spec constant 4 (the merge form): the invocations that share one
    // contiguous piece of the row, interleaved: a subgroup (a power of 2,
    // at most the form's workgroup of 64).
    std::vector<int32_t> spec = {0, static_cast<int32_t>(p.mode), 0, static_cast<int32_t>(tp.k)};
    if (!onepass) spec.push_back(static_cast<int32_t>(std::min<uint32_t>(c.dev.features.subgroup_size, 64)));
    const Binding bs[] = {x.binding, ov.binding, oi.binding};
    const std::string name = shader("topk", d) + (onepass ? "_onepass" : "_wgmerge");
    c.dev.exec.dispatch(c.stream, c.dev.pipelines.get(name, spec, 3), bs, a.w, static_cast<uint32_t>(p.outer_n), p.mode,
                        p.groups, c.op());
    return;
  }
  dispatch_rows(c, shader("topk", d), {}, {x.binding, ov.binding, oi.binding}, a, p);
}

}  // namespace

void register_index(Registry& r) {
  const bp_dtype all[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64, BP_DTYPE_I8,
                          BP_DTYPE_I16, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8,  BP_DTYPE_BOOL};
  const bp_dtype numeric[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64, BP_DTYPE_I8,
                              BP_DTYPE_I16, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8};
  // index_mask: the i64 index input (bit 1) is read as int32 pairs; an i64
  // data dtype is only copied (raw 64-bit moves still need shaderInt64).
  for (bp_dtype d : all) r.add("gather", {d, BP_DTYPE_I64, d}, {S, S}, gather_impl, 0, 0, false, 0x2);
  for (bp_dtype d : all) r.add("index_select", {d, BP_DTYPE_I64, d}, {S, S}, index_select_impl, 0, 0, false, 0x2);
  for (bp_dtype d : all)
    r.add("slice_update", {d, d, BP_DTYPE_I64, d}, {S, S, S}, slice_update_impl, 0, 0, false, 0x4);
  for (bp_dtype d : numeric) r.add("topk", {d, d}, {S}, topk_impl, 0, 2);
}

}  // namespace backplane::vulkan
