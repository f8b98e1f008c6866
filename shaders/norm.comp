#version 450
#extension GL_GOOGLE_include_directive : require
// Row-wise normalisations. OP: 0 softmax 1 log_softmax 2 layer_norm 3 var_mean.
// Params (RPARAMS +): 0 flags (1: weight, 2: bias), 1 offset of the second
// output (var_mean's mean slot), 2 / 3 offsets of weight / bias, 4.. eps
// (layer_norm) / correction (var_mean) in the compute type.
#include "common.glsl"
#include "rows.glsl"
#ifdef IN_DC
#define BP_MATH_DOUBLE 1
#endif
#include "math.glsl"

layout(local_size_x = WG) in;
layout(constant_id = 0) const int OP = 0;

DECL_RO1(2, x, IN_DT)
DECL_RW1(3, o, IN_DT)
DECL_RW1(4, o2, IN_DT)
DECL_RO1(5, wt, IN_DT)
DECL_RO1(6, bs, IN_DT)

#define CT CTYPE(IN_DT)
shared CT sh[WG];

#ifdef IN_DC
CT EXP(CT v) { return exp_d(v); }
CT LOG(CT v) { return log_d(v); }
CT param_ct(int i) { return packDouble2x32(uvec2(uint(A(RPARAMS + i)), uint(A(RPARAMS + i + 1)))); }
#else
CT EXP(CT v) { return exp_f(v); }
CT LOG(CT v) { return log_f(v); }
CT param_ct(int i) { return intBitsToFloat(A(RPARAMS + i)); }
#endif

CT nanmax(CT a, CT b) { return (isnan(a) || isnan(b)) ? a + b : max(a, b); }

// Workgroup-wide reduction (mode 0); identity in mode 1.
#ifdef SG
#define GROUP_REDUCE(name, COMBINE)                                                        \
  CT name(CT v, bool group) {                                                              \
    if (!group) return v;                                                                  \
    for (uint m = gl_SubgroupSize / 2u; m > 0u; m >>= 1) v = COMBINE(v, subgroupShuffleXor(v, m)); \
    barrier();                                                                             \
    if (gl_SubgroupInvocationID == 0u) sh[gl_SubgroupID] = v;                              \
    barrier();                                                                             \
    v = sh[0];                                                                             \
    for (uint k = 1u; k < gl_NumSubgroups; ++k) v = COMBINE(v, sh[k]);                      \
    return v;                                                                              \
  }
#else
#define GROUP_REDUCE(name, COMBINE)                                 \
  CT name(CT v, bool group) {                                       \
    if (!group) return v;                                           \
    const uint lid = gl_LocalInvocationID.x;                        \
    barrier();                                                      \
    sh[lid] = v;                                                    \
    barrier();                                                      \
    for (uint s = WG / 2; s > 0; s >>= 1) {                         \
      if (lid < s) sh[lid] = COMBINE(sh[lid], sh[lid + s]);         \
      barrier();                                                    \
    }                                                               \
    return sh[0];                                                   \
  }
#endif
CT add2(CT a, CT b) { return a + b; }

// acc += v with Kahan compensation c (nothing to compensate once infinite).
void kahan_add(inout CT acc, inout CT c, CT v) {
  precise CT y = v - c;
  precise CT t = acc + y;
  c = isinf(t) ? CT(0) : (t - acc) - y;
  acc = t;
}
GROUP_REDUCE(group_sum, add2)
GROUP_REDUCE(group_max, nanmax)

// The element offsets of row element i: inner rank 1 (the usual case) by
// one multiply with strides read once, else the general walk.
bool g_simple;
int g_ist, g_ost;
void inner_offsets(int i, out int ii, out int io) {
  if (g_simple) {
    ii = i * g_ist;
    io = i * g_ost;
  } else {
    row_offsets(R_INNER, i, ii, io);
  }
}

void main() {
  const int rows = int(pc.n);
  const int n = INNER_N;
  const bool group = RMODE == 0u;
  const uint lid = gl_LocalInvocationID.x;
  int row, first, step;
  if (group) {
    row = int(group_linear());
    first = int(lid);
    step = WG;
  } else {
    row = int(group_linear()) * WG + int(lid);
    first = 0;
    step = 1;
  }
  if (row >= rows) return;  // uniform per workgroup in mode 0
  int ib, ob;
  row_offsets(R_OUTER, row, ib, ob);
  const int base = IN_OFF + ib;
  const int obase = OUT_OFF + ob;
  int ii, io;
  g_simple = A(R_INNER) == 1;
  g_ist = A(R_INNER + 9);
  g_ost = A(R_INNER + 17);

  if (OP <= 1) {
    CT m = CT(-uintBitsToFloat(0x7f800000u));
    for (int i = first; i < n; i += step) {
      inner_offsets(i, ii, io);
      m = nanmax(m, LD(IN_DT, x.v[base + ii]));
    }
    m = group_max(m, group);
    CT s = CT(0);
    for (int i = first; i < n; i += step) {
      inner_offsets(i, ii, io);
      s += EXP(LD(IN_DT, x.v[base + ii]) - m);
    }
    s = group_sum(s, group);
    const CT ls = LOG(s);
    for (int i = first; i < n; i += step) {
      inner_offsets(i, ii, io);
      CT v = LD(IN_DT, x.v[base + ii]) - m;
      o.v[obase + io] = SV(IN_DT, OP == 0 ? EXP(v) / s : v - ls);
    }
    return;
  }

  // layer_norm / var_mean: two-pass mean and variance, each sum compensated
  // (one invocation may sum a whole long row, see row_header).
  CT s = CT(0);
  precise CT cs = CT(0);
  for (int i = first; i < n; i += step) {
    inner_offsets(i, ii, io);
    kahan_add(s, cs, LD(IN_DT, x.v[base + ii]));
  }
  const CT mean = group_sum(s, group) / CT(n);
  CT q = CT(0);
  precise CT cq = CT(0);
  for (int i = first; i < n; i += step) {
    inner_offsets(i, ii, io);
    CT d = LD(IN_DT, x.v[base + ii]) - mean;
    kahan_add(q, cq, d * d);
  }
  q = group_sum(q, group);
  if (OP == 3) {
    if (!group || lid == 0u) {
      // PyTorch's divisor: max(0, N - correction) (an empty row gives 0/0, NaN).
      o.v[obase] = SV(IN_DT, q / max(CT(0), CT(n) - param_ct(4)));
      o2.v[A(RPARAMS + 1) + ob] = SV(IN_DT, mean);
    }
    return;
  }
  const CT rstd = CT(1) / sqrt(q / CT(n) + param_ct(4));
  const int flags = A(RPARAMS);
  for (int i = first; i < n; i += step) {
    inner_offsets(i, ii, io);
    CT y = (LD(IN_DT, x.v[base + ii]) - mean) * rstd;
    if ((flags & 1) != 0) y *= LD(IN_DT, wt.v[A(RPARAMS + 2) + i]);
    if ((flags & 2) != 0) y += LD(IN_DT, bs.v[A(RPARAMS + 3) + i]);
    o.v[obase + io] = SV(IN_DT, y);
  }
}
