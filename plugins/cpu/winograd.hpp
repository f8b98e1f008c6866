// conv2d by Winograd F(2x2, 3x3) (winograd.cpp): the path Conv2dK takes for
// 3x3 kernels at stride 1 and dilation 1 computing in f32, where it pays.
#pragma once

#include <cstdint>
#include <memory>

namespace backplane::cpu {

struct Call;

struct WinogradConv {
  int64_t N, C, H, W;  // x
  int64_t O, G;        // filters (all groups), groups
  int64_t pt, pl;      // top and left padding (bottom/right only set OH, OW)
  int64_t OH, OW;      // output
  int64_t xs[4];       // element strides of x
};

// Whether F(2x2, 3x3) is worth taking for this geometry (the caller has
// checked kH = kW = 3, stride 1, dilation 1 and f32 compute).
bool winograd_pays(const WinogradConv& g);

// The filters transformed for F(2x2, 3x3) (U = G g G^T, packed for the
// block kernel): what conv2d_winograd computes from w at every call unless
// it is given them. Made once for constant weights and kept (packed.hpp).
struct WinogradFilters;
// From w, dense [O, C/G, 3, 3] f32.
std::shared_ptr<const WinogradFilters> winograd_filters(const Call& c, const WinogradConv& g, const float* w);

// y [N, O, OH, OW] (dense) = conv2d(x, w) + bias. x points at x[0, 0, 0, 0];
// w is dense [O, C/G, 3, 3] and bias [O], both f32; or w is NULL and `u`
// gives the transformed filters. T: float, f16 or bf16.
template <class T>
void conv2d_winograd(const Call& c, const WinogradConv& g, const T* x, const float* w, const float* bias, T* y,
                     const WinogradFilters* u = nullptr);

}  // namespace backplane::cpu
