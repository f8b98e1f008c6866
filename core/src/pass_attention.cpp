// scaled_dot_product_attention: fused from its composed form, and expanded
// back into it where no device has the op (see pass_attention.hpp).
#include "pass_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "ops.hpp"
#include "pass_patterns.hpp"
#include "pass_simplify.hpp"
#include "plugin.hpp"

namespace backplane::detail {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";
constexpr size_t kMaxNearMissNotes = 8;
using Constants = NamedConstants;

std::vector<bp_dtype> key_of(bp_dtype d) { return {d, d, d, d, d}; }

// Whether `t` swaps the last two dims of a rank-`rank` value (a transpose,
// or a permute that moves nothing else).
bool swaps_last_two(const Node& t, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  auto norm = [&](int64_t d) { return d < 0 ? d + r : d; };
  if (t.op == "transpose" && t.params.contains("dim0") && t.params.contains("dim1") &&
      t.params["dim0"].is_number_integer() && t.params["dim1"].is_number_integer()) {
    const int64_t a = norm(t.params["dim0"].get<int64_t>()), b = norm(t.params["dim1"].get<int64_t>());
    return std::min(a, b) == r - 2 && std::max(a, b) == r - 1;
  }
  if (t.op == "permute" && t.params.contains("dims") && t.params["dims"].is_array() &&
      t.params["dims"].size() == rank) {
    for (int64_t i = 0; i < r; ++i) {
      const Json& d = t.params["dims"][static_cast<size_t>(i)];
      if (!d.is_number_integer()) return false;
      const int64_t want = i == r - 2 ? r - 1 : i == r - 1 ? r - 2 : i;
      if (norm(d.get<int64_t>()) != want) return false;
    }
    return true;
  }
  return false;
}

class Fuser {
 public:
  Fuser(const Graph& g, Device* dev, const std::vector<std::string>& keep, uint64_t cpu_min_bytes)
      : g_(g), dev_(dev), cpu_min_bytes_(cpu_min_bytes) {
    ValueUses u = value_uses(g, keep);
    producer_ = std::move(u.producer);
    uses_ = std::move(u.count);
    for (const auto& in : g.inputs())
      if (in.constant) constants_[in.name] = in.constant.get();
  }

  std::optional<AttentionResult> run() {
    bool any = false;
    for (const Node& n : g_.nodes()) any = any || n.op == "softmax";
    if (!any) return std::nullopt;
    types_ = infer_standard_nodes(g_, nullptr);
    const auto& nodes = g_.nodes();
    std::vector<int> role(nodes.size(), 0);  // 0 kept, 1 replaced, 2 absorbed
    std::map<size_t, std::vector<Node>> replacement;
    Constants constants;  // masks made from where's condition
    std::vector<std::string> notes;
    size_t near = 0;
    int fused = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].op != "matmul" || role[i] != 0) continue;
      std::vector<size_t> absorbed;
      std::string why;
      Constants extra;
      std::vector<Node> v = match(i, absorbed, why, extra);
      if (v.empty()) {
        if (!why.empty() && near++ < kMaxNearMissNotes)
          notes.push_back("node '" + nodes[i].name + "' (matmul): not replaced by " + kOp + ": " + why);
        continue;
      }
      bool taken = false;
      for (size_t a : absorbed) taken = taken || role[a] != 0;
      if (taken) continue;
      std::sort(absorbed.begin(), absorbed.end());
      std::vector<std::string> names;
      for (size_t a : absorbed) {
        role[a] = 2;
        names.push_back(nodes[a].name);
      }
      role[i] = 1;
      notes.push_back("node '" + nodes[i].name + "' (matmul) with " + listed(names) + ": replaced by " + kOp +
                      " on " + dev_->name() + " (" + (v.back().inputs[3].empty() ? "scores" : "masked scores") +
                      ", softmax and the weighted sum in one kernel; the score matrix is never stored)");
      replacement[i] = std::move(v);
      constants.insert(constants.end(), extra.begin(), extra.end());
      ++fused;
    }
    if (near > kMaxNearMissNotes) notes.push_back(std::to_string(near - kMaxNearMissNotes) + " more near misses not listed");
    if (fused == 0 && notes.empty()) return std::nullopt;
    AttentionResult r;
    r.notes = std::move(notes);
    r.changed = fused;
    if (fused == 0) {
      r.graph = g_;
      return r;
    }
    std::vector<Node> out;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (role[i] == 1)
        for (auto& n : replacement[i]) out.push_back(std::move(n));
      else if (role[i] == 0)
        out.push_back(nodes[i]);
    }
    r.graph = rebuilt_graph(g_, out, constants);
    return r;
  }

 private:
  const Node* producer(const std::string& name) const {
    auto it = producer_.find(name);
    return it == producer_.end() ? nullptr : &g_.nodes()[it->second];
  }
  size_t index(const Node* n) const { return producer_.at(n->name); }
  // `base`, or base#2, base#3, ... : a name no value of the graph has yet
  // (nor one this pass made).
  std::string fresh(const std::string& base) const {
    auto taken = [&](const std::string& n) {
      if (producer_.count(n) || made_.count(n)) return true;
      for (const auto& in : g_.inputs())
        if (in.name == n) return true;
      return false;
    };
    std::string n = base;
    for (int i = 2; taken(n); ++i) n = base + "#" + std::to_string(i);
    made_.insert(n);
    return n;
  }
  // The value of a one-element float constant, if `name` is one.
  std::optional<double> scalar(const std::string& name) const {
    auto it = constants_.find(name);
    if (it == constants_.end() || it->second->numel() != 1 || !is_float(it->second->dtype)) return std::nullopt;
    return it->second->get(0);
  }

  // The nodes that replace the matmul at `i` (empty: no match; `why` says
  // why when the softmax and the matmul matched but something else did not).
  std::vector<Node> match(size_t i, std::vector<size_t>& absorbed, std::string& why, Constants& extra) const {
    const Node& y = g_.nodes()[i];
    if (y.inputs.size() != 2) return {};
    const Node* sm = producer(y.inputs[0]);
    if (!sm || sm->op != "softmax") return {};
    const std::string& v = y.inputs[1];
    auto t = types_.find(sm->inputs[0]);
    if (t == types_.end() || t->second.is_bundle()) return {};
    const auto rank = static_cast<int64_t>(t->second.shape.size());
    const int64_t dim = sm->params.contains("dim") && sm->params["dim"].is_number_integer()
                            ? sm->params["dim"].get<int64_t>()
                            : 0;
    if (dim != -1 && dim != rank - 1) {
      why = "its softmax '" + sm->name + "' is not over the last dim";
      return {};
    }
    absorbed.push_back(index(sm));
    // softmax's input: [add(·, mask)] over [scale(·)] over matmul(q, kt).
    std::string mask, where_cond;
    double where_fill = 0;
    bool fill_when_true = true;
    const Node* s = producer(sm->inputs[0]);
    double scale = 1.0;
    const Node* mm = nullptr;
    auto scores = [&](const Node* n, double& sc, std::vector<size_t>& took) -> const Node* {
      if (!n) return nullptr;
      if (n->op == "matmul") return n;
      if (n->inputs.size() < 1) return nullptr;
      std::string from;
      if (n->op == "mul" && n->inputs.size() == 2) {
        for (int a = 0; a < 2; ++a)
          if (auto c = scalar(n->inputs[static_cast<size_t>(a)])) {
            sc = *c;
            from = n->inputs[static_cast<size_t>(1 - a)];
            break;
          }
      } else if (n->op == "div" && n->inputs.size() == 2) {
        if (auto c = scalar(n->inputs[1]); c && *c != 0) {
          sc = 1.0 / *c;
          from = n->inputs[0];
        }
      } else if (n->op == "affine") {
        const double add = n->params.contains("add") && n->params["add"].is_number() ? n->params["add"].get<double>() : 0;
        if (add == 0 && n->params.contains("mul") && n->params["mul"].is_number()) {
          sc = n->params["mul"].get<double>();
          from = n->inputs[0];
        }
      }
      const Node* m = from.empty() ? nullptr : producer(from);
      if (!m || m->op != "matmul") return nullptr;
      took.push_back(index(n));
      return m;
    };
    std::vector<size_t> took;
    if (s && s->op == "add" && s->inputs.size() == 2) {
      for (int a = 0; a < 2 && !mm; ++a) {
        took.clear();
        scale = 1.0;
        mm = scores(producer(s->inputs[static_cast<size_t>(a)]), scale, took);
        if (mm) mask = s->inputs[static_cast<size_t>(1 - a)];
      }
      if (mm) took.push_back(index(s));
    } else if (s && s->op == "where" && s->inputs.size() == 3) {
      // masked_fill: where(cond, fill, scores) or where(cond, scores, fill)
      // with a one-element fill; it becomes the additive mask cond ? fill :
      // 0 (or the reverse), since softmax gives fill's weight either way.
      for (size_t a = 1; a < 3 && !mm; ++a) {
        const auto fill = scalar(s->inputs[a]);
        if (!fill) continue;
        took.clear();
        scale = 1.0;
        mm = scores(producer(s->inputs[3 - a]), scale, took);
        if (mm) {
          where_cond = s->inputs[0];
          where_fill = *fill;
          fill_when_true = a == 1;
        }
      }
      if (mm) took.push_back(index(s));
    } else {
      mm = scores(s, scale, took);
    }
    if (!mm) {
      why = "the softmax's input is not q·kᵀ, scaled by a constant and masked by add or where";
      return {};
    }
    absorbed.insert(absorbed.end(), took.begin(), took.end());
    absorbed.push_back(index(mm));
    // Intermediates used only inside the match, nothing pinned.
    for (size_t a : absorbed) {
      const Node& n = g_.nodes()[a];
      if (!n.device.empty()) {
        why = "node '" + n.name + "' is pinned";
        return {};
      }
      auto u = uses_.find(n.name);
      if (u != uses_.end() && u->second > 1) {
        why = "node '" + n.name + "' is also used outside the pattern";
        return {};
      }
    }
    if (!y.device.empty()) {
      why = "it is pinned";
      return {};
    }
    const std::string& q = mm->inputs[0];
    const std::string& kt = mm->inputs[1];
    auto tq = types_.find(q), tkt = types_.find(kt), tv = types_.find(v);
    if (tq == types_.end() || tkt == types_.end() || tv == types_.end()) return {};
    const bp_dtype d = tq->second.dtype;
    if (!DeviceAccess::has_kernel(*dev_, kOp, key_of(d))) {
      why = "device '" + dev_->name() + "' has no " + kOp + " kernel for " + std::string(dtype_name(d));
      return {};
    }
    // On a CPU the composed ops are as fast while the scores stay small
    // (their matmuls and softmax are tuned; the scores stay in cache): the
    // fused kernel pays from cpu_min_bytes_ of scores on.
    if (dev_->kind() == "cpu") {
      auto ts = types_.find(mm->name);
      if (ts == types_.end()) return {};
      uint64_t bytes = 4;
      for (int64_t x : ts->second.shape) bytes *= static_cast<uint64_t>(std::max<int64_t>(x, 0));
      if (bytes < cpu_min_bytes_) {
        why = "its scores (" + std::to_string(bytes >> 10) + " KiB) are below " + std::to_string(cpu_min_bytes_ >> 10) +
              " KiB, where the composed ops are as fast on a cpu";
        return {};
      }
    }
    std::vector<Node> out;
    std::string k;
    ValueType tk;
    const Node* kt_node = producer(kt);
    if (kt_node && kt_node->inputs.size() == 1 && swaps_last_two(*kt_node, tkt->second.shape.size()) &&
        types_.count(kt_node->inputs[0])) {
      k = kt_node->inputs[0];
      tk = types_.at(k);
    } else {
      Node tr;
      tr.name = fresh(y.name + "/k");
      tr.op = "transpose";
      tr.inputs = {kt};
      tr.params = {{"dim0", -2}, {"dim1", -1}};
      try {
        tk = infer_node(tr, {&tkt->second}).out;
      } catch (const Error& e) {
        why = e.what();
        return {};
      }
      k = tr.name;
      out.push_back(std::move(tr));
    }
    ValueType where_mask;
    if (!where_cond.empty()) {
      auto tc = types_.find(where_cond);
      if (tc == types_.end() || tc->second.is_bundle() || tc->second.dtype != BP_DTYPE_BOOL) {
        why = "its where's condition is not a bool tensor";
        return {};
      }
      const double on = fill_when_true ? where_fill : 0.0, off = fill_when_true ? 0.0 : where_fill;
      mask = fresh(y.name + "/mask");
      where_mask = {d, tc->second.shape, {}};
      auto c = constants_.find(where_cond);
      if (c != constants_.end()) {
        // A constant condition (a causal triangle): the mask is a constant.
        auto m = std::make_shared<HostTensor>(d, tc->second.shape);
        for (int64_t e = 0; e < m->numel(); ++e) m->set(e, c->second->get_int(e) ? on : off);
        extra.emplace_back(mask, std::move(m));
      } else {
        std::vector<std::string> names;
        for (const auto& [suffix, value] : {std::pair<const char*, double>{"/on", on}, {"/off", off}}) {
          auto t = std::make_shared<HostTensor>(d, Shape{});
          t->set(0, value);
          names.push_back(fresh(y.name + suffix));
          extra.emplace_back(names.back(), std::move(t));
        }
        out.push_back(Node{mask, "where", {where_cond, names[0], names[1]}, Json::object(), ""});
      }
    }
    Node f;
    f.name = y.name;
    f.op = kOp;
    f.inputs = {q, k, v, mask};
    f.params = {{"scale", scale}};
    const ValueType* tm = nullptr;
    if (!where_cond.empty()) {
      tm = &where_mask;
    } else if (!mask.empty()) {
      auto it = types_.find(mask);
      if (it == types_.end()) return {};
      tm = &it->second;
    }
    try {
      const InferredNode r = infer_node(f, {&tq->second, &tk, &tv->second, tm});
      auto ty = types_.find(y.name);
      if (ty == types_.end() || r.out.dtype != ty->second.dtype || r.out.shape != ty->second.shape) {
        why = "the fused op would not give the matmul's type";
        return {};
      }
    } catch (const Error& e) {
      why = e.what();
      return {};
    }
    out.push_back(std::move(f));
    return out;
  }

  const Graph& g_;
  Device* dev_;
  uint64_t cpu_min_bytes_;
  std::map<std::string, size_t> producer_;
  std::map<std::string, int> uses_;
  std::map<std::string, const HostTensor*> constants_;
  mutable std::set<std::string> made_;  // names fresh() gave out
  std::map<std::string, ValueType> types_;
};

}  // namespace

std::optional<AttentionResult> fuse_attention(const Graph& graph, const std::vector<Device*>& devices,
                                              const std::vector<std::string>& keep, uint64_t cpu_min_score_bytes) {
  if (devices.empty()) return std::nullopt;
  return Fuser(graph, devices.front(), keep, cpu_min_score_bytes).run();
}

std::optional<AttentionResult> expand_attention(const Graph& graph, const std::vector<Device*>& devices) {
  bool any = false;
  for (const Node& n : graph.nodes()) any = any || n.op == kOp;
  if (!any) return std::nullopt;
  const auto types = infer_standard_nodes(graph, nullptr);
  AttentionResult r;
  Constants extra;
  std::vector<Node> out;
  for (const Node& n : graph.nodes()) {
    if (n.op != kOp) {
      out.push_back(n);
      continue;
    }
    auto tq = n.inputs.size() >= 3 ? types.find(n.inputs[0]) : types.end();
    auto tk = n.inputs.size() >= 3 ? types.find(n.inputs[1]) : types.end();
    if (tq == types.end() || tk == types.end() || tq->second.shape.size() < 2 || tk->second.shape.size() < 2) {
      out.push_back(n);  // lowering reports the node's own error
      continue;
    }
    const bp_dtype d = tq->second.dtype;
    bool served = false;
    for (Device* dev : devices)
      if (n.device.empty() || dev->name() == n.device) served = served || DeviceAccess::has_kernel(*dev, kOp, key_of(d));
    if (served) {
      out.push_back(n);
      continue;
    }
    const Shape& qs = tq->second.shape;
    const int64_t Sq = qs[qs.size() - 2], D = qs.back(), Sk = tk->second.shape[tk->second.shape.size() - 2];
    const double scale = n.params.contains("scale") && n.params["scale"].is_number()
                             ? n.params["scale"].get<double>()
                             : (D > 0 ? 1.0 / std::sqrt(static_cast<double>(D)) : 1.0);
    const bool causal = n.params.contains("causal") && n.params["causal"].is_boolean() && n.params["causal"].get<bool>();
    const std::string p = n.name + "/";
    auto add = [&](const std::string& name, const std::string& op, std::vector<std::string> ins, Json params) {
      out.push_back(Node{name, op, std::move(ins), std::move(params), n.device});
      return name;
    };
    std::string x = add(p + "kt", "transpose", {n.inputs[1]}, {{"dim0", -2}, {"dim1", -1}});
    x = add(p + "scores", "matmul", {n.inputs[0], x}, Json::object());
    x = add(p + "scaled", "affine", {x}, {{"mul", scale}, {"add", 0.0}});
    if (n.inputs.size() > 3 && !n.inputs[3].empty()) x = add(p + "masked", "add", {x, n.inputs[3]}, Json::object());
    if (causal) {
      auto m = std::make_shared<HostTensor>(d, Shape{Sq, Sk});
      for (int64_t i = 0; i < Sq; ++i)
        for (int64_t j = 0; j < Sk; ++j)
          if (j > i + Sk - Sq) m->set(i * Sk + j, -std::numeric_limits<double>::infinity());
      extra.emplace_back(p + "causal_mask", std::move(m));
      x = add(p + "causal", "add", {x, p + "causal_mask"}, Json::object());
    }
    x = add(p + "weights", "softmax", {x}, {{"dim", -1}});
    add(n.name, "matmul", {x, n.inputs[2]}, Json::object());
    r.notes.push_back("node '" + n.name + "' (" + kOp + "): no device of the list has its kernel for " +
                      std::string(dtype_name(d)) + "; runs its composed form (transpose, matmul, affine" +
                      (n.inputs.size() > 3 && !n.inputs[3].empty() ? ", add of the mask" : "") +
                      (causal ? ", add of a causal mask" : "") + ", softmax, matmul: " + p + "...)");
    ++r.changed;
  }
  if (r.changed == 0) return std::nullopt;
  r.graph = rebuilt_graph(graph, out, extra);
  return r;
}

}  // namespace backplane::detail
