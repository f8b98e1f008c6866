#version 450
#extension GL_GOOGLE_include_directive : require
// scaled_dot_product_attention, for GPUs (a CPU device declines the op and
// the host runs the composed form there): one workgroup per query row
// (batch b, row i), WG invocations. Keys go in tiles of WG: invocation t scores key j0 + t
// (q·k over D, scaled, masked) into shared memory; after a barrier every
// invocation finds the tile's max, invocation t weighs its own key once
// (exp(s - m) into shared memory), and every invocation folds the weights
// into the row's running sum and the output columns it owns (c0 + t + WG·r,
// r < MAXR):
// acc = acc·exp(m_old - m) + Σ_j exp(s_j - m)·v[j][c]. The score row is never
// stored; wider v runs the key loop once per WG·MAXR columns. With causal,
// row i sees keys j <= i + Sk - Sq. Every score -inf gives NaN (as the
// composed softmax does), Sk == 0 zeros. f32 arithmetic for f16/bf16.
// Args: [0] batch dims nb [1] Sq [2] Sk [3] D [4] Dv [5] scale (f32 bits)
// [6] causal [7] has_mask [8..12] q, k, v, mask, y origins [13..22] the
// row and column strides of q, k, v, mask, y (mask: 0 where broadcast);
// then per batch dim (outermost first): its size and the five strides.
#define WG 64
#include "common.glsl"
#include "math.glsl"

layout(local_size_x = WG) in;

DECL_RO1(2, q, IN_DT)
DECL_RO1(3, k, IN_DT)
DECL_RO1(4, v, IN_DT)
DECL_RO1(5, m, IN_DT)
DECL_RW1(6, y, IN_DT)

// The row's operand origins (batch b, row i), from the argument block.
struct Origins {
  int q, k, v, m, y;
};
Origins origins(int row, int Sq) {
  const int nb = A(0);
  int b = row / Sq;
  const int i = row - b * Sq;
  Origins o = Origins(A(8), A(9), A(10), A(11), A(12));
  for (int d = nb - 1; d >= 0; --d) {
    const int at = 23 + 6 * d;
    const int size = A(at), idx = b % size;
    b /= size;
    o.q += idx * A(at + 1);
    o.k += idx * A(at + 2);
    o.v += idx * A(at + 3);
    o.m += idx * A(at + 4);
    o.y += idx * A(at + 5);
  }
  o.q += i * A(13);
  o.m += i * A(19);
  o.y += i * A(21);
  return o;
}

#define MAXR 4
shared float tile[WG];    // the tile's scores
shared float weight[WG];  // exp(score - running max), one per key

void main() {
  const int row = int(group_linear());
  if (row >= int(pc.n)) return;  // the whole workgroup leaves together
  const int t = int(gl_LocalInvocationID.x);
  const int Sq = A(1), Sk = A(2), D = A(3), Dv = A(4);
  const float scale = Af(5);
  const bool causal = A(6) != 0, has_mask = A(7) != 0;
  const Origins o = origins(row, Sq);
  const int i = row % Sq;
  const int qc = A(14), kr = A(15), kc = A(16), vr = A(17), vc = A(18), mc = A(20), yc = A(22);
  const int oq = o.q, ok = o.k, ov = o.v, om = o.m, oy = o.y;
  const int seen = causal ? clamp(i + Sk - Sq + 1, 0, Sk) : Sk;
  const float NEG_INF = -uintBitsToFloat(0x7f800000u), NAN = uintBitsToFloat(0x7fc00000u);
  for (int c0 = 0; c0 < Dv; c0 += WG * MAXR) {
    float mx = NEG_INF, l = 0.0;
    float acc[MAXR];
    for (int r = 0; r < MAXR; ++r) acc[r] = 0.0;
    for (int j0 = 0; j0 < seen; j0 += WG) {
      const int j = j0 + t;
      float s = NEG_INF;
      if (j < seen) {
        float dot = 0.0;
        for (int e = 0; e < D; ++e) dot += float(LD(IN_DT, q.v[oq + e * qc])) * float(LD(IN_DT, k.v[ok + j * kr + e * kc]));
        s = dot * scale;
        if (has_mask) s += float(LD(IN_DT, m.v[om + j * mc]));
      }
      tile[t] = s;
      barrier();
      const int cnt = min(WG, seen - j0);
      float tmax = NEG_INF;
      bool nan = false;
      for (int u = 0; u < cnt; ++u) {
        nan = nan || isnan(tile[u]);
        tmax = max(tmax, tile[u]);
      }
      const float mnew = nan ? NAN : max(mx, tmax);
      // Each key's weight once, by the invocation that scored it.
      const bool any = !(mnew == NEG_INF);  // else nothing seen yet has any weight
      weight[t] = (any && t < cnt) ? exp_f(s - mnew) : 0.0;
      barrier();
      if (any) {
        const float alpha = exp_f(mx - mnew);
        l *= alpha;
        for (int r = 0; r < MAXR; ++r) acc[r] *= alpha;
        for (int u = 0; u < cnt; ++u) {
          const float p = weight[u];
          l += p;
          const int vrow = ov + (j0 + u) * vr;
          for (int r = 0; r < MAXR; ++r) {
            const int c = c0 + t + WG * r;
            if (c < Dv) acc[r] += p * float(LD(IN_DT, v.v[vrow + c * vc]));
          }
        }
        mx = mnew;
      }
      barrier();
    }
    for (int r = 0; r < MAXR; ++r) {
      const int c = c0 + t + WG * r;
      if (c >= Dv) continue;
      // No key at all: zeros (the composed ops' empty sum); keys all hidden
      // (l stays 0): NaN, not left to the device's 0/0.
      const float res = Sk == 0 ? 0.0 : (l == 0.0 || isnan(l)) ? NAN : acc[r] / l;
      y.v[oy + c * yc] = SV(IN_DT, res);
    }
  }
}
