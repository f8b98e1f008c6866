#version 450
#extension GL_GOOGLE_include_directive : require
// Unary elementwise ops; OP (specialization constant):
//  0 neg 1 abs 2 sign 3 sqr 4 sqrt 5 rsqrt 6 recip 7 exp 8 log 9 sin 10 cos
// 11 tanh 12 erf 13 floor 14 ceil 15 round 16 relu 17 sigmoid 18 silu
// 19 softplus 20 gelu(erf) 21 gelu(tanh) 22 clamp 23 affine
// Params: clamp [has_min, has_max, min, max], affine [mul, add] (compute type).
#define NREC 2  // x, output
#include "common.glsl"
#include "elementwise.glsl"
#ifdef IN_DC
#define BP_MATH_DOUBLE 1
#endif
#include "math.glsl"

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

layout(local_size_x = WG) in;
layout(constant_id = 0) const int OP = 0;

// Which transcendental ops this variant holds: -DUOP=k only op k (the host
// picks unary_<dtype>_op<k> for them), -DUNARY_CHEAP none (unary_<dtype>,
// the cheap ops). Lavapipe compiles a pipeline in time that grows with all
// the code of the module, dead branches of the spec constant included (one
// variant with every op: ~200-400 ms a pipeline; one op: a few ms).
#if defined(UOP)
#define HAS_OP(k) (UOP == (k))
#elif defined(UNARY_CHEAP)
#define HAS_OP(k) 0
#else
#define HAS_OP(k) 1
#endif

DECL_RO(2, a, IN_DT)
DECL_RW(3, o, OUT_DT)

#define CT CTYPE(IN_DT)

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

void main() {
  const int n = int(pc.n);
  const int j = int(group_linear()) * WG + int(gl_LocalInvocationID.x);
  const int i0 = j * 4;
  if (i0 >= n) return;
  const int cnt = min(4, n - i0);
  const bool whole = FAST && (!FAST_TAIL || i0 + 4 <= n);
  // Every path gathers its (up to) 4 elements, then op runs at one call site
  // in a loop: lavapipe's compile time grows with every inlined copy of a
  // transcendental, dead paths of the specialization included (three call
  // sites, one per path, took ~8-10 ms a pipeline for silu/softplus).
  CTYPE4(IN_DT) va = CTYPE4(IN_DT)(0);
  int dst[4] = int[4](0, 0, 0, 0);
  if (FAST) {
    const int oa = pc.p.x, oo = pc.p.y;
    if (BCAST0) {
      va = CTYPE4(IN_DT)(LD(IN_DT, a.v[oa]));  // a broadcast scalar
    } else if (whole) {
      va = LD4(IN_DT, a4.v[oa / 4 + j]);
    } else {
      for (int c = 0; c < cnt; ++c) va[c] = LD(IN_DT, a.v[oa + i0 + c]);
    }
    for (int c = 0; c < 4; ++c) dst[c] = oo + i0 + c;
  } else {
    for (int c = 0; c < cnt; ++c) {
      int off[NREC];
      elem_offsets(i0 + c, off);
      va[c] = LD(IN_DT, a.v[off[0]]);
      dst[c] = off[1];
    }
  }
  CTYPE4(OUT_DT) r;
  for (int c = 0; c < 4; ++c) r[c] = op(va[c]);
  if (whole) {
    o4.v[pc.p.y / 4 + j] = SV4(OUT_DT, r);
  } else {
    for (int c = 0; c < cnt; ++c) o.v[dst[c]] = SV(OUT_DT, r[c]);
  }
}
