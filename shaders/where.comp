#version 450
#extension GL_GOOGLE_include_directive : require
// where(cond, a, b): cond is bool (one byte), a/b/output IN_DT.
#define NREC 4  // cond, a, b, output
#include "common.glsl"
#include "elementwise.glsl"

layout(local_size_x = WG) in;

DECL_RO(2, cnd, DT_BOOL)
DECL_RO(3, a, IN_DT)
DECL_RO(4, b, IN_DT)
DECL_RW(5, o, IN_DT)

void main() {
  const int n = int(pc.n);
  const int j = int(group_linear()) * WG + int(gl_LocalInvocationID.x);
  const int i0 = j * 4;
  if (i0 >= n) return;
  for (int c = 0; c < 4; ++c) {
    const int i = i0 + c;
    if (i >= n) break;
    int off[NREC];
    elem_offsets(i, off);
    o.v[off[3]] = RAWSV(IN_DT, uint(cnd.v[off[0]]) != 0u ? RAWLD(IN_DT, a.v[off[1]]) : RAWLD(IN_DT, b.v[off[2]]));
  }
}
