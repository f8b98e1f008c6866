#version 450
#extension GL_GOOGLE_include_directive : require
// Binary arithmetic (OP 0..6: add sub mul div maximum minimum pow) and, with
// -DCMP, comparisons (OP 0..5: eq ne lt le gt ge) writing bool.
// Each invocation handles 4 consecutive output elements (vec4 loads and
// stores on the fast path: rank-1 operands with stride 1 or 0).
#define NREC 3  // a, b, output
#include "common.glsl"
#include "elementwise.glsl"
#ifdef IN_DC
#define BP_MATH_DOUBLE 1
#endif
#include "math.glsl"

layout(local_size_x = WG) in;
layout(constant_id = 0) const int OP = 0;

DECL_RO(2, a, IN_DT)
DECL_RO(3, b, IN_DT)
DECL_RW(4, o, OUT_DT)

#define CT CTYPE(IN_DT)
#define OT CTYPE(OUT_DT)

#include "binary_op.glsl"

// Operand k's 4x4 block at (r0, c0) on the 2-D block path, as 4 rows:
// a column broadcast (one value per row), dense rows (4-vector loads), a
// dense column (TRANS: row stride 1, 4-vector loads down each column, then
// transposed in registers) or any other stride (16 scalar loads).
#define LOAD_BLOCK(NAME, V, V4, COL, VEC, TRANS, OFF, RS, S)                             \
  void NAME(int r0, int c0, out CTYPE4(IN_DT) v[4]) {                                   \
    if (COL) {                                                                          \
      for (int i = 0; i < 4; ++i) v[i] = CTYPE4(IN_DT)(LD(IN_DT, V.v[OFF + (r0 + i) * RS])); \
    } else if (VEC) {                                                                   \
      for (int i = 0; i < 4; ++i) v[i] = LD4(IN_DT, V4.v[(OFF + (r0 + i) * RS + c0) / 4]); \
    } else if (TRANS) {                                                                 \
      CTYPE4(IN_DT) t[4];                                                               \
      for (int j = 0; j < 4; ++j) t[j] = LD4(IN_DT, V4.v[(OFF + r0 + (c0 + j) * S) / 4]); \
      for (int i = 0; i < 4; ++i) v[i] = CTYPE4(IN_DT)(t[0][i], t[1][i], t[2][i], t[3][i]); \
    } else {                                                                            \
      for (int i = 0; i < 4; ++i) {                                                     \
        const int b0 = OFF + (r0 + i) * RS + c0 * S;                                    \
        v[i] = CTYPE4(IN_DT)(LD(IN_DT, V.v[b0]), LD(IN_DT, V.v[b0 + S]), LD(IN_DT, V.v[b0 + 2 * S]), \
                             LD(IN_DT, V.v[b0 + 3 * S]));                                \
      }                                                                                 \
    }                                                                                   \
  }
LOAD_BLOCK(load_block0, a, a4, COL0, VEC0, TRANS0, pc.p.x, pc.q.x, int(pc.extra))
LOAD_BLOCK(load_block1, b, b4, COL1, VEC1, TRANS1, pc.p.y, pc.q.y, pc.q.w)

// The fast path: every operand dense or a broadcast scalar, 4 elements an
// invocation. Unsigned indices throughout (offsets are >= 0): with the
// signed ones the other paths use, lavapipe ran the 16M add ~9% slower
// (plugin/raw medians 1.33 against 1.21, ten alternating runs).
void fast_path() {
  const uint n = pc.n;
  const uint j = group_linear() * uint(WG) + gl_LocalInvocationID.x;
  const uint i0 = j * 4u;
  if (i0 >= n) return;
  const uint oa = uint(pc.p.x), ob = uint(pc.p.y), oo = uint(pc.p.z);
  if (!FAST_TAIL || i0 + 4u <= n) {
    CTYPE4(IN_DT) va, vb;
    if (BCAST0) va = CTYPE4(IN_DT)(LD(IN_DT, a.v[oa]));
    else va = LD4(IN_DT, a4.v[oa / 4u + j]);
    if (BCAST1) vb = CTYPE4(IN_DT)(LD(IN_DT, b.v[ob]));
    else vb = LD4(IN_DT, b4.v[ob / 4u + j]);
    CTYPE4(OUT_DT) r = CTYPE4(OUT_DT)(op(va.x, vb.x), op(va.y, vb.y), op(va.z, vb.z), op(va.w, vb.w));
    o4.v[oo / 4u + j] = SV4(OUT_DT, r);
  } else {
    for (uint i = i0; i < n; ++i)
      o.v[oo + i] = SV(OUT_DT, op(LD(IN_DT, a.v[BCAST0 ? oa : oa + i]), LD(IN_DT, b.v[BCAST1 ? ob : ob + i])));
  }
}

// FAST_ONLY (modules <family>_<dtype>_fast, the host's choice whenever MODE
// has the fast bit): main holds the fast path alone. lavapipe compiles every
// path of a module, dead ones included: binary_f32 with all four paths took
// 4-8.6 ms a pipeline, the fast path alone ~0.8 ms.
void main() {
#ifdef FAST_ONLY
  fast_path();
#else
  if (FAST) {
    fast_path();
    return;
  }
  const int n = int(pc.n);
  const int j = int(group_linear()) * WG + int(gl_LocalInvocationID.x);
  const int i0 = j * 4;
  if (BLOCK) {  // its own grid (the check below is for 4 elements per invocation)
    // 4x4 blocks, 4x64 blocks (16x256 elements) per workgroup: each
    // 64-byte line of a transposed operand is read whole by one workgroup
    // (on lavapipe under heavy load 16x256 beat 64x64, 32x128 and 8x512 by
    // 10-30%; with the machine quiet they and the 2-D path were within noise).
    const int W = pc.p.w, R = n / W;
    const int tiles_c = (W + 255) / 256;
    const int g = int(group_linear()), lid = int(gl_LocalInvocationID.x);
    const int r0 = (g / tiles_c) * 16 + (lid / 64) * 4;
    const int c0 = (g % tiles_c) * 256 + (lid % 64) * 4;
    if (r0 >= R || c0 >= W) return;
    CTYPE4(IN_DT) va[4], vb[4];
    load_block0(r0, c0, va);
    load_block1(r0, c0, vb);
    for (int i = 0; i < 4; ++i) {
      CTYPE4(OUT_DT) res;
      for (int c = 0; c < 4; ++c) res[c] = op(va[i][c], vb[i][c]);
      o4.v[(pc.p.z + (r0 + i) * pc.q.z + c0) / 4] = SV4(OUT_DT, res);
    }
    return;
  }
  if (i0 >= n) return;
  if (TWO_D) {
    const int W = pc.p.w;
    const int r = i0 / W;
    const int col = i0 - r * W;
    const int ra = pc.p.x + r * pc.q.x, rb = pc.p.y + r * pc.q.y;
    CTYPE4(IN_DT) va, vb;
    if (COL0) va = CTYPE4(IN_DT)(LD(IN_DT, a.v[ra]));
    else if (VEC0) va = LD4(IN_DT, a4.v[(ra + col) / 4]);
    else {
      const int s = int(pc.extra), b0 = ra + col * s;
      va = CTYPE4(IN_DT)(LD(IN_DT, a.v[b0]), LD(IN_DT, a.v[b0 + s]), LD(IN_DT, a.v[b0 + 2 * s]), LD(IN_DT, a.v[b0 + 3 * s]));
    }
    if (COL1) vb = CTYPE4(IN_DT)(LD(IN_DT, b.v[rb]));
    else if (VEC1) vb = LD4(IN_DT, b4.v[(rb + col) / 4]);
    else {
      const int s = pc.q.w, b0 = rb + col * s;
      vb = CTYPE4(IN_DT)(LD(IN_DT, b.v[b0]), LD(IN_DT, b.v[b0 + s]), LD(IN_DT, b.v[b0 + 2 * s]), LD(IN_DT, b.v[b0 + 3 * s]));
    }
    CTYPE4(OUT_DT) res;
    for (int c = 0; c < 4; ++c) res[c] = op(va[c], vb[c]);
    o4.v[(pc.p.z + r * pc.q.z + col) / 4] = SV4(OUT_DT, res);
    return;
  }
  for (int c = 0; c < 4; ++c) {
    const int i = i0 + c;
    if (i >= n) break;
    int off[NREC];
    elem_offsets(i, off);
    o.v[off[2]] = SV(OUT_DT, op(LD(IN_DT, a.v[off[0]]), LD(IN_DT, b.v[off[1]])));
  }
#endif
}
