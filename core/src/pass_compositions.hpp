// An optimizer pass (CompileOptions::optimize): the compositions exporters
// write for ops older opsets lack, mapped back onto the standard op that
// does the same in one pass (pass_compositions.cpp):
//   - LayerNorm (before opset 17: ReduceMean, Sub, Pow, ReduceMean, Add,
//     Sqrt, Div, then optionally Mul by a weight and Add of a bias) becomes
//     layer_norm over the last dim;
//   - GELU's erf form (Div by √2, Erf, Add 1, Mul by x, Mul by 0.5) becomes
//     gelu.
// Only f32/f64 chains (an f16 chain rounds after every step), unpinned,
// whose every intermediate is read only inside the match (not a graph
// output nor a kept value), with constants of the values the formula needs.
// layer_norm and gelu give the chain's values within the ops' tolerances.
#pragma once

#include <backplane/backplane.hpp>

#include <optional>
#include <string>
#include <vector>

namespace backplane::detail {

struct CompositionResult {
  Graph graph;
  std::vector<std::string> notes;  // one per kind mapped, for explain()
};

// nullopt when nothing matched.
std::optional<CompositionResult> map_compositions(const Graph& g, const std::vector<std::string>& keep);

}  // namespace backplane::detail
