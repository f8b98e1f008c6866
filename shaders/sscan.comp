#version 450
#extension GL_GOOGLE_include_directive : require
// selective_scan (Mamba S6) on dense u, delta [B,L,D], a [D,N], b, c [B,L,N]:
// one invocation per (batch, channel) carries the state h[N] (f32, f64 for
// f64) through the L steps. MAXN (specialization constant) >= N.
// Argument block: [0] B [1] L [2] D [3] N [4] u_off [5] delta_off [6] a_off
// [7] b_off [8] c_off [9] y_off [10] state_off [11] delta_softplus.
#include "common.glsl"
#ifdef IN_DC
#define BP_MATH_DOUBLE 1
#endif
#include "math.glsl"

layout(local_size_x = 64) in;
layout(constant_id = 1) const int MAXN = 16;

DECL_RO1(2, u, IN_DT)
DECL_RO1(3, dl, IN_DT)
DECL_RO1(4, am, IN_DT)
DECL_RO1(5, bm, IN_DT)
DECL_RO1(6, cm, IN_DT)
DECL_RW1(7, y, IN_DT)
DECL_RW1(8, hs, IN_DT)

#define CT CTYPE(IN_DT)
#ifdef IN_DC
CT EXP(CT v) { return exp_d(v); }
CT SOFTPLUS(CT v) {
  double e = exp_d(-abs(v));
  double u1 = 1.0LF + e;
  double l = u1 == 1.0LF ? e : log_d(u1) * (e / (u1 - 1.0LF));
  return max(v, 0.0LF) + l;
}
#else
CT EXP(CT v) { return exp_f(v); }
CT SOFTPLUS(CT v) { return max(v, 0.0) + log1p_f(exp_f(-abs(v))); }
#endif

void main() {
  const int B = A(0), L = A(1), D = A(2), N = A(3);
  const int e = int(group_linear()) * 64 + int(gl_LocalInvocationID.x);
  if (e >= B * D) return;
  const int bi = e / D, ch = e % D;
  const bool sp = A(11) != 0;
  CT h[MAXN];
  for (int j = 0; j < MAXN; ++j) h[j] = CT(0);
  for (int t = 0; t < L; ++t) {
    const int bl = bi * L + t;
    CT d = LD(IN_DT, dl.v[A(5) + bl * D + ch]);
    if (sp) d = isnan(d) ? d : SOFTPLUS(d);
    const CT du = d * LD(IN_DT, u.v[A(4) + bl * D + ch]);
    CT acc = CT(0);
    for (int j = 0; j < N; ++j) {
      h[j] = EXP(d * LD(IN_DT, am.v[A(6) + ch * N + j])) * h[j] + du * LD(IN_DT, bm.v[A(7) + bl * N + j]);
      acc += h[j] * LD(IN_DT, cm.v[A(8) + bl * N + j]);
    }
    y.v[A(9) + bl * D + ch] = SV(IN_DT, acc);
  }
  for (int j = 0; j < N; ++j) hs.v[A(10) + (bi * D + ch) * N + j] = SV(IN_DT, h[j]);
}
