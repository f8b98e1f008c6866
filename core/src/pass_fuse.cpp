// Elementwise chains as one fused_elementwise node (see pass_fuse.hpp).
#include "pass_fuse.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "fused_program.hpp"
#include "ops.hpp"
#include "pass_patterns.hpp"
#include "pass_simplify.hpp"
#include "plugin.hpp"

namespace backplane::detail {

namespace {

// Inputs of a fused node the pass writes: what every shipped kernel takes
// (the Vulkan plugin passes at most 8 operands, the output included; the
// op itself allows 16).
constexpr size_t kMaxInputs = 7;
const char* const kOp = "fused_elementwise";

class Fuser {
 public:
  Fuser(const Graph& g, const std::vector<Node>& nodes, const std::vector<std::string>& keep)
      : nodes_(nodes) {
    // Types by name: the graph's, then every standard node of the list in
    // order (later passes add values of their own; a vendor node keeps the
    // name and type of what it replaced, or stays unknown).
    types_ = infer_standard_nodes(g);
    infer_nodes(nodes_, types_);
    for (size_t i = 0; i < nodes_.size(); ++i) producer_[nodes_[i].name] = i;
    for (const Node& n : nodes_)
      for (const auto& in : n.inputs)
        if (!in.empty()) ++uses_[in];
    for (const auto& o : g.outputs()) ++uses_[o], pinned_values_.insert(o);
    for (const auto& k : keep) ++uses_[k], pinned_values_.insert(k);
  }

  FuseResult run() {
    FuseResult r;
    std::vector<int> group_of(nodes_.size(), -1);
    std::vector<std::vector<size_t>> groups;
    for (size_t s = nodes_.size(); s-- > 0;) {
      if (group_of[s] >= 0 || !sink_ok(s)) continue;
      std::vector<size_t> members = grow(s, group_of);
      if (members.size() < 2) continue;
      const int id = static_cast<int>(groups.size());
      for (size_t m : members) group_of[m] = id;
      groups.push_back(std::move(members));
    }
    if (groups.empty()) return r;
    std::vector<Node> fused(groups.size());
    std::vector<std::string> texts(groups.size());
    std::vector<char> made(groups.size(), 0);
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      std::string why;
      if (build(groups[gi], fused[gi], texts[gi], why)) {
        made[gi] = 1;
        continue;
      }
      r.notes.push_back("fuse: not fused: " + describe(groups[gi]) + ": " + why);
    }
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const int gi = group_of[i];
      if (gi < 0 || !made[static_cast<size_t>(gi)]) {
        r.nodes.push_back(nodes_[i]);
        continue;
      }
      const auto& members = groups[static_cast<size_t>(gi)];
      if (i != members.front()) continue;  // the sink comes first (grown from it)
      r.nodes.push_back(fused[static_cast<size_t>(gi)]);
      ++r.fused;
      r.nodes_in += static_cast<int>(members.size());
      const Node& f = fused[static_cast<size_t>(gi)];
      r.notes.push_back("fuse: " + describe(members) + " run as one fused_elementwise node '" + f.name + "' (" +
                        std::to_string(f.inputs.size()) + " input" + (f.inputs.size() == 1 ? "" : "s") + ": " +
                        texts[static_cast<size_t>(gi)] + ")");
    }
    if (!r.fused) r.nodes.clear();
    return r;
  }

 private:
  const ValueType* type(const std::string& v) const {
    auto it = types_.find(v);
    return it == types_.end() || it->second.is_bundle() ? nullptr : &it->second;
  }

  // The node is an op a program takes, on f32 values (a where's condition
  // and a comparison's result: bool), unpinned, its types known.
  bool node_ok(size_t i) const {
    const Node& n = nodes_[i];
    const FusedOpInfo* info = fused_op(n.op);
    if (!info || !n.device.empty()) return false;
    const ValueType* out = type(n.name);
    if (!out) return false;
    const bool compare = info->arity == FusedArity::Compare;
    if (out->dtype != (compare ? BP_DTYPE_BOOL : BP_DTYPE_F32)) return false;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const ValueType* t = n.inputs[k].empty() ? nullptr : type(n.inputs[k]);
      if (!t) return false;
      const bool cond = info->arity == FusedArity::Where && k == 0;
      if (t->dtype != (cond ? BP_DTYPE_BOOL : BP_DTYPE_F32)) return false;
    }
    return true;
  }

  bool sink_ok(size_t i) const { return node_ok(i) && type(nodes_[i].name)->dtype == BP_DTYPE_F32; }

  // The sink, then every producer that joins, until none does.
  std::vector<size_t> grow(size_t sink, const std::vector<int>& group_of) const {
    std::vector<size_t> members{sink};
    std::set<size_t> in_group{sink};
    const Shape& shape = type(nodes_[sink].name)->shape;
    for (bool changed = true; changed;) {
      changed = false;
      std::map<std::string, int> reads;  // values the group reads, and how often
      for (size_t m : members)
        for (const auto& in : nodes_[m].inputs)
          if (!in.empty()) ++reads[in];
      for (const auto& [v, count] : reads) {
        auto p = producer_.find(v);
        if (p == producer_.end() || in_group.count(p->second) || group_of[p->second] >= 0) continue;
        if (pinned_values_.count(v) || uses_.at(v) != count || !node_ok(p->second)) continue;
        if (type(v)->shape != shape) continue;
        members.push_back(p->second);
        in_group.insert(p->second);
        changed = true;
      }
    }
    if (members.size() > BP_FUSED_MAX_CODE) members.clear();
    return members;
  }

  // The group's node: outside values as inputs (an f32 one first), the
  // members in list order as the program.
  bool build(const std::vector<size_t>& members, Node& out, std::string& text, std::string& why) const {
    std::vector<size_t> order = members;
    std::sort(order.begin(), order.end());
    std::vector<std::string> ins;
    std::set<std::string> inside;
    for (size_t m : order) inside.insert(nodes_[m].name);
    for (size_t m : order)
      for (const auto& v : nodes_[m].inputs)
        if (!inside.count(v) && std::find(ins.begin(), ins.end(), v) == ins.end()) ins.push_back(v);
    if (ins.size() > kMaxInputs) {
      why = "it reads " + std::to_string(ins.size()) + " values; the optimizer writes fused nodes of at most " +
            std::to_string(kMaxInputs) + " inputs";
      return false;
    }
    std::stable_partition(ins.begin(), ins.end(), [&](const std::string& v) { return type(v)->dtype == BP_DTYPE_F32; });
    std::map<std::string, int> reg;
    for (size_t k = 0; k < ins.size(); ++k) reg[ins[k]] = static_cast<int>(k);
    Json program = Json::array();
    for (size_t m : order) {
      const Node& n = nodes_[m];
      Json one = Json::array({n.op});
      for (const auto& v : n.inputs) one.push_back(reg.at(v));
      Json p = n.params.is_object() ? n.params : Json::object();
      if (!p.empty()) one.push_back(p);
      program.push_back(std::move(one));
      reg[n.name] = static_cast<int>(ins.size() + program.size() - 1);
    }
    out = Node{};
    out.name = nodes_[order.back()].name;
    out.op = kOp;
    out.inputs = ins;
    out.params = Json{{"program", std::move(program)}};
    // Proven before use: the program must check and give the sink's type.
    try {
      std::vector<const ValueType*> in;
      for (const auto& v : ins) in.push_back(type(v));
      const InferredNode r = infer_node(out, in);
      text = program_text(*r.program, ins.size());
      const ValueType* want = type(out.name);
      if (r.out.dtype != want->dtype || r.out.shape != want->shape) {
        why = "the fused node would give " + shape_str(r.out.shape) + ", the chain " + shape_str(want->shape);
        return false;
      }
    } catch (const std::exception& e) {
      why = e.what();
      return false;
    }
    return true;
  }

  std::string describe(const std::vector<size_t>& members) const {
    std::vector<size_t> order = members;
    std::sort(order.begin(), order.end());
    std::vector<std::string> names;
    for (size_t m : order) names.push_back(nodes_[m].name);
    return std::to_string(members.size()) + " elementwise nodes (" + listed(names) + ")";
  }

  const std::vector<Node>& nodes_;
  std::map<std::string, ValueType> types_;
  std::map<std::string, size_t> producer_;
  std::map<std::string, int> uses_;
  std::set<std::string> pinned_values_;
};

}  // namespace

namespace {
bool has_fused_kernel(const Device& d, bp_dtype dt = BP_DTYPE_F32) {
  // A variadic kernel keyed (x0, output).
  const int k = DeviceAccess::plugin(d).find_kernel(kOp, {dt, dt});
  return DeviceAccess::supports(d, k) && DeviceAccess::plugin(d).info().kernels[static_cast<size_t>(k)].variadic;
}
}  // namespace

std::optional<FuseExpansion> expand_fused(const Graph& graph, const std::vector<Device*>& devices) {
  bool any = false;
  for (const Node& n : graph.nodes()) any = any || n.op == kOp;
  if (!any) return std::nullopt;
  const auto types = infer_standard_nodes(graph);
  FuseExpansion r;
  std::vector<Node> out;
  int changed = 0;
  for (const Node& n : graph.nodes()) {
    auto t = types.find(n.name);
    bool served = false;
    for (Device* dev : devices)
      if (t != types.end() && (n.device.empty() || dev->name() == n.device))
        served = served || has_fused_kernel(*dev, t->second.dtype);
    const Json* prog = n.params.is_object() && n.params.contains("program") ? &n.params["program"] : nullptr;
    // Left as written: another op, a device that runs it, or a node that
    // does not infer (lowering reports its own error).
    if (n.op != kOp || served || t == types.end() || !prog) {
      out.push_back(n);
      continue;
    }
    std::vector<std::string> regs = n.inputs;
    for (size_t k = 0; k < prog->size(); ++k) {
      const Json& ins = (*prog)[k];
      Node s;
      s.name = k + 1 == prog->size() ? n.name + "/last" : n.name + "/r" + std::to_string(regs.size());
      s.op = ins[0].get<std::string>();
      s.device = n.device;
      for (size_t a = 1; a < ins.size(); ++a) {
        if (ins[a].is_object()) s.params = ins[a];
        else s.inputs.push_back(regs.at(ins[a].get<size_t>()));
      }
      regs.push_back(s.name);
      out.push_back(std::move(s));
    }
    // The node's own name last, at its shape (the last register may be
    // smaller when some input is used only earlier).
    out.push_back(Node{n.name, "broadcast_to", {regs.back()}, {{"shape", t->second.shape}}, n.device});
    r.notes.push_back("node '" + n.name + "' (" + kOp + "): no device of the list has its kernel; runs its " +
                      std::to_string(prog->size()) + " instructions as standard nodes (" + n.name + "/...)");
    ++changed;
  }
  if (!changed) return std::nullopt;
  r.graph = rebuilt_graph(graph, out);
  return r;
}

FuseResult fuse_elementwise(const Graph& graph, const std::vector<Node>& nodes, const std::vector<Device*>& devices,
                            const std::vector<std::string>& keep) {
  FuseResult r;
  if (devices.empty()) return r;
  const Device& first = *devices.front();
  if (!has_fused_kernel(first)) return r;
  return Fuser(graph, nodes, keep).run();
}

}  // namespace backplane::detail
