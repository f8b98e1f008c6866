#version 450
#extension GL_GOOGLE_include_directive : require
// Direct 2-D convolution on dense NCHW input and OIHW weights, one output
// element per invocation. Argument block: [0] N [1] C [2] H [3] W [4] O
// [5] OH [6] OW [7] KH [8] KW [9] stride_h [10] stride_w [11] pad_top
// [12] pad_left [13] dil_h [14] dil_w [15] groups [16] x_off [17] w_off
// [18] bias_off [19] out_off [20] has_bias.
#include "common.glsl"

layout(local_size_x = WG) in;

DECL_RO1(2, x, IN_DT)
DECL_RO1(3, w, IN_DT)
DECL_RO1(4, bias, IN_DT)
DECL_RW1(5, o, IN_DT)

#define CT CTYPE(IN_DT)

void main() {
  const int total = int(pc.n);
  const int e = int(group_linear()) * WG + int(gl_LocalInvocationID.x);
  if (e >= total) return;
  const int C = A(1), H = A(2), W = A(3), O = A(4), OH = A(5), OW = A(6), KH = A(7), KW = A(8);
  const int sh = A(9), sw = A(10), ph = A(11), pw = A(12), dh = A(13), dw = A(14), groups = A(15);
  const int ow = e % OW;
  const int oh = (e / OW) % OH;
  const int oc = (e / (OW * OH)) % O;
  const int n = e / (OW * OH * O);
  const int cg = C / groups;
  const int g = oc / (O / groups);
  CT acc = A(20) != 0 ? LD(IN_DT, bias[A(18) + oc]) : CT(0);
  const int xo = A(16), wo = A(17);
  for (int c = 0; c < cg; ++c) {
    const int ci = g * cg + c;
    const int xbase = xo + (n * C + ci) * H * W;
    const int wbase = wo + (oc * cg + c) * KH * KW;
    for (int kh = 0; kh < KH; ++kh) {
      const int ih = oh * sh - ph + kh * dh;
      if (ih < 0 || ih >= H) continue;
      for (int kw = 0; kw < KW; ++kw) {
        const int iw = ow * sw - pw + kw * dw;
        if (iw < 0 || iw >= W) continue;
        acc += LD(IN_DT, x[xbase + ih * W + iw]) * LD(IN_DT, w[wbase + kh * KW + kw]);
      }
    }
  }
  o[A(19) + e] = SV(IN_DT, acc);
}
