// The last pass before lowering: common subexpressions merged and dead nodes
// removed, over the nodes the earlier passes left.
//
//   - Two nodes of the same standard op on the same inputs with equal params
//     and the same pin compute the same value: the second's readers read the
//     first's (every standard op is a pure function of its inputs). A node
//     whose name is a graph output or a kept value stays, so every name the
//     application asks for is still there.
//   - A standard node nothing reads (no node, no graph output, no kept value)
//     is removed, and so, in turn, are nodes only it read. Vendor ops are
//     left as written (a plugin's op is the plugin's business).
//
//   - A node that passes its input through bit for bit (a cast to its own
//     dtype, mul or div by a constant of ones, sub of +0, add of -0, none of
//     them growing the input's shape) is skipped: its readers read its
//     input. x + (+0) stays (it turns -0 into +0).
//   - A reshape of a reshape reads the first one's input; a permute of a
//     permute is one permute, or none when they cancel.
//
// Results are bit-identical to the graph as written: the same kernels run on
// the same values, only fewer times.
#pragma once

#include <backplane/backplane.hpp>

#include <string>
#include <vector>

namespace backplane::detail {

struct SimplifyResult {
  std::vector<Node> nodes;         // the nodes left (only when changed)
  std::vector<std::string> notes;  // for explain()
  int merged = 0, removed = 0, identities = 0, views = 0;
  bool changed() const { return merged + removed + identities + views > 0; }
};

SimplifyResult simplify(const Graph& graph, const std::vector<Node>& nodes, const std::vector<std::string>& keep);

// Node names for the passes' notes: "'a', 'b', 'c', 'd' and 2 more".
std::string listed(const std::vector<std::string>& names);

}  // namespace backplane::detail
