#version 450
#extension GL_GOOGLE_include_directive : require
// topk along the inner dim of each row, one workgroup per row: k rounds,
// each picking the best element ranked after the previous pick (a total
// order: value, NaN above every number, then lower index first), so the
// output is sorted. Params (RPARAMS +): 0 k, 1 largest, 2 values offset,
// 3 indices offset, 4 output stride of the dim.
// RMODE 1 (k <= 16, many rows; the host's choice on CPU devices): one
// invocation per row in one pass, keeping its best K in a sorted array (K,
// specialization constant 3, is k, so every index into the array is a
// constant and the array lives in registers; most elements fail the first
// comparison, against the K-th best).
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

layout(constant_id = 3) const int K = 1;

void main() {
  const int rows = int(pc.n);
  const int n = INNER_N;
  const uint lid = gl_LocalInvocationID.x;
  if (RMODE == 1u) {
    const int r1 = int(group_linear()) * WG + int(lid);
    if (r1 >= rows) return;
    largest = A(RPARAMS + 1) != 0;
    const int vo = A(RPARAMS + 2), io = A(RPARAMS + 3), ost = A(RPARAMS + 4);
    int ib, ob;
    row_offsets(R_OUTER, r1, ib, ob);
    const int base = IN_OFF + ib;
    const bool simple = A(R_INNER) == 1;
    const int st = A(R_INNER + 9);
    // Best first; index -1 marks an empty slot (ranks after everything).
    CT hv[K];
    int hx[K];
    for (int r = 0; r < K; ++r) {
      hv[r] = CT(0);
      hx[r] = -1;
    }
    for (int i = 0; i < n; ++i) {
      int ii = i * st, iu;
      if (!simple) row_offsets(R_INNER, i, ii, iu);
      const CT v = LD(IN_DT, x.v[base + ii]);
      if (!before(v, i, hv[K - 1], hx[K - 1])) continue;
      hv[K - 1] = v;
      hx[K - 1] = i;
      for (int r = K - 1; r > 0; --r) {
        if (!before(hv[r], hx[r], hv[r - 1], hx[r - 1])) break;
        const CT tv = hv[r];
        const int tx = hx[r];
        hv[r] = hv[r - 1];
        hx[r] = hx[r - 1];
        hv[r - 1] = tv;
        hx[r - 1] = tx;
      }
    }
    for (int r = 0; r < K; ++r) {
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
