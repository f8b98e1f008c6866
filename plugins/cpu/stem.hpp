// The channels-last convolutions' path for a network's first layer (at most
// four input channels): see stem.cpp.
#pragma once

#include "kernels.hpp"
#include "onednn.hpp"

namespace backplane::cpu {

// f32 conv2d of g (groups 1, C <= 4, O <= 64, no residual) into y dense
// [N, OH, OW, O] with g.act applied (NaN kept). False when not taken.
bool stem_nhwc(const Call& c, const onednn::ConvGeom& g);

}  // namespace backplane::cpu
