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

#include "unary_op.glsl"

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
