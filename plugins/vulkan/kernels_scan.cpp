// Scans: cumsum (a row kernel, shaders/scan.comp) and selective_scan
// (shaders/sscan.comp, the state carried per (batch, channel) invocation).
#include "kernels.hpp"

namespace backplane::vulkan {

namespace {

void cumsum_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_layout& in = c.lin(0);
  const auto& dp = c.params_of(BP_PARAMS_DIM).u.dim;
  BP_SDK_CHECK(in.rank == 0 || (dp.dim >= 0 && static_cast<uint32_t>(dp.dim) < in.rank),
             BP_ERR_INVALID_ARGUMENT, "cumsum: dim out of range");
  const int64_t n = numel(in);
  if (n == 0) return;
  Operand x = bind(c, c.in[0], in, d, false);
  Operand o = bind_dense(c, c.out[0], n, d, true);
  const auto os = dense_strides(in.rank, in.shape);
  Args a;
  // Short rows: one invocation per row; long rows: a workgroup per row.
  RowPlan p = row_header(a, in, os.data(), in.rank == 0 ? 0u : 1u << dp.dim, x.offset, o.offset);
  if (p.inner_n < 2048) {
    p.mode = 1;
    p.groups = ceil_div(p.outer_n, 256);
  }
  a.i32(dp.exclusive ? 1 : 0);
  a.i32(dp.reverse ? 1 : 0);
  dispatch_rows(c, shader("scan", d), {}, {x.binding, o.binding}, a, p);
}

void selective_scan_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_layout &ul = c.lin(0), &dl = c.lin(1), &al = c.lin(2), &bl = c.lin(3), &cl = c.lin(4);
  BP_SDK_CHECK(ul.rank == 3 && dl.rank == 3 && al.rank == 2 && bl.rank == 3 && cl.rank == 3,
             BP_ERR_INVALID_ARGUMENT, "selective_scan: expected u, delta [B,L,D], a [D,N], b, c [B,L,N]");
  const int64_t B = ul.shape[0], L = ul.shape[1], D = ul.shape[2], N = al.shape[1];
  BP_SDK_CHECK(al.shape[0] == D && bl.shape[0] == B && bl.shape[1] == L && bl.shape[2] == N &&
                 cl.shape[0] == B && cl.shape[1] == L && cl.shape[2] == N && dl.shape[0] == B &&
                 dl.shape[1] == L && dl.shape[2] == D,
             BP_ERR_INVALID_ARGUMENT, "selective_scan: shapes do not match");
  BP_SDK_CHECK(
      N <= 256, BP_ERR_UNIMPLEMENTED,
      "selective_scan: state size N = " + std::to_string(N) + " exceeds the vulkan plugin's limit of 256");
  const bp_bundle_slot* slots = c.out[0].slots;
  BP_SDK_CHECK(slots[0].dtype == d && slots[1].dtype == d, BP_ERR_INVALID_ARGUMENT,
             "selective_scan: bad bundle slots");
  const bool softplus = c.params && c.params->kind == BP_PARAMS_SELECTIVE_SCAN && c.params->u.selective_scan.delta_softplus;
  const uint64_t es = dtype_size(d);
  const int64_t ny = B * L * D, nh = B * D * N;
  if (B * D == 0) return;
  Operand u = bind_dense(c, c.in[0], numel(ul), d, false);
  Operand dt = bind_dense(c, c.in[1], numel(dl), d, false);
  Operand a = bind_dense(c, c.in[2], numel(al), d, false);
  Operand b = bind_dense(c, c.in[3], numel(bl), d, false);
  Operand cc = bind_dense(c, c.in[4], numel(cl), d, false);
  Operand y = bind_dense(c, c.out[0], ny, d, true, slots[0].byte_offset + slots[0].layout.offset * es);
  Operand h = bind_dense(c, c.out[0], nh, d, true, slots[1].byte_offset + slots[1].layout.offset * es);
  h.binding.handle = 0;  // same buffer as y
  Args args;
  for (int64_t v : {B, L, D, N}) args.i32(v);
  for (const Operand* op : {&u, &dt, &a, &b, &cc, &y, &h}) args.i32(op->offset);
  args.i32(softplus ? 1 : 0);
  const int32_t maxn = N <= 16 ? 16 : N <= 64 ? 64 : 256;
  const Pipeline& p = c.dev.pipelines.get(shader("sscan", d), {0, maxn}, 7);
  const Binding bs[] = {u.binding, dt.binding, a.binding, b.binding, cc.binding, y.binding, h.binding};
  c.dev.exec.dispatch(c.stream, p, bs, args.w, static_cast<uint32_t>(B * D), 0, ceil_div(B * D, 64), c.op());
}

}  // namespace

void register_scan(Registry& r) {
  const bp_dtype floats[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64};
  const bp_dtype numeric[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64, BP_DTYPE_I8,
                              BP_DTYPE_I16, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8};
  for (bp_dtype d : numeric) r.add("cumsum", {d, d}, {S}, cumsum_impl);
  for (bp_dtype d : floats) r.add("selective_scan", {d, d, d, d, d, d}, {C, C, C, C, C}, selective_scan_impl, 0, 2);
}

}  // namespace backplane::vulkan
