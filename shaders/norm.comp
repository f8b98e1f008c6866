#version 450
#extension GL_GOOGLE_include_directive : require
// Row-wise normalisations. OP: 0 softmax 1 log_softmax 2 layer_norm 3 var_mean.
// NFAM (-D, one module per family): 0 softmax/log_softmax (OP 0/1), 1
// layer_norm, 2 var_mean; -DSGROW (with -DSG): the module holds only the
// subgroup-per-row mode (RM_SUBGROUP), rows of 4-vectors with SGROW=2 (RVEC
// 1) and others with SGROW=1 (RVEC 0), else only modes 0/1. lavapipe's
// compile time grows with all the code in a module, dead specialization
// branches included (one module for all four ops and modes took 27-34 ms a
// pipeline).
// Params (RPARAMS +): 0 flags (1: weight, 2: bias), 1 offset of the second
// output (var_mean's mean slot), 2 / 3 offsets of weight / bias, 4.. eps
// (layer_norm) / correction (var_mean) in the compute type.
#include "common.glsl"
#include "rows.glsl"
#ifdef IN_DC
#define BP_MATH_DOUBLE 1
#endif
#include "math.glsl"
#ifndef NFAM
#error "NFAM (0 softmax/log_softmax, 1 layer_norm, 2 var_mean) is required"
#endif
#if defined(SGROW) && !defined(SG)
#error "SGROW needs SG"
#endif

layout(local_size_x = WG) in;
layout(constant_id = 0) const int OP = 0;

DECL_RO(2, x, IN_DT)
DECL_RW(3, o, IN_DT)
DECL_RW1(4, o2, IN_DT)
DECL_RO(5, wt, IN_DT)
DECL_RO(6, bs, IN_DT)

#define CT CTYPE(IN_DT)
#define C4 CTYPE4(IN_DT)
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

#if NFAM == 0
// e^x for x <= 0 (x - max in softmax), -inf or NaN: exp_f's reduction and
// polynomial, scaled by two powers of two built from their bits (normal
// numbers for n in [-150, 0]) instead of two ldexp calls.
#ifdef IN_DC
CT EXPN(CT x) { return EXP(x); }
#else
CT EXPN(CT x) {
  const float xc = max(x, -104.0);
  const float fx = floor(xc * 1.44269504088896341 + 0.5);
  float r = xc - fx * 0.693359375;
  r = r + fx * 2.12194440e-4;
  const float z = r * r;
  const float p = (((((1.9875691500E-4 * r + 1.3981999507E-3) * r + 8.3334519073E-3) * r + 4.1665795894E-2) * r +
                    1.6666665459E-1) * r + 5.0000001201E-1) * z + r + 1.0;
  const int n = int(fx), h = n / 2;
  const float y = p * uintBitsToFloat(uint(h + 127) << 23) * uintBitsToFloat(uint(n - h + 127) << 23);
  return isnan(x) ? x : x < -103.972084045410 ? 0.0 : y;
}
#endif
// softmax in f32/f64 stores exp(x - m) in the pass that sums it and divides
// it in place in the next (one exp per element, not two; one call site of
// EXPN fewer to compile).
#if IN_DT == 1 || IN_DT == 4
#define KEEP_EXP 1
#else
#define KEEP_EXP 0
#endif
#endif

#ifdef SGROW
// RM_SUBGROUP: one subgroup per row, pc.p.x rows per workgroup; no shared
// memory and no barrier. RVEC: the row is contiguous in x and o, starts on a
// multiple of 4 in both and has a multiple of 4 elements (so do weight and
// bias): 4-vector loads and stores. The row is read once from memory: on a
// CPU device a subgroup runs the whole row before the next, so the later
// passes find it in cache.
#if NFAM == 0
C4 EXPN4(C4 v) { return C4(EXPN(v.x), EXPN(v.y), EXPN(v.z), EXPN(v.w)); }
#endif
void kahan_add4(inout C4 acc, inout C4 c, C4 v) {
  precise C4 y = v - c;
  precise C4 t = acc + y;
  precise C4 d = (t - acc) - y;
  c = mix(d, C4(0), isinf(t));
  acc = t;
}
CT sg_sum(CT v) {
  for (uint m = gl_SubgroupSize / 2u; m > 0u; m >>= 1) v += subgroupShuffleXor(v, m);
  return v;
}
CT sg_max(CT v) {
  for (uint m = gl_SubgroupSize / 2u; m > 0u; m >>= 1) v = nanmax(v, subgroupShuffleXor(v, m));
  return v;
}

// var_mean's stores, or layer_norm's write pass, from the row's mean and
// sum of squared deviations q.
void norm_finish(int ob, int base, int obase, int n, CT mean, CT q) {
  const int sl = int(gl_SubgroupInvocationID), ss = int(gl_SubgroupSize);
  int ii, io;
#if NFAM == 2
  if (sl == 0) {
    o.v[obase] = SV(IN_DT, q / max(CT(0), CT(n) - param_ct(4)));
    o2.v[A(RPARAMS + 1) + ob] = SV(IN_DT, mean);
  }
#else
  const CT rstd = CT(1) / sqrt(q / CT(n) + param_ct(4));
  const int flags = A(RPARAMS), wo = A(RPARAMS + 2), bo = A(RPARAMS + 3);
#if SGROW == 2
  // 4-vector rows (the host checks that they have whole 4-vectors).
  const int n4 = n >> 2, b4 = base >> 2, o4b = obase >> 2;
  for (int j = sl; j < n4; j += ss) {
    C4 y = (LD4(IN_DT, x4.v[b4 + j]) - mean) * rstd;
    if ((flags & 1) != 0) y *= LD4(IN_DT, wt4.v[(wo >> 2) + j]);
    if ((flags & 2) != 0) y += LD4(IN_DT, bs4.v[(bo >> 2) + j]);
    o4.v[o4b + j] = SV4(IN_DT, y);
  }
#else
  for (int i = sl; i < n; i += ss) {
    inner_offsets(i, ii, io);
    CT y = (LD(IN_DT, x.v[base + ii]) - mean) * rstd;
    if ((flags & 1) != 0) y *= LD(IN_DT, wt.v[wo + i]);
    if ((flags & 2) != 0) y += LD(IN_DT, bs.v[bo + i]);
    o.v[obase + io] = SV(IN_DT, y);
  }
#endif  // SGROW == 2
#endif  // NFAM == 2
}
void subgroup_row(int row, int n) {
  int ib, ob;
  row_offsets(R_OUTER, row, ib, ob);
  const int base = IN_OFF + ib, obase = OUT_OFF + ob;
  const int sl = int(gl_SubgroupInvocationID), ss = int(gl_SubgroupSize);
#if SGROW == 2
  const int n4 = n >> 2, b4 = base >> 2, o4b = obase >> 2;
#endif
  int ii, io;
#if NFAM == 0
#if SGROW == 2
  {
    // Online: one read for the running max m and the sum s of exp(x - m)
    // (rescaled when m grows), merged across the subgroup, then one read to
    // write (2 reads, 1 write; softmax_dim-1 on lavapipe 86-95 ms with three
    // passes, 73-75 ms with this and EXPN).
    CT m = CT(-uintBitsToFloat(0x7f800000u)), s = CT(0);
    for (int j = sl; j < n4; j += ss) {
      const C4 v = LD4(IN_DT, x4.v[b4 + j]);
      const CT mn = nanmax(m, nanmax(nanmax(v.x, v.y), nanmax(v.z, v.w)));
      // Every element so far -inf (a masked row's start): nothing to add yet,
      // and v - mn would be -inf - -inf = NaN.
      const C4 e = isinf(mn) && mn < CT(0) ? C4(0) : EXPN4(v - mn);
      s = s * (m == mn ? CT(1) : EXPN(m - mn)) + ((e.x + e.y) + (e.z + e.w));
      m = mn;
    }
    const CT M = sg_max(m);
    const CT S = sg_sum(s * (m == M ? CT(1) : EXPN(m - M)));
    const CT ls = LOG(S);
    const CT rs = CT(1) / S;
    for (int j = sl; j < n4; j += ss) {
      const C4 v = LD4(IN_DT, x4.v[b4 + j]) - M;
      o4.v[o4b + j] = SV4(IN_DT, OP == 0 ? EXPN4(v) * rs : v - ls);
    }
  }
#else
  {
    // Rows that are not 4-vectors (no 4-vector loads here: n4 is 0).
    CT m = CT(-uintBitsToFloat(0x7f800000u));
    for (int i = sl; i < n; i += ss) {
      inner_offsets(i, ii, io);
      m = nanmax(m, LD(IN_DT, x.v[base + ii]));
    }
    m = sg_max(m);
    CT s = CT(0);
    for (int i = sl; i < n; i += ss) {
      inner_offsets(i, ii, io);
      const CT e = EXPN(LD(IN_DT, x.v[base + ii]) - m);
      if (KEEP_EXP == 1 && OP == 0) o.v[obase + io] = SV(IN_DT, e);
      s += e;
    }
    s = sg_sum(s);
    const CT ls = LOG(s);
    for (int i = sl; i < n; i += ss) {
      inner_offsets(i, ii, io);
      CT y;
#if KEEP_EXP
      if (OP == 0) y = LD(IN_DT, o.v[obase + io]) / s;
#else
      if (OP == 0) y = EXPN(LD(IN_DT, x.v[base + ii]) - m) / s;
#endif
      else y = LD(IN_DT, x.v[base + ii]) - m - ls;
      o.v[obase + io] = SV(IN_DT, y);
    }
  }
#endif  // SGROW == 2
#else
#if SGROW == 2
  {
    // layer_norm / var_mean over 4-vectors, in one read: the mean from a
    // compensated sum (exact propagation of inf and NaN), the sum of
    // squared deviations by Chan et al.'s merge of (count, mean, M2): per
    // 4-vector, then across the subgroup (symmetric, so every lane agrees).
    C4 s4 = C4(0), c4 = C4(0);
    CT wn = CT(0), wm = CT(0), w2 = CT(0);
    for (int j = sl; j < n4; j += ss) {
      const C4 v = LD4(IN_DT, x4.v[b4 + j]);
      kahan_add4(s4, c4, v);
      const CT bm = ((v.x + v.y) + (v.z + v.w)) * CT(0.25);
      const C4 dv = v - bm;
      const CT nn = wn + CT(4), r = CT(1) / nn;
      const CT delta = bm - wm;
      w2 += dot(dv, dv) + delta * delta * wn * (CT(4) * r);
      wm = (wn * wm + CT(4) * bm) * r;
      wn = nn;
    }
    CT s = (s4.x + s4.y) + (s4.z + s4.w);
    precise CT cs = CT(0);
    for (int i = 4 * n4 + sl; i < n; i += ss) {
      const CT v = LD(IN_DT, x.v[base + i]);
      kahan_add(s, cs, v);
      const CT nn = wn + CT(1);
      const CT delta = v - wm;
      w2 += delta * delta * wn / nn;
      wm = (wn * wm + v) / nn;
      wn = nn;
    }
    const CT mean = sg_sum(s) / CT(n);
    for (uint m = gl_SubgroupSize / 2u; m > 0u; m >>= 1) {
      const CT nb = subgroupShuffleXor(wn, m), mb = subgroupShuffleXor(wm, m), qb = subgroupShuffleXor(w2, m);
      const CT nn = wn + nb;
      if (nn > CT(0)) {
        const CT delta = mb - wm;
        w2 = (w2 + qb) + delta * delta * (wn * nb / nn);
        wm = (wn * wm + nb * mb) / nn;
      }
      wn = nn;
    }
    norm_finish(ob, base, obase, n, mean, w2);
  }
#else
  // layer_norm / var_mean, rows that are not 4-vectors (n4 is 0): mean,
  // then the sum of squared deviations, each compensated.
  CT s = CT(0);
  precise CT cs = CT(0);
  for (int i = sl; i < n; i += ss) {
    inner_offsets(i, ii, io);
    kahan_add(s, cs, LD(IN_DT, x.v[base + ii]));
  }
  const CT mean = sg_sum(s) / CT(n);
  CT q = CT(0);
  precise CT cq = CT(0);
  for (int i = sl; i < n; i += ss) {
    inner_offsets(i, ii, io);
    const CT dv = LD(IN_DT, x.v[base + ii]) - mean;
    kahan_add(q, cq, dv * dv);
  }
  q = sg_sum(q);
  norm_finish(ob, base, obase, n, mean, q);
#endif  // SGROW == 2
#endif  // NFAM == 0
}

#endif

void main() {
  const int rows = int(pc.n);
  const int n = INNER_N;
#ifdef SGROW
  g_simple = A(R_INNER) == 1;
  g_ist = A(R_INNER + 9);
  g_ost = A(R_INNER + 17);
  const int g0 = int(group_linear()) * pc.p.x;
  const int g1 = min(rows, g0 + pc.p.x);
  for (int row = g0 + int(gl_SubgroupID); row < g1; row += int(gl_NumSubgroups)) subgroup_row(row, n);
#else
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

#if NFAM == 0
  {
    CT m = CT(-uintBitsToFloat(0x7f800000u));
    for (int i = first; i < n; i += step) {
      inner_offsets(i, ii, io);
      m = nanmax(m, LD(IN_DT, x.v[base + ii]));
    }
    m = group_max(m, group);
    CT s = CT(0);
    for (int i = first; i < n; i += step) {
      inner_offsets(i, ii, io);
      const CT e = EXPN(LD(IN_DT, x.v[base + ii]) - m);
      if (KEEP_EXP == 1 && OP == 0) o.v[obase + io] = SV(IN_DT, e);
      s += e;
    }
    s = group_sum(s, group);
    const CT ls = LOG(s);
    for (int i = first; i < n; i += step) {
      inner_offsets(i, ii, io);
      CT y;
#if KEEP_EXP
      if (OP == 0) y = LD(IN_DT, o.v[obase + io]) / s;
#else
      if (OP == 0) y = EXPN(LD(IN_DT, x.v[base + ii]) - m) / s;
#endif
      else y = LD(IN_DT, x.v[base + ii]) - m - ls;
      o.v[obase + io] = SV(IN_DT, y);
    }
  }
#else

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
#if NFAM == 2
  if (!group || lid == 0u) {
    // PyTorch's divisor: max(0, N - correction) (an empty row gives 0/0, NaN).
    o.v[obase] = SV(IN_DT, q / max(CT(0), CT(n) - param_ct(4)));
    o2.v[A(RPARAMS + 1) + ob] = SV(IN_DT, mean);
  }
#else
  const CT rstd = CT(1) / sqrt(q / CT(n) + param_ct(4));
  const int flags = A(RPARAMS);
  for (int i = first; i < n; i += step) {
    inner_offsets(i, ii, io);
    CT y = (LD(IN_DT, x.v[base + ii]) - mean) * rstd;
    if ((flags & 1) != 0) y *= LD(IN_DT, wt.v[A(RPARAMS + 2) + i]);
    if ((flags & 2) != 0) y += LD(IN_DT, bs.v[A(RPARAMS + 3) + i]);
    o.v[obase + io] = SV(IN_DT, y);
  }
#endif  // NFAM == 2
#endif  // NFAM == 0
#endif  // SGROW
}
