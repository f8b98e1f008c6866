// Vendor ops' decompositions as patterns (see pass_patterns.hpp).
#include "pass_patterns.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "ops.hpp"
#include "plugin.hpp"
#include "vendor_ops.hpp"

namespace backplane::detail {

namespace {

constexpr size_t kMaxNearMissNotes = 8;

// A vendor op's decomposition, indexed.
struct Pattern {
  const VendorOpInfo* decl = nullptr;
  std::vector<const Json*> nodes;
  std::map<std::string, size_t> index;  // local node name -> position
  size_t out = 0;                       // the node that gives the op's output
  std::string shape;                    // "conv2d -> relu", for notes
};

struct Match {
  std::map<size_t, size_t> node_of;             // pattern node -> graph node
  std::map<std::string, std::string> input_of;  // vendor input -> graph value
};

std::optional<Pattern> make_pattern(const VendorOpInfo* decl) {
  if (!decl || !decl->has_decomposition() || decl->outputs.size() != 1) return std::nullopt;
  const Json& d = decl->decomposition;
  if (!d.contains("nodes") || !d["nodes"].is_array() || d["nodes"].empty() || !d.contains("outputs") ||
      d["outputs"].size() != 1)
    return std::nullopt;
  Pattern p;
  p.decl = decl;
  for (const auto& n : d["nodes"]) {
    p.index[n["name"].get<std::string>()] = p.nodes.size();
    p.nodes.push_back(&n);
    p.shape += (p.shape.empty() ? "" : " -> ") + n["op"].get<std::string>();
  }
  auto it = p.index.find(d["outputs"][0].get<std::string>());
  if (it == p.index.end()) return std::nullopt;
  p.out = it->second;
  return p;
}

std::vector<std::string> inputs_of(const Json& n) {
  std::vector<std::string> v;
  if (n.contains("inputs"))
    for (const auto& i : n["inputs"]) v.push_back(i.is_string() ? i.get<std::string>() : std::string());
  return v;
}

std::vector<std::string> trimmed(std::vector<std::string> v) {
  while (!v.empty() && v.back().empty()) v.pop_back();
  return v;
}

// The params bytes as infer_node fills them (zeroed first, see params_of):
// equal bytes are equal params, -0.0 and 0.0 differ.
bool same_params(const bp_op_params& a, const bp_op_params& b) { return std::memcmp(&a, &b, sizeof a) == 0; }

class Substituter {
 public:
  Substituter(Runtime& rt, const Graph& g, const std::vector<Device*>& devices, const std::vector<std::string>& keep)
      : rt_(rt), g_(g), dev_(devices.empty() ? nullptr : devices.front()) {
    ValueUses u = value_uses(g, keep);
    producer_ = std::move(u.producer);
    uses_ = std::move(u.count);
  }

  PatternResult run() {
    PatternResult r;
    std::vector<Pattern> patterns;
    if (dev_) {
      std::set<std::string> seen;
      for (const auto& k : dev_->kernels())
        if (k.op.find('.') != std::string::npos && seen.insert(k.op).second)
          if (auto p = make_pattern(rt_.vendor_op(k.op))) patterns.push_back(std::move(*p));
    }
    // No pattern on this device (Vulkan, most plugins): nothing to infer, the
    // graph's nodes stay as they are (r.nodes empty, r.substituted 0).
    if (patterns.empty()) return r;
    infer_all();
    r.types = types_;
    // Larger patterns first: conv2d -> add -> relu before conv2d -> relu.
    std::stable_sort(patterns.begin(), patterns.end(),
                     [](const Pattern& a, const Pattern& b) { return a.nodes.size() > b.nodes.size(); });
    const auto& nodes = g_.nodes();
    std::vector<int> role(nodes.size(), 0);  // 0 kept, 1 anchor (replaced), 2 absorbed
    std::map<size_t, Node> replacement;
    size_t near_misses = 0;
    // From the last node back: a pattern is anchored at its output node, so
    // a longer chain (matmul -> add -> gelu, anchored at gelu) is tried
    // before a shorter one inside it (matmul -> add) takes its nodes.
    std::vector<std::string> notes;
    for (size_t gi = nodes.size(); gi-- > 0;) {
      for (const Pattern& p : patterns) {
        const Json& out_node = *p.nodes[p.out];
        if (out_node["op"] != nodes[gi].op) continue;
        Match m;
        if (!structure(p, p.out, gi, m, role)) continue;
        std::string why;
        std::optional<Node> v = prove(p, gi, m, why);
        if (!v) {
          if (near_misses++ < kMaxNearMissNotes)
            notes.push_back("node '" + nodes[gi].name + "' (" + nodes[gi].op + "): not replaced by " + p.decl->op +
                            " (" + p.shape + "): " + why);
          continue;
        }
        for (const auto& [pi, n] : m.node_of) role[n] = 2;
        role[gi] = 1;
        std::string absorbed;
        for (const auto& [pi, n] : m.node_of)
          if (n != gi) absorbed += (absorbed.empty() ? "'" : ", '") + nodes[n].name + "'";
        notes.push_back("node '" + nodes[gi].name + "' (" + nodes[gi].op + ")" +
                        (absorbed.empty() ? "" : " with " + absorbed) + ": replaced by " + p.decl->op + " on " +
                        dev_->name() + " (its manifest's decomposition " + p.shape + " matched)");
        replacement[gi] = std::move(*v);
        ++r.substituted;
        break;
      }
    }
    // In the graph's order, as --explain reads best.
    r.notes.insert(r.notes.end(), notes.rbegin(), notes.rend());
    if (near_misses > kMaxNearMissNotes)
      r.notes.push_back(std::to_string(near_misses - kMaxNearMissNotes) + " more near misses not listed");
    if (r.substituted == 0) return r;
    for (size_t gi = 0; gi < nodes.size(); ++gi) {
      if (role[gi] == 1)
        r.nodes.push_back(std::move(replacement[gi]));
      else if (role[gi] == 0)
        r.nodes.push_back(nodes[gi]);
    }
    return r;
  }

 private:
  struct Typed {
    ValueType type;
    bp_op_params params{};
    OpClass cls = OpClass::Kernel;
    // Views (slice, permute, ...): their params live here, not in `params`.
    std::function<std::optional<Layout>(const Layout&)> view;
    Shape in_shape;  // input 0's, to probe `view` with
  };

  // Whether two inferences of one op agree: typed params, and for views
  // the layout each makes of the same dense input (a slice's start and step
  // are not in bp_op_params).
  static bool same_node(const InferredNode& r, const Typed& t) {
    if (r.cls != t.cls || r.out.dtype != t.type.dtype || r.out.shape != t.type.shape || !same_params(r.params, t.params))
      return false;
    if (!r.view && !t.view) return true;
    if (!r.view || !t.view) return false;
    const Layout probe = Layout::contiguous(t.in_shape);
    return r.view(probe) == t.view(probe);
  }

  // Types and typed params of every standard node whose inputs are known.
  void infer_all() {
    types_ = infer_standard_nodes(g_, [&](size_t i, const InferredNode& r, const std::vector<const ValueType*>& in) {
      typed_[i] = {r.out, r.params, r.cls, r.view, !in.empty() && in[0] ? in[0]->shape : Shape{}};
    });
  }

  // Same ops, same wiring, from the output node back to the vendor inputs.
  bool structure(const Pattern& p, size_t pi, size_t gi, Match& m, const std::vector<int>& role) const {
    if (auto it = m.node_of.find(pi); it != m.node_of.end()) return it->second == gi;
    for (const auto& [q, n] : m.node_of)
      if (n == gi) return false;
    const Node& gn = g_.nodes()[gi];
    const Json& dn = *p.nodes[pi];
    if (role[gi] != 0 || dn["op"] != gn.op || !typed_.count(gi)) return false;
    const auto din = trimmed(inputs_of(dn));
    const auto gin = trimmed(gn.inputs);
    if (din.size() != gin.size()) return false;
    m.node_of[pi] = gi;
    const auto& vin = p.decl->inputs;
    auto inputs_match = [&](const std::vector<std::string>& order, Match& mm) {
      for (size_t k = 0; k < din.size(); ++k) {
        if (din[k].empty() != order[k].empty()) return false;
        if (din[k].empty()) continue;
        if (std::find(vin.begin(), vin.end(), din[k]) != vin.end()) {
          auto [it, fresh] = mm.input_of.emplace(din[k], order[k]);
          if (!fresh && it->second != order[k]) return false;
          continue;
        }
        auto local = p.index.find(din[k]);
        auto prod = producer_.find(order[k]);
        if (local == p.index.end() || prod == producer_.end()) return false;
        if (!structure(p, local->second, prod->second, mm, role)) return false;
      }
      return true;
    };
    // A commutative binary op matches its operands in either order
    // (exporters write Add(bias, x) as often as Add(x, bias)).
    static const std::set<std::string> commutative = {"add", "mul", "maximum", "minimum", "eq", "ne"};
    if (din.size() == 2 && commutative.count(gn.op)) {
      Match swapped = m;
      if (inputs_match(gin, m)) return true;
      if (inputs_match({gin[1], gin[0]}, swapped)) {
        m = std::move(swapped);
        return true;
      }
      return false;
    }
    return inputs_match(gin, m);
  }

  // The checks after the structure matched; the vendor node, or why not.
  std::optional<Node> prove(const Pattern& p, size_t anchor, const Match& m, std::string& why) const {
    const auto& nodes = g_.nodes();
    const VendorOpInfo& decl = *p.decl;
    for (const auto& name : decl.inputs)
      if (!m.input_of.count(name)) {
        why = "its input '" + name + "' is not used by the decomposition";
        return std::nullopt;
      }
    // Intermediates used only inside the match.
    for (const auto& [pi, gi] : m.node_of) {
      if (!nodes[gi].device.empty()) {
        why = "node '" + nodes[gi].name + "' is pinned";
        return std::nullopt;
      }
      if (gi == anchor) continue;
      int inside = 0;
      for (const auto& [q, gj] : m.node_of)
        for (const auto& in : nodes[gj].inputs) inside += in == nodes[gi].name;
      auto u = uses_.find(nodes[gi].name);
      if (u != uses_.end() && u->second > inside) {
        why = "node '" + nodes[gi].name + "' is also used outside the pattern";
        return std::nullopt;
      }
    }
    // Params: "$name" entries bind the vendor op's params.
    Json bound = Json::object();
    for (const auto& [pi, gi] : m.node_of) {
      const Json& dn = *p.nodes[pi];
      if (!dn.contains("params")) continue;
      for (const auto& [key, val] : dn["params"].items()) {
        if (!val.is_string()) continue;
        std::string s = val.get<std::string>();
        if (s.empty() || s[0] != '$') continue;
        s.erase(0, 1);
        if (!decl.params.contains(s) || !nodes[gi].params.contains(key)) continue;
        const Json& given = nodes[gi].params[key];
        if (bound.contains(s) && bound[s] != given) {
          why = "param '" + s + "' would take two values";
          return std::nullopt;
        }
        bound[s] = given;
      }
    }
    Node v;
    v.name = nodes[anchor].name;
    v.op = decl.op;
    v.params = bound;
    std::vector<std::pair<bp_dtype, Shape>> in_types;
    std::vector<bp_dtype> key;
    for (const auto& name : decl.inputs) {
      v.inputs.push_back(m.input_of.at(name));
      auto t = types_.find(v.inputs.back());
      if (t == types_.end() || t->second.is_bundle()) {
        why = "input '" + v.inputs.back() + "' has no known type";
        return std::nullopt;
      }
      in_types.emplace_back(t->second.dtype, t->second.shape);
      key.push_back(t->second.dtype);
    }
    const Typed& out = typed_.at(anchor);
    if (out.type.is_bundle()) {
      why = "the node gives a bundle";
      return std::nullopt;
    }
    key.push_back(out.type.dtype);
    if (!DeviceAccess::has_kernel(*dev_, decl.op, key)) {
      why = "device '" + dev_->name() + "' has no " + decl.op + " kernel for these dtypes";
      return std::nullopt;
    }
    // Proof: the decomposition with these params infers, node by node, what
    // the graph's nodes infer (same outputs, same typed params).
    try {
      const Expansion e = expand_vendor_node(decl, v, in_types);
      std::map<std::string, ValueType> local;
      auto type_of = [&](const std::string& name) -> const ValueType* {
        if (auto it = local.find(name); it != local.end()) return &it->second;
        if (auto it = types_.find(name); it != types_.end()) return &it->second;
        return nullptr;
      };
      for (const Node& sub : e.nodes) {
        std::vector<const ValueType*> in;
        for (const auto& name : sub.inputs) in.push_back(name.empty() ? nullptr : type_of(name));
        const InferredNode r = infer_node(sub, in);
        local[sub.name] = r.out;
        const std::string short_name = sub.name.substr(v.name.size() + 1);
        auto pi = p.index.find(short_name);
        if (pi == p.index.end()) continue;
        const size_t gi = m.node_of.at(pi->second);
        const Typed& t = typed_.at(gi);
        if (!same_node(r, t)) {
          why = "node '" + nodes[gi].name + "' has params the decomposition does not give (" + nodes[gi].params.dump() +
                ")";
          return std::nullopt;
        }
      }
    } catch (const std::exception& e) {
      why = std::string("its decomposition does not apply: ") + e.what();
      return std::nullopt;
    }
    return v;
  }

  Runtime& rt_;
  const Graph& g_;
  Device* dev_;
  std::map<std::string, size_t> producer_;
  std::map<std::string, int> uses_;
  std::map<std::string, ValueType> types_;
  std::map<size_t, Typed> typed_;
};

}  // namespace

ValueUses value_uses(const Graph& g, const std::vector<std::string>& keep) {
  ValueUses u;
  for (const auto& o : g.outputs()) ++u.count[o];
  for (const auto& k : keep) ++u.count[k];
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    u.producer[n.name] = i;
    for (const auto& in : n.inputs)
      if (!in.empty()) ++u.count[in];
  }
  return u;
}

void infer_nodes(const std::vector<Node>& nodes, std::map<std::string, ValueType>& types,
                 const std::function<void(size_t, const InferredNode&, const std::vector<const ValueType*>&)>& on_node) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (is_custom_op(n.op) && !is_known_op(n.op)) continue;
    std::vector<const ValueType*> in;
    bool known = true;
    for (const auto& name : n.inputs) {
      if (name.empty()) {
        in.push_back(nullptr);
        continue;
      }
      auto it = types.find(name);
      known = it != types.end();
      if (!known) break;
      in.push_back(&it->second);
    }
    if (!known) continue;
    try {
      InferredNode r = infer_node(n, in);
      if (on_node) on_node(i, r, in);
      types[n.name] = r.out;
    } catch (const std::exception&) {
    }
  }
}

std::map<std::string, ValueType> infer_standard_nodes(
    const Graph& g, const std::function<void(size_t, const InferredNode&, const std::vector<const ValueType*>&)>& on_node) {
  std::map<std::string, ValueType> types;
  for (const auto& in : g.inputs()) types[in.name] = {in.dtype, in.shape, {}};
  infer_nodes(g.nodes(), types, on_node);
  return types;
}

Graph rebuilt_graph(const Graph& g, const std::vector<Node>& nodes, const NamedConstants& extra,
                    const std::set<std::string>& drop) {
  Graph r;
  for (const auto& in : g.inputs()) {
    if (in.constant) {
      if (!drop.count(in.name)) r.constant(in.name, in.constant);
    } else if (in.dim_names.empty()) {
      r.input(in.name, in.dtype, in.shape);
    } else {
      r.input(in.name, in.dtype, in.shape, in.dim_names);
    }
  }
  for (const auto& [name, value] : extra) r.constant(name, value);
  for (const Node& n : nodes) r.node(n.name, n.op, n.inputs, n.params, n.device);
  for (const auto& o : g.outputs()) r.output(o);
  return r;
}

PatternResult substitute_patterns(Runtime& rt, const Graph& graph, const std::vector<Device*>& devices,
                                  const std::vector<std::string>& keep) {
  return Substituter(rt, graph, devices, keep).run();
}

}  // namespace backplane::detail
