// A pass before lowering, after the patterns: values kept in the layout a
// device's kernels write best (channels-last for the CPU's convolutions).
//
// A device declares a layout variant of an op U as a vendor op V whose
// manifest decomposition is U (a standard op, or U's own decomposition when
// U is a vendor op) followed by one `permute` of its output: V computes
// permute(U(...), P) with the output dense in that order. The conformance
// suite checks V against exactly that. Where the list's first device has
// such a V, a node of U (not pinned, inputs and params as V takes them, a
// kernel row for its dtypes) becomes
//
//   V(...) -> permute(·, P^-1)     the permute is a view: no copy
//
// and permutes then sink through elementwise nodes whose every input is the
// same permute of a value of the output's shape, and through concat (its
// dim mapped through the permute: a channel concat becomes one along the
// last dim of channels-last values):
//
//   add(permute(a, Q), permute(b, Q))    -> permute(add(a, b), Q)
//   concat(permute(a, Q), permute(b, Q)) -> permute(concat(a, b, Q[dim]), Q)
//
// so a chain conv -> add -> relu -> conv keeps its values in V's layout, and
// the next V reads its input as the view it wants, with no reorder on
// either side. Value names are kept (the permute takes the node's name), so
// graph outputs, kept values and pins are untouched; results are those of
// V's kernel (within U's tolerance) and of the same elementwise kernels.
#pragma once

#include <backplane/backplane.hpp>

#include <map>
#include <string>
#include <vector>

#include "ops.hpp"

namespace backplane::detail {

struct LayoutResult {
  std::vector<Node> nodes;         // the rewritten nodes (only when rewritten > 0)
  std::vector<std::string> notes;  // for explain()
  int rewritten = 0;               // nodes that now run in a variant's layout
};

// `nodes` are the graph's nodes after earlier passes (the patterns);
// `types`, the graph's value types when an earlier pass inferred them (else
// this pass infers them, only if the device has variants).
LayoutResult propagate_layouts(Runtime& rt, const Graph& graph, const std::vector<Node>& nodes,
                               const std::vector<Device*>& devices, const std::vector<std::string>& keep,
                               const std::map<std::string, ValueType>* types = nullptr);

}  // namespace backplane::detail
