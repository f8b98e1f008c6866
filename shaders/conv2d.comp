#version 450
#extension GL_GOOGLE_include_directive : require
// 2-D convolution on dense NCHW input and OIHW weights as an implicit GEMM per
// group: C[m, oc] = sum_k im2col(x)[m, k] w[oc, k] with m = (n, oh, ow) and
// k = (c, kh, kw), tiled like matmul.comp (64x64 outputs per workgroup, K in
// steps of 16 through shared memory); im2col is never materialised.
// Argument block: [0] N [1] C [2] H [3] W [4] O [5] OH [6] OW [7] KH [8] KW
// [9] stride_h [10] stride_w [11] pad_top [12] pad_left [13] dil_h [14] dil_w
// [15] groups [16] x_off [17] w_off [18] bias_off [19] out_off [20] has_bias.
#include "common.glsl"

#define BM 64
#define BN 64
#define BK 16
// The direct form (DIRECT_FORM, below) runs 64 invocations per workgroup:
// its blocks are big, and a mid-size problem should still make several
// workgroups for the CPU's threads.
#ifdef DIRECT_FORM
#define DIRECT_WG 64
layout(local_size_x = DIRECT_WG) in;
#else
layout(local_size_x = 256) in;
#endif

DECL_RO1(2, x, IN_DT)
DECL_RO1(3, w, IN_DT)
DECL_RO1(4, bias, IN_DT)
DECL_RW1(5, o, IN_DT)

#define CT CTYPE(IN_DT)
shared CT As[BK][BM];
shared CT Bs[BK][BN];

#ifndef DIRECT_FORM
void main() {
  const int N = A(0), C = A(1), H = A(2), W = A(3), O = A(4), OH = A(5), OW = A(6), KH = A(7), KW = A(8);
  const int sh = A(9), sw = A(10), ph = A(11), pw = A(12), dh = A(13), dw = A(14), groups = A(15);
  const int cg = C / groups, og = O / groups;
  const int M = N * OH * OW, K = cg * KH * KW, khw = KH * KW, ohw = OH * OW;
  const int tiles_n = (og + BN - 1) / BN, tiles_m = (M + BM - 1) / BM;
  const int g = int(group_linear());
  const int tn = g % tiles_n;
  const int tm = (g / tiles_n) % tiles_m;
  const int grp = g / (tiles_n * tiles_m);
  if (grp >= groups) return;
  const int xo = A(16), wo = A(17);
  const int lid = int(gl_LocalInvocationID.x);
  const int tx = lid % 16, ty = lid / 16;
  CT acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = CT(0);
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int e = lid; e < BM * BK; e += 256) {
      const int mm = e / BK, kk = e % BK;
      const int m = tm * BM + mm, k = k0 + kk;
      CT v = CT(0);
      if (m < M && k < K) {
        const int n = m / ohw, pix = m - n * ohw;
        const int oh = pix / OW, ow = pix - oh * OW;
        const int c = k / khw, r = k - c * khw;
        const int kh = r / KW, kw = r - kh * KW;
        const int ih = oh * sh - ph + kh * dh, iw = ow * sw - pw + kw * dw;
        if (ih >= 0 && ih < H && iw >= 0 && iw < W)
          v = LD(IN_DT, x.v[xo + ((n * C + grp * cg + c) * H + ih) * W + iw]);
      }
      As[kk][mm] = v;
    }
    for (int e = lid; e < BK * BN; e += 256) {
      const int kk = e / BN, nn = e % BN;
      const int k = k0 + kk, oc = tn * BN + nn;
      Bs[kk][nn] = (k < K && oc < og) ? LD(IN_DT, w.v[wo + (grp * og + oc) * K + k]) : CT(0);
    }
    barrier();
    for (int kk = 0; kk < BK; ++kk) {
      CT ar[4], br[4];
      for (int i = 0; i < 4; ++i) ar[i] = As[kk][ty + 16 * i];
      for (int j = 0; j < 4; ++j) br[j] = Bs[kk][tx + 16 * j];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] += ar[i] * br[j];
    }
    barrier();
  }
  const bool has_bias = A(20) != 0;
  for (int i = 0; i < 4; ++i) {
    const int m = tm * BM + ty + 16 * i;
    if (m >= M) continue;
    const int n = m / ohw, pix = m - n * ohw;
    for (int j = 0; j < 4; ++j) {
      const int ocl = tn * BN + tx + 16 * j;
      if (ocl >= og) continue;
      const int oc = grp * og + ocl;
      CT v = acc[i][j];
      if (has_bias) v += LD(IN_DT, bias.v[A(18) + oc]);
      o.v[A(19) + (n * O + oc) * ohw + pix] = SV(IN_DT, v);
    }
  }
}
#else
// The direct form (-DDIRECT_FORM, modules conv2d_<dtype>_direct: the host's
// choice on CPU devices such as lavapipe, where barriers and lane-indexed
// shared loads make the tiled form slow): no shared memory. Invocation g
// computes TO output channels x TW consecutive output columns of one output
// row; consecutive invocations take consecutive column blocks of the same
// channels, so their weight loads are the same and their input loads adjacent.
// Taps outside the input read a clamped index and are zeroed.
// The block is fixed per module (register arrays sized by specialization
// constants were not kept in registers by lavapipe).
#ifndef TO
#define TO 32
#endif
#ifndef TW
#define TW 8
#endif

void main() {
  const int N = A(0), C = A(1), H = A(2), W = A(3), O = A(4), OH = A(5), OW = A(6), KH = A(7), KW = A(8);
  const int sh = A(9), sw = A(10), ph = A(11), pw = A(12), dh = A(13), dw = A(14), groups = A(15);
  const int cg = C / groups, og = O / groups;
  const int owb = (OW + TW - 1) / TW, ob = (og + TO - 1) / TO;
  const int g = int(group_linear()) * DIRECT_WG + int(gl_LocalInvocationID.x);
  int rest = g;
  const int bw = rest % owb;
  rest /= owb;
  const int oh = rest % OH;
  rest /= OH;
  const int n = rest % N;
  rest /= N;
  const int bo = rest % ob;
  const int grp = rest / ob;
  if (grp >= groups) return;
  const int ow0 = bw * TW, oc0 = bo * TO;
  const int khw = KH * KW, K = cg * khw;
  int wr[TO];
  for (int i = 0; i < TO; ++i) wr[i] = A(17) + (grp * og + min(oc0 + i, og - 1)) * K;  // channels past og repeat the last
  int iw0[TW];
  for (int t = 0; t < TW; ++t) iw0[t] = min(ow0 + t, OW - 1) * sw - pw;
  CT acc[TO][TW];
  for (int i = 0; i < TO; ++i)
    for (int t = 0; t < TW; ++t) acc[i][t] = CT(0);
  const int xbase = A(16) + (n * C + grp * cg) * H * W;
  for (int c = 0; c < cg; ++c) {
    const int xc = xbase + c * H * W;
    for (int kh = 0; kh < KH; ++kh) {
      const int ih = oh * sh - ph + kh * dh;
      if (ih < 0 || ih >= H) continue;
      const int xr = xc + ih * W;
      const int kk0 = c * khw + kh * KW;
      for (int kw = 0; kw < KW; ++kw) {
        CT xv[TW], wv[TO];
        for (int t = 0; t < TW; ++t) {
          const int iw = iw0[t] + kw * dw;
          const CT v = LD(IN_DT, x.v[xr + clamp(iw, 0, W - 1)]);
          xv[t] = (iw >= 0 && iw < W) ? v : CT(0);
        }
        for (int i = 0; i < TO; ++i) wv[i] = LD(IN_DT, w.v[wr[i] + kk0 + kw]);
        for (int i = 0; i < TO; ++i)
          for (int t = 0; t < TW; ++t) acc[i][t] += wv[i] * xv[t];
      }
    }
  }
  const bool has_bias = A(20) != 0;
  for (int i = 0; i < TO; ++i) {
    if (oc0 + i >= og) break;
    const int oc = grp * og + oc0 + i;
    const CT bv = has_bias ? LD(IN_DT, bias.v[A(18) + oc]) : CT(0);
    for (int t = 0; t < TW; ++t)
      if (ow0 + t < OW) o.v[A(19) + ((n * O + oc) * OH + oh) * OW + ow0 + t] = SV(IN_DT, acc[i][t] + bv);
  }
}
#endif
