// Element offsets for elementwise shaders. Argument block:
//   [0] rank  [1] flags (bit 0: fast path; the fast path itself reads
//   MODE / pc.p instead)  [2..9] shape
//   [10 + 9k] offset of record k, [11 + 9k ..] its 8 strides
//   params from PARAMS = 10 + 9 * NREC
// NREC (records: inputs, then the output where it is strided) must be defined.

// MODE (specialization constant 1, chosen by the host per dispatch):
//   0      the general path: any strides, offsets from the argument block;
//   bit 0  the fast path: every operand dense (stride 1, offset a multiple of
//          4) or a broadcast scalar, offsets in pc.p, 4-vector loads/stores;
//   bit 1+k  input k is a broadcast scalar (fast path);
//   bit 8  n is not a multiple of 4: the last invocation has a partial
//          4-vector (fast path).
// A specialization constant rather than a push-constant flag so that the path
// not taken is compiled out: lavapipe (Mesa 22.3) runs both sides of every
// branch under a lane mask, and the general path's mere presence slowed the
// fast path of a 16M add by ~20%.
layout(constant_id = 1) const uint MODE = 0u;
const bool FAST = (MODE & 1u) != 0u;
const bool BCAST0 = (MODE & 2u) != 0u;
const bool BCAST1 = (MODE & 4u) != 0u;
const bool FAST_TAIL = (MODE & 256u) != 0u;
// The 2-D path (binary ops, bit 9): two coalesced dims, rows of W = pc.p.w
// elements (W % 4 == 0, so an invocation's 4 elements share a row), the
// output dense along a row. Operand k's offset is pc.p[k], its row stride
// pc.q[k]; its stride along a row is 0 (bit 10 + k: one value per row, a
// column broadcast), 1 (bit 12 + k: 4-vector loads) or any other (input 0:
// pc.extra, input 1: pc.q.w; 4 scalar loads, e.g. a transposed operand).
// Row and column broadcasts and transposes skip the general path's per-element
// divisions and argument-block reads.
const bool TWO_D = (MODE & 512u) != 0u;
const bool COL0 = (MODE & 1024u) != 0u;
const bool COL1 = (MODE & 2048u) != 0u;
const bool VEC0 = (MODE & 4096u) != 0u;
const bool VEC1 = (MODE & 8192u) != 0u;
// The 2-D block path (bit 16, with bit 9): each invocation a 4x4 block, a
// workgroup 16x256 elements (rows R = n / W, both multiples of 4); input k
// with bit 14 + k set is a dense column (row stride 1, stride along a row
// a multiple of 4: a transposed operand), read by 4-vectors down columns.
const bool BLOCK = (MODE & 65536u) != 0u;
const bool TRANS0 = (MODE & 16384u) != 0u;
const bool TRANS1 = (MODE & 32768u) != 0u;
#define PARAMS (10 + 9 * NREC)
#define REC_OFF(k) A(10 + 9 * (k))
#define REC_STRIDE(k, d) A(11 + 9 * (k) + (d))

void elem_offsets(int i, out int off[NREC]) {
  for (int k = 0; k < NREC; ++k) off[k] = REC_OFF(k);
  int rank = A(0);
  for (int d = rank - 1; d >= 0; --d) {
    int s = A(2 + d);
    int q = i / s;
    int r = i - q * s;
    i = q;
    for (int k = 0; k < NREC; ++k) off[k] += r * REC_STRIDE(k, d);
  }
}

// Scalar params of the compute type of IN_DT, word index i from PARAMS.
#ifdef IN_DT
#if defined(IN_FC)
float param_in(int i) { return intBitsToFloat(A(PARAMS + i)); }
#define PWORDS 1
#elif defined(IN_DC)
double param_in(int i) { return packDouble2x32(uvec2(uint(A(PARAMS + i)), uint(A(PARAMS + i + 1)))); }
#define PWORDS 2
#elif defined(IN_LC)
int64_t param_in(int i) {
  return int64_t(uint64_t(uint(A(PARAMS + i))) | (uint64_t(uint(A(PARAMS + i + 1))) << 32));
}
#define PWORDS 2
#else
int param_in(int i) { return A(PARAMS + i); }
#define PWORDS 1
#endif
#endif
