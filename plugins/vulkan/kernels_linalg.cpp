// matmul (strided A and B, tiled in shared memory), conv2d (an implicit
// GEMM per group on dense NCHW input and OIHW weights, same tiling) and
// max_pool2d / avg_pool2d (one invocation per output, strided input).
#include "kernels.hpp"

namespace backplane::vulkan {

namespace {

// The direct forms' blocks per invocation (CPU devices; must match the
// defaults of TM/TN in shaders/matmul.comp and TO/TW in shaders/conv2d.comp).
// Measured on lavapipe (2 loaded cores): matmul 1024^3 4x4 ~1x, 8x8 ~2x,
// 8x16 and 16x16 ~3x; conv2d 8x4 1.7, 16x8 3.6, 32x8 5.8, 64x8 1.9 GFLOP/s.
constexpr int kDirectTM = 16, kDirectTN = 16;
// Products of at most this many multiply-adds take the direct form's 4x4
// block (modules matmul_<dtype>_direct4): either block runs them in well
// under a millisecond, and lavapipe compiles the 4x4 module in ~6 ms against
// ~35 ms for the 16x16 one, which a plan's first run pays.
constexpr int64_t kSmallMacs = int64_t{1} << 21;
constexpr int kDirectTO = 32, kDirectTW = 8;
constexpr int kDirectWG = 64;  // invocations per workgroup (DIRECT_WG)

void matmul_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_layout &al = c.lin(0), &bl = c.lin(1), &cl = c.lout();
  const uint32_t r = cl.rank;
  BP_SDK_CHECK(r >= 2 && al.rank == r && bl.rank == r, BP_ERR_INVALID_ARGUMENT,
             "matmul: operands must have the output's rank >= 2");
  const int64_t M = al.shape[r - 2], K = al.shape[r - 1], N = bl.shape[r - 1];
  BP_SDK_CHECK(bl.shape[r - 2] == K && cl.shape[r - 2] == M && cl.shape[r - 1] == N, BP_ERR_INVALID_ARGUMENT,
             "matmul: shapes do not match");
  const int64_t total = numel(cl);
  if (total == 0) return;
  Operand a = bind(c, c.in[0], al, d, false);
  Operand b = bind(c, c.in[1], bl, d, false);
  Operand o = bind_dense(c, c.out[0], total, d, true);
  // K == 0 needs nothing special: the tiled loop runs no step and writes zeros.
  const auto cs = dense_strides(r, cl.shape);
  const Coalesced bc = coalesce(r - 2, cl.shape, {al.strides, bl.strides, cs.data()});
  int64_t batch = 1;
  for (uint32_t i = 0; i + 2 < r; ++i) batch *= cl.shape[i];
  Args args;
  args.i32(M);
  args.i32(N);
  args.i32(K);
  args.i32(a.offset);
  args.i32(al.strides[r - 2]);
  args.i32(al.strides[r - 1]);
  args.i32(b.offset);
  args.i32(bl.strides[r - 2]);
  args.i32(bl.strides[r - 1]);
  args.i32(o.offset);
  args.i32(bc.rank);
  for (int i = 0; i < BP_MAX_RANK; ++i) args.i32(i < bc.rank ? bc.shape[i] : 1);
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < BP_MAX_RANK; ++i) args.i32(i < bc.rank ? bc.strides[k][i] : 0);
  // A CPU device (lavapipe) takes the direct form: a kDirectTM x kDirectTN
  // block of C per invocation, no shared memory (shaders/matmul.comp:
  // DIRECT_FORM), 4-vector loads of B's rows where they are dense and
  // 4-aligned (every batch step too).
  const bool direct = c.cpu_device();
  auto aligned = [&](int k, int64_t off, int64_t row_stride, int64_t unit_stride, int64_t len) {
    if (unit_stride != 1 || off % 4 != 0 || row_stride % 4 != 0 || len % 4 != 0) return false;
    for (int i = 0; i < bc.rank; ++i)
      if (bc.strides[k][i] % 4 != 0) return false;
    return true;
  };
  const bool bvec = aligned(1, b.offset, bl.strides[r - 2], bl.strides[r - 1], N);
  const bool small = direct && static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) * static_cast<double>(batch) <= static_cast<double>(kSmallMacs);
  const int tm = small ? 4 : kDirectTM, tn = small ? 4 : kDirectTN;
  const int64_t blocks = direct ? ceil_div(M, tm) * ceil_div(N, tn) * batch : ceil_div(M, 64) * ceil_div(N, 64) * batch;
  const uint64_t groups = direct ? ceil_div(blocks, kDirectWG) : blocks;
  BP_SDK_CHECK(groups < (1ull << 31) && blocks < (int64_t{1} << 31), BP_ERR_UNIMPLEMENTED, "matmul: too many tiles");
  const Pipeline& p = direct ? c.dev.pipelines.get(shader("matmul", d) + (small ? "_direct4" : "_direct"), {bvec ? 1 : 0}, 3)
                             : c.dev.pipelines.get(shader("matmul", d), {}, 3);
  const Binding bs[] = {a.binding, b.binding, o.binding};
  c.dev.exec.dispatch(c.stream, p, bs, args.w, static_cast<uint32_t>(batch), 0, groups, c.op());
}

void conv2d_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_layout &xl = c.lin(0), &wl = c.lin(1), &ol = c.lout();
  const auto& cp = c.params_of(BP_PARAMS_CONV2D).u.conv2d;
  BP_SDK_CHECK(xl.rank == 4 && wl.rank == 4 && ol.rank == 4, BP_ERR_INVALID_ARGUMENT,
             "conv2d: x, w and output must be 4-D");
  const int64_t N = xl.shape[0], C = xl.shape[1], H = xl.shape[2], W = xl.shape[3];
  const int64_t O = wl.shape[0], KH = wl.shape[2], KW = wl.shape[3];
  const int64_t OH = ol.shape[2], OW = ol.shape[3];
  BP_SDK_CHECK(cp.groups >= 1 && C % cp.groups == 0 && O % cp.groups == 0 && wl.shape[1] == C / cp.groups &&
                 ol.shape[0] == N && ol.shape[1] == O,
             BP_ERR_INVALID_ARGUMENT, "conv2d: shapes and groups do not match");
  const int64_t total = numel(ol);
  if (total == 0) return;
  const bool has_bias = c.n_in > 2 && c.present(2);
  Operand x = bind_dense(c, c.in[0], numel(xl), d, false);
  Operand w = bind_dense(c, c.in[1], numel(wl), d, false);
  Operand b = has_bias ? bind_dense(c, c.in[2], O, d, false) : bind_dummy(c);
  Operand o = bind_dense(c, c.out[0], total, d, true);
  Args a;
  for (int64_t v : {N, C, H, W, O, OH, OW, KH, KW, cp.stride[0], cp.stride[1], cp.padding[0], cp.padding[1],
                    cp.dilation[0], cp.dilation[1], cp.groups})
    a.i32(v);
  a.i32(x.offset);
  a.i32(w.offset);
  a.i32(b.offset);
  a.i32(o.offset);
  a.i32(has_bias ? 1 : 0);
  BP_SDK_CHECK(total < (int64_t{1} << 31) && C / cp.groups * KH * KW < (int64_t{1} << 31), BP_ERR_UNIMPLEMENTED,
             "conv2d: more than 2^31 outputs or reduction terms");
  // A CPU device takes the direct form (shaders/conv2d.comp: DIRECT_FORM): a
  // block of to output channels x tw output columns per invocation.
  const bool direct = c.cpu_device();
  const int to = kDirectTO, tw = kDirectTW;
  const int64_t og = O / cp.groups;
  const int64_t blocks = direct ? ceil_div(og, to) * N * OH * ceil_div(OW, tw) * cp.groups : 0;
  BP_SDK_CHECK(blocks < (int64_t{1} << 31), BP_ERR_UNIMPLEMENTED, "conv2d: too many output blocks");
  const uint64_t groups = direct ? ceil_div(blocks, kDirectWG)
                                 : ceil_div(N * OH * OW, 64) * ceil_div(og, 64) * static_cast<uint64_t>(cp.groups);
  const Pipeline& p = direct ? c.dev.pipelines.get(shader("conv2d", d) + "_direct", {}, 4)
                             : c.dev.pipelines.get(shader("conv2d", d), {}, 4);
  const Binding bs[] = {x.binding, w.binding, b.binding, o.binding};
  c.dev.exec.dispatch(c.stream, p, bs, a.w, static_cast<uint32_t>(total), 0, groups, c.op());
}

// max_pool2d (code 0) and avg_pool2d (code 1): shaders/pool2d.comp.
void pool2d_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bool avg = c.row.code == 1;
  const bp_layout &xl = c.lin(0), &ol = c.lout();
  const auto& p = c.params_of(BP_PARAMS_POOL2D).u.pool2d;
  BP_SDK_CHECK(xl.rank == 4 && ol.rank == 4 && ol.shape[0] == xl.shape[0] && ol.shape[1] == xl.shape[1],
             BP_ERR_INVALID_ARGUMENT, std::string(c.op()) + ": x and output must be 4-D, [N, C, ...] alike");
  BP_SDK_CHECK(p.kernel[0] >= 1 && p.kernel[1] >= 1 && p.stride[0] >= 1 && p.stride[1] >= 1 && p.dilation[0] >= 1 &&
                 p.dilation[1] >= 1 && p.padding[0] >= 0 && p.padding[1] >= 0 && p.padding[2] >= 0 && p.padding[3] >= 0,
             BP_ERR_INVALID_ARGUMENT, std::string(c.op()) + ": bad pooling params");
  const int64_t total = numel(ol);
  if (total == 0) return;
  const int64_t H = xl.shape[2], W = xl.shape[3];
  const int64_t pt = p.padding[0], pl = p.padding[1], pb = p.padding[2], pr = p.padding[3];
  Operand x = bind(c, c.in[0], xl, d, false);
  Operand o = bind_dense(c, c.out[0], total, d, true);
  Args a;  // i32() refuses anything past int32 (window positions of a huge padded input)
  for (int64_t v : {xl.shape[1], H, W, ol.shape[2], ol.shape[3], int64_t{p.kernel[0]}, int64_t{p.kernel[1]},
                    int64_t{p.stride[0]}, int64_t{p.stride[1]}, pt, pl, int64_t{p.dilation[0]}, int64_t{p.dilation[1]}})
    a.i32(v);
  // The divisor's region in padded coordinates.
  const bool pad_counts = avg && p.count_include_pad;
  a.i32(pad_counts ? 0 : pt);
  a.i32(pad_counts ? H + pt + pb : H + pt);
  a.i32(pad_counts ? 0 : pl);
  a.i32(pad_counts ? W + pl + pr : W + pl);
  a.i32(x.offset);
  for (int i = 0; i < 4; ++i) a.i32(xl.strides[i]);
  a.i32(o.offset);
  // Window positions (oh·stride + (k - 1)·dilation) must fit int32 in the shader.
  BP_SDK_CHECK(total < (int64_t{1} << 31) &&
                 (ol.shape[2] - 1) * p.stride[0] + (int64_t{p.kernel[0]} - 1) * p.dilation[0] < (int64_t{1} << 31) &&
                 (ol.shape[3] - 1) * p.stride[1] + (int64_t{p.kernel[1]} - 1) * p.dilation[1] < (int64_t{1} << 31),
             BP_ERR_UNIMPLEMENTED, std::string(c.op()) + ": more than 2^31 outputs or window positions");
  const Pipeline& pl_ = c.dev.pipelines.get(shader("pool2d", d) + (avg ? "_avg" : "_max"), {}, 2);
  const Binding bs[] = {x.binding, o.binding};
  c.dev.exec.dispatch(c.stream, pl_, bs, a.w, static_cast<uint32_t>(total), 0, ceil_div(static_cast<uint64_t>(total), 256), c.op());
}

// scaled_dot_product_attention (shaders/attention.comp): one workgroup per
// query row, an online softmax over tiles of keys; every operand strided, the
// mask broadcast by zero strides.
void attention_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_layout &ql = c.lin(0), &kl = c.lin(1), &vl = c.lin(2), &yl = c.lout();
  const auto& p = c.params_of(BP_PARAMS_ATTENTION).u.attention;
  const uint32_t rank = ql.rank;
  BP_SDK_CHECK(rank >= 2 && kl.rank == rank && vl.rank == rank && yl.rank == rank, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op()) + ": q, k, v and y must have one rank of at least 2");
  const int64_t Sq = ql.shape[rank - 2], D = ql.shape[rank - 1], Sk = kl.shape[rank - 2], Dv = vl.shape[rank - 1];
  BP_SDK_CHECK(kl.shape[rank - 1] == D && vl.shape[rank - 2] == Sk && yl.shape[rank - 2] == Sq && yl.shape[rank - 1] == Dv,
               BP_ERR_INVALID_ARGUMENT, std::string(c.op()) + ": shapes of q, k, v and y do not fit");
  int64_t rows = Sq;
  for (uint32_t i = 0; i + 2 < rank; ++i) {
    BP_SDK_CHECK(kl.shape[i] == ql.shape[i] && vl.shape[i] == ql.shape[i] && yl.shape[i] == ql.shape[i],
                 BP_ERR_INVALID_ARGUMENT, std::string(c.op()) + ": batch dims differ");
    rows *= ql.shape[i];
  }
  if (rows == 0 || Dv == 0) return;
  const bool has_mask = c.n_in > 3 && c.present(3);
  int64_t ms[BP_MAX_RANK] = {};  // the mask's strides aligned to the scores [batch..., Sq, Sk]
  if (has_mask) {
    const bp_layout& ml = c.lin(3);
    BP_SDK_CHECK(ml.rank <= rank, BP_ERR_INVALID_ARGUMENT, std::string(c.op()) + ": mask of higher rank than the scores");
    for (uint32_t i = 0; i < ml.rank; ++i) ms[rank - ml.rank + i] = ml.shape[i] == 1 ? 0 : ml.strides[i];
  }
  Operand q = bind(c, c.in[0], ql, d, false), k = bind(c, c.in[1], kl, d, false), v = bind(c, c.in[2], vl, d, false);
  Operand m = has_mask ? bind(c, c.in[3], c.lin(3), d, false) : bind_dummy(c);
  Operand y = bind(c, c.out[0], yl, d, true);
  Args a;
  for (int64_t x : {int64_t{rank - 2}, Sq, Sk, D, Dv}) a.i32(x);
  a.f32(p.scale);
  a.i32(p.causal ? 1 : 0);
  a.i32(has_mask ? 1 : 0);
  for (int64_t x : {q.offset, k.offset, v.offset, m.offset, y.offset}) a.i32(x);
  for (const int64_t* st : {ql.strides, kl.strides, vl.strides, static_cast<const int64_t*>(ms), yl.strides}) {
    a.i32(st[rank - 2]);
    a.i32(st[rank - 1]);
  }
  for (uint32_t i = 0; i + 2 < rank; ++i) {
    a.i32(ql.shape[i]);
    for (const int64_t* st : {ql.strides, kl.strides, vl.strides, static_cast<const int64_t*>(ms), yl.strides})
      a.i32(st[i]);
  }
  BP_SDK_CHECK(rows < (int64_t{1} << 31), BP_ERR_UNIMPLEMENTED, std::string(c.op()) + ": more than 2^31 query rows");
  // (A CPU device declines the op: api_device_supports_kernel.)
  const Pipeline& pl = c.dev.pipelines.get(shader("attention", d), {}, 5);
  const Binding bs[] = {q.binding, k.binding, v.binding, m.binding, y.binding};
  c.dev.exec.dispatch(c.stream, pl, bs, a.w, static_cast<uint32_t>(rows), 0, static_cast<uint64_t>(rows), c.op());
}

}  // namespace

void register_linalg(Registry& r) {
  const bp_dtype floats[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64};
  for (bp_dtype d : floats) r.add("matmul", {d, d, d}, {S, S}, matmul_impl);
  for (bp_dtype d : floats) r.add("conv2d", {d, d, d, d}, {C, C, C}, conv2d_impl);
  for (bp_dtype d : floats) r.add("max_pool2d", {d, d}, {S}, pool2d_impl, 0);
  for (bp_dtype d : floats) r.add("avg_pool2d", {d, d}, {S}, pool2d_impl, 1);
  // f64 is left to the host's composed form (no f64 exp in the shader).
  for (bp_dtype d : {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16})
    r.add("scaled_dot_product_attention", {d, d, d, d, d}, {S, S, S, S}, attention_impl);
}

}  // namespace backplane::vulkan
