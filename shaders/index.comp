#version 450
#extension GL_GOOGLE_include_directive : require
// gather and index_select as one gather: for output element with coordinates
// r, x is read at  x_off + sum r_d*xs_d + idx[i_off + sum r_d*is_d] * x_dim_stride.
// slice_update's write of its update is the same walk turned round (mode 1):
// element r of x (the update) goes to  out_off + sum r_d*os_d + k * dim_stride,
// k = idx[...] in [0, size] (size: the room left along the dim).
// Argument block: [0] rank [1..8] shape [9..16] xs [17..24] is [25..32] out strides
// [33] x offset [34] index offset [35] out offset [36] x (mode 1: out) dim stride
// [37] x dim size (mode 1: the largest start) [38] mode
// Indices are i64 read as int32 pairs; out-of-range raises ERR_INDEX.
#include "common.glsl"

layout(local_size_x = WG) in;

DECL_RO1(2, x, IN_DT)
DECL_IDX(3, idx)
DECL_RW1(4, o, IN_DT)

void main() {
  const int n = int(pc.n);
  const int i0 = int(group_linear()) * WG + int(gl_LocalInvocationID.x);
  if (i0 >= n) return;
  int rem = i0;
  int xo = A(33), io = A(34), oo = A(35);
  for (int d = A(0) - 1; d >= 0; --d) {
    int s = A(1 + d);
    int q = rem / s;
    int r = rem - q * s;
    rem = q;
    xo += r * A(9 + d);
    io += r * A(17 + d);
    oo += r * A(25 + d);
  }
  if (A(38) == 1) {
    ivec2 v = idx.v[io];
    if (v.y != 0 || v.x < 0 || v.x > A(37)) {
      raise_error(ERR_INDEX);
      return;
    }
    o.v[oo + v.x * A(36)] = x.v[xo];
    return;
  }
  int k = norm_index(idx.v[io], A(37));
  if (k < 0) {
    raise_error(ERR_INDEX);
    o.v[oo] = RAWSV(IN_DT, 0);
    return;
  }
  o.v[oo] = x.v[xo + k * A(36)];
}
