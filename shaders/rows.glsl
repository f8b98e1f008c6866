// Row kernels (reductions, softmax, norms, scans, topk). The input is split
// into rows: "outer" dims index the rows, "inner" dims the elements of one
// row. Argument block:
//   [0]  outer rank  [1..8] shape  [9..16] input strides  [17..24] output strides
//   [25] inner rank  [26..33] shape [34..41] input strides [42..49] output strides
//   [50] input offset [51] output offset [52] inner count [53] outer count
//   params from RPARAMS = 54
// RMODE (specialization constant 1; the push constant pc.extra carries the
// same value): 0 = one workgroup per row, 1 = one invocation per row, and in
// reduce/argreduce 2/3 = the split passes; in reduce/norm (the _sg variants)
// 4 = one subgroup per row (pc.p.x rows per workgroup, no barriers); in
// reduce 5/6/7 = columns (below). A specialization constant, as MODE in
// elementwise.glsl; lavapipe still compiles the dead modes' code, so mode 4
// (_row, _row4) and the columns (_cols) are modules of their own (-D in
// reduce.comp/norm.comp, the name picked in kernels_reduce.cpp).
layout(constant_id = 1) const uint RMODE = 0u;
// RVEC (specialization constant 2): 1 when the elements an invocation loads
// together are contiguous and 4-aligned (the row in mode 4, the invocation's
// 4 columns in modes 5/6), so they come as one 4-vector.
layout(constant_id = 2) const uint RVEC = 0u;
#define RM_GROUP 0u
#define RM_INVOCATION 1u
#define RM_SPLIT 2u
#define RM_SPLIT_FINAL 3u
#define RM_SUBGROUP 4u
// Columns: the kept dims coalesce to one of input stride 1 (a reduction over
// leading dims, e.g. sum over dim 0): invocation t owns output positions
// ("columns") [4 CV t, 4 CV t + 4 CV) (CV in reduce.comp) and walks the
// rows, so neighbouring invocations load neighbouring elements. 5 = all
// rows, 6 = rows [c * R, c * R + R) of
// chunk c = workgroup / pc.p.y into scratch partials [c][column] (R = pc.p.z),
// 7 = the sum of the pc.p.w partials of each column.
#define RM_COLUMNS 5u
#define RM_COLUMNS_SPLIT 6u
#define RM_COLUMNS_FINAL 7u

// -DSG (the _sg variants, for devices whose compute stage has subgroup
// shuffles; the host picks them): workgroup reductions combine within a
// subgroup by shuffles first, so one barrier replaces log2(WG) of them
// (a barrier is costly on lavapipe, which runs a workgroup's invocations as
// coroutines).
#ifdef SG
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#define R_OUTER 0
#define R_INNER 25
#define IN_OFF A(50)
#define OUT_OFF A(51)
#define INNER_N A(52)
#define OUTER_N A(53)
#define RPARAMS 54

void row_offsets(int base, int idx, out int ioff, out int ooff) {
  int rank = A(base);
  if (rank == 1) {
    ioff = idx * A(base + 9);
    ooff = idx * A(base + 17);
    return;
  }
  ioff = 0;
  ooff = 0;
  for (int d = rank - 1; d >= 0; --d) {
    int s = A(base + 1 + d);
    int q = idx / s;
    int r = idx - q * s;
    idx = q;
    ioff += r * A(base + 9 + d);
    ooff += r * A(base + 17 + d);
  }
}

int row_in_stride() { return A(R_INNER) == 1 ? A(R_INNER + 9) : 0; }
