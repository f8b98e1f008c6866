// Elementwise kernels: unary, binary arithmetic, comparisons, where, cast,
// contiguous, concat (one strided copy per input).
#include "kernels.hpp"

#include <algorithm>
#include <array>
#include <cstdint>

namespace backplane::vulkan {

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
// fast_mode: the shader has the fast path selected by specialization
// constant 1 (MODE in shaders/elementwise.glsl); spec holds constant 0 at most.
void elementwise_dispatch(Call& c, std::string shader_name, std::vector<int32_t> spec, bool fast_mode,
                      const std::vector<In>& ins, const bp_storage& out, const bp_layout& ol, bp_dtype odt,
                      const Args& params, uint64_t out_extra_bytes = 0, bool two_d_mode = false,
                      bool fast_module = false) {
  const int64_t n = numel(ol);
  if (n == 0) return;
  BP_SDK_CHECK(n < (int64_t{1} << 31), BP_ERR_UNIMPLEMENTED,
             std::string(c.op()) + ": more than 2^31 elements (vulkan plugin limit)");
  std::vector<Binding> bindings;
  std::vector<int64_t> offsets;
  std::vector<const int64_t*> strides;
  bindings.reserve(ins.size() + 1);
  offsets.reserve(ins.size() + 1);
  strides.reserve(ins.size() + 1);
  for (const In& in : ins) {
    BP_SDK_CHECK(in.l->rank == ol.rank, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op()) + ": input rank differs from output");
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
  fast = fast && fast_mode && offsets.size() <= 4;
  Args a;
  a.w.reserve(10 + 9 * offsets.size() + params.w.size());
  elementwise_header(a, co, offsets, fast);
  a.w.insert(a.w.end(), params.w.begin(), params.w.end());
  // The fast path is a pipeline of its own (MODE: fast, which inputs are
  // broadcast scalars, whether there is a partial last 4-vector) and reads
  // its offsets from push constants, no argument block.
  std::array<int32_t, 4> pw{}, qw{};
  uint32_t extra = 0;
  // The 2-D path (shaders/elementwise.glsl, binary ops): two dims, rows a
  // multiple of 4 long, the output dense along rows at 4-aligned starts.
  bool two_d = two_d_mode && fast_mode && !fast && co.rank == 2 && ins.size() == 2 && co.shape[1] % 4 == 0;
  if (two_d) {
    const size_t ko = offsets.size() - 1;
    two_d = co.strides[ko][1] == 1 && offsets[ko] % 4 == 0 && co.strides[ko][0] % 4 == 0;
    for (size_t k = 0; k < ko && two_d; ++k) {
      const int64_t s1 = co.strides[k][1];
      if (s1 != 0 && s1 != 1 && (s1 > INT32_MAX / 4 || s1 < INT32_MIN / 4)) two_d = false;
    }
  }
  if (fast_mode) {
    uint32_t mode = 0;
    if (two_d) {
      mode = 512;
      for (size_t k = 0; k < 3; ++k) {
        pw[k] = static_cast<int32_t>(offsets[k]);
        qw[k] = static_cast<int32_t>(co.strides[k][0]);
      }
      pw[3] = static_cast<int32_t>(co.shape[1]);
      for (size_t k = 0; k < 2; ++k) {
        const int64_t s1 = co.strides[k][1];
        if (s1 == 0) mode |= 1024u << k;
        else if (s1 == 1 && offsets[k] % 4 == 0 && co.strides[k][0] % 4 == 0) mode |= 4096u << k;
      }
      extra = static_cast<uint32_t>(static_cast<int32_t>(co.strides[0][1]));
      qw[3] = static_cast<int32_t>(co.strides[1][1]);
      // A dense column (row stride 1, a transposed operand) takes the block
      // path: 4x4 blocks per invocation, 4-vector loads down its columns,
      // a 16x256 tile per workgroup. Measured on lavapipe only, so CPU
      // devices only: a GPU keeps the 2-D path's scalar loads.
      if (co.shape[0] % 4 == 0 && c.cpu_device())
        for (size_t k = 0; k < 2; ++k) {
          const int64_t s1 = co.strides[k][1];
          if (co.strides[k][0] == 1 && s1 % 4 == 0 && s1 != 0 && offsets[k] % 4 == 0) mode |= (16384u << k) | 65536u;
        }
    } else if (fast) {
      mode = 1;
      for (size_t k = 0; k < offsets.size(); ++k) {
        pw[k] = static_cast<int32_t>(offsets[k]);
        if (k < ins.size() && (co.rank == 0 || co.strides[k][0] == 0)) mode |= 2u << k;
      }
      if (n % kPerThread != 0) mode |= 256u;
    }
    spec.resize(2, 0);
    spec[1] = static_cast<int32_t>(mode);
    // fast_module: the shader has a module holding the fast path alone
    // (<name>_fast), which lavapipe compiles ~5x sooner (binary, compare:
    // shaders/binary.comp FAST_ONLY).
    if ((mode & 1u) && fast_module) shader_name += "_fast";
  }
  const Pipeline& p = c.dev.pipelines.get(shader_name, spec, static_cast<uint32_t>(bindings.size()));
  const bool block = fast_mode && (spec[1] & 65536) != 0;
  const uint64_t groups = block ? ceil_div(co.shape[0], 16) * ceil_div(co.shape[1], 256) : ceil_div(n, kWG * kPerThread);
  c.dev.exec.dispatch(c.stream, p, bindings, a.w, static_cast<uint32_t>(n), extra, groups, c.op(), pw, qw);
}

void binary_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const bp_dtype od = c.row.dtypes.back();
  const std::string family = od == BP_DTYPE_BOOL && c.row.code >= 100 ? "compare" : "binary";
  // pow (code 6) on floats is a module of its own (shaders/binary.comp: POW),
  // so the other ops' pipelines compile without it.
  const bool pw = family == "binary" && c.row.code == 6;
  elementwise_dispatch(c, shader(family, d) + (pw ? "_pow" : ""), {c.row.code % 100}, true,
                   {{&c.in[0], &c.lin(0), d}, {&c.in[1], &c.lin(1), d}}, c.out[0], c.lout(), od, Args{}, 0, true, !pw);
}

enum UnaryOp {
  kNeg, kAbs, kSign, kSqr, kSqrt, kRsqrt, kRecip, kExp, kLog, kSin, kCos, kTanh, kErf, kFloor, kCeil, kRound,
  kRelu, kSigmoid, kSilu, kSoftplus, kGelu, kGeluTanh, kClamp, kAffine
};

// Writes a value in the compute type of dtype d (see param_in in elementwise.glsl).
void param_value(Args& a, bp_dtype d, double f, int64_t i) {
  switch (d) {
    case BP_DTYPE_F64: a.f64(f); break;
    case BP_DTYPE_F32: case BP_DTYPE_F16: case BP_DTYPE_BF16: a.f32(f); break;
    case BP_DTYPE_I64: a.i64(i); break;
    default: a.i32(i);
  }
}

int64_t int_min(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_I8: return INT8_MIN;
    case BP_DTYPE_I16: return INT16_MIN;
    case BP_DTYPE_I32: return INT32_MIN;
    case BP_DTYPE_U8: return 0;
    default: return INT64_MIN;
  }
}
int64_t int_max(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_I8: return INT8_MAX;
    case BP_DTYPE_I16: return INT16_MAX;
    case BP_DTYPE_I32: return INT32_MAX;
    case BP_DTYPE_U8: return UINT8_MAX;
    default: return INT64_MAX;
  }
}

void unary_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  int code = c.row.code;
  Args p;
  if (code == kGelu && c.params && c.params->kind == BP_PARAMS_GELU && c.params->u.gelu.tanh_approximation)
    code = kGeluTanh;
  if (code == kClamp) {
    const auto& cp = c.params_of(BP_PARAMS_CLAMP).u.clamp;
    p.i32(cp.has_min ? 1 : 0);
    p.i32(cp.has_max ? 1 : 0);
    if (backplane::is_float(d)) {
      param_value(p, d, cp.has_min ? cp.min_f : 0.0, 0);
      param_value(p, d, cp.has_max ? cp.max_f : 0.0, 0);
    } else {
      param_value(p, d, 0, cp.has_min ? std::clamp(cp.min_i, int_min(d), int_max(d)) : 0);
      param_value(p, d, 0, cp.has_max ? std::clamp(cp.max_i, int_min(d), int_max(d)) : 0);
    }
  } else if (code == kAffine) {
    const auto& ap = c.params_of(BP_PARAMS_AFFINE).u.affine;
    param_value(p, d, ap.mul, 0);
    param_value(p, d, ap.add, 0);
  }
  // Transcendental ops have a SPIR-V module each (shaders/unary.comp: UOP),
  // which lavapipe compiles ~10x faster than one holding every op.
  const bool transcendental = (code >= 7 && code <= 12) || (code >= 17 && code <= 21);
  const std::string name = transcendental ? shader("unary", d) + "_op" + std::to_string(code) : shader("unary", d);
  elementwise_dispatch(c, name, {code}, true, {{&c.in[0], &c.lin(0), d}}, c.out[0], c.lout(), d, p);
}

void where_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[1];
  elementwise_dispatch(c, shader("where", d), {}, false,
                   {{&c.in[0], &c.lin(0), BP_DTYPE_BOOL}, {&c.in[1], &c.lin(1), d}, {&c.in[2], &c.lin(2), d}},
                   c.out[0], c.lout(), d, Args{});
}

std::string copy_shader(bp_dtype from, bp_dtype to) { return from == to ? shader("copy", from) : shader("copy", from, to); }

// contiguous and cast: one strided copy.
void copy_impl(Call& c) {
  const bp_dtype from = c.row.dtypes[0], to = c.row.dtypes.back();
  elementwise_dispatch(c, copy_shader(from, to), {}, true, {{&c.in[0], &c.lin(0), from}}, c.out[0], c.lout(), to, Args{});
}

// concat: input k is copied into the slice of the output it occupies.
void concat_impl(Call& c) {
  const bp_dtype d = c.row.dtypes[0];
  const int dim = c.params_of(BP_PARAMS_DIM).u.dim.dim;
  const bp_layout& ol = c.lout();
  BP_SDK_CHECK(dim >= 0 && static_cast<uint32_t>(dim) < ol.rank, BP_ERR_INVALID_ARGUMENT,
             "concat: dim out of range");
  int64_t at = 0;
  for (size_t k = 0; k < c.n_in; ++k) {
    const bp_layout& il = c.lin(k);
    BP_SDK_CHECK(il.rank == ol.rank, BP_ERR_INVALID_ARGUMENT, "concat: input rank differs from output");
    bp_layout view = ol;
    for (uint32_t i = 0; i < ol.rank; ++i) view.shape[i] = il.shape[i];
    view.offset = ol.offset + at * ol.strides[dim];
    at += il.shape[dim];
    BP_SDK_CHECK(at <= ol.shape[dim], BP_ERR_INVALID_ARGUMENT, "concat: inputs longer than the output");
    copy_strided(c, c.in[k], il, c.out[0], view, d);
  }
  BP_SDK_CHECK(at == ol.shape[dim], BP_ERR_INVALID_ARGUMENT, "concat: inputs do not fill the output");
}

}  // namespace

void copy_strided(Call& c, const bp_storage& in, const bp_layout& il, const bp_storage& out, const bp_layout& ol,
                  bp_dtype d) {
  elementwise_dispatch(c, copy_shader(d, d), {}, true, {{&in, &il, d}}, out, ol, d, Args{});
}

void register_eltwise(Registry& r) {
  const bp_dtype floats[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64};
  const bp_dtype ints[] = {BP_DTYPE_I8, BP_DTYPE_I16, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8};
  const bp_dtype all[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64, BP_DTYPE_I8,
                          BP_DTYPE_I16, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8,  BP_DTYPE_BOOL};
  std::vector<bp_dtype> numeric(std::begin(floats), std::end(floats));
  numeric.insert(numeric.end(), std::begin(ints), std::end(ints));

  // Unary: float ops on f32/f16/bf16 (f32 math) and f64 (double math in
  // shaders/math.glsl); integers: neg abs sign clamp.
  const char* unops[] = {"neg",   "abs",  "sign",  "sqr",  "sqrt",    "rsqrt", "recip",    "exp",
                         "log",   "sin",  "cos",   "tanh", "erf",     "floor", "ceil",     "round",
                         "relu",  "sigmoid", "silu", "softplus", "gelu", nullptr, "clamp", "affine"};
  for (int op = 0; op < 24; ++op) {
    if (!unops[op]) continue;
    for (bp_dtype d : numeric) {
      const bool f = backplane::is_float(d);
      if (!f && !(op == kNeg || op == kAbs || op == kSign || op == kClamp)) continue;
      r.add(unops[op], {d, d}, {S}, unary_impl, op);
    }
  }
  const char* binops[] = {"add", "sub", "mul", "div", "maximum", "minimum", "pow"};
  for (int op = 0; op < 7; ++op)
    for (bp_dtype d : numeric) {
      if (op == 6 && !backplane::is_float(d)) continue;  // pow: float only
      r.add(binops[op], {d, d, d}, {S, S}, binary_impl, op);
    }
  const char* cmps[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  for (int op = 0; op < 6; ++op)
    for (bp_dtype d : all) r.add(cmps[op], {d, d, BP_DTYPE_BOOL}, {S, S}, binary_impl, 100 + op);
  for (bp_dtype d : all) r.add("where", {BP_DTYPE_BOOL, d, d, d}, {S, S, S}, where_impl);
  for (bp_dtype d : all) r.add("contiguous", {d, d}, {S}, copy_impl);
  for (bp_dtype from : all)
    for (bp_dtype to : all) r.add("cast", {from, to}, {S}, copy_impl);
  for (bp_dtype d : all) r.add("concat", {d, d}, {S}, concat_impl, 0, 0, true);
}

}  // namespace backplane::vulkan
