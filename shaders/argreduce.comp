#version 450
#extension GL_GOOGLE_include_directive : require
// argmax (OP 0) / argmin (OP 1) over the inner dims of each row; writes i64
// indices as two int32 words. First NaN wins; ties: lowest index, or the
// highest with select_last_index (RPARAMS + 0). RMODE as in reduce.comp:
// 0 a workgroup per row, 1 an invocation per row, 2 partial pass over chunk
// g % P of row g / P (P, chunk length at RPARAMS + 1, + 2) into scratch,
// 3 final pass over the P partials of each row.
#include "common.glsl"
#include "rows.glsl"

layout(local_size_x = WG) in;
layout(constant_id = 0) const int OP = 0;

DECL_RO1(2, x, IN_DT)
DECL_RAW(3, o, ivec2)

#define CT CTYPE(IN_DT)
DECL_RAW(4, part_v, CT)
DECL_RAW(5, part_i, int)
shared CT shv[WG];
shared int shi[WG];

// Whether (va, ia) is preferred over (vb, ib); index -1 marks "nothing".
bool better(CT va, int ia, CT vb, int ib, bool last) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
#ifdef IN_FLOAT
  bool na = isnan(va), nb = isnan(vb);
  if (na || nb) return (na && nb) ? ia < ib : na;
#endif
  if (va != vb) return OP == 0 ? va > vb : va < vb;
  return last ? ia > ib : ia < ib;
}

void scan_row(int base, int first, int step, int n, bool last, out CT bv, out int bi) {
  bv = CT(0);
  bi = -1;
  const int st = row_in_stride();
  const bool simple = A(R_INNER) == 1;
  for (int i = first; i < n; i += step) {
    int ii, io;
    if (simple) ii = i * st;
    else row_offsets(R_INNER, i, ii, io);
    CT v = LD(IN_DT, x.v[base + ii]);
    if (better(v, i, bv, bi, last)) {
      bv = v;
      bi = i;
    }
  }
}

void main() {
  const int rows = int(pc.n);
  const int n = INNER_N;
  const bool last = A(RPARAMS) != 0;
  const uint lid = gl_LocalInvocationID.x;
  // Every mode's row scan at one call site (lavapipe compiles each inlined
  // copy, dead modes included).
  int row, base, first, step, end, ob;
  const int g = int(group_linear());
  const int P = A(RPARAMS + 1), chunk = A(RPARAMS + 2);
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
  int ib;
  row_offsets(R_OUTER, row, ib, ob);
  base = IN_OFF + ib;
  end = n;
  if (RMODE == 2u) {
    const int c0 = (g % P) * chunk;
    first += c0;
    end = min(n, c0 + chunk);
  }
  CT bv;
  int bi;
  if (RMODE == 3u) {
    bv = CT(0);
    bi = -1;
    for (int t = int(lid); t < P; t += WG) {
      CT v = part_v.v[row * P + t];
      int i = part_i.v[row * P + t];
      if (better(v, i, bv, bi, last)) {
        bv = v;
        bi = i;
      }
    }
  } else {
    scan_row(base, first, step, end, last, bv, bi);
  }
  if (RMODE == 1u) {
    o.v[OUT_OFF + ob] = ivec2(bi, 0);
    return;
  }
  shv[lid] = bv;
  shi[lid] = bi;
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s && better(shv[lid + s], shi[lid + s], shv[lid], shi[lid], last)) {
      shv[lid] = shv[lid + s];
      shi[lid] = shi[lid + s];
    }
    barrier();
  }
  if (lid != 0u) return;
  if (RMODE == 2u) {
    part_v.v[g] = shv[0];
    part_i.v[g] = shi[0];
  } else {
    o.v[OUT_OFF + ob] = ivec2(shi[0], 0);
  }
}
