// A pass before lowering, after the others: chains (and small DAGs) of
// elementwise nodes become one fused_elementwise node (docs/ops.md), when the
// list's first device has a kernel for it.
//
//   - A group grows from a sink (an f32 elementwise node, from the last node
//     back) over the producers of its inputs: a producer joins when it is an
//     elementwise op a program takes, unpinned, of the sink's shape (so no
//     value is recomputed per element of a larger output), f32 (or a
//     comparison's bool feeding a where), and every reader of its value is
//     already in the group (not a graph output nor a kept value).
//   - A group of two or more nodes becomes one node named as the sink, with
//     the group's outside values as inputs (an f32 one first, at most 7) and
//     the group as a program (at most 64 instructions).
//
// The fused kernel runs each instruction with the element function of the
// op's own kernel, so results are those of the unfused nodes; every fusion
// is a note for explain().
#pragma once

#include <backplane/backplane.hpp>

#include <optional>
#include <string>
#include <vector>

namespace backplane::detail {

struct FuseResult {
  std::vector<Node> nodes;         // the nodes with the groups replaced (only when fused > 0)
  std::vector<std::string> notes;  // for explain()
  int fused = 0;                   // groups
  int nodes_in = 0;                // nodes they replaced
};

// fused_elementwise is a built-in fused op: a node of it for which no device
// of the list (or its pin) has the kernel becomes its instructions as
// standard nodes ("<node>/r<k>", the last one named as the node, broadcast to
// the node's shape where the last register is smaller). Runs always, before
// any pass; nullopt when nothing changed.
struct FuseExpansion {
  Graph graph;
  std::vector<std::string> notes;
};
std::optional<FuseExpansion> expand_fused(const Graph& graph, const std::vector<Device*>& devices);

FuseResult fuse_elementwise(const Graph& graph, const std::vector<Node>& nodes, const std::vector<Device*>& devices,
                            const std::vector<std::string>& keep);

}  // namespace backplane::detail
