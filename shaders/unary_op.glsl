// The unary ops' element function, `CT op(CT x)` with OP (0..23, codes in
// shaders/unary.comp) and HAS_OP(k) defined by the includer, CT the compute
// type. unary.comp includes it once with OP its specialization constant;
// the generated fused_elementwise shaders (plugins/vulkan/fused.cpp) include
// it once per opcode with `#define OP <code>` and `op` renamed, so each
// instruction computes exactly what the op's own kernel does.
// Clamp (22) and affine (23) read their params from the argument block
// (elementwise.glsl: PARAMS, param_in).
#ifndef BP_UNARY_CONSTS
#define BP_UNARY_CONSTS 1
// Transcendentals and constants of the compute type (double literals need
// the LF suffix to keep their precision).
#ifdef IN_DC
const double C_SQRT1_2 = 0.70710678118654752440LF;
const double C_GELU_K = 0.79788456080286535588LF;
const double C_GELU_A = 0.044715LF;
#define M_EXP exp_d
#define M_LOG log_d
#define M_LOG1P log1p_d
#define M_SIN sin_d
#define M_COS cos_d
#define M_TANH tanh_d
#define M_ERF erf_d
#define M_ERFC erfc_d
#define M_NAN D_NAN
#else
const float C_SQRT1_2 = 0.70710678118654752440;
const float C_GELU_K = 0.79788456080286535588;
const float C_GELU_A = 0.044715;
#define M_EXP exp_f
#define M_LOG log_f
#define M_LOG1P log1p_f
#define M_SIN sin_f
#define M_COS cos_f
#define M_TANH tanh_f
#define M_ERF erf_f
#define M_ERFC erfc_f
#define M_NAN F_NAN
#endif
#endif

CT op(CT x) {
  if (OP == 0) return -x;
  if (OP == 1) return x < CT(0) ? -x : (x == CT(0) ? CT(0) : x);  // abs(-0) is +0
  if (OP == 2) {
#ifdef IN_FLOAT
    if (isnan(x) || x == CT(0)) return x;
#endif
    return x > CT(0) ? CT(1) : (x < CT(0) ? CT(-1) : CT(0));
  }
  if (OP == 22) {
#ifdef IN_FLOAT
    if (isnan(x)) return x;
#endif
    if (A(PARAMS) != 0 && x < param_in(2)) x = param_in(2);
    if (A(PARAMS + 1) != 0 && x > param_in(2 + PWORDS)) x = param_in(2 + PWORDS);
    return x;
  }
#ifdef IN_FLOAT
  if (OP == 3) return x * x;
  if (OP == 4) return x < CT(0) ? CT(M_NAN) : sqrt(x);
  if (OP == 5) return x < CT(0) ? CT(M_NAN) : CT(1) / sqrt(x);
  if (OP == 6) return CT(1) / x;
  if (OP == 13) return floor(x);
  if (OP == 14) return ceil(x);
#ifdef IN_DC
  // roundEven on doubles is wrong on some drivers (lavapipe rounds 1.5 to 1):
  // half to even by hand, keeping the sign of zero.
  if (OP == 15) {
    if (!(abs(x) < 4503599627370496.0LF)) return x;  // NaN, inf, or already integral
    CT f = floor(x);
    const CT d = x - f;
    if (d > 0.5LF || (d == 0.5LF && f - 2.0LF * floor(f * 0.5LF) != 0.0LF)) f += 1.0LF;
    // Zero keeps x's sign (by bits: x * 0.0 may be folded to +0).
    return f == 0.0LF ? packDouble2x32(uvec2(0u, unpackDouble2x32(x).y & 0x80000000u)) : f;
  }
#endif
  if (OP == 15) return roundEven(x);
  if (OP == 16) return x < CT(0) ? CT(0) : x;  // NaN and -0 stay (PyTorch's relu)
  if (OP == 23) return param_in(0) * x + param_in(PWORDS);
#if HAS_OP(7)
  if (OP == 7) return M_EXP(x);
#endif
#if HAS_OP(8)
  if (OP == 8) return M_LOG(x);
#endif
#if HAS_OP(9)
  if (OP == 9) return M_SIN(x);
#endif
#if HAS_OP(10)
  if (OP == 10) return M_COS(x);
#endif
#if HAS_OP(11)
  if (OP == 11) return M_TANH(x);
#endif
#if HAS_OP(12)
  if (OP == 12) return M_ERF(x);
#endif
#if HAS_OP(17)
  if (OP == 17) {
    if (x >= CT(0)) return CT(1) / (CT(1) + M_EXP(-x));
    CT e = M_EXP(x);
    return e / (CT(1) + e);
  }
#endif
#if HAS_OP(18)
  if (OP == 18) {
    if (x >= CT(0)) return x / (CT(1) + M_EXP(-x));
    CT e = M_EXP(x);
    return x * e / (CT(1) + e);
  }
#endif
#if HAS_OP(19)
  if (OP == 19) {
    if (isnan(x)) return x;
    return max(x, CT(0)) + M_LOG1P(M_EXP(-abs(x)));
  }
#endif
#if HAS_OP(20)
  if (OP == 20) return CT(0.5) * x * M_ERFC(-x * C_SQRT1_2);
#endif
#if HAS_OP(21)
  if (OP == 21) {
    CT u = C_GELU_K * (x + C_GELU_A * x * x * x);
    return x / (CT(1) + M_EXP(CT(-2) * u));
  }
#endif
#endif
  return x;
}
