#version 450
#extension GL_GOOGLE_include_directive : require
// Reductions over the inner dims of each row. OP: 0 sum 1 mean 2 prod 3 max 4 min.
// RMODE (rows.glsl): 0 a workgroup per row, 1 an invocation per row, and for a few
// very long rows a split: 2 = partial pass (workgroup g reduces chunk
// g % P of row g / P into scratch[g]; P and the chunk length at RPARAMS),
// 3 = final pass (a workgroup per row reduces its P partials).
#include "common.glsl"
#include "rows.glsl"

layout(local_size_x = WG) in;
layout(constant_id = 0) const int OP = 0;

DECL_RO1(2, x, IN_DT)
DECL_RW1(3, o, IN_DT)
#define CT CTYPE(IN_DT)
DECL_RAW(4, part, CT)

shared CT sh[WG];

CT identity() {
  if (OP == 2) return CT(1);
#if defined(IN_FLOAT)
  if (OP == 3) return CT(-uintBitsToFloat(0x7f800000u));
  if (OP == 4) return CT(uintBitsToFloat(0x7f800000u));
#elif defined(IN_LC)
  if (OP == 3) return int64_t(0x8000000000000000ul);
  if (OP == 4) return int64_t(0x7ffffffffffffffful);
#else
  if (OP == 3) return int(0x80000000u);
  if (OP == 4) return int(0x7fffffffu);
#endif
  return CT(0);
}

CT combine(CT a, CT b) {
  if (OP <= 1) return a + b;
  if (OP == 2) return a * b;
#ifdef IN_FLOAT
  if (isnan(a) || isnan(b)) return a + b;
#endif
  return OP == 3 ? max(a, b) : min(a, b);
}

// Accumulates elements [first, n) step `step` of the row at `base`
// (from the scratch partials when `partials`).
CT accumulate(int base, int first, int step, int n, bool partials) {
  CT acc = identity();
#ifdef IN_FLOAT
  precise CT comp = CT(0);  // Kahan compensation for sums
#endif
  const int st = row_in_stride();
  const bool simple = A(R_INNER) == 1;
  for (int i = first; i < n; i += step) {
    int ii, io;
    if (simple) ii = i * st;
    else row_offsets(R_INNER, i, ii, io);
    CT v = partials ? part.v[base + i] : LD(IN_DT, x.v[base + ii]);
#ifdef IN_FLOAT
    if (OP <= 1) {
      precise CT y = v - comp;
      precise CT t = acc + y;
      comp = isinf(t) ? CT(0) : (t - acc) - y;  // nothing to compensate once infinite
      acc = t;
      continue;
    }
#endif
    acc = combine(acc, v);
  }
  return acc;
}

void store(int ob, CT acc, int n) {
#ifdef IN_FLOAT
  if (OP == 1) acc = acc / CT(n);
#endif
  o.v[OUT_OFF + ob] = SV(IN_DT, acc);
}

void main() {
  const int rows = int(pc.n);
  const int n = INNER_N;
  const uint lid = gl_LocalInvocationID.x;
  if (RMODE == 1u) {
    const int row = int(group_linear()) * WG + int(lid);
    if (row >= rows) return;
    int ib, ob;
    row_offsets(R_OUTER, row, ib, ob);
    store(ob, accumulate(IN_OFF + ib, 0, 1, n, false), n);
    return;
  }
  const int P = A(RPARAMS), chunk = A(RPARAMS + 1);
  const int g = int(group_linear());
  const int row = RMODE == 2u ? g / P : g;
  if (row >= rows) return;
  int ib, ob;
  row_offsets(R_OUTER, row, ib, ob);
  if (RMODE == 2u) {
    const int c0 = (g % P) * chunk;
    sh[lid] = accumulate(IN_OFF + ib, c0 + int(lid), WG, min(n, c0 + chunk), false);
  } else if (RMODE == 3u) {
    sh[lid] = accumulate(row * P, int(lid), WG, P, true);
  } else {
    sh[lid] = accumulate(IN_OFF + ib, int(lid), WG, n, false);
  }
#ifdef SG
  CT v = sh[lid];
  for (uint m = gl_SubgroupSize / 2u; m > 0u; m >>= 1) v = combine(v, subgroupShuffleXor(v, m));
  barrier();
  if (gl_SubgroupInvocationID == 0u) sh[gl_SubgroupID] = v;
  barrier();
  if (lid != 0u) return;
  for (uint k = 1u; k < gl_NumSubgroups; ++k) v = combine(v, sh[k]);
  sh[0] = v;
#else
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) sh[lid] = combine(sh[lid], sh[lid + s]);
    barrier();
  }
  if (lid != 0u) return;
#endif
  if (RMODE == 2u) part.v[g] = sh[0];
  else store(ob, sh[0], n);
}
