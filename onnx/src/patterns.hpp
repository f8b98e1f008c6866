// Compositions mapped back onto standard ops (patterns.cpp).
#pragma once

#include <backplane/backplane.hpp>

#include <string>
#include <vector>

namespace backplane::onnx::detail {

// The graph with each exported LayerNorm and GELU composition replaced by
// layer_norm / gelu (f32 and f64 chains), and constants no longer read
// dropped; one note per kind replaced.
Graph map_compositions(Graph&& g, std::vector<std::string>& notes);

}  // namespace backplane::onnx::detail
