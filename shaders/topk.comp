#version 450
#extension GL_GOOGLE_include_directive : require
// topk along the inner dim of each row, one workgroup per row: k rounds,
// each picking the best element ranked after the previous pick (a total
// order: value, NaN above every number, then lower index first), so the
// output is sorted. Params (RPARAMS +): 0 k, 1 largest, 2 values offset,
// 3 indices offset, 4 output stride of the dim.
// RMODE 1 (k <= KMAX, many rows; the host's choice on CPU devices): one
// invocation per row in one pass, keeping its best k in a sorted array
// (most elements fail the first comparison, against the k-th best).
#include "common.glsl"
#include "rows.glsl"

layout(local_size_x = WG) in;

DECL_RO1(2, x, IN_DT)
DECL_RW1(3, ov, IN_DT)
DECL_RAW(4, oi, ivec2)

#define CT CTYPE(IN_DT)
shared CT shv[WG];
shared int shi[WG];

bool largest;
// Whether (va, ia) ranks before (vb, ib); index -1 = nothing (ranks last).
bool before(CT va, int ia, CT vb, int ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
#ifdef IN_FLOAT
  bool na = isnan(va), nb = isnan(vb);
  if (na || nb) {
    if (na && nb) return ia < ib;
    return largest ? na : nb;
  }
#endif
  if (va != vb) return largest ? va > vb : va < vb;
  return ia < ib;
}

#define KMAX 16

void main() {
  const int rows = int(pc.n);
  const int n = INNER_N;
  const uint lid = gl_LocalInvocationID.x;
  if (RMODE == 1u) {
    const int r1 = int(group_linear()) * WG + int(lid);
    if (r1 >= rows) return;
    const int k = A(RPARAMS);
    largest = A(RPARAMS + 1) != 0;
    const int vo = A(RPARAMS + 2), io = A(RPARAMS + 3), ost = A(RPARAMS + 4);
    int ib, ob;
    row_offsets(R_OUTER, r1, ib, ob);
    const int base = IN_OFF + ib;
    const bool simple = A(R_INNER) == 1;
    const int st = A(R_INNER + 9);
    CT hv[KMAX];
    int hx[KMAX];
    int cnt = 0;
    for (int i = 0; i < n; ++i) {
      int ii = i * st, iu;
      if (!simple) row_offsets(R_INNER, i, ii, iu);
      const CT v = LD(IN_DT, x.v[base + ii]);
      if (cnt == k && !before(v, i, hv[k - 1], hx[k - 1])) continue;
      int j = cnt < k ? cnt : k - 1;
      if (cnt < k) ++cnt;
      while (j > 0 && before(v, i, hv[j - 1], hx[j - 1])) {
        hv[j] = hv[j - 1];
        hx[j] = hx[j - 1];
        --j;
      }
      hv[j] = v;
      hx[j] = i;
    }
    for (int r = 0; r < k; ++r) {
      ov.v[vo + ob + r * ost] = SV(IN_DT, hv[r]);
      oi.v[io + ob + r * ost] = ivec2(hx[r], 0);
    }
    return;
  }
  const int row = int(group_linear());
  if (row >= rows) return;
  const int k = A(RPARAMS);
  largest = A(RPARAMS + 1) != 0;
  const int vo = A(RPARAMS + 2), io = A(RPARAMS + 3), ost = A(RPARAMS + 4);
  int ib, ob;
  row_offsets(R_OUTER, row, ib, ob);
  const int base = IN_OFF + ib;
  CT pv = CT(0);
  int pi = -1;
  for (int r = 0; r < k; ++r) {
    CT bv = CT(0);
    int bi = -1;
    for (int i = int(lid); i < n; i += WG) {
      int ii, iu;
      row_offsets(R_INNER, i, ii, iu);
      CT v = LD(IN_DT, x.v[base + ii]);
      if ((pi < 0 || before(pv, pi, v, i)) && before(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
    shv[lid] = bv;
    shi[lid] = bi;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
      if (lid < s && before(shv[lid + s], shi[lid + s], shv[lid], shi[lid])) {
        shv[lid] = shv[lid + s];
        shi[lid] = shi[lid + s];
      }
      barrier();
    }
    pv = shv[0];
    pi = shi[0];
    if (lid == 0u) {
      ov.v[vo + ob + r * ost] = SV(IN_DT, pv);
      oi.v[io + ob + r * ost] = ivec2(pi, 0);
    }
    barrier();
  }
}
