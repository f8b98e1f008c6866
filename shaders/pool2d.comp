#version 450
#extension GL_GOOGLE_include_directive : require
// max_pool2d (-DPOOL_MAX) and avg_pool2d on a strided NCHW input, one
// invocation per output element (y is dense [N, C, OH, OW]). Window taps
// outside x are skipped: max starts from -inf (an all-padding window gives
// it) and NaN propagates; avg sums in the compute type (f32 for f16/bf16)
// and divides by the taps inside [lo_h, hi_h) x [lo_w, hi_w) of the padded
// input (the padded extent with count_include_pad, else x's own), 0/0 = NaN.
// Argument block: [0] C [1] H [2] W [3] OH [4] OW [5] KH [6] KW [7] stride_h
// [8] stride_w [9] pad_top [10] pad_left [11] dil_h [12] dil_w [13] lo_h
// [14] hi_h [15] lo_w [16] hi_w [17] x_off [18..21] x strides [22] out_off.
#include "common.glsl"

layout(local_size_x = WG) in;

DECL_RO1(2, x, IN_DT)
DECL_RW1(3, o, IN_DT)

#define CT CTYPE(IN_DT)

// Taps k in [0, n) of a window starting at padded position s with r = s +
// k·dil inside [lo, hi).
int taps_inside(int s, int n, int dil, int lo, int hi) {
  int c = 0;
  for (int k = 0; k < n; ++k) {
    const int r = s + k * dil;
    c += (r >= lo && r < hi) ? 1 : 0;
  }
  return c;
}

void main() {
  const uint g = group_linear() * WG + gl_LocalInvocationID.x;
  if (g >= pc.n) return;
  const int C = A(0), H = A(1), W = A(2), OH = A(3), OW = A(4), KH = A(5), KW = A(6);
  const int sh = A(7), sw = A(8), pt = A(9), pl = A(10), dh = A(11), dw = A(12);
  int rest = int(g);
  const int ow = rest % OW;
  rest /= OW;
  const int oh = rest % OH;
  rest /= OH;
  const int ch = rest % C;
  const int n = rest / C;
  const int xs2 = A(20), xs3 = A(21);
  const int base = A(17) + n * A(18) + ch * A(19);
  const int h0 = oh * sh - pt, w0 = ow * sw - pl;  // the window's first tap in x
#ifdef POOL_MAX
  CT acc = CT(-uintBitsToFloat(0x7f800000u));
  bool nan = false;
#else
  CT acc = CT(0);
#endif
  for (int kh = 0; kh < KH; ++kh) {
    const int ih = h0 + kh * dh;
    if (ih < 0 || ih >= H) continue;
    const int row = base + ih * xs2;
    for (int kw = 0; kw < KW; ++kw) {
      const int iw = w0 + kw * dw;
      if (iw < 0 || iw >= W) continue;
      const CT v = LD(IN_DT, x.v[row + iw * xs3]);
#ifdef POOL_MAX
      nan = nan || isnan(v);
      acc = max(acc, v);
#else
      acc += v;
#endif
    }
  }
#ifdef POOL_MAX
  if (nan) acc = CT(uintBitsToFloat(0x7fc00000u));
#else
  const int cnt = taps_inside(oh * sh, KH, dh, A(13), A(14)) * taps_inside(ow * sw, KW, dw, A(15), A(16));
  acc = cnt == 0 ? CT(uintBitsToFloat(0x7fc00000u)) : acc / CT(cnt);  // 0/0, not left to the device
#endif
  o.v[A(22) + int(g)] = SV(IN_DT, acc);
}
