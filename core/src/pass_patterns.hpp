// A pass before lowering: plugins' vendor ops as patterns. When the device a
// node would run on by default (the list's first) has a kernel for a vendor
// op whose manifest decomposition matches a subgraph of the graph, the
// subgraph becomes one node of that op:
//
//   - the same ops with the same wiring, anchored at the decomposition's
//     output node (single-output vendor ops); a commutative binary op
//     (add, mul, maximum, minimum, eq, ne) in either operand order;
//   - every vendor input bound to one graph value, consistently;
//   - params bound from "$name" entries, and then proven: the decomposition
//     instantiated with the bound params must infer, node by node, exactly
//     the typed params (bp_op_params) the graph's nodes infer, so a constant
//     in the decomposition ("min": 0) or a param it leaves out must agree;
//   - no intermediate value used outside the match (by another node, as a
//     graph output or a kept value), no node pinned, and the device has a
//     kernel row for the dtypes.
//
// Results are those of the vendor kernel, which the conformance suite
// checks against the same decomposition within the op's tolerance class.
// Every substitution and every refused near miss (the pattern's ops and
// wiring matched, something else did not) is a note for --explain.
#pragma once

#include <backplane/backplane.hpp>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ops.hpp"

namespace backplane::detail {

struct PatternResult {
  std::vector<Node> nodes;         // the graph's nodes with the matches replaced (only when substituted > 0)
  std::vector<std::string> notes;  // substitutions and near misses, for explain()
  int substituted = 0;
  // The graph's value types when the pass inferred them (it had patterns to
  // look for), for the passes after it; empty otherwise.
  std::map<std::string, ValueType> types;
};

// Which node gives each value (its index in the graph) and how often each
// value is read: by nodes, as a graph output, as a kept value. The matchers
// refuse a match whose intermediate is read outside it.
struct ValueUses {
  std::map<std::string, size_t> producer;
  std::map<std::string, int> count;
};
ValueUses value_uses(const Graph& g, const std::vector<std::string>& keep);

// The graph with other nodes: its inputs and constants (less those named in
// `drop`), then `extra` constants, `nodes`, and its outputs. The passes that
// rewrite a whole graph build their result with it.
using NamedConstants = std::vector<std::pair<std::string, std::shared_ptr<const HostTensor>>>;
Graph rebuilt_graph(const Graph& g, const std::vector<Node>& nodes, const NamedConstants& extra = {},
                    const std::set<std::string>& drop = {});

// The types of the graph's inputs and of every standard node whose inputs
// are known; on_node sees each node inferred (with its inputs' types).
// Anything the core cannot infer here (a vendor op, a bad graph: lowering
// reports it) stays unknown.
// The same over a node list (a later pass's), adding to `types`.
void infer_nodes(const std::vector<Node>& nodes, std::map<std::string, ValueType>& types,
                 const std::function<void(size_t, const InferredNode&, const std::vector<const ValueType*>&)>& on_node = {});
std::map<std::string, ValueType> infer_standard_nodes(
    const Graph& g,
    const std::function<void(size_t, const InferredNode&, const std::vector<const ValueType*>&)>& on_node = {});

PatternResult substitute_patterns(Runtime& rt, const Graph& graph, const std::vector<Device*>& devices,
                                  const std::vector<std::string>& keep);

}  // namespace backplane::detail
