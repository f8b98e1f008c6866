// Common subexpressions and dead nodes (see pass_simplify.hpp).
#include "pass_simplify.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "ops.hpp"
#include "pass_patterns.hpp"

#include <cmath>

namespace backplane::detail {

namespace {

// Whether constant `c` holds only `v` (bit for bit: -0 and +0 differ) and
// broadcasts into `x` without growing it, so `x op c` has x's shape.
bool only(const HostTensor* c, double v, const Shape& x) {
  if (!c || !is_float(c->dtype) || c->shape.size() > x.size()) return false;
  for (size_t i = 0; i < c->shape.size(); ++i) {
    const int64_t cd = c->shape[c->shape.size() - 1 - i], xd = x[x.size() - 1 - i];
    if (cd != 1 && cd != xd) return false;
  }
  for (int64_t i = 0; i < c->numel(); ++i) {
    const double e = c->get(i);
    if (e != v || std::signbit(e) != std::signbit(v)) return false;
  }
  return true;
}

// The input a node passes through unchanged, bit for bit, or "": a cast to
// its own dtype, mul or div by ones, sub of +0, add of -0 (x + +0 turns -0
// into +0, so add of +0 stays).
std::string identity_input(const Node& n, const std::map<std::string, ValueType>& types,
                           const std::map<std::string, const HostTensor*>& consts) {
  auto type = [&](const std::string& v) -> const ValueType* {
    auto it = types.find(v);
    return it == types.end() || it->second.is_bundle() ? nullptr : &it->second;
  };
  auto constant = [&](const std::string& v) -> const HostTensor* {
    auto it = consts.find(v);
    return it == consts.end() ? nullptr : it->second;
  };
  if (!n.device.empty()) return {};
  if (n.op == "cast" && n.inputs.size() == 1 && n.params.is_object() && n.params.contains("dtype")) {
    const ValueType* t = type(n.inputs[0]);
    if (t && n.params["dtype"].is_string() && dtype_name(t->dtype) == n.params["dtype"].get<std::string>())
      return n.inputs[0];
    return {};
  }
  if (n.inputs.size() != 2) return {};
  auto passes = [&](size_t keep, double v) {
    const ValueType* t = type(n.inputs[keep]);
    const ValueType* o = type(n.inputs[1 - keep]);
    return t && o && t->dtype == o->dtype && only(constant(n.inputs[1 - keep]), v, t->shape);
  };
  if (n.op == "mul") {
    if (passes(0, 1.0)) return n.inputs[0];
    if (passes(1, 1.0)) return n.inputs[1];
  } else if (n.op == "div" && passes(0, 1.0)) {
    return n.inputs[0];
  } else if (n.op == "sub" && passes(0, 0.0)) {
    return n.inputs[0];
  } else if (n.op == "add") {
    if (passes(0, -0.0)) return n.inputs[0];
    if (passes(1, -0.0)) return n.inputs[1];
  }
  return {};
}

}  // namespace

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
  std::vector<std::string> merged_names, identity_names, view_names;
  cse.reserve(nodes.size());
  // Types and constants, for the identities (the graph's names keep their
  // types through the earlier passes).
  const auto types = infer_standard_nodes(graph);
  std::map<std::string, const HostTensor*> consts;
  for (const auto& in : graph.inputs())
    if (in.constant) consts[in.name] = in.constant.get();
  std::map<std::string, size_t> view_of;  // reshape/permute nodes kept: their index in cse
  for (const Node& n0 : nodes) {
    Node n = n0;
    for (auto& in : n.inputs)
      if (auto a = alias.find(in); a != alias.end()) in = a->second;
    // A node that passes its input through: its readers read the input.
    if (!wanted.count(n.name)) {
      const std::string through = identity_input(n, types, consts);
      if (!through.empty()) {
        alias[n.name] = through;
        identity_names.push_back(n.name);
        continue;
      }
    }
    // View chains: reshape of a reshape is one reshape; permute of a permute
    // one permute (none when they cancel). The inner one is then dead
    // unless something else reads it.
    if (n.device.empty() && n.inputs.size() == 1 && (n.op == "reshape" || n.op == "permute")) {
      auto inner = view_of.find(n.inputs[0]);
      if (inner != view_of.end() && cse[inner->second].op == n.op && cse[inner->second].device.empty()) {
        const Node in = cse[inner->second];
        if (n.op == "reshape") {
          n.inputs[0] = in.inputs[0];
          view_names.push_back(n.name);
        } else if (n.params.contains("dims") && in.params.contains("dims") && n.params["dims"].is_array() &&
                   in.params["dims"].is_array() && n.params["dims"].size() == in.params["dims"].size()) {
          const Json& q = n.params["dims"];
          const Json& p0 = in.params["dims"];
          const auto rank = static_cast<int64_t>(q.size());
          std::vector<int64_t> r;
          bool ok = true, ident = true;
          for (const auto& d : q) {
            if (!d.is_number_integer()) ok = false;
            if (!ok) break;
            int64_t qi = d.get<int64_t>();
            if (qi < 0) qi += rank;
            if (qi < 0 || qi >= rank || !p0[static_cast<size_t>(qi)].is_number_integer()) {
              ok = false;
              break;
            }
            int64_t pi = p0[static_cast<size_t>(qi)].get<int64_t>();
            if (pi < 0) pi += rank;
            ident = ident && pi == static_cast<int64_t>(r.size());
            r.push_back(pi);
          }
          if (ok) {
            if (ident && !wanted.count(n.name)) {
              alias[n.name] = in.inputs[0];
              view_names.push_back(n.name);
              continue;
            }
            n.inputs[0] = in.inputs[0];
            n.params["dims"] = r;
            view_names.push_back(n.name);
          }
        }
      }
    }
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
    if (cse.back().op == "reshape" || cse.back().op == "permute") view_of[cse.back().name] = cse.size() - 1;
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
  r.identities = static_cast<int>(identity_names.size());
  r.views = static_cast<int>(view_names.size());
  if (!r.changed()) return r;
  for (size_t i = 0; i < cse.size(); ++i)
    if (keep_node[i]) r.nodes.push_back(std::move(cse[i]));
  if (r.merged)
    r.notes.push_back("simplify: " + std::to_string(r.merged) + " node" + (r.merged == 1 ? "" : "s") + " (" +
                      listed(merged_names) + ") repeat" + (r.merged == 1 ? "s" : "") +
                      " an earlier node's op, inputs and params: read from it instead");
  if (r.identities)
    r.notes.push_back("simplify: " + std::to_string(r.identities) + " node" + (r.identities == 1 ? "" : "s") + " (" +
                      listed(identity_names) + (r.identities == 1 ? ") passes its" : ") pass their") +
                      " input through (a cast to its own dtype, mul or div by 1, sub of +0, add of -0): "
                      "read the input instead");
  if (r.views)
    r.notes.push_back("simplify: " + std::to_string(r.views) + " view" + (r.views == 1 ? "" : "s") + " (" +
                      listed(view_names) + ") of a view of the same kind: one view of the first one's input");
  if (r.removed)
    r.notes.push_back("simplify: " + std::to_string(r.removed) + " node" + (r.removed == 1 ? "" : "s") + " (" +
                      listed(dead_names) + ") feed" + (r.removed == 1 ? "s" : "") + " no output: removed");
  return r;
}

}  // namespace backplane::detail
