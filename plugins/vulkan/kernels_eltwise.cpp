// Elementwise kernels: binary arithmetic, comparisons.
#include "kernels.hpp"

namespace bpvk {

namespace {

constexpr int kWG = 256;        // workgroup size of the elementwise shaders
constexpr int kPerThread = 4;   // elements per invocation

struct In {
  const bp_storage* s;
  const bp_layout* l;
  bp_dtype dt;
};

// One elementwise dispatch. All inputs have the output's shape (the host
// broadcasts with stride 0); the output may be strided (concat).
void eltwise_dispatch(Call& c, const std::string& shader_name, const std::vector<int32_t>& spec,
                      const std::vector<In>& ins, const bp_storage& out, const bp_layout& ol, bp_dtype odt,
                      const Args& params, uint64_t out_extra_bytes = 0) {
  const int64_t n = numel(ol);
  if (n == 0) return;
  check(n < (int64_t{1} << 31), BP_ERR_UNIMPLEMENTED,
        std::string(c.op()) + ": more than 2^31 elements (vulkan plugin limit)");
  std::vector<Binding> bindings;
  std::vector<int64_t> offsets;
  std::vector<const int64_t*> strides;
  for (const In& in : ins) {
    check(in.l->rank == ol.rank, BP_ERR_INVALID_ARGUMENT, std::string(c.op()) + ": input rank differs from output");
    Operand o = bind(c, *in.s, *in.l, in.dt, false);
    bindings.push_back(o.binding);
    offsets.push_back(o.offset);
    strides.push_back(in.l->strides);
  }
  Operand oo = bind(c, out, ol, odt, true, out_extra_bytes);
  bindings.push_back(oo.binding);
  offsets.push_back(oo.offset);
  strides.push_back(ol.strides);
  const Coalesced co = coalesce(ol.rank, ol.shape, strides);
  bool fast = co.rank <= 1;
  for (size_t k = 0; k < offsets.size() && fast; ++k) {
    const int64_t st = co.rank ? co.strides[k][0] : 0;
    const bool is_out = k + 1 == offsets.size();
    if (!((st == 0 && !is_out) || (st == 1 && offsets[k] % 4 == 0))) fast = false;
  }
  Args a;
  eltwise_header(a, co, offsets, fast);
  a.w.insert(a.w.end(), params.w.begin(), params.w.end());
  const Pipeline& p = c.dev.pipelines.get(shader_name, spec, static_cast<uint32_t>(bindings.size()));
  c.dev.exec.dispatch(p, bindings, a.w, static_cast<uint32_t>(n), 0, ceil_div(n, kWG * kPerThread), c.op());
}

void binary_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_dtype od = c.row.dtypes.back();
  const std::string family = od == BP_DTYPE_BOOL && c.row.code >= 100 ? "compare" : "binary";
  eltwise_dispatch(c, shader(family, d), {c.row.code % 100}, {{&c.in[0], &c.lin(0), d}, {&c.in[1], &c.lin(1), d}},
                   c.out[0], c.lout(), od, Args{});
}

}  // namespace

void register_eltwise(Registry& r) {
  const bp_dtype floats[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64};
  const bp_dtype ints[] = {BP_DTYPE_I8, BP_DTYPE_I16, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8};
  const bp_dtype all[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64, BP_DTYPE_I8,
                          BP_DTYPE_I16, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8,  BP_DTYPE_BOOL};
  std::vector<bp_dtype> numeric(std::begin(floats), std::end(floats));
  numeric.insert(numeric.end(), std::begin(ints), std::end(ints));

  // First slice: f32 only until the other dtypes are verified.
  numeric = {BP_DTYPE_F32};
  const bp_dtype all_f32[] = {BP_DTYPE_F32};
  (void)all;
  const char* binops[] = {"add", "sub", "mul", "div", "maximum", "minimum", "pow"};
  for (int op = 0; op < 7; ++op)
    for (bp_dtype d : numeric) {
      if (op == 6 && d != BP_DTYPE_F32 && d != BP_DTYPE_F16 && d != BP_DTYPE_BF16) continue;  // pow: f32 math
      r.add(binops[op], {d, d, d}, {S, S}, binary_impl, op);
    }
  const char* cmps[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  for (int op = 0; op < 6; ++op)
    for (bp_dtype d : all_f32) r.add(cmps[op], {d, d, BP_DTYPE_BOOL}, {S, S}, binary_impl, 100 + op);
}

}  // namespace bpvk
