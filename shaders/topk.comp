#version 450
#extension GL_GOOGLE_include_directive : require
// topk along the inner dim of each row, one workgroup per row: k rounds,
// each picking the best element ranked after the previous pick (a total
// order: value, NaN above every number, then lower index first), so the
// output is sorted. Params (RPARAMS +): 0 k, 1 largest, 2 values offset,
// 3 indices offset, 4 output stride of the dim.
// RMODE 1 (k <= 16, many rows; the host's choice on CPU devices; only in
// the variant topk_<dtype>_onepass, -DTOPK_ONEPASS, and the k-round form only
// in topk_<dtype>: lavapipe's compile time grows with all the code of a
// module, branches dead by specialization included: 42 ms for the demo's
// topk with both forms in one module, 2.4 ms without the one-pass form): one
// invocation per row in one pass, keeping its best K in a sorted array (K,
// specialization constant 3, is k, so every index into the array is a
// constant and the array lives in registers; most elements fail the first
// comparison, against the K-th best).
// TOPK_WGMERGE (k <= 16, few rows or a GPU; only in the variant
// topk_<dtype>_wgmerge, neither other form in it): one workgroup of 64 per
// row in one pass. Each invocation keeps the best K of its share of the row
// (LANES below) in K named register slots of rank keys (as the one-pass
// form; 64-bit keys for f64 and i64), sorted; then the WG sorted lists are
// merged in shared memory by a pairwise tree (log2(WG) steps, each list
// pair's top K taken in K constant-index picks). An empty slot (an invocation with
// fewer than K elements) holds the lowest key and index 0x7fffffff, so it
// ranks after every element. WG 64: the lists take WG * 16 keys and indices
// of shared memory, 12 KiB with 64-bit keys (16 KiB is all a device must
// offer).
#if defined(TOPK_WGMERGE) && !defined(WG)
#define WG 64
#endif
#include "common.glsl"
#include "rows.glsl"

layout(local_size_x = WG) in;

DECL_RO1(2, x, IN_DT)
DECL_RW1(3, ov, IN_DT)
DECL_RAW(4, oi, ivec2)

#define CT CTYPE(IN_DT)
bool largest;
#ifndef TOPK_WGMERGE
shared CT shv[WG];
shared int shi[WG];

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
#endif

layout(constant_id = 3) const int K = 1;

#ifdef IN_FC
#define KT uint
KT rank_key(CT v) {
  const uint u = v == 0.0 ? 0u : floatBitsToUint(v);
  const uint k = isnan(v) ? 0xffffffffu : (u & 0x80000000u) != 0u ? ~u : u | 0x80000000u;
  return largest ? k : ~k;
}
#elif defined(IN_IC)
#define KT int
KT rank_key(CT v) { return largest ? v : ~v; }
#endif
#ifdef TOPK_WGMERGE
// 64-bit keys (the merge form only): f64 as two words, high first, made
// monotonic as the 32-bit float key (NaN highest, -0 as +0); i64 as it is.
#if defined(IN_DC)
#define KT uvec2
KT rank_key(CT v) {
  const uvec2 u = v == 0.0LF ? uvec2(0u) : unpackDouble2x32(v).yx;
  const uvec2 k = isnan(v) ? uvec2(0xffffffffu) : (u.x & 0x80000000u) != 0u ? ~u : uvec2(u.x | 0x80000000u, u.y);
  return largest ? k : ~k;
}
bool key_gt(KT a, KT b) { return a.x != b.x ? a.x > b.x : a.y > b.y; }
#define KEY_NONE uvec2(0u)
#elif defined(IN_LC)
#define KT int64_t
KT rank_key(CT v) { return largest ? v : ~v; }
#define KEY_NONE (-9223372036854775807L - 1L)
#elif defined(IN_FC)
#define KEY_NONE 0u
#else
#define KEY_NONE (-2147483647 - 1)
#endif
#ifndef IN_DC
bool key_gt(KT a, KT b) { return a > b; }
#endif
#elif defined(KT)
// Orders the pair (a before b) when b's key is higher.
void key_swap(inout KT ka, inout int xa, inout KT kb, inout int xb) {
  const bool s = kb > ka;
  const KT tk = ka;
  const int tx = xa;
  ka = s ? kb : ka;
  xa = s ? xb : xa;
  kb = s ? tk : kb;
  xb = s ? tx : xb;
}
#endif

#ifdef TOPK_WGMERGE
// LANES (specialization constant 4; a power of 2 dividing WG, the host
// gives the subgroup size): the row is cut into WG / LANES contiguous pieces,
// one per LANES invocations, which read it interleaved (invocation t of a
// piece: its elements t, t + LANES, ...). So a subgroup's lanes read
// neighbouring elements together (coalesced on a GPU), and each subgroup
// streams a piece of its own (lavapipe runs a workgroup's subgroups one
// after another up to a barrier: shares strided by WG had each one stream
// the whole row for a few bytes of every cache line, 2-3x slower).
layout(constant_id = 4) const int LANES = WG;
#define NONE_X 0x7fffffff
shared KT mk[WG * 16];
shared int mx[WG * 16];
// This invocation's best K, best first (k0/x0); named slots, every index a
// constant (registers), the guards on K constants after specialization.
KT k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15;
int x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15;
// Whether (ka, xa) ranks before (kb, xb): the higher key, then the lower index.
bool key_before(KT ka, int xa, KT kb, int xb) { return key_gt(ka, kb) || (ka == kb && xa < xb); }
void rank_swap(inout KT ka, inout int xa, inout KT kb, inout int xb) {
  const bool s = key_before(kb, xb, ka, xa);
  const KT tk = ka;
  const int tx = xa;
  ka = s ? kb : ka;
  xa = s ? xb : xa;
  kb = s ? tk : kb;
  xb = s ? tx : xb;
}
#define WM_SET(j) if (K - 1 == j) { k##j = kv; x##j = i; }
#define WM_SWAP(a, b) if (K > b) rank_swap(k##a, x##a, k##b, x##b);
// (kv, i) replaces the K-th best (the caller saw it rank before it) and
// moves up to its place. The full order (key, then index): an element equal
// to an empty slot's key goes before it.
void insert(KT kv, int i) {
  WM_SET(0) WM_SET(1) WM_SET(2) WM_SET(3) WM_SET(4) WM_SET(5) WM_SET(6) WM_SET(7)
  WM_SET(8) WM_SET(9) WM_SET(10) WM_SET(11) WM_SET(12) WM_SET(13) WM_SET(14) WM_SET(15)
  WM_SWAP(14, 15) WM_SWAP(13, 14) WM_SWAP(12, 13) WM_SWAP(11, 12) WM_SWAP(10, 11) WM_SWAP(9, 10) WM_SWAP(8, 9)
  WM_SWAP(7, 8) WM_SWAP(6, 7) WM_SWAP(5, 6) WM_SWAP(4, 5) WM_SWAP(3, 4) WM_SWAP(2, 3) WM_SWAP(1, 2) WM_SWAP(0, 1)
}
// The K-th key: the bar to enter.
KT kth() {
  return (K - 1 == 15 ? k15 : (K - 1 == 14 ? k14 : (K - 1 == 13 ? k13 : (K - 1 == 12 ? k12 : (K - 1 == 11 ? k11 : (K - 1 == 10 ? k10 : (K - 1 == 9 ? k9 : (K - 1 == 8 ? k8 : (K - 1 == 7 ? k7 : (K - 1 == 6 ? k6 : (K - 1 == 5 ? k5 : (K - 1 == 4 ? k4 : (K - 1 == 3 ? k3 : (K - 1 == 2 ? k2 : (K - 1 == 1 ? k1 : k0)))))))))))))));
}
#define WM_STORE(j) if (K > j) { mk[at + j] = k##j; mx[at + j] = x##j; }
// The slots into shared memory at `at`.
void store_list(int at) {
  WM_STORE(0) WM_STORE(1) WM_STORE(2) WM_STORE(3) WM_STORE(4) WM_STORE(5) WM_STORE(6) WM_STORE(7)
  WM_STORE(8) WM_STORE(9) WM_STORE(10) WM_STORE(11) WM_STORE(12) WM_STORE(13) WM_STORE(14) WM_STORE(15)
}
// Pick j of a merge: the better head of the lists at a and b. Neither head
// passes its list's end: after j picks, each list gave at most j < K.
#define WM_PICK(j)                                          \
  if (K > j) {                                              \
    const KT ka = mk[a], kb = mk[b];                        \
    const int xa = mx[a], xb = mx[b];                       \
    const bool t = key_before(ka, xa, kb, xb);              \
    k##j = t ? ka : kb;                                     \
    x##j = t ? xa : xb;                                     \
    a += t ? 1 : 0;                                         \
    b += t ? 0 : 1;                                         \
  }
// The top K of the sorted lists at a and b (shared memory) into the slots.
void merge_lists(int a, int b) {
  WM_PICK(0) WM_PICK(1) WM_PICK(2) WM_PICK(3) WM_PICK(4) WM_PICK(5) WM_PICK(6) WM_PICK(7)
  WM_PICK(8) WM_PICK(9) WM_PICK(10) WM_PICK(11) WM_PICK(12) WM_PICK(13) WM_PICK(14) WM_PICK(15)
}
#endif

void main() {
  const int rows = int(pc.n);
  const int n = INNER_N;
  const uint lid = gl_LocalInvocationID.x;
#ifdef TOPK_ONEPASS
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
#if defined(IN_FC) || defined(IN_IC)
    // 32-bit keys ordered as the ranking (higher is better: a float's bits
    // made monotonic, NaN highest, -0 as +0; integers as they are; both
    // complemented for the smallest), so a comparison is one integer compare
    // and ties go to the lower index, already in the array. The first K
    // elements fill it; later ones enter only above the K-th key. Values are
    // read back by index at the end.
    // K <= 16 named slots (k0/x0 best first): every index is a constant, so
    // they stay in registers (an array indexed in a loop went to memory on
    // lavapipe). Guards on K are constants after specialization.
    KT k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15;
    int x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15;
    if (K > 0) { int ii = 0 * st, iu; if (!simple) row_offsets(R_INNER, 0, ii, iu); k0 = rank_key(LD(IN_DT, x.v[base + ii])); x0 = 0; }
    if (K > 1) { int ii = 1 * st, iu; if (!simple) row_offsets(R_INNER, 1, ii, iu); k1 = rank_key(LD(IN_DT, x.v[base + ii])); x1 = 1; }
    if (K > 2) { int ii = 2 * st, iu; if (!simple) row_offsets(R_INNER, 2, ii, iu); k2 = rank_key(LD(IN_DT, x.v[base + ii])); x2 = 2; }
    if (K > 3) { int ii = 3 * st, iu; if (!simple) row_offsets(R_INNER, 3, ii, iu); k3 = rank_key(LD(IN_DT, x.v[base + ii])); x3 = 3; }
    if (K > 4) { int ii = 4 * st, iu; if (!simple) row_offsets(R_INNER, 4, ii, iu); k4 = rank_key(LD(IN_DT, x.v[base + ii])); x4 = 4; }
    if (K > 5) { int ii = 5 * st, iu; if (!simple) row_offsets(R_INNER, 5, ii, iu); k5 = rank_key(LD(IN_DT, x.v[base + ii])); x5 = 5; }
    if (K > 6) { int ii = 6 * st, iu; if (!simple) row_offsets(R_INNER, 6, ii, iu); k6 = rank_key(LD(IN_DT, x.v[base + ii])); x6 = 6; }
    if (K > 7) { int ii = 7 * st, iu; if (!simple) row_offsets(R_INNER, 7, ii, iu); k7 = rank_key(LD(IN_DT, x.v[base + ii])); x7 = 7; }
    if (K > 8) { int ii = 8 * st, iu; if (!simple) row_offsets(R_INNER, 8, ii, iu); k8 = rank_key(LD(IN_DT, x.v[base + ii])); x8 = 8; }
    if (K > 9) { int ii = 9 * st, iu; if (!simple) row_offsets(R_INNER, 9, ii, iu); k9 = rank_key(LD(IN_DT, x.v[base + ii])); x9 = 9; }
    if (K > 10) { int ii = 10 * st, iu; if (!simple) row_offsets(R_INNER, 10, ii, iu); k10 = rank_key(LD(IN_DT, x.v[base + ii])); x10 = 10; }
    if (K > 11) { int ii = 11 * st, iu; if (!simple) row_offsets(R_INNER, 11, ii, iu); k11 = rank_key(LD(IN_DT, x.v[base + ii])); x11 = 11; }
    if (K > 12) { int ii = 12 * st, iu; if (!simple) row_offsets(R_INNER, 12, ii, iu); k12 = rank_key(LD(IN_DT, x.v[base + ii])); x12 = 12; }
    if (K > 13) { int ii = 13 * st, iu; if (!simple) row_offsets(R_INNER, 13, ii, iu); k13 = rank_key(LD(IN_DT, x.v[base + ii])); x13 = 13; }
    if (K > 14) { int ii = 14 * st, iu; if (!simple) row_offsets(R_INNER, 14, ii, iu); k14 = rank_key(LD(IN_DT, x.v[base + ii])); x14 = 14; }
    if (K > 15) { int ii = 15 * st, iu; if (!simple) row_offsets(R_INNER, 15, ii, iu); k15 = rank_key(LD(IN_DT, x.v[base + ii])); x15 = 15; }
    // A stable sort of the first K (a strict comparison keeps ties in index order).
    if (K > 1) {
      key_swap(k0, x0, k1, x1);
    }
    if (K > 2) {
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 3) {
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 4) {
      key_swap(k3, x3, k4, x4);
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 5) {
      key_swap(k4, x4, k5, x5);
      key_swap(k3, x3, k4, x4);
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 6) {
      key_swap(k5, x5, k6, x6);
      key_swap(k4, x4, k5, x5);
      key_swap(k3, x3, k4, x4);
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 7) {
      key_swap(k6, x6, k7, x7);
      key_swap(k5, x5, k6, x6);
      key_swap(k4, x4, k5, x5);
      key_swap(k3, x3, k4, x4);
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 8) {
      key_swap(k7, x7, k8, x8);
      key_swap(k6, x6, k7, x7);
      key_swap(k5, x5, k6, x6);
      key_swap(k4, x4, k5, x5);
      key_swap(k3, x3, k4, x4);
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 9) {
      key_swap(k8, x8, k9, x9);
      key_swap(k7, x7, k8, x8);
      key_swap(k6, x6, k7, x7);
      key_swap(k5, x5, k6, x6);
      key_swap(k4, x4, k5, x5);
      key_swap(k3, x3, k4, x4);
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 10) {
      key_swap(k9, x9, k10, x10);
      key_swap(k8, x8, k9, x9);
      key_swap(k7, x7, k8, x8);
      key_swap(k6, x6, k7, x7);
      key_swap(k5, x5, k6, x6);
      key_swap(k4, x4, k5, x5);
      key_swap(k3, x3, k4, x4);
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 11) {
      key_swap(k10, x10, k11, x11);
      key_swap(k9, x9, k10, x10);
      key_swap(k8, x8, k9, x9);
      key_swap(k7, x7, k8, x8);
      key_swap(k6, x6, k7, x7);
      key_swap(k5, x5, k6, x6);
      key_swap(k4, x4, k5, x5);
      key_swap(k3, x3, k4, x4);
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 12) {
      key_swap(k11, x11, k12, x12);
      key_swap(k10, x10, k11, x11);
      key_swap(k9, x9, k10, x10);
      key_swap(k8, x8, k9, x9);
      key_swap(k7, x7, k8, x8);
      key_swap(k6, x6, k7, x7);
      key_swap(k5, x5, k6, x6);
      key_swap(k4, x4, k5, x5);
      key_swap(k3, x3, k4, x4);
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 13) {
      key_swap(k12, x12, k13, x13);
      key_swap(k11, x11, k12, x12);
      key_swap(k10, x10, k11, x11);
      key_swap(k9, x9, k10, x10);
      key_swap(k8, x8, k9, x9);
      key_swap(k7, x7, k8, x8);
      key_swap(k6, x6, k7, x7);
      key_swap(k5, x5, k6, x6);
      key_swap(k4, x4, k5, x5);
      key_swap(k3, x3, k4, x4);
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 14) {
      key_swap(k13, x13, k14, x14);
      key_swap(k12, x12, k13, x13);
      key_swap(k11, x11, k12, x12);
      key_swap(k10, x10, k11, x11);
      key_swap(k9, x9, k10, x10);
      key_swap(k8, x8, k9, x9);
      key_swap(k7, x7, k8, x8);
      key_swap(k6, x6, k7, x7);
      key_swap(k5, x5, k6, x6);
      key_swap(k4, x4, k5, x5);
      key_swap(k3, x3, k4, x4);
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    if (K > 15) {
      key_swap(k14, x14, k15, x15);
      key_swap(k13, x13, k14, x14);
      key_swap(k12, x12, k13, x13);
      key_swap(k11, x11, k12, x12);
      key_swap(k10, x10, k11, x11);
      key_swap(k9, x9, k10, x10);
      key_swap(k8, x8, k9, x9);
      key_swap(k7, x7, k8, x8);
      key_swap(k6, x6, k7, x7);
      key_swap(k5, x5, k6, x6);
      key_swap(k4, x4, k5, x5);
      key_swap(k3, x3, k4, x4);
      key_swap(k2, x2, k3, x3);
      key_swap(k1, x1, k2, x2);
      key_swap(k0, x0, k1, x1);
    }
    KT kt = (K - 1 == 15 ? k15 : (K - 1 == 14 ? k14 : (K - 1 == 13 ? k13 : (K - 1 == 12 ? k12 : (K - 1 == 11 ? k11 : (K - 1 == 10 ? k10 : (K - 1 == 9 ? k9 : (K - 1 == 8 ? k8 : (K - 1 == 7 ? k7 : (K - 1 == 6 ? k6 : (K - 1 == 5 ? k5 : (K - 1 == 4 ? k4 : (K - 1 == 3 ? k3 : (K - 1 == 2 ? k2 : (K - 1 == 1 ? k1 : k0)))))))))))))));  // the K-th key: the bar to enter
    // Blocks of 16: the keys are compared with the bar first, and only the
    // elements above it are inserted, in a loop that every lane leaves at
    // once when none is (lavapipe runs both sides of a branch under a lane
    // mask; a loop with no lane left ends).
    for (int i0 = K; i0 < n; i0 += 16) {
      uint pend = 0u;
      for (int e = 0; e < 16; ++e) {
        const int i = min(i0 + e, n - 1);
        int ii = i * st, iu;
        if (!simple) row_offsets(R_INNER, i, ii, iu);
        pend |= (i0 + e < n && rank_key(LD(IN_DT, x.v[base + ii])) > kt) ? 1u << e : 0u;
      }
      while (pend != 0u) {
        const int i = i0 + findLSB(pend);
        pend &= pend - 1u;
        int ii = i * st, iu;
        if (!simple) row_offsets(R_INNER, i, ii, iu);
        const KT kv = rank_key(LD(IN_DT, x.v[base + ii]));
        if (kv <= kt) continue;  // the bar rose since
        if (K - 1 == 0) { k0 = kv; x0 = i; }
        if (K - 1 == 1) { k1 = kv; x1 = i; }
        if (K - 1 == 2) { k2 = kv; x2 = i; }
        if (K - 1 == 3) { k3 = kv; x3 = i; }
        if (K - 1 == 4) { k4 = kv; x4 = i; }
        if (K - 1 == 5) { k5 = kv; x5 = i; }
        if (K - 1 == 6) { k6 = kv; x6 = i; }
        if (K - 1 == 7) { k7 = kv; x7 = i; }
        if (K - 1 == 8) { k8 = kv; x8 = i; }
        if (K - 1 == 9) { k9 = kv; x9 = i; }
        if (K - 1 == 10) { k10 = kv; x10 = i; }
        if (K - 1 == 11) { k11 = kv; x11 = i; }
        if (K - 1 == 12) { k12 = kv; x12 = i; }
        if (K - 1 == 13) { k13 = kv; x13 = i; }
        if (K - 1 == 14) { k14 = kv; x14 = i; }
        if (K - 1 == 15) { k15 = kv; x15 = i; }
        if (K > 15) key_swap(k14, x14, k15, x15);
        if (K > 14) key_swap(k13, x13, k14, x14);
        if (K > 13) key_swap(k12, x12, k13, x13);
        if (K > 12) key_swap(k11, x11, k12, x12);
        if (K > 11) key_swap(k10, x10, k11, x11);
        if (K > 10) key_swap(k9, x9, k10, x10);
        if (K > 9) key_swap(k8, x8, k9, x9);
        if (K > 8) key_swap(k7, x7, k8, x8);
        if (K > 7) key_swap(k6, x6, k7, x7);
        if (K > 6) key_swap(k5, x5, k6, x6);
        if (K > 5) key_swap(k4, x4, k5, x5);
        if (K > 4) key_swap(k3, x3, k4, x4);
        if (K > 3) key_swap(k2, x2, k3, x3);
        if (K > 2) key_swap(k1, x1, k2, x2);
        if (K > 1) key_swap(k0, x0, k1, x1);
        kt = (K - 1 == 15 ? k15 : (K - 1 == 14 ? k14 : (K - 1 == 13 ? k13 : (K - 1 == 12 ? k12 : (K - 1 == 11 ? k11 : (K - 1 == 10 ? k10 : (K - 1 == 9 ? k9 : (K - 1 == 8 ? k8 : (K - 1 == 7 ? k7 : (K - 1 == 6 ? k6 : (K - 1 == 5 ? k5 : (K - 1 == 4 ? k4 : (K - 1 == 3 ? k3 : (K - 1 == 2 ? k2 : (K - 1 == 1 ? k1 : k0)))))))))))))));
      }
    }
    if (K > 0) { int ii = x0 * st, iu; if (!simple) row_offsets(R_INNER, x0, ii, iu); ov.v[vo + ob + 0 * ost] = x.v[base + ii]; oi.v[io + ob + 0 * ost] = ivec2(x0, 0); }
    if (K > 1) { int ii = x1 * st, iu; if (!simple) row_offsets(R_INNER, x1, ii, iu); ov.v[vo + ob + 1 * ost] = x.v[base + ii]; oi.v[io + ob + 1 * ost] = ivec2(x1, 0); }
    if (K > 2) { int ii = x2 * st, iu; if (!simple) row_offsets(R_INNER, x2, ii, iu); ov.v[vo + ob + 2 * ost] = x.v[base + ii]; oi.v[io + ob + 2 * ost] = ivec2(x2, 0); }
    if (K > 3) { int ii = x3 * st, iu; if (!simple) row_offsets(R_INNER, x3, ii, iu); ov.v[vo + ob + 3 * ost] = x.v[base + ii]; oi.v[io + ob + 3 * ost] = ivec2(x3, 0); }
    if (K > 4) { int ii = x4 * st, iu; if (!simple) row_offsets(R_INNER, x4, ii, iu); ov.v[vo + ob + 4 * ost] = x.v[base + ii]; oi.v[io + ob + 4 * ost] = ivec2(x4, 0); }
    if (K > 5) { int ii = x5 * st, iu; if (!simple) row_offsets(R_INNER, x5, ii, iu); ov.v[vo + ob + 5 * ost] = x.v[base + ii]; oi.v[io + ob + 5 * ost] = ivec2(x5, 0); }
    if (K > 6) { int ii = x6 * st, iu; if (!simple) row_offsets(R_INNER, x6, ii, iu); ov.v[vo + ob + 6 * ost] = x.v[base + ii]; oi.v[io + ob + 6 * ost] = ivec2(x6, 0); }
    if (K > 7) { int ii = x7 * st, iu; if (!simple) row_offsets(R_INNER, x7, ii, iu); ov.v[vo + ob + 7 * ost] = x.v[base + ii]; oi.v[io + ob + 7 * ost] = ivec2(x7, 0); }
    if (K > 8) { int ii = x8 * st, iu; if (!simple) row_offsets(R_INNER, x8, ii, iu); ov.v[vo + ob + 8 * ost] = x.v[base + ii]; oi.v[io + ob + 8 * ost] = ivec2(x8, 0); }
    if (K > 9) { int ii = x9 * st, iu; if (!simple) row_offsets(R_INNER, x9, ii, iu); ov.v[vo + ob + 9 * ost] = x.v[base + ii]; oi.v[io + ob + 9 * ost] = ivec2(x9, 0); }
    if (K > 10) { int ii = x10 * st, iu; if (!simple) row_offsets(R_INNER, x10, ii, iu); ov.v[vo + ob + 10 * ost] = x.v[base + ii]; oi.v[io + ob + 10 * ost] = ivec2(x10, 0); }
    if (K > 11) { int ii = x11 * st, iu; if (!simple) row_offsets(R_INNER, x11, ii, iu); ov.v[vo + ob + 11 * ost] = x.v[base + ii]; oi.v[io + ob + 11 * ost] = ivec2(x11, 0); }
    if (K > 12) { int ii = x12 * st, iu; if (!simple) row_offsets(R_INNER, x12, ii, iu); ov.v[vo + ob + 12 * ost] = x.v[base + ii]; oi.v[io + ob + 12 * ost] = ivec2(x12, 0); }
    if (K > 13) { int ii = x13 * st, iu; if (!simple) row_offsets(R_INNER, x13, ii, iu); ov.v[vo + ob + 13 * ost] = x.v[base + ii]; oi.v[io + ob + 13 * ost] = ivec2(x13, 0); }
    if (K > 14) { int ii = x14 * st, iu; if (!simple) row_offsets(R_INNER, x14, ii, iu); ov.v[vo + ob + 14 * ost] = x.v[base + ii]; oi.v[io + ob + 14 * ost] = ivec2(x14, 0); }
    if (K > 15) { int ii = x15 * st, iu; if (!simple) row_offsets(R_INNER, x15, ii, iu); ov.v[vo + ob + 15 * ost] = x.v[base + ii]; oi.v[io + ob + 15 * ost] = ivec2(x15, 0); }
    return;
#else
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
#endif
  }
#elif defined(TOPK_WGMERGE)
  const int row = int(group_linear());
  if (row >= rows) return;
  largest = A(RPARAMS + 1) != 0;
  const int vo = A(RPARAMS + 2), io = A(RPARAMS + 3), ost = A(RPARAMS + 4);
  int ib, ob;
  row_offsets(R_OUTER, row, ib, ob);
  const int base = IN_OFF + ib;
  // Element i at i * st: the inner dims are topk's dim alone (rank 1), or
  // none when it has one element (rank 0, stride word 0, i == 0), so no
  // row_offsets (each inlined copy of its loop costs compile time).
  const int st = A(R_INNER + 9);
  k0 = k1 = k2 = k3 = k4 = k5 = k6 = k7 = k8 = k9 = k10 = k11 = k12 = k13 = k14 = k15 = KEY_NONE;
  x0 = x1 = x2 = x3 = x4 = x5 = x6 = x7 = x8 = x9 = x10 = x11 = x12 = x13 = x14 = x15 = NONE_X;
  // This invocation's share (LANES): elements start, start + step, ...
  // before end.
  const int piece = (n + WG / LANES - 1) / (WG / LANES);
  const int step = LANES;
  const int start = int(lid) / LANES * piece + int(lid) % LANES;
  const int end = min(int(lid) / LANES * piece + piece, n);
  // Blocks of 16 of its elements as in the one-pass form: the keys compared
  // with the bar (the K-th key) first, the few above it inserted after, in a
  // loop that every lane leaves at once when none is. An element equal to
  // the bar does not enter (the one there has a lower index). The first
  // block's first K elements enter whatever their key (each goes before an
  // empty slot, which an equal key would not pass); one call of insert() in
  // all (lavapipe's compile time grows with every copy).
  KT kt = KEY_NONE;
  for (int i0 = start; i0 < end; i0 += 16 * step) {
    const bool first = i0 == start;
    uint pend = 0u;
    for (int e = 0; e < 16; ++e) {
      const int i = min(i0 + e * step, end - 1);
      const int ii = i * st;
      pend |= (i0 + e * step < end && ((first && e < K) || key_gt(rank_key(LD(IN_DT, x.v[base + ii])), kt))) ? 1u << e : 0u;
    }
    while (pend != 0u) {
      const int e = findLSB(pend);
      const int i = i0 + e * step;
      pend &= pend - 1u;
      const int ii = i * st;
      const KT kv = rank_key(LD(IN_DT, x.v[base + ii]));
      if (!(first && e < K) && !key_gt(kv, kt)) continue;  // the bar rose since
      insert(kv, i);
      kt = kth();
    }
  }
  // The tree merge: at step s, invocation t (a multiple of 2s) merges its
  // list with list t + s into its own place (no other invocation reads or
  // writes list t in that step).
  const int me = int(lid) * K;
  store_list(me);
  for (int s = 1; s < WG; s <<= 1) {
    barrier();
    if ((int(lid) & (2 * s - 1)) == 0) {
      merge_lists(me, me + s * K);
      store_list(me);
    }
  }
  if (lid != 0u) return;
  // The values read back by index (the element itself: -0 stays -0).
#define WM_OUT(j)                                                            \
  if (K > j) {                                                               \
    ov.v[vo + ob + j * ost] = x.v[base + x##j * st];                         \
    oi.v[io + ob + j * ost] = ivec2(x##j, 0);                                \
  }
  WM_OUT(0) WM_OUT(1) WM_OUT(2) WM_OUT(3) WM_OUT(4) WM_OUT(5) WM_OUT(6) WM_OUT(7)
  WM_OUT(8) WM_OUT(9) WM_OUT(10) WM_OUT(11) WM_OUT(12) WM_OUT(13) WM_OUT(14) WM_OUT(15)
#else
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
#endif
}
