// Constant folding (see pass_fold.hpp).
#include "pass_fold.hpp"
#include "pass_patterns.hpp"
#include "pass_simplify.hpp"

#include <map>
#include <memory>
#include <set>

namespace backplane::detail {

namespace {

// Ops whose results every conformant device computes bit for bit: the
// conformance suite's exact class (layouts, gathers, casts, comparisons,
// selection), and add/sub/mul on integers.
bool exact_op(const std::string& op, bp_dtype dtype) {
  static const std::set<std::string> always = {
      "reshape", "permute", "transpose", "broadcast_to", "slice", "squeeze", "unsqueeze", "contiguous",
      "gather", "index_select", "concat", "cast", "neg", "abs", "eq", "ne", "lt", "le", "gt", "ge",
      "where", "maximum", "minimum"};
  static const std::set<std::string> on_integers = {"add", "sub", "mul"};
  if (always.count(op)) return true;
  const bool integer = dtype == BP_DTYPE_I8 || dtype == BP_DTYPE_U8 || dtype == BP_DTYPE_I16 || dtype == BP_DTYPE_I32 ||
                       dtype == BP_DTYPE_I64;
  return integer && on_integers.count(op);
}

// Views cost nothing at run time (no kernel, no copy): over constants they
// are computed for the nodes that fold after them, but stay views, so no
// dense copy of a constant is made and patterns over them still match.
bool view_op(const std::string& op) {
  static const std::set<std::string> views = {"reshape", "permute", "transpose", "broadcast_to",
                                              "slice",   "squeeze", "unsqueeze"};
  return views.count(op) > 0;
}


}  // namespace

std::optional<FoldResult> fold_constants(Runtime& rt, const Graph& graph, const std::vector<Device*>& devices,
                                         const std::vector<std::string>& keep) {
  std::map<std::string, std::shared_ptr<const HostTensor>> constants;
  for (const auto& in : graph.inputs())
    if (in.constant) constants[in.name] = in.constant;
  if (constants.empty()) return std::nullopt;
  // The CPU plugin: from the compile's list, else the runtime's "cpu" (its
  // plugin alone loaded, never every plugin).
  Device* cpu = nullptr;
  for (Device* d : devices)
    if (d->plugin_name() == "cpu") cpu = d;
  if (!cpu)
    for (const auto& e : rt.devices())
      if (e.plugin == "cpu" && (e.name == "cpu" || e.state == PluginState::NotLoaded)) {
        try {
          cpu = &rt.device("cpu");
        } catch (const Error&) {
          return std::nullopt;
        }
        break;
      }
  if (!cpu || cpu->plugin_name() != "cpu") return std::nullopt;
  std::set<std::string> wanted(graph.outputs().begin(), graph.outputs().end());
  wanted.insert(keep.begin(), keep.end());

  std::set<std::string> folded;
  std::vector<std::string> folded_names;
  std::set<std::string> read_by_folded;
  for (const Node& n : graph.nodes()) {
    if (n.op.find('.') != std::string::npos || wanted.count(n.name) || n.inputs.empty()) continue;
    bool all_constant = true;
    for (const auto& in : n.inputs) all_constant = all_constant && !in.empty() && constants.count(in);
    if (!all_constant) continue;
    Graph sub;
    std::set<std::string> given;
    for (const auto& in : n.inputs)
      if (given.insert(in).second) sub.constant(in, constants.at(in));
    sub.node(n.name, n.op, n.inputs, n.params);
    sub.output(n.name);
    std::pair<bp_dtype, Shape> type;
    try {
      type = infer_graph(sub).at(n.name);
    } catch (const Error&) {
      continue;  // the compile reports it, naming the node, as for any node
    }
    const bp_dtype in_dtype = constants.at(n.inputs[0])->dtype;
    if (!exact_op(n.op, in_dtype)) continue;
    uint64_t bytes = dtype_size(type.first);
    for (int64_t d : type.second) bytes *= static_cast<uint64_t>(d);
    if (bytes > kFoldLimitBytes) continue;
    CompileOptions o;
    o.optimize = false;
    o.prepare = false;
    HostTensor value;
    try {
      value = rt.compile(sub, *cpu, o).run({}).at(n.name);
    } catch (const Error&) {
      continue;  // a data error (an index out of range): left for the run to report
    }
    constants[n.name] = std::make_shared<const HostTensor>(std::move(value));
    if (view_op(n.op)) continue;  // known for later folds; the node stays a view
    folded.insert(n.name);
    folded_names.push_back(n.name);
    read_by_folded.insert(n.inputs.begin(), n.inputs.end());
  }
  if (folded.empty()) return std::nullopt;

  // Constants still read: by a node left, an output or a kept value.
  std::set<std::string> used(wanted.begin(), wanted.end());
  for (const Node& n : graph.nodes())
    if (!folded.count(n.name)) used.insert(n.inputs.begin(), n.inputs.end());
  FoldResult r;
  std::set<std::string> dropped;  // constants only folded nodes read
  for (const auto& in : graph.inputs())
    if (in.constant && read_by_folded.count(in.name) && !used.count(in.name)) dropped.insert(in.name);
  NamedConstants made;
  for (const auto& name : folded_names)
    if (used.count(name)) made.emplace_back(name, constants.at(name));
  std::vector<Node> left;
  for (const Node& n : graph.nodes())
    if (!folded.count(n.name)) left.push_back(n);
  r.graph = rebuilt_graph(graph, left, made, dropped);
  r.folded = static_cast<int>(folded.size());
  r.notes.push_back("folded " + std::to_string(r.folded) + " node(s) whose inputs are all constants into constants, " +
                    "computed once by the cpu plugin (exact on every device): " + listed(folded_names));
  return r;
}

}  // namespace backplane::detail
