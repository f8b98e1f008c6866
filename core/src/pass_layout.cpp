// Layout variants and permute sinking (see pass_layout.hpp).
#include "pass_layout.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "ops.hpp"
#include "ops_spec.hpp"
#include "pass_patterns.hpp"
#include "plugin.hpp"

namespace backplane::detail {

namespace {

using Perm = std::vector<int64_t>;

// V is a layout variant of `base`: V = permute(base(...), perm).
struct Variant {
  const VendorOpInfo* v = nullptr;
  Perm perm;     // V's output dims, in base's order
  Perm inverse;  // the permute that gives base's output back from V's
};

bool is_permutation(const Perm& p) {
  std::vector<bool> seen(p.size(), false);
  for (int64_t d : p) {
    if (d < 0 || d >= static_cast<int64_t>(p.size()) || seen[static_cast<size_t>(d)]) return false;
    seen[static_cast<size_t>(d)] = true;
  }
  return true;
}

// The decomposition's nodes other than a final permute, with the permute's
// input renamed to `as` (so they compare with base's own decomposition); the
// permute's dims in `perm`. Nothing when the decomposition does not end so.
std::optional<std::vector<Json>> before_permute(const VendorOpInfo& v, const std::string& as, Perm& perm) {
  if (!v.has_decomposition() || v.outputs.size() != 1) return std::nullopt;
  const Json& d = v.decomposition;
  if (!d.contains("nodes") || !d["nodes"].is_array() || d["nodes"].size() < 2 || !d.contains("outputs") ||
      d["outputs"].size() != 1)
    return std::nullopt;
  const Json& last = d["nodes"].back();
  if (last.value("op", "") != "permute" || last.value("name", "") != d["outputs"][0] || !last.contains("inputs") ||
      last["inputs"].size() != 1 || !last["inputs"][0].is_string() || !last.contains("params") ||
      !last["params"].contains("dims") || !last["params"]["dims"].is_array())
    return std::nullopt;
  for (const auto& x : last["params"]["dims"]) {
    if (!x.is_number_integer()) return std::nullopt;
    perm.push_back(x.get<int64_t>());
  }
  if (!is_permutation(perm)) return std::nullopt;
  const std::string from = last["inputs"][0].get<std::string>();
  std::vector<Json> rest;
  for (size_t i = 0; i + 1 < d["nodes"].size(); ++i) {
    Json n = d["nodes"][i];
    if (n.value("name", "") == from) n["name"] = as;
    if (n.contains("inputs"))
      for (auto& in : n["inputs"])
        if (in.is_string() && in.get<std::string>() == from) in = as;
    rest.push_back(std::move(n));
  }
  return rest;
}

Variant variant(const VendorOpInfo* v, const Perm& perm) {
  Variant var{v, perm, Perm(perm.size(), 0)};
  for (size_t i = 0; i < perm.size(); ++i) var.inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  return var;
}

// The variants the device offers, by the op they are a variant of.
std::map<std::string, Variant> variants_of(Runtime& rt, Device& dev) {
  std::set<std::string> vendor;
  for (const auto& k : dev.kernels())
    if (k.op.find('.') != std::string::npos) vendor.insert(k.op);
  std::map<std::string, Variant> out;
  for (const auto& name : vendor) {
    const VendorOpInfo* v = rt.vendor_op(name);
    if (!v) continue;
    Perm perm;
    // A standard base op: one node taking V's inputs in order, every param
    // passed through as "$name".
    if (auto rest = before_permute(*v, "base", perm); rest && rest->size() == 1) {
      const Json& n = rest->front();
      const std::string op = n.value("op", "");
      bool through = n.contains("inputs") && n["inputs"] == Json(v->inputs) && !is_custom_op(op);
      const Json params = n.value("params", Json::object());
      through = through && params.size() == v->params.size();
      for (const auto& [key, val] : params.items())
        through = through && v->params.contains(key) && val == Json("$" + key);
      if (through) {
        out.emplace(op, variant(v, perm));
        continue;
      }
    }
    // A vendor base op: the same inputs, params and decomposition nodes.
    for (const auto& base_name : vendor) {
      const VendorOpInfo* b = rt.vendor_op(base_name);
      if (!b || b == v || !b->has_decomposition() || b->inputs != v->inputs || b->params != v->params ||
          b->outputs.size() != 1 || !b->decomposition.contains("outputs") || b->decomposition["outputs"].size() != 1)
        continue;
      perm.clear();
      auto rest = before_permute(*v, b->decomposition["outputs"][0].get<std::string>(), perm);
      if (!rest || Json(*rest) != b->decomposition["nodes"]) continue;
      out.emplace(base_name, variant(v, perm));
      break;
    }
  }
  return out;
}

bool elementwise(const std::string& op) {
  const spec::OpSpec* s = is_custom_op(op) ? nullptr : spec::find_op(op);
  return s && s->family == "Elementwise";
}

}  // namespace

LayoutResult propagate_layouts(Runtime& rt, const Graph& graph, const std::vector<Node>& nodes,
                               const std::vector<Device*>& devices, const std::vector<std::string>& keep,
                               const std::map<std::string, ValueType>* known_types) {
  LayoutResult r;
  if (devices.empty()) return r;
  Device& dev = *devices.front();
  const std::map<std::string, Variant> variants = variants_of(rt, dev);
  if (variants.empty()) return r;  // most devices: nothing to infer
  // Value names and types are those of the graph as given (the patterns keep
  // the names and types of the nodes they replace).
  std::map<std::string, ValueType> inferred;
  if (!known_types || known_types->empty()) inferred = infer_standard_nodes(graph);
  const std::map<std::string, ValueType>& types = known_types && !known_types->empty() ? *known_types : inferred;
  auto type_of = [&](const std::string& name) -> const ValueType* {
    auto it = types.find(name);
    return it == types.end() || it->second.is_bundle() ? nullptr : &it->second;
  };
  std::set<std::string> names;
  for (const auto& in : graph.inputs()) names.insert(in.name);
  for (const auto& n : nodes) names.insert(n.name);
  auto fresh = [&](const std::string& base) {
    std::string s = base + "/channels_last";
    for (int i = 2; names.count(s); ++i) s = base + "/channels_last" + std::to_string(i);
    names.insert(s);
    return s;
  };
  // A kernel row of `op` for the node's dtypes (every input present: a
  // vendor op's inputs are all required, so conv2d without a bias keeps
  // its layout).
  auto has_row = [&](const std::string& op, const Node& n) {
    std::vector<bp_dtype> key;
    for (const auto& in : n.inputs) {
      const ValueType* t = in.empty() ? nullptr : type_of(in);
      if (!t) return false;
      key.push_back(t->dtype);
    }
    const ValueType* t = type_of(n.name);
    if (!t) return false;
    key.push_back(t->dtype);
    return DeviceAccess::has_kernel(dev, op, key);
  };
  // Which nodes take their variant: those in a chain, where a candidate's
  // output reaches another candidate directly or through elementwise nodes
  // (both ends then take it). A lone convolution stays as it is: its
  // variant would only add a reorder where its output is read.
  auto candidate = [&](const Node& n) {
    auto v = variants.find(n.op);
    const ValueType* t = type_of(n.name);
    return n.device.empty() && v != variants.end() && t && t->shape.size() == v->second.perm.size() &&
           n.inputs.size() == v->second.v->inputs.size() && has_row(v->second.v->op, n);
  };
  std::map<std::string, std::vector<size_t>> readers;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const auto& in : nodes[i].inputs) readers[in].push_back(i);
  std::set<std::string> chained;
  for (const Node& n : nodes) {
    if (!candidate(n)) continue;
    std::vector<std::string> frontier{n.name};
    std::set<std::string> seen;
    for (int depth = 0; depth < 16 && !frontier.empty(); ++depth) {
      std::vector<std::string> next;
      for (const auto& value : frontier)
        for (size_t r : readers[value]) {
          const Node& m = nodes[r];
          if (!seen.insert(m.name).second) continue;
          if (candidate(m)) {
            chained.insert(n.name);
            chained.insert(m.name);
          } else if ((elementwise(m.op) || m.op == "concat") && m.device.empty()) {
            next.push_back(m.name);
          }
        }
      frontier = std::move(next);
    }
  }

  // value -> (the value it is a permute of, the permute's dims), for the
  // permutes this pass makes.
  std::map<std::string, std::pair<std::string, Perm>> permuted;
  std::map<std::string, int> variant_count;
  int sunk = 0;
  std::vector<Node> out;
  auto add_permute = [&](const std::string& name, const std::string& from, const Perm& dims) {
    Node p;
    p.name = name;
    p.op = "permute";
    p.inputs = {from};
    p.params = Json{{"dims", dims}};
    out.push_back(std::move(p));
    permuted[name] = {from, dims};
  };
  for (const Node& n : nodes) {
    if (!n.device.empty()) {
      out.push_back(n);
      continue;
    }
    const ValueType* t = type_of(n.name);
    if (auto v = variants.find(n.op); v != variants.end() && chained.count(n.name)) {
      Node vn = n;
      vn.name = fresh(n.name);
      vn.op = v->second.v->op;
      const std::string from = vn.name;
      out.push_back(std::move(vn));
      add_permute(n.name, from, v->second.inverse);
      ++variant_count[v->second.v->op];
      continue;
    }
    // Every input the same permute of a value (of the output's shape, when
    // `same_shape`): that permute's dims and the values under it.
    auto common_permute = [&](bool same_shape) -> std::optional<std::pair<Perm, std::vector<std::string>>> {
      const Perm* dims = nullptr;
      std::vector<std::string> from;
      for (const auto& in : n.inputs) {
        auto p = permuted.find(in);
        const ValueType* ti = in.empty() ? nullptr : type_of(in);
        if (p == permuted.end() || (dims && *dims != p->second.second) || (same_shape && !(ti && ti->shape == t->shape)))
          return std::nullopt;
        dims = &p->second.second;
        from.push_back(p->second.first);
      }
      if (!dims) return std::nullopt;
      return std::make_pair(*dims, std::move(from));
    };
    // The node on the values under the permute, then the permute.
    auto sink = [&](Node e, const Perm& dims, std::vector<std::string> from) {
      e.name = fresh(n.name);
      e.inputs = std::move(from);
      const std::string e_name = e.name;
      out.push_back(std::move(e));
      add_permute(n.name, e_name, dims);
      ++sunk;
    };
    if (elementwise(n.op) && t) {
      if (auto common = common_permute(true)) {
        sink(n, common->first, std::move(common->second));
        continue;
      }
    }
    if (n.op == "concat" && t && n.params.contains("dim") && n.params["dim"].is_number_integer()) {
      // concat(permute(a, Q), permute(b, Q), dim) = permute(concat(a, b, Q[dim]), Q).
      const int64_t rank = static_cast<int64_t>(t->shape.size());
      int64_t d = n.params["dim"].get<int64_t>();
      d = d < 0 ? d + rank : d;
      auto common = common_permute(false);
      if (common && d >= 0 && d < rank && static_cast<int64_t>(common->first.size()) == rank) {
        Node e = n;
        e.params["dim"] = common->first[static_cast<size_t>(d)];
        sink(std::move(e), common->first, std::move(common->second));
        continue;
      }
    }
    out.push_back(n);
  }
  if (variant_count.empty()) return r;
  // Permutes nobody reads any more (their elementwise readers now read the
  // value under them) are dropped.
  std::map<std::string, int> uses;
  for (const auto& o : graph.outputs()) ++uses[o];
  for (const auto& k : keep) ++uses[k];
  for (const auto& n : out)
    for (const auto& in : n.inputs) ++uses[in];
  int views = 0;
  for (auto& n : out) {
    if (!permuted.count(n.name)) {
      r.nodes.push_back(std::move(n));
      continue;
    }
    if (uses[n.name] == 0) continue;
    ++views;
    r.nodes.push_back(std::move(n));
  }
  std::string what;
  for (const auto& [op, count] : variant_count) {
    what += (what.empty() ? "" : ", ") + std::to_string(count) + " as " + op;
    r.rewritten += count;
  }
  r.notes.push_back("layouts: " + what + " on " + dev.name() + " (its manifest's layout variants); " +
                    std::to_string(sunk) + " elementwise or concat node" + (sunk == 1 ? " follows" : "s follow") +
                    " in the same layout; " + std::to_string(views) + " permute view" +
                    (views == 1 ? "" : "s") + " give the values back where other ops read them");
  r.rewritten += sunk;
  return r;
}

}  // namespace backplane::detail
