// Constant folding, the first pass before lowering: a standard node whose
// inputs are all constants, whose op's result is exact on every conformant
// device (data movement, casts, comparisons, selection, integer arithmetic:
// the conformance suite's exact class), and whose result is at most
// kFoldLimitBytes, is computed once at compile time by the CPU plugin and
// becomes a constant. Chains fold in order. Views (reshape, permute, slice,
// ...) over constants stay views, their values used by the nodes that fold
// after them. Graph outputs and kept values stay nodes. Constants that only
// folded nodes read are dropped. Results are bit-identical to the graph as
// written on every device.
#pragma once

#include <backplane/backplane.hpp>

#include <optional>
#include <string>
#include <vector>

namespace backplane::detail {

constexpr uint64_t kFoldLimitBytes = uint64_t{16} << 20;

struct FoldResult {
  Graph graph;                     // the graph with folded nodes as constants
  std::vector<std::string> notes;  // for explain()
  int folded = 0;
};

// nullopt when nothing folds, or no CPU plugin can compute it (the one in
// the compile's device list, else the runtime's "cpu"; no other plugin is
// loaded for it).
std::optional<FoldResult> fold_constants(Runtime& rt, const Graph& graph, const std::vector<Device*>& devices,
                                         const std::vector<std::string>& keep);

}  // namespace backplane::detail
