// Vendor ops declared in manifests: parsing, param defaults, and the
// decomposition of a vendor node into standard ops.
#pragma once

#include <backplane/backplane.hpp>
#include <string>
#include <utility>
#include <vector>

namespace backplane::detail {

// Reads one entry of a manifest's "vendor_ops" (already schema-checked) and
// checks its decomposition: standard ops only, names defined before use,
// one decomposition output per declared output. Throws Error naming `where`.
VendorOpInfo parse_vendor_op(const Json& j, const std::string& where);

// The node's params with the op's defaults filled in; a param the op does
// not declare is an Error naming the node.
Json vendor_params(const VendorOpInfo& op, const Node& node);

// A vendor node written as standard nodes. Node names are "<node>/<name>",
// inputs refer to the outer graph's names; `outputs` holds, per declared
// output slot, the outer name of the value that carries it.
struct Expansion {
  std::vector<Node> nodes;
  std::vector<std::string> outputs;
};
Expansion expand_vendor_node(const VendorOpInfo& op, const Node& node,
                             const std::vector<std::pair<bp_dtype, Shape>>& input_types);

// The output types of a vendor node through its decomposition (no device
// needed): one per declared output. Throws Error naming the node.
std::vector<std::pair<bp_dtype, Shape>> decomposition_output_types(const VendorOpInfo& op, const Node& node,
                                                                   const std::vector<std::pair<bp_dtype, Shape>>& input_types);

// Evaluates a decomposition param expression ("$eps", "$x.shape[-1] / 2").
// `names` are the op's params, `shapes` its inputs' shapes. Throws Error.
Json eval_param_expression(const std::string& expr, const Json& params,
                           const std::vector<std::pair<std::string, Shape>>& shapes);

}  // namespace backplane::detail
