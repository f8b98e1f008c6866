// A network's first convolution into channels-last output (cpu.conv2d*_nhwc
// with at most four input channels and a window of at most 3x3: an RGB
// image's first layer in MobileNet, ShuffleNet, SqueezeNet). oneDNN's
// brgconv blocks over input channels, and three of them leave its tiles
// mostly empty (MobileNetV2's 3->32 3x3/2 on 224x224: 145 us on 2 threads).
// Here each output pixel's channels are a few vectors of accumulators, and
// every input value is broadcast against the weights of all output channels
// at that tap: a block of pixels shares each weight load.
#include "stem.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace backplane::cpu {
namespace {

typedef float sv16 __attribute__((vector_size(64)));

struct StemArgs {
  const onednn::ConvGeom* g;
  const float* x;
  int64_t xs[4];
  const float* wp;    // [C, kH, kW, OP]: every tap's weights for all output channels
  const float* bias;  // [OP], zero padded (zeros when the op has none)
  int64_t OP;         // O rounded up to whole vectors
  float* y;           // [N, OH, OW, O], dense
};

[[gnu::always_inline]] inline sv16 ld(const float* p) {
  sv16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The activation with NaN kept (a comparison with NaN is false).
[[gnu::always_inline]] inline sv16 act(sv16 v, const onednn::Activation& a) {
  if (a.kind == onednn::Activation::Relu) return v < 0.0f ? sv16{} : v;
  if (a.kind == onednn::Activation::Clip) {
    v = v < a.lo ? sv16{} + a.lo : v;
    return v > a.hi ? sv16{} + a.hi : v;
  }
  return v;
}

[[gnu::always_inline]] inline void put(const StemArgs& s, float* out, const sv16* acc, int OV) {
  const int64_t O = s.g->O;
  for (int v = 0; v < OV; ++v) {
    const sv16 r = act(acc[v], s.g->act);
    if (O - v * 16 >= 16) {
      std::memcpy(out + v * 16, &r, sizeof r);
    } else {
      float t[16];
      std::memcpy(t, &r, sizeof r);
      for (int64_t k = 0; k < O - v * 16; ++k) out[v * 16 + k] = t[k];
    }
  }
}

// The taps of one output row whose input row is inside x: each one's
// offset in x from the pixel's first column, and its weights' offset in wp.
// One flat loop over them (not c, i and j nested: a 3-long j loop ended in
// a mispredicted branch for every 12 multiply-adds).
struct Taps {
  int64_t x[36], w[36], iw[36];  // C <= 4 channels x 9 taps; iw: the column offset from the pixel's first
  int64_t n = 0;
};

// PW pixels of an output row from ow0, every tap inside x along the width
// (no checks): OV vectors of channels each.
template <int OV, int PW>
[[gnu::always_inline]] inline void block(const StemArgs& s, const Taps& t, const float* xrow, int64_t ow0, float* out) {
  const onednn::ConvGeom& g = *s.g;
  sv16 acc[PW][OV];
#pragma GCC unroll 8
  for (int p = 0; p < PW; ++p)
#pragma GCC unroll 4
    for (int v = 0; v < OV; ++v) acc[p][v] = ld(s.bias + v * 16);
  const float* xb = xrow + (ow0 * g.sw - g.pl) * s.xs[3];
  const int64_t ps = g.sw * s.xs[3];
  for (int64_t k = 0; k < t.n; ++k) {
    sv16 w[OV];
#pragma GCC unroll 4
    for (int v = 0; v < OV; ++v) w[v] = ld(s.wp + t.w[k] + v * 16);
    const float* xk = xb + t.x[k];
#pragma GCC unroll 8
    for (int p = 0; p < PW; ++p) {
      const float xv = xk[p * ps];
#pragma GCC unroll 4
      for (int v = 0; v < OV; ++v) acc[p][v] += xv * w[v];
    }
  }
#pragma GCC unroll 8
  for (int p = 0; p < PW; ++p) put(s, out + (ow0 + p) * g.O, acc[p], OV);
}

// One pixel whose window may leave x: taps outside are no terms at all
// (not zeros times a weight, which an infinite weight would make NaN).
template <int OV>
[[gnu::always_inline]] inline void edge(const StemArgs& s, const Taps& t, const float* xrow, int64_t ow, float* out) {
  const onednn::ConvGeom& g = *s.g;
  sv16 acc[OV];
  for (int v = 0; v < OV; ++v) acc[v] = ld(s.bias + v * 16);
  const int64_t iw0 = ow * g.sw - g.pl;
  for (int64_t k = 0; k < t.n; ++k) {
    const int64_t iw = iw0 + t.iw[k];
    if (iw < 0 || iw >= g.W) continue;
    const float xv = xrow[iw0 * s.xs[3] + t.x[k]];
    for (int v = 0; v < OV; ++v) acc[v] += xv * ld(s.wp + t.w[k] + v * 16);
  }
  put(s, out + ow * g.O, acc, OV);
}

// Output rows [r0, r1) of all images (row r = n * OH + oh).
template <int OV, int PW> [[gnu::always_inline]] inline void rows(const StemArgs& s, int64_t r0, int64_t r1) {
  const onednn::ConvGeom& g = *s.g;
  // Pixels whose every tap is inside x along the width: [a, b).
  const int64_t span = (g.kW - 1) * g.dw;
  int64_t a = (g.pl + g.sw - 1) / g.sw, b = g.W - 1 - span + g.pl >= 0 ? (g.W - 1 - span + g.pl) / g.sw + 1 : 0;
  a = std::min(a, g.OW);
  b = std::max(a, std::min(b, g.OW));
  Taps t;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / g.OH, oh = r % g.OH;
    t.n = 0;
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t i = 0; i < g.kH; ++i) {
        const int64_t ih = oh * g.sh - g.pt + i * g.dh;
        if (ih < 0 || ih >= g.H) continue;
        for (int64_t j = 0; j < g.kW; ++j) {
          t.x[t.n] = c * s.xs[1] + ih * s.xs[2] + j * g.dw * s.xs[3];
          t.w[t.n] = ((c * g.kH + i) * g.kW + j) * s.OP;
          t.iw[t.n] = j * g.dw;
          ++t.n;
        }
      }
    const float* xrow = s.x + n * s.xs[0];
    float* out = s.y + r * g.OW * g.O;
    int64_t ow = 0;
    for (; ow < a; ++ow) edge<OV>(s, t, xrow, ow, out);
    for (; ow + PW <= b; ow += PW) block<OV, PW>(s, t, xrow, ow, out);
    for (; ow < g.OW; ++ow) edge<OV>(s, t, xrow, ow, out);
  }
}

template <int OV, int PW> void rows_base(const StemArgs& s, int64_t r0, int64_t r1) { rows<OV, PW>(s, r0, r1); }
#if defined(__x86_64__)
template <int OV, int PW> __attribute__((target("avx512f,avx512vl,avx2,fma"))) void rows_avx512(const StemArgs& s, int64_t r0, int64_t r1) {
  rows<OV, PW>(s, r0, r1);
}
template <int OV, int PW> __attribute__((target("avx2,fma"))) void rows_avx2(const StemArgs& s, int64_t r0, int64_t r1) {
  rows<OV, PW>(s, r0, r1);
}
#endif

using RowsFn = void (*)(const StemArgs&, int64_t, int64_t);
// Pixels per block: as many as leave room in 32 vector registers for the
// accumulators and one tap's weights.
template <int OV> RowsFn pick() {
  constexpr int PW = OV == 1 ? 8 : 6;
#if defined(__x86_64__)
  if (isa() >= Isa::avx512) return &rows_avx512<OV, PW>;
  if (isa() >= Isa::avx2) return &rows_avx2<OV, PW>;
#endif
  return &rows_base<OV, PW>;
}

}  // namespace

bool stem_nhwc(const Call& c, const onednn::ConvGeom& g) {
  // 3x3 and smaller windows only: on ResNet's 7x7 stem (3 -> 64) this
  // kernel is no faster than oneDNN (in ResNet-18 on 2 threads, alternating:
  // 630-790 against 620-750 us).
  if (g.G != 1 || g.C > 4 || g.O > 64 || g.res.data != nullptr || g.kH * g.kW > 9) return false;
  const bp_layout& lx = c.in_layout(0);
  const bp_layout& lw = c.in_layout(1);
  const int64_t OV = (g.O + 15) / 16, OP = OV * 16;
  // Weights repacked per call (at most 4 x 9 taps x 64 channels).
  std::vector<float> wp(static_cast<size_t>(g.C * g.kH * g.kW * OP), 0.0f), bias(static_cast<size_t>(OP), 0.0f);
  const float* w = c.in_data<float>(1);
  for (int64_t o = 0; o < g.O; ++o)
    for (int64_t ci = 0; ci < g.C; ++ci)
      for (int64_t i = 0; i < g.kH; ++i)
        for (int64_t j = 0; j < g.kW; ++j)
          wp[static_cast<size_t>(((ci * g.kH + i) * g.kW + j) * OP + o)] =
              w[lw.offset + o * lw.strides[0] + ci * lw.strides[1] + i * lw.strides[2] + j * lw.strides[3]];
  if (c.has_input(2)) {
    const bp_layout& lb = c.in_layout(2);
    const float* b = c.in_data<float>(2);
    for (int64_t o = 0; o < g.O; ++o) bias[static_cast<size_t>(o)] = b[lb.offset + o * lb.strides[lb.rank - 1]];
  }
  const StemArgs s{&g, c.in_data<float>(0) + lx.offset, {lx.strides[0], lx.strides[1], lx.strides[2], lx.strides[3]},
                   wp.data(), bias.data(), OP, c.out_data<float>()};
  RowsFn fn = OV == 1 ? pick<1>() : OV == 2 ? pick<2>() : OV == 3 ? pick<3>() : pick<4>();
  const int64_t per_row = std::max<int64_t>(1, g.OW * g.C * g.kH * g.kW * OP);
  pfor(c, g.N * g.OH, std::max<int64_t>(1, (int64_t{1} << 17) / per_row), [&](int64_t r0, int64_t r1) { fn(s, r0, r1); });
  return true;
}

}  // namespace backplane::cpu
