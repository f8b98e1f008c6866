#version 450
#extension GL_GOOGLE_include_directive : require
// cumsum along the inner dim of each row. Params (RPARAMS +): 0 exclusive,
// 1 reverse. Mode 1: an invocation per row, sequential. Mode 0: a workgroup
// per row; each invocation scans a contiguous chunk, chunk totals are
// scanned in shared memory. Float sums are Kahan-compensated.
#include "common.glsl"
#include "rows.glsl"

layout(local_size_x = WG) in;

DECL_RO1(2, x, IN_DT)
DECL_RW1(3, o, IN_DT)

#define CT CTYPE(IN_DT)
shared CT sh[WG];

struct Acc {
  CT s;
  CT c;
};
void acc_add(inout Acc a, CT v) {
#ifdef IN_FLOAT
  precise CT y = v - a.c;
  precise CT t = a.s + y;
  // Once the sum is infinite there is nothing to compensate (inf - inf
  // would turn every later sum into NaN).
  a.c = isinf(t) ? CT(0) : (t - a.s) - y;
  a.s = t;
#else
  a.s += v;
#endif
}

// Scans positions [lo, hi) of the row (in scan order) starting from `start`;
// returns the total when write is false.
CT scan_range(int base, int obase, int n, int lo, int hi, CT start, bool write) {
  const bool excl = A(RPARAMS) != 0, rev = A(RPARAMS + 1) != 0;
  Acc acc;
  acc.s = start;
  acc.c = CT(0);
  for (int p = lo; p < hi; ++p) {
    int i = rev ? n - 1 - p : p;
    int ii, io;
    row_offsets(R_INNER, i, ii, io);
    CT v = LD(IN_DT, x.v[base + ii]);
    if (excl) {
      if (write) o.v[obase + io] = SV(IN_DT, acc.s);
      acc_add(acc, v);
    } else {
      acc_add(acc, v);
      if (write) o.v[obase + io] = SV(IN_DT, acc.s);
    }
  }
  return acc.s;
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
    scan_range(IN_OFF + ib, OUT_OFF + ob, n, 0, n, CT(0), true);
    return;
  }
  const int row = int(group_linear());
  if (row >= rows) return;
  int ib, ob;
  row_offsets(R_OUTER, row, ib, ob);
  const int chunk = (n + WG - 1) / WG;
  const int lo = min(n, int(lid) * chunk), hi = min(n, lo + chunk);
  sh[lid] = scan_range(IN_OFF + ib, OUT_OFF + ob, n, lo, hi, CT(0), false);
  barrier();
  // Exclusive scan of the chunk totals (Hillis-Steele on WG entries).
  for (uint s = 1; s < WG; s <<= 1) {
    CT v = lid >= s ? sh[lid - s] : CT(0);
    barrier();
    sh[lid] += v;
    barrier();
  }
  CT start = lid == 0u ? CT(0) : sh[lid - 1];
  scan_range(IN_OFF + ib, OUT_OFF + ob, n, lo, hi, start, true);
}
