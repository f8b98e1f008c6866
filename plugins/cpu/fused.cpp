// fused_elementwise: a program of elementwise ops over f32 (abi.h,
// bp_fused_instr), run as one pass over the output. The output is cut into
// blocks of up to kBlock elements along its last (coalesced) dim; per block
// each input is read once (a dense f32 input in place, a broadcast or
// strided one gathered, a bool one widened to 0/1), every instruction runs a
// vectorisable loop over L1-resident registers with the element functor of
// the op's own kernel (eltwise_ops.hpp, so values match the unfused chain),
// and the last instruction writes the output block directly.
#include "eltwise_ops.hpp"

#include <algorithm>
#include <vector>

namespace backplane::cpu {
namespace {
using namespace eltwise;
using namespace eltwise::ops;

constexpr int64_t kBlock = 512;
constexpr size_t kMaxInputs = 16;

// The output's shape with mergeable dims merged (dim i and i+1 merge when
// every layout steps over i as over i+1 times its size), and the strides of
// each input (then the output) over the merged dims.
struct Geometry {
  int rank = 0;
  int64_t shape[BP_MAX_RANK] = {};
  std::vector<std::array<int64_t, BP_MAX_RANK>> strides;  // n_in + 1
  std::vector<int64_t> offset;
};

Geometry coalesce(const Call& c) {
  const bp_layout& lo = c.out_layout();
  const size_t n = c.n_in + 1;
  Geometry g;
  g.strides.resize(n);
  g.offset.resize(n);
  for (size_t k = 0; k < n; ++k) g.offset[k] = c.lay[k].offset;
  if (lo.rank == 0) {
    g.rank = 1;
    g.shape[0] = 1;
    for (size_t k = 0; k < n; ++k) g.strides[k][0] = 0;
    return g;
  }
  for (uint32_t d = 0; d < lo.rank; ++d) {
    if (lo.shape[d] == 1) continue;  // size-1 dims step nowhere
    bool merge = g.rank > 0;
    for (size_t k = 0; merge && k < n; ++k)
      merge = g.strides[k][g.rank - 1] == c.lay[k].strides[d] * lo.shape[d];
    if (merge) {
      g.shape[g.rank - 1] *= lo.shape[d];
      for (size_t k = 0; k < n; ++k) g.strides[k][g.rank - 1] = c.lay[k].strides[d];
    } else {
      g.shape[g.rank] = lo.shape[d];
      for (size_t k = 0; k < n; ++k) g.strides[k][g.rank] = c.lay[k].strides[d];
      ++g.rank;
    }
  }
  if (g.rank == 0) {  // every dim of size 1
    g.rank = 1;
    g.shape[0] = 1;
    for (size_t k = 0; k < n; ++k) g.strides[k][0] = 0;
  }
  return g;
}

// Inlined into each ISA's copy of the block loop (run_block below), so the
// loops vectorise at that ISA's width. Results do not depend on the width:
// every op is IEEE-exact per element or a libm call per element, and
// fused.cpp is built with -ffp-contract=off (no FMA the unfused kernels,
// built for the baseline ISA, would not have).
#define BP_FUSED_INLINE [[gnu::always_inline]] inline
template <class Op> BP_FUSED_INLINE void run_unary(const Op& op, const float* x, float* y, int64_t n) {
  if constexpr (requires { op.block_f32_applies(); }) {
    if (op.block_f32_applies()) {
      op.block_f32(x, y, n);
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) y[i] = op(x[i]);
}
template <class Op> BP_FUSED_INLINE void run_binary(const Op& op, const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = op(a[i], b[i]);
}
template <class Op> BP_FUSED_INLINE void run_compare(const Op& op, const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = op(a[i], b[i]) ? 1.0f : 0.0f;
}

// One instruction over n elements. `p` is the params its op's kernel would
// get (gelu, clamp, affine), built once per call.
BP_FUSED_INLINE void step(const bp_fused_instr& ins, const bp_op_params& p, const float* const* r, float* y,
                          int64_t n) {
  const float* a = r[ins.args[0]];
  const float* b = r[ins.args[1]];
  switch (ins.op) {
#define BP_U(CODE, OP) \
  case CODE: run_unary(OP(&p), a, y, n); return;
    BP_U(BP_FUSED_NEG, Neg) BP_U(BP_FUSED_ABS, Abs) BP_U(BP_FUSED_SIGN, Sign) BP_U(BP_FUSED_SQR, Sqr)
    BP_U(BP_FUSED_SQRT, Sqrt) BP_U(BP_FUSED_RSQRT, Rsqrt) BP_U(BP_FUSED_RECIP, Recip) BP_U(BP_FUSED_EXP, Exp)
    BP_U(BP_FUSED_LOG, Log) BP_U(BP_FUSED_SIN, Sin) BP_U(BP_FUSED_COS, Cos) BP_U(BP_FUSED_TANH, Tanh)
    BP_U(BP_FUSED_ERF, Erf) BP_U(BP_FUSED_FLOOR, Floor) BP_U(BP_FUSED_CEIL, Ceil) BP_U(BP_FUSED_ROUND, Round)
    BP_U(BP_FUSED_RELU, Relu) BP_U(BP_FUSED_SIGMOID, Sigmoid) BP_U(BP_FUSED_SILU, Silu)
    BP_U(BP_FUSED_SOFTPLUS, Softplus) BP_U(BP_FUSED_GELU, Gelu) BP_U(BP_FUSED_CLAMP, Clamp)
    BP_U(BP_FUSED_AFFINE, Affine)
#undef BP_U
#define BP_B(CODE, OP) \
  case CODE: run_binary(OP(&p), a, b, y, n); return;
    BP_B(BP_FUSED_ADD, Add) BP_B(BP_FUSED_SUB, Sub) BP_B(BP_FUSED_MUL, Mul) BP_B(BP_FUSED_DIV, Div)
    BP_B(BP_FUSED_MAXIMUM, Maximum) BP_B(BP_FUSED_MINIMUM, Minimum) BP_B(BP_FUSED_POW, Pow)
#undef BP_B
#define BP_C(CODE, OP) \
  case CODE: run_compare(OP(&p), a, b, y, n); return;
    BP_C(BP_FUSED_EQ, Eq) BP_C(BP_FUSED_NE, Ne) BP_C(BP_FUSED_LT, Lt) BP_C(BP_FUSED_LE, Le) BP_C(BP_FUSED_GT, Gt)
    BP_C(BP_FUSED_GE, Ge)
#undef BP_C
    case BP_FUSED_WHERE: {
      const float* v = r[ins.args[2]];
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] != 0.0f ? b[i] : v[i];
      return;
    }
    default:
      sdk::fail(BP_ERR_INVALID_ARGUMENT, "fused_elementwise: unknown opcode " + std::to_string(ins.op));
  }
}

// Every instruction over one block of n elements; the last writes `out`.
#define BP_FUSED_RUN_BLOCK(NAME, ATTR)                                                                       \
  ATTR void NAME(const bp_fused_instr* code, uint32_t n_code, const bp_op_params* ps, const float** r,       \
                 float* scratch, size_t n_in, float* out, int64_t n) {                                       \
    for (uint32_t i = 0; i < n_code; ++i) {                                                                  \
      float* dst = i + 1 == n_code ? out : scratch + (n_in + i) * kBlock;                                    \
      step(code[i], ps[i], r, dst, n);                                                                       \
      r[n_in + i] = dst;                                                                                     \
    }                                                                                                        \
  }
BP_FUSED_RUN_BLOCK(run_block_baseline, )
BP_FUSED_RUN_BLOCK(run_block_avx2, __attribute__((target("avx2"))))
BP_FUSED_RUN_BLOCK(run_block_avx512, __attribute__((target("avx512f,avx512vl,avx512dq,avx2"))))
#undef BP_FUSED_RUN_BLOCK
using RunBlock = void (*)(const bp_fused_instr*, uint32_t, const bp_op_params*, const float**, float*, size_t, float*,
                          int64_t);

// The params each instruction's functor takes, and a check of the program
// (the host checked it; a wrong one is an error here, never a stray read).
std::vector<bp_op_params> prepare(const Call& c, const bp_fused_params& f) {
  BP_SDK_CHECK(f.code != nullptr && f.n_code >= 1 && f.n_code <= BP_FUSED_MAX_CODE, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": the program is empty or longer than BP_FUSED_MAX_CODE");
  std::vector<bp_op_params> ps(f.n_code);
  for (uint32_t k = 0; k < f.n_code; ++k) {
    const bp_fused_instr& ins = f.code[k];
    for (uint16_t a : ins.args)
      BP_SDK_CHECK(a < c.n_in + k, BP_ERR_INVALID_ARGUMENT,
                   std::string(c.op) + ": instruction " + std::to_string(k) + " reads register " + std::to_string(a) +
                       ", not defined before it");
    bp_op_params& p = ps[k];
    std::memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    switch (ins.op) {
      case BP_FUSED_GELU:
        p.kind = BP_PARAMS_GELU;
        p.u.gelu.tanh_approximation = ins.imm[0] != 0;
        break;
      case BP_FUSED_CLAMP:
        p.kind = BP_PARAMS_CLAMP;
        p.u.clamp.has_min = !std::isnan(ins.imm[0]);
        p.u.clamp.has_max = !std::isnan(ins.imm[1]);
        p.u.clamp.min_f = ins.imm[0];
        p.u.clamp.max_f = ins.imm[1];
        break;
      case BP_FUSED_AFFINE:
        p.kind = BP_PARAMS_AFFINE;
        p.u.affine.mul = ins.imm[0];
        p.u.affine.add = ins.imm[1];
        break;
      default:
        p.kind = BP_PARAMS_NONE;
        break;
    }
  }
  return ps;
}

struct FusedF32 {
  static void impl(const Call& c) {
    c.expect(0, BP_PARAMS_FUSED);
    BP_SDK_CHECK(c.n_in <= kMaxInputs, BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": " + std::to_string(c.n_in) + " inputs; the kernel takes at most 16");
    BP_SDK_CHECK(c.in[0].dtype == BP_DTYPE_F32 && c.out[0].dtype == BP_DTYPE_F32, BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": x0 and the output must be f32");
    const bp_layout& lo = c.out_layout();
    for (size_t k = 0; k < c.n_in; ++k) {
      BP_SDK_CHECK(c.in[k].dtype == BP_DTYPE_F32 || c.in[k].dtype == BP_DTYPE_BOOL, BP_ERR_INVALID_ARGUMENT,
                   std::string(c.op) + ": input " + std::to_string(k) + " must be f32 or bool");
      bool same = c.lay[k].rank == lo.rank;
      for (uint32_t d = 0; same && d < lo.rank; ++d) same = c.lay[k].shape[d] == lo.shape[d];
      BP_SDK_CHECK(same, BP_ERR_INVALID_ARGUMENT,
                   std::string(c.op) + ": input " + std::to_string(k) + " " + dims_str(c.lay[k]) +
                       " is not broadcast to the output's " + dims_str(lo));
    }
    BP_SDK_CHECK(sdk::is_contiguous(lo), BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": the output must be dense");
    const bp_fused_params& f = c.params->u.fused;
    const std::vector<bp_op_params> ps = prepare(c, f);
    if (sdk::numel(lo) == 0) return;

    const Geometry g = coalesce(c);
    const int last = g.rank - 1;
    const int64_t L = g.shape[last];
    const int64_t per_row = (L + kBlock - 1) / kBlock;
    int64_t rows = 1;
    for (int d = 0; d < last; ++d) rows *= g.shape[d];
    const size_t n_in = c.n_in, n_regs = n_in + f.n_code;
    float* y = c.out_data<float>();
    const int64_t grain = std::max<int64_t>(1, kGrain / (kBlock * std::max<int64_t>(1, f.n_code / 2)));

    const bool stream = streams<float>(lo);
    const RunBlock run_block = isa() == Isa::avx512 ? run_block_avx512
                               : isa() == Isa::avx2  ? run_block_avx2
                                                     : run_block_baseline;
    pfor(c, rows * per_row, grain, [&](int64_t b, int64_t e) {
      std::vector<float> scratch(n_regs * kBlock);
      std::vector<float> out_block(stream ? kBlock : 0);
      std::vector<const float*> r(n_regs);
      std::vector<int64_t> off(n_in + 1);
      for (int64_t blk = b; blk < e; ++blk) {
        const int64_t row = blk / per_row, j0 = (blk % per_row) * kBlock;
        const int64_t n = std::min(kBlock, L - j0);
        // The row's start in every layout.
        for (size_t k = 0; k <= n_in; ++k) off[k] = g.offset[k] + j0 * g.strides[k][last];
        for (int64_t rest = row, d = last - 1; d >= 0; --d) {
          const int64_t i = rest % g.shape[d];
          rest /= g.shape[d];
          for (size_t k = 0; k <= n_in; ++k) off[k] += i * g.strides[k][d];
        }
        for (size_t k = 0; k < n_in; ++k) {
          const int64_t s = g.strides[k][last];
          float* buf = scratch.data() + k * kBlock;
          if (c.in[k].dtype == BP_DTYPE_F32) {
            const float* x = c.in_data<float>(k) + off[k];
            if (s == 1) {
              r[k] = x;
              continue;
            }
            if (s == 0) std::fill(buf, buf + n, x[0]);
            else
              for (int64_t i = 0; i < n; ++i) buf[i] = x[i * s];
          } else {
            const uint8_t* x = c.in_data<uint8_t>(k) + off[k];
            for (int64_t i = 0; i < n; ++i) buf[i] = x[i * s] != 0 ? 1.0f : 0.0f;
          }
          r[k] = buf;
        }
        if (!stream) {
          run_block(f.code, f.n_code, ps.data(), r.data(), scratch.data(), n_in, y + off[n_in], n);
          continue;
        }
        // A large output is streamed out (no read of each line it writes),
        // as the unfused kernels do.
        run_block(f.code, f.n_code, ps.data(), r.data(), scratch.data(), n_in, out_block.data(), n);
        stream_store(y + off[n_in], out_block.data(), n);
      }
      if (stream) rows::fence();
    });
  }
};

}  // namespace

void register_fused(sdk::KernelTable& t) {
  t.add("fused_elementwise", {BP_DTYPE_F32, BP_DTYPE_F32}, {kStrided}, &entry<FusedF32>, 0, BP_KERNEL_FLAG_VARIADIC);
}

}  // namespace backplane::cpu
