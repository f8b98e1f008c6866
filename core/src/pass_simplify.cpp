// Common subexpressions and dead nodes (see pass_simplify.hpp).
#include "pass_simplify.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "ops.hpp"

namespace backplane::detail {

std::string listed(const std::vector<std::string>& names) {
  constexpr size_t kNamesListed = 4;
  std::string s;
  for (size_t i = 0; i < names.size() && i < kNamesListed; ++i) s += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > kNamesListed) s += " and " + std::to_string(names.size() - kNamesListed) + " more";
  return s;
}

SimplifyResult simplify(const Graph& graph, const std::vector<Node>& nodes, const std::vector<std::string>& keep) {
  SimplifyResult r;
  std::set<std::string> wanted(graph.outputs().begin(), graph.outputs().end());
  wanted.insert(keep.begin(), keep.end());

  // Common subexpressions, in order: a node's inputs are renamed to the
  // values they duplicate first, so chains of duplicates merge too.
  std::map<std::string, std::string> alias;  // merged node -> the node it repeats
  std::map<std::string, std::string> first;  // key -> the first node with it
  std::vector<Node> cse;
  std::vector<std::string> merged_names;
  cse.reserve(nodes.size());
  for (const Node& n0 : nodes) {
    Node n = n0;
    for (auto& in : n.inputs)
      if (auto a = alias.find(in); a != alias.end()) in = a->second;
    if (!is_custom_op(n.op)) {
      std::string key = n.op + '\n' + n.device + '\n' + n.params.dump();
      for (const auto& in : n.inputs) key += '\n' + in;
      auto [it, fresh] = first.emplace(key, n.name);
      if (!fresh && !wanted.count(n.name)) {
        alias[n.name] = it->second;
        merged_names.push_back(n.name);
        continue;
      }
    }
    cse.push_back(std::move(n));
  }

  // Dead nodes, from the last back: a node is live when something live
  // reads it (or it is a vendor op, kept as written).
  std::set<std::string> live = wanted;
  std::vector<char> keep_node(cse.size(), 0);
  std::vector<std::string> dead_names;
  for (size_t i = cse.size(); i-- > 0;) {
    const Node& n = cse[i];
    if (live.count(n.name) || is_custom_op(n.op)) {
      keep_node[i] = 1;
      for (const auto& in : n.inputs)
        if (!in.empty()) live.insert(in);
    } else {
      dead_names.push_back(n.name);
    }
  }
  std::reverse(dead_names.begin(), dead_names.end());
  r.merged = static_cast<int>(merged_names.size());
  r.removed = static_cast<int>(dead_names.size());
  if (!r.changed()) return r;
  for (size_t i = 0; i < cse.size(); ++i)
    if (keep_node[i]) r.nodes.push_back(std::move(cse[i]));
  if (r.merged)
    r.notes.push_back("simplify: " + std::to_string(r.merged) + " node" + (r.merged == 1 ? "" : "s") + " (" +
                      listed(merged_names) + ") repeat" + (r.merged == 1 ? "s" : "") +
                      " an earlier node's op, inputs and params: read from it instead");
  if (r.removed)
    r.notes.push_back("simplify: " + std::to_string(r.removed) + " node" + (r.removed == 1 ? "" : "s") + " (" +
                      listed(dead_names) + ") feed" + (r.removed == 1 ? "s" : "") + " no output: removed");
  return r;
}

}  // namespace backplane::detail
