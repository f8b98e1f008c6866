#version 450
#extension GL_GOOGLE_include_directive : require
// Reductions over the inner dims of each row. OP: 0 sum 1 mean 2 prod 3 max 4 min.
// RMODE (rows.glsl): 0 a workgroup per row, 1 an invocation per row, and for a few
// very long rows a split: 2 = partial pass (workgroup g reduces chunk
// g % P of row g / P into scratch[g]; P and the chunk length at RPARAMS),
// 3 = final pass (a workgroup per row reduces its P partials); 4 a subgroup
// per row (SG variants), 5/6/7 columns (rows.glsl).
// One module per kind of mode (lavapipe's compile time grows with all the
// code in a module, dead specialization branches included): -DRCOLS the
// columns (5 to 7) only, -DSGROW (with -DSG) the subgroup rows (4) only (=2
// rows of 4-vectors, =1 others), else
// modes 0 to 3.
#include "common.glsl"
#include "rows.glsl"
#if defined(SGROW) && !defined(SG)
#error "SGROW needs SG"
#endif
#if defined(SGROW) && defined(RCOLS)
#error "SGROW and RCOLS are separate modules"
#endif

layout(local_size_x = WG) in;
layout(constant_id = 0) const int OP = 0;

DECL_RO(2, x, IN_DT)
DECL_RW1(3, o, IN_DT)
#define CT CTYPE(IN_DT)
#define C4 CTYPE4(IN_DT)
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

// 4-lane forms for the 4-vector loads (modes 4 to 6): acc += v with a
// Kahan compensation per lane for float sums (none once infinite), else
// combine().
C4 combine4(C4 a, C4 b) {
  if (OP <= 1) return a + b;
  if (OP == 2) return a * b;
  C4 m = OP == 3 ? max(a, b) : min(a, b);
#ifdef IN_FLOAT
  m = mix(m, a + b, bvec4(uvec4(isnan(a)) | uvec4(isnan(b))));
#endif
  return m;
}
void add4(inout C4 acc, inout C4 comp, C4 v) {
#ifdef IN_FLOAT
  if (OP <= 1) {
    precise C4 y = v - comp;
    precise C4 t = acc + y;
    precise C4 c = (t - acc) - y;
    comp = mix(c, C4(0), isinf(t));
    acc = t;
    return;
  }
#endif
  acc = combine4(acc, v);
}
CT fold4(C4 v) { return combine(combine(v.x, v.y), combine(v.z, v.w)); }

void store(int ob, CT acc, int n) {
#ifdef IN_FLOAT
  if (OP == 1) acc = acc / CT(n);
#endif
  o.v[OUT_OFF + ob] = SV(IN_DT, acc);
}

#ifdef RCOLS
// CV (specialization constant 3, modes 5 to 7): 4-column groups per
// invocation, side by side (4 CV neighbouring columns; a workgroup spans
// 4 WG CV of them, so on a CPU device with CV = 4 it takes whole rows of up
// to 4096 elements, and each subgroup reads a contiguous stretch of a row).
layout(constant_id = 3) const int CV = 1;

// The 4 columns from `col` (clamped into the row; only whole groups are
// 4-vectors, RVEC).
C4 load_cols(int b, int col, int cols) {
  if (RVEC == 1u) return LD4(IN_DT, x4.v[(b + col) >> 2]);
  return C4(LD(IN_DT, x.v[b + min(col, cols - 1)]), LD(IN_DT, x.v[b + min(col + 1, cols - 1)]),
            LD(IN_DT, x.v[b + min(col + 2, cols - 1)]), LD(IN_DT, x.v[b + min(col + 3, cols - 1)]));
}

// Columns (modes 5 to 7): pc.n is the column count; each workgroup spans
// 4 WG CV columns (pc.p.y spans per chunk of rows) and reduces rows
// [r0, r1) of them.
void columns_main(int n) {
  const int cols = int(pc.n);
  const int lid = int(gl_LocalInvocationID.x);
  const int g = int(group_linear());
  const int gpc = pc.p.y;
  const int chunk = RMODE == RM_COLUMNS_SPLIT ? g / gpc : 0;
  const int col0 = 4 * CV * ((g - chunk * gpc) * WG + lid);
  int r0 = 0, r1 = n;
  if (RMODE == RM_COLUMNS_SPLIT) {
    r0 = chunk * pc.p.z;
    r1 = min(n, r0 + pc.p.z);
  } else if (RMODE == RM_COLUMNS_FINAL) {
    r1 = pc.p.w;
  }
  C4 acc[CV], comp[CV];
  for (int q = 0; q < CV; ++q) {
    acc[q] = C4(identity());
    comp[q] = C4(0);
  }
  if (RMODE == RM_COLUMNS_FINAL) {
    // The partials: a dense [P, cols] array.
    for (int r = r0; r < r1; ++r) {
      const int b = r * cols;
      for (int q = 0; q < CV; ++q) {
        const int c = col0 + 4 * q;
        add4(acc[q], comp[q], C4(part.v[b + min(c, cols - 1)], part.v[b + min(c + 1, cols - 1)],
                                 part.v[b + min(c + 2, cols - 1)], part.v[b + min(c + 3, cols - 1)]));
      }
    }
  } else {
    if (col0 >= cols) return;
    const int st = row_in_stride();
    const bool simple = A(R_INNER) == 1;
    for (int r = r0; r < r1; ++r) {
      int ii = r * st, io;
      if (!simple) row_offsets(R_INNER, r, ii, io);
      const int b = IN_OFF + ii;
      for (int q = 0; q < CV; ++q) {
        const int c = col0 + 4 * q;
        if (CV == 1 || c < cols) add4(acc[q], comp[q], load_cols(b, c, cols));
      }
    }
  }
  for (int q = 0; q < CV; ++q) {
    const int c = col0 + 4 * q;
    for (int k = 0; k < 4 && c + k < cols; ++k) {
      if (RMODE == RM_COLUMNS_SPLIT) part.v[chunk * cols + c + k] = acc[q][k];
      else store(c + k, acc[q][k], n);
    }
  }
}
#endif  // RCOLS

void main() {
  const int rows = int(pc.n);
  const int n = INNER_N;
#if defined(RCOLS)
  columns_main(n);
#elif defined(SGROW)
  {
    // pc.p.x rows per workgroup, each taken by one subgroup at a time: no
    // shared memory, no barrier. SGROW 2 (RVEC 1, a module of its own): the
    // row is contiguous and starts on a multiple of 4 (4-vector loads).
    const int sl = int(gl_SubgroupInvocationID), ss = int(gl_SubgroupSize);
    const int g0 = int(group_linear()) * pc.p.x;
    const int g1 = min(rows, g0 + pc.p.x);
    for (int row = g0 + int(gl_SubgroupID); row < g1; row += int(gl_NumSubgroups)) {
      int ib, ob;
      row_offsets(R_OUTER, row, ib, ob);
      const int base = IN_OFF + ib;
      CT acc;
#if SGROW == 2
      {
        C4 a4 = C4(identity()), c4 = C4(0);
        const int n4 = n >> 2, b4 = base >> 2;
        for (int j = sl; j < n4; j += ss) add4(a4, c4, LD4(IN_DT, x4.v[b4 + j]));
        acc = fold4(a4);
        for (int i = 4 * n4 + sl; i < n; i += ss) acc = combine(acc, LD(IN_DT, x.v[base + i]));
      }
#else
      acc = accumulate(base, sl, ss, n, false);
#endif
      for (uint m = gl_SubgroupSize / 2u; m > 0u; m >>= 1) acc = combine(acc, subgroupShuffleXor(acc, m));
      if (sl == 0) store(ob, acc, n);
    }
  }
#else
  // Every mode's accumulate() at one call site (lavapipe compiles each
  // inlined copy, dead modes included).
  const uint lid = gl_LocalInvocationID.x;
  const int g = int(group_linear());
  const int P = A(RPARAMS), chunk = A(RPARAMS + 1);
  int row, first, step;
  if (RMODE == 1u) {
    row = g * WG + int(lid);
    first = 0;
    step = 1;
  } else {
    row = RMODE == 2u ? g / P : g;
    first = int(lid);
    step = WG;
  }
  if (row >= rows) return;  // uniform per workgroup but in mode 1
  int ib, ob;
  row_offsets(R_OUTER, row, ib, ob);
  int base = IN_OFF + ib, end = n;
  if (RMODE == 2u) {
    const int c0 = (g % P) * chunk;
    first += c0;
    end = min(n, c0 + chunk);
  } else if (RMODE == 3u) {
    base = row * P;
    end = P;
  }
  const CT acc = accumulate(base, first, step, end, RMODE == 3u);
  if (RMODE == 1u) {
    store(ob, acc, n);
    return;
  }
  sh[lid] = acc;
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
#endif  // RCOLS / SGROW
}
