// Row kernels: sum mean prod max min, argmax argmin, softmax log_softmax,
// layer_norm, var_mean. The host-side split into rows (kept dims) and row
// elements (reduced dims) is in row_header(); shaders/rows.glsl reads it.
#include "kernels.hpp"

#include <algorithm>

namespace backplane::vulkan {

namespace {

// The reduce/norm shader of dtype d: the subgroup-shuffle variant
// (shaders/rows.glsl: SG) for float-computed dtypes where the device has it.
bool has_sg_variant(const Call& c, bp_dtype d) {
  return c.dev.features.subgroup_shuffle && (d == BP_DTYPE_F32 || d == BP_DTYPE_F16 || d == BP_DTYPE_BF16);
}
std::string rows_shader(const Call& c, const char* family, bp_dtype d) {
  return shader(family, d) + (has_sg_variant(c, d) ? "_sg" : "");
}
// The module of a row plan's mode: the subgroup-per-row mode (4) is a module
// of its own (_row; its rows of 4-vectors, RVEC, _row4), as are the columns
// (reduce's _cols) and each norm op family: lavapipe compiles all the code in
// a module, dead specialization branches included.
std::string mode_suffix(const RowPlan& p) { return p.mode != 4 ? "" : p.vec != 0 ? "_row4" : "_row"; }

constexpr int64_t kWG = 256;  // WG of the row shaders (common.glsl)

// The device's subgroup size, at most a workgroup.
uint32_t subgroup_size(const Call& c) { return std::min<uint32_t>(c.dev.features.subgroup_size, kWG); }

// Whether the row kernels' 4-vector loads apply to rows that are contiguous
// (inner stride 1): every row starts on a multiple of 4.
bool rows_aligned4(const RowPlan& p, int64_t in_off) {
  if (in_off % 4 != 0) return false;
  for (int i = 0; i < p.outer_rank; ++i)
    if (p.outer_in[i] % 4 != 0) return false;
  return true;
}

// One subgroup per row (RM_SUBGROUP, the _sg shaders): on a CPU device
// (lavapipe runs a subgroup as one SIMD vector, and a subgroup's whole row
// before the next) for many rows long enough to stream (a few rows keep a
// workgroup each: every core gets one). 4-vector loads when the rows are
// contiguous and aligned. On lavapipe (4096 x 4096 f32, fractions of the
// copy roof) sum over dim -1 went from ~49% (an invocation per row) to
// 50-60%, softmax from 13% to 36-45%, var_mean from 15% to 33-46%.
bool use_subgroup_rows(const Call& c, bp_dtype d, const RowPlan& p) {
  return has_sg_variant(c, d) && c.cpu_device() && p.inner_n >= 32 && p.outer_n >= 256;
}
void plan_subgroup_rows(const Call& c, RowPlan& p, int64_t in_off) {
  const int64_t per_group = std::max<int64_t>(1, kWG / subgroup_size(c));
  p.mode = 4;
  p.vec = p.inner_rank == 1 && p.inner_in[0] == 1 && rows_aligned4(p, in_off) ? 1 : 0;
  p.pwords[0] = static_cast<int32_t>(per_group);
  p.groups = ceil_div(p.outer_n, per_group);
}

uint32_t dims_mask(const bp_layout& in, uint32_t n_dims, const int32_t* dims) {
  if (n_dims == 0) return in.rank == 0 ? 0u : ((1u << in.rank) - 1u);  // absent = all dims
  uint32_t m = 0;
  for (uint32_t i = 0; i < n_dims; ++i) {
    BP_SDK_CHECK(dims[i] >= 0 && static_cast<uint32_t>(dims[i]) < in.rank, BP_ERR_INVALID_ARGUMENT,
               "reduction dim out of range");
    m |= 1u << dims[i];
  }
  return m;
}

void reduce_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_layout& in = c.lin(0);
  const auto& rp = c.params_of(BP_PARAMS_REDUCE).u.reduce;
  const uint32_t mask = dims_mask(in, rp.n_dims, rp.dims);
  const auto os = reduced_out_strides(in, mask);
  const int64_t n_out = numel(c.lout());
  if (n_out == 0) return;
  Operand x = bind(c, c.in[0], in, d, false);
  Operand o = bind_dense(c, c.out[0], n_out, d, true);
  Args a;
  RowPlan p = row_header(a, in, os.data(), mask, x.offset, o.offset, true, c.cpu_device());
  BP_SDK_CHECK(p.outer_n == n_out, BP_ERR_INVALID_ARGUMENT,
             std::string(c.op()) + ": output size does not match the reduction");
  if (p.inner_n == 0 && c.row.code >= 3)
    fail(BP_ERR_INVALID_ARGUMENT, std::string(c.op()) + ": reduction over an empty dim has no identity");
  // (inner_n == 0 still dispatches: the shader writes the identity.)
  if (p.outer_rank == 1 && p.outer_in[0] == 1 && p.outer_out[0] == 1 && p.inner_n > 1) {
    // Columns (shaders/reduce.comp, RM_COLUMNS): the kept dim is the
    // contiguous one. Invocation t owns 4 (GPU) or 16 (CPU device: a
    // workgroup spans 4096 columns) neighbouring columns and walks the rows
    // of its chunk; the chunks' partials are added by a second pass. A GPU
    // gets chunks enough for ~512 workgroups; a CPU device chunks of 32 rows,
    // so the rows a workgroup's subgroups read in turn stay in cache (sum
    // over dim 0 of 4096 x 4096 f32 on lavapipe: 22% of the copy roof with
    // a workgroup per column, 15% with one 4-column strip per invocation
    // down all rows, 33-43% now).
    const int64_t cols = p.outer_n, rows = p.inner_n;
    const bool cpu = c.cpu_device();
    const int32_t cv = cpu ? 4 : 1;  // 4-column groups per invocation
    const int64_t gpc = ceil_div(cols, 4 * kWG * cv);  // workgroups per chunk
    int64_t P = cpu ? std::min<int64_t>(256, ceil_div(rows, 32))
                    : std::clamp<int64_t>(ceil_div(512, gpc), 1, std::max<int64_t>(1, rows / 64));
    P = std::max<int64_t>(1, std::min<int64_t>(P, (int64_t{1} << 24) / cols));  // partials: at most 16M
    // A small reduction on a CPU device (16K elements, a few microseconds on
    // one core) in one pass: a second pass costs a dispatch, and its pipeline
    // (a plan's first run compiles it) more than the split saves.
    if (cpu && rows * cols <= (int64_t{1} << 14)) P = 1;
    const int64_t R = ceil_div(rows, P);
    P = ceil_div(rows, R);
    bool vec = cols % 4 == 0 && x.offset % 4 == 0;
    for (int i = 0; i < p.inner_rank; ++i) vec = vec && p.inner_in[i] % 4 == 0;
    std::vector<int32_t> spec = {c.row.code, 0, vec ? 1 : 0, cv};
    if (P == 1) {
      a.i32(0);
      a.i32(0);
      Binding none = c.dev.exec.scratch(c.stream, 4);
      none.write = false;
      none.handle = 0;
      spec[1] = 5;
      const Pipeline& pl = c.dev.pipelines.get(shader("reduce", d) + "_cols", spec, 3);
      const Binding bs[] = {x.binding, o.binding, none};
      c.dev.exec.dispatch(c.stream, pl, bs, a.w, static_cast<uint32_t>(cols), 5, static_cast<uint64_t>(gpc), c.op(),
                          {0, static_cast<int32_t>(gpc), 0, 0});
      return;
    }
    const uint64_t ct = (d == BP_DTYPE_F64 || d == BP_DTYPE_I64) ? 8 : 4;
    Binding s = c.dev.exec.scratch(c.stream, static_cast<uint64_t>(P * cols) * ct);
    a.i32(0);
    a.i32(0);
    spec[1] = 6;
    const Pipeline& pl = c.dev.pipelines.get(shader("reduce", d) + "_cols", spec, 3);
    const Binding b1[] = {x.binding, o.binding, s};
    c.dev.exec.dispatch(c.stream, pl, b1, a.w, static_cast<uint32_t>(cols), 6, static_cast<uint64_t>(gpc * P), c.op(),
                        {0, static_cast<int32_t>(gpc), static_cast<int32_t>(R), static_cast<int32_t>(P)});
    Binding s2 = s;
    s2.write = false;
    const Binding b2[] = {x.binding, o.binding, s2};
    spec = {c.row.code, 7, 0, cv};
    const Pipeline& pl7 = c.dev.pipelines.get(shader("reduce", d) + "_cols", spec, 3);
    c.dev.exec.dispatch(c.stream, pl7, b2, a.w, static_cast<uint32_t>(cols), 7, static_cast<uint64_t>(gpc), c.op(),
                        {0, static_cast<int32_t>(gpc), static_cast<int32_t>(R), static_cast<int32_t>(P)});
    return;
  }
  if (p.mode == 0 && p.outer_n <= 16 && p.inner_n >= (1 << 16)) {
    // A few very long rows: split each into P chunks reduced by P
    // workgroups into scratch partials, then reduce the partials.
    const int64_t P = std::min<int64_t>(1024, ceil_div(p.inner_n, 1 << 14));
    const int64_t chunk = ceil_div(p.inner_n, P);
    const uint64_t ct = (d == BP_DTYPE_F64 || d == BP_DTYPE_I64) ? 8 : 4;  // compute type size
    Binding s = c.dev.exec.scratch(c.stream, static_cast<uint64_t>(p.outer_n * P) * ct);
    a.i32(P);
    a.i32(chunk);
    const Pipeline& pl = c.dev.pipelines.get(rows_shader(c, "reduce", d), row_spec({c.row.code}, 2), 3);
    const Pipeline& pl3 = c.dev.pipelines.get(rows_shader(c, "reduce", d), row_spec({c.row.code}, 3), 3);
    const Binding b1[] = {x.binding, o.binding, s};
    c.dev.exec.dispatch(c.stream, pl, b1, a.w, static_cast<uint32_t>(p.outer_n), 2, static_cast<uint64_t>(p.outer_n * P), c.op());
    Binding s2 = s;
    s2.write = false;
    const Binding b2[] = {x.binding, o.binding, s2};
    c.dev.exec.dispatch(c.stream, pl3, b2, a.w, static_cast<uint32_t>(p.outer_n), 3, static_cast<uint64_t>(p.outer_n), c.op());
    return;
  }
  a.i32(0);
  a.i32(0);
  Binding none = c.dev.exec.scratch(c.stream, 4);
  none.write = false;
  none.handle = 0;
  if (use_subgroup_rows(c, d, p)) plan_subgroup_rows(c, p, x.offset);
  dispatch_rows(c, rows_shader(c, "reduce", d) + mode_suffix(p), {c.row.code}, {x.binding, o.binding, none}, a, p);
}

void argreduce_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_layout& in = c.lin(0);
  const auto& ap = c.params_of(BP_PARAMS_ARG_REDUCE).u.arg_reduce;
  BP_SDK_CHECK(ap.dim >= 0 && static_cast<uint32_t>(ap.dim) < std::max<uint32_t>(in.rank, 1),
             BP_ERR_INVALID_ARGUMENT, std::string(c.op()) + ": dim out of range");
  const uint32_t mask = in.rank == 0 ? 0u : (1u << ap.dim);
  const auto os = reduced_out_strides(in, mask);
  const int64_t n_out = numel(c.lout());
  if (n_out == 0) return;
  Operand x = bind(c, c.in[0], in, d, false);
  Operand o = bind_dense(c, c.out[0], n_out, BP_DTYPE_I64, true);
  Args a;
  RowPlan p = row_header(a, in, os.data(), mask, x.offset, o.offset, true, c.cpu_device());
  a.i32(ap.select_last_index ? 1 : 0);
  if (p.inner_n == 0) fail(BP_ERR_INVALID_ARGUMENT, std::string(c.op()) + ": reduction over an empty dim");
  auto pipeline = [&](uint32_t mode) -> const Pipeline& {
    return c.dev.pipelines.get(shader("argreduce", d), row_spec({c.row.code}, mode), 4);
  };
  if (p.mode == 0 && p.outer_n <= 16 && p.inner_n >= (1 << 16)) {
    // A few very long rows: partial (value, index) pairs per chunk, then a
    // pass over the partials (as in reduce_impl).
    const int64_t P = std::min<int64_t>(1024, ceil_div(p.inner_n, 1 << 14));
    const int64_t chunk = ceil_div(p.inner_n, P);
    const uint64_t ct = (d == BP_DTYPE_F64 || d == BP_DTYPE_I64) ? 8 : 4;
    const uint64_t vbytes = (static_cast<uint64_t>(p.outer_n * P) * ct + 255) / 256 * 256;
    Binding sv = c.dev.exec.scratch(c.stream, vbytes + static_cast<uint64_t>(p.outer_n * P) * 4);
    Binding si = sv;
    sv.range = vbytes;
    si.offset += vbytes;
    si.range = static_cast<uint64_t>(p.outer_n * P) * 4;
    si.handle = 0;  // same buffer as sv
    a.i32(P);
    a.i32(chunk);
    const Binding b1[] = {x.binding, o.binding, sv, si};
    c.dev.exec.dispatch(c.stream, pipeline(2), b1, a.w, static_cast<uint32_t>(p.outer_n), 2, static_cast<uint64_t>(p.outer_n * P), c.op());
    sv.write = si.write = false;
    const Binding b2[] = {x.binding, o.binding, sv, si};
    c.dev.exec.dispatch(c.stream, pipeline(3), b2, a.w, static_cast<uint32_t>(p.outer_n), 3, static_cast<uint64_t>(p.outer_n), c.op());
    return;
  }
  a.i32(0);
  a.i32(0);
  Binding none = c.dev.exec.scratch(c.stream, 4);
  none.write = false;
  none.handle = 0;
  const Binding bs[] = {x.binding, o.binding, none, none};
  if (p.outer_n == 0) return;
  c.dev.exec.dispatch(c.stream, pipeline(p.mode), bs, a.w, static_cast<uint32_t>(p.outer_n), p.mode, p.groups, c.op());
}

void param_ct(Args& a, bp_dtype d, double v) {
  if (d == BP_DTYPE_F64) a.f64(v);
  else a.f32(v);
}

// softmax (0), log_softmax (1), layer_norm (2), var_mean (3).
void norm_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_layout& in = c.lin(0);
  const int op = c.row.code;
  uint32_t mask = 0;
  std::array<int64_t, BP_MAX_RANK> os{};
  Args a;
  Operand x = bind(c, c.in[0], in, d, false);
  Operand o, o2, w, b;
  bool have_w = false, have_b = false;
  double scalar = 0;
  if (op <= 2) {
    if (op <= 1) {
      const int dim = c.params_of(BP_PARAMS_DIM).u.dim.dim;
      BP_SDK_CHECK(in.rank == 0 || (dim >= 0 && static_cast<uint32_t>(dim) < in.rank), BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op()) + ": dim out of range");
      mask = in.rank == 0 ? 0u : 1u << dim;
    } else {
      const auto& lp = c.params_of(BP_PARAMS_LAYER_NORM).u.layer_norm;
      BP_SDK_CHECK(lp.n_dims >= 1 && lp.n_dims <= in.rank, BP_ERR_INVALID_ARGUMENT, "layer_norm: bad dims");
      for (uint32_t i = in.rank - lp.n_dims; i < in.rank; ++i) mask |= 1u << i;
      scalar = lp.eps;
    }
    os = dense_strides(in.rank, in.shape);
    if (numel(in) == 0) return;
    o = bind_dense(c, c.out[0], numel(in), d, true);
    o2 = bind_dummy(c);
    if (op == 2) {
      have_w = c.n_in > 1 && c.present(1);
      have_b = c.n_in > 2 && c.present(2);
      w = have_w ? bind_dense(c, c.in[1], numel(c.lin(1)), d, false) : bind_dummy(c);
      b = have_b ? bind_dense(c, c.in[2], numel(c.lin(2)), d, false) : bind_dummy(c);
    } else {
      w = b = bind_dummy(c);
    }
  } else {
    const auto& vp = c.params_of(BP_PARAMS_VAR_MEAN).u.var_mean;
    mask = dims_mask(in, vp.n_dims, vp.dims);
    scalar = vp.correction;
    os = reduced_out_strides(in, mask);
    const bp_bundle_slot* slots = c.out[0].slots;
    const int64_t n_out = numel(slots[0].layout);
    if (n_out == 0) return;
    BP_SDK_CHECK(slots[0].dtype == d && slots[1].dtype == d && numel(slots[1].layout) == n_out,
               BP_ERR_INVALID_ARGUMENT, "var_mean: bundle slots do not match");
    const uint64_t es = dtype_size(d);
    o = bind_dense(c, c.out[0], n_out, d, true, slots[0].byte_offset + slots[0].layout.offset * es);
    o2 = bind_dense(c, c.out[0], n_out, d, true, slots[1].byte_offset + slots[1].layout.offset * es);
    o2.binding.handle = 0;  // same buffer as o: tracked once
    w = b = bind_dummy(c);
  }
  RowPlan p = row_header(a, in, os.data(), mask, x.offset, o.offset, true, c.cpu_device());
  a.i32((have_w ? 1 : 0) | (have_b ? 2 : 0));
  a.i32(o2.offset);
  a.i32(w.offset);
  a.i32(b.offset);
  param_ct(a, d, scalar);
  if (p.inner_n == 0 && op <= 1) return;  // nothing to normalise
  if (use_subgroup_rows(c, d, p)) {
    plan_subgroup_rows(c, p, x.offset);
    // 4-vectors also need the output (softmax, layer_norm), weight and bias
    // rows contiguous and aligned, and whole 4-vectors per row.
    if (op != 3) {
      bool ok = p.inner_out[0] == 1 && o.offset % 4 == 0 && p.inner_n % 4 == 0;
      for (int i = 0; i < p.outer_rank; ++i) ok = ok && p.outer_out[i] % 4 == 0;
      if (have_w) ok = ok && w.offset % 4 == 0;
      if (have_b) ok = ok && b.offset % 4 == 0;
      if (!ok) p.vec = 0;
    }
  }
  static const char* const fams[] = {"_sm", "_sm", "_ln", "_vm"};
  dispatch_rows(c, rows_shader(c, "norm", d) + fams[op] + mode_suffix(p), {op},
                {x.binding, o.binding, o2.binding, w.binding, b.binding}, a, p);
}

}  // namespace

void register_reduce(Registry& r) {
  const bp_dtype floats[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64};
  const bp_dtype numeric[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64, BP_DTYPE_I8,
                              BP_DTYPE_I16, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8};
  const char* reds[] = {"sum", "mean", "prod", "max", "min"};
  for (int op = 0; op < 5; ++op)
    for (bp_dtype d : numeric) {
      if (op == 1 && !backplane::is_float(d)) continue;
      r.add(reds[op], {d, d}, {S}, reduce_impl, op);
    }
  for (int op = 0; op < 2; ++op)
    for (bp_dtype d : numeric) r.add(op == 0 ? "argmax" : "argmin", {d, BP_DTYPE_I64}, {S}, argreduce_impl, op, 0, false, 0x2);
  for (bp_dtype d : floats) r.add("softmax", {d, d}, {S}, norm_impl, 0);
  for (bp_dtype d : floats) r.add("log_softmax", {d, d}, {S}, norm_impl, 1);
  for (bp_dtype d : floats) r.add("layer_norm", {d, d, d, d}, {S, C, C}, norm_impl, 2);
  for (bp_dtype d : floats) r.add("var_mean", {d, d}, {S}, norm_impl, 3, 2);
}

}  // namespace backplane::vulkan
