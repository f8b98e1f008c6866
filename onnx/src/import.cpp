// ONNX graph -> Backplane graph. The walk (this file): inputs and
// initializers, the live nodes in order, each mapped by its op's handler
// (ops.cpp) through Importer::emit, which infers every node with the core's
// own op table and evaluates at import the nodes whose inputs are all known.
#include "importer.hpp"
#include "pass_compositions.hpp"  // the optimizer's (core/src)

#include "conformance/reference.hpp"

#include <algorithm>
#include <set>
#include <sstream>

namespace backplane::onnx {

namespace detail {

namespace {

bool plain_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-' ||
         c == ':';
}

}  // namespace

std::string Importer::sanitize(const std::string& onnx_name) {
  std::string s;
  size_t i = 0;
  while (i < onnx_name.size() && onnx_name[i] == '/') ++i;
  for (; i < onnx_name.size(); ++i) {
    const char c = onnx_name[i];
    s += c == '/' ? '.' : plain_char(c) ? c : '_';
  }
  if (s.empty() || s == "." || s == "..") s = "v" + s;
  return s;
}

std::string Importer::unique(const std::string& base) {
  std::string name = base;
  for (int k = 1; used_.count(name); ++k) name = base + "_" + std::to_string(k);
  used_.insert(name);
  return name;
}

std::string Importer::origin(const ::onnx::NodeProto& n) {
  return "node '" + (n.name().empty() ? (n.output_size() ? n.output(0) : std::string("?")) : n.name()) + "' (" + n.op_type() +
         ")";
}

std::string Importer::where(const ::onnx::NodeProto& n) const {
  return label_ + ": node '" + (n.name().empty() ? (n.output_size() ? n.output(0) : std::string("?")) : n.name()) + "' (" +
         n.op_type() + ", opset " + std::to_string(opset_) + ")";
}

ValPtr Importer::constant(HostTensor t, const std::string& base) {
  auto v = std::make_shared<Val>();
  v->base = base;
  v->type = {t.dtype, t.shape, {}};
  v->value = std::make_shared<HostTensor>(std::move(t));
  if (current_node_) v->origin = origin(*current_node_);
  return v;
}

void Importer::ensure_in_graph(const ValPtr& v) {
  if (v->in_graph) return;
  if (!v->value) throw Error(label_ + ": internal: value '" + v->base + "' has neither a node nor data");
  v->name = unique(sanitize(v->base));
  if (!v->origin.empty()) origins_[v->name] = v->origin;
  // Small constants are kept for later folding; large ones go to the graph,
  // which shares their data (an initializer's with the model's other imports).
  if (v->value->nbytes() <= kKeepBytes) {
    graph_.constant(v->name, *v->value);
  } else {
    graph_.constant(v->name, std::shared_ptr<const HostTensor>(std::move(v->value)));
    v->moved = true;
  }
  weight_bytes_ += dtype_size(v->type.dtype) * static_cast<uint64_t>(std::max<int64_t>(0, numel(v->type.shape)));
  v->in_graph = true;
}

// Saturating: shapes read from a model's data (ConstantOfShape) may be
// any int64s; a count past INT64_MAX is INT64_MAX (above every limit).
int64_t Importer::numel(const Shape& s) {
  for (auto d : s)
    if (d == 0) return 0;
  int64_t n = 1;
  for (auto d : s)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return INT64_MAX;
  return n;
}

ValPtr Importer::emit(const std::string& base, const std::string& op, const std::vector<ValPtr>& ins, Json params) {
  Node node{base, op, {}, std::move(params), ""};
  std::vector<const backplane::detail::ValueType*> types;
  bool known = true;
  for (const auto& v : ins) {
    types.push_back(v ? &v->type : nullptr);
    node.inputs.push_back(v ? v->base : std::string());
    if (v && !v->value) known = false;
  }
  backplane::detail::InferredNode r;
  try {
    r = backplane::detail::infer_node(node, types);
  } catch (const Error& e) {
    throw Error(*current_ + ": " + e.what(), e.code());
  }
  auto out = std::make_shared<Val>();
  out->base = base;
  out->type = r.out;
  if (current_node_) out->origin = origin(*current_node_);
  // Folding: every input known, small enough, one output.
  if (known && !r.out.is_bundle() && numel(r.out.shape) <= options_.fold_limit) {
    bool small = true;
    std::vector<const HostTensor*> hs;
    for (const auto& v : ins) {
      hs.push_back(v ? v->value.get() : nullptr);
      if (v && numel(v->type.shape) > options_.fold_limit) small = false;
    }
    if (small) {
      try {
        auto res = conformance::reference(op, hs, node.params);
        out->value = std::make_shared<HostTensor>(res.at(0).to_host());
        ++folded_;
        return out;
      } catch (const std::exception&) {
        // Data the op refuses (an index out of range, ...) or an op the
        // evaluator lacks: left to a device, whose error names the node.
      }
    }
  }
  for (const auto& v : ins)
    if (v) ensure_in_graph(v);
  out->name = unique(sanitize(base));
  std::vector<std::string> names;
  for (const auto& v : ins) names.push_back(v ? v->name : std::string());
  graph_.node(out->name, op, std::move(names), std::move(node.params));
  if (!out->origin.empty()) origins_[out->name] = out->origin;
  out->in_graph = true;
  return out;
}

ValPtr Importer::get(const ::onnx::NodeProto& n, int k) const {
  if (k >= n.input_size() || n.input(k).empty()) return nullptr;
  auto it = vals_.find(n.input(k));
  if (it == vals_.end()) throw Error(where(n) + ": input '" + n.input(k) + "' is not defined before this node");
  return it->second;
}

ValPtr Importer::need(const ::onnx::NodeProto& n, int k) const {
  auto v = get(n, k);
  if (!v) throw Error(where(n) + ": input " + std::to_string(k) + " is required");
  return v;
}

const HostTensor& Importer::known(const ::onnx::NodeProto& n, int k, const char* what) const {
  auto v = need(n, k);
  if (!v->value)
    throw Error(where(n) + ": input " + std::to_string(k) + " (" + what + ", '" + n.input(k) +
                "') must be known at import (a constant or computable from shapes); it depends on the data",
                BP_ERR_UNIMPLEMENTED);
  return *v->value;
}

std::vector<int64_t> Importer::ints_of(const HostTensor& t) {
  std::vector<int64_t> r;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!is_float(t.dtype)) {
      r.push_back(t.get_int(i));
      continue;
    }
    const double v = t.get(i);  // a float used as an int: in range, or refused
    if (!(v >= -9.2e18 && v <= 9.2e18)) throw Error("the value " + std::to_string(v) + " is not an integer that fits int64");
    r.push_back(static_cast<int64_t>(v));
  }
  return r;
}

void Importer::set(const ::onnx::NodeProto& n, int k, ValPtr v) {
  if (k < n.output_size() && !n.output(k).empty()) vals_[n.output(k)] = std::move(v);
}

const ::onnx::AttributeProto* Importer::attr(const ::onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

int64_t Importer::attr_i(const ::onnx::NodeProto& n, const std::string& name, int64_t dflt) {
  const auto* a = attr(n, name);
  return a ? a->i() : dflt;
}

double Importer::attr_f(const ::onnx::NodeProto& n, const std::string& name, double dflt) {
  const auto* a = attr(n, name);
  return a ? a->f() : dflt;
}

std::string Importer::attr_s(const ::onnx::NodeProto& n, const std::string& name, const std::string& dflt) {
  const auto* a = attr(n, name);
  return a ? a->s() : dflt;
}

std::optional<std::vector<int64_t>> Importer::attr_ints(const ::onnx::NodeProto& n, const std::string& name) {
  const auto* a = attr(n, name);
  if (!a) return std::nullopt;
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

Shape Importer::input_shape(const ::onnx::ValueInfoProto& vi, const std::string& name) {
  const auto& tt = vi.type().tensor_type();
  auto given = options_.input_shapes.find(name);
  if (!tt.has_shape()) {
    if (given == options_.input_shapes.end())
      throw Error(label_ + ": input '" + name + "' has no shape in the model; give one (--input " + name + "=FILE.npy)");
    return given->second;
  }
  const int rank = tt.shape().dim_size();
  if (given != options_.input_shapes.end() && static_cast<int>(given->second.size()) != rank)
    throw Error(label_ + ": input '" + name + "' has rank " + std::to_string(rank) + " in the model, " +
                std::to_string(given->second.size()) + " given (" + shape_str(given->second) + ")");
  Shape s;
  for (int i = 0; i < rank; ++i) {
    const auto& d = tt.shape().dim(i);
    const int64_t g = given != options_.input_shapes.end() ? given->second[static_cast<size_t>(i)] : -1;
    if (d.has_dim_value() && d.dim_value() > 0) {
      if (g >= 0 && g != d.dim_value())
        throw Error(label_ + ": input '" + name + "' has dim " + std::to_string(i) + " = " + std::to_string(d.dim_value()) +
                    " in the model, " + std::to_string(g) + " given (" + shape_str(given->second) + ")");
      s.push_back(d.dim_value());
      continue;
    }
    // Dynamic: a named dim, or an unnamed one.
    const std::string sym = d.has_dim_param() ? d.dim_param() : std::string();
    int64_t v = g;
    if (auto p = probe_.find(sym); !sym.empty() && p != probe_.end()) v = p->second;
    if (v < 0 && !sym.empty()) {
      auto it = options_.dims.find(sym);
      if (it != options_.dims.end()) v = it->second;
    }
    if (v < 0) v = options_.default_dim;
    if (v < 0)
      throw Error(label_ + ": input '" + name + "' has a dynamic dim " + std::to_string(i) +
                  (sym.empty() ? std::string() : " ('" + sym + "')") + "; give its size (--input " + name +
                  "=FILE.npy" + (sym.empty() ? std::string() : ", or --dim " + sym + "=N") + ")");
    if (!sym.empty()) {
      auto [it, fresh] = dim_values_.emplace(sym, v);
      if (!fresh && it->second != v)
        throw Error(label_ + ": dynamic dim '" + sym + "' is " + std::to_string(it->second) + " in one input and " +
                    std::to_string(v) + " in input '" + name + "'");
    }
    s.push_back(v);
  }
  return s;
}

namespace {

// The nodes that contribute to an output, in the model's (topological) order.
std::vector<int> live_nodes(const ::onnx::GraphProto& g) {
  std::map<std::string, int> producer;
  for (int i = 0; i < g.node_size(); ++i)
    for (const auto& o : g.node(i).output()) producer[o] = i;
  std::vector<bool> live(static_cast<size_t>(g.node_size()), false);
  std::vector<std::string> todo;
  for (const auto& o : g.output()) todo.push_back(o.name());
  while (!todo.empty()) {
    const std::string v = todo.back();
    todo.pop_back();
    auto it = producer.find(v);
    if (it == producer.end() || live[static_cast<size_t>(it->second)]) continue;
    live[static_cast<size_t>(it->second)] = true;
    for (const auto& in : g.node(it->second).input())
      if (!in.empty()) todo.push_back(in);
  }
  std::vector<int> r;
  for (int i = 0; i < g.node_size(); ++i)
    if (live[static_cast<size_t>(i)]) r.push_back(i);
  return r;
}

}  // namespace

int64_t default_opset(const ::onnx::ModelProto& model, const std::string& label) {
  int64_t opset = 0;
  for (const auto& o : model.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
  if (opset == 0) throw Error(label + ": imports no opset of the default ONNX domain");
  if (opset < kMinOpset || opset > kMaxOpset)
    throw Error(label + ": opset " + std::to_string(opset) + " is outside the supported " + std::to_string(kMinOpset) + "-" +
                    std::to_string(kMaxOpset) + " (convert it with onnx.version_converter)",
                BP_ERR_UNIMPLEMENTED);
  return opset;
}

ImportedModel Importer::run(const ::onnx::ModelProto& model, const Initializers& initializers) {
  opset_ = default_opset(model, label_);
  const auto& g = model.graph();
  const auto live = live_nodes(g);

  // Every op without a mapping, before any work.
  std::map<std::string, std::vector<std::string>> missing;
  for (int i : live) {
    const auto& n = g.node(i);
    const bool default_domain = n.domain().empty() || n.domain() == "ai.onnx";
    if (!default_domain || !handlers().count(n.op_type())) {
      const std::string op = default_domain ? n.op_type() : n.domain() + "." + n.op_type();
      missing[op].push_back(n.name().empty() ? n.output(0) : n.name());
    }
  }
  if (!missing.empty()) {
    std::ostringstream m;
    m << label_ << ": " << missing.size() << " ONNX op" << (missing.size() > 1 ? "s" : "") << " of opset " << opset_
      << " cannot be imported (no mapping onto Backplane's ops):";
    for (const auto& [op, nodes] : missing) {
      m << "\n  " << op << ": " << nodes.size() << " node" << (nodes.size() > 1 ? "s" : "") << " (";
      for (size_t k = 0; k < nodes.size() && k < 5; ++k) m << (k ? ", " : "") << "'" << nodes[k] << "'";
      if (nodes.size() > 5) m << ", ...";
      m << ")";
    }
    throw Error(m.str(), BP_ERR_UNIMPLEMENTED);
  }

  // Initializers: constants (an input of the same name takes its default from
  // the initializer, which is then the value used).
  std::set<std::string> init_names;
  for (const auto& [name, t] : initializers) {
    auto v = std::make_shared<Val>();
    v->base = name;
    v->type = {t->dtype, t->shape, {}};
    v->value = t;
    v->origin = "initializer '" + name + "'";
    vals_[name] = std::move(v);
    init_names.insert(name);
  }
  for (const auto& vi : g.input()) {
    if (init_names.count(vi.name())) continue;
    if (!vi.type().has_tensor_type()) throw Error(label_ + ": input '" + vi.name() + "' is not a tensor");
    const auto dt = dtype_of(vi.type().tensor_type().elem_type());
    if (!dt)
      throw Error(label_ + ": input '" + vi.name() + "' has dtype " + onnx_type_name(vi.type().tensor_type().elem_type()) +
                  ", which Backplane lacks");
    const Shape s = input_shape(vi, vi.name());
    auto v = std::make_shared<Val>();
    v->base = vi.name();
    v->name = unique(sanitize(vi.name()));
    v->type = {*dt, s, {}};
    v->in_graph = true;
    graph_.input(v->name, *dt, s);
    vals_[vi.name()] = v;
    result_.inputs.push_back(v->name);
    result_.onnx_names[v->name] = vi.name();
  }
  for (const auto& [name, shape] : options_.input_shapes) {
    bool found = false;
    for (const auto& vi : g.input()) found = found || (vi.name() == name && !init_names.count(name));
    if (!found) throw Error(label_ + ": a shape was given for '" + name + "', which is not an input of the model");
  }

  // Consumers, for the folds that need to know a value has one use.
  for (int i : live)
    for (const auto& in : g.node(i).input()) ++uses_[in];
  for (const auto& o : g.output()) ++uses_[o.name()];

  for (size_t k = 0; k < live.size(); ++k) {
    const auto& n = g.node(live[k]);
    if (skip_.count(live[k])) continue;
    const std::string w = where(n);
    current_ = &w;
    current_node_ = &n;
    next_ = k + 1 < live.size() ? &g.node(live[k + 1]) : nullptr;
    next_index_ = k + 1 < live.size() ? live[k + 1] : -1;
    handlers().at(n.op_type())(*this, n);
    for (const auto& o : n.output())
      if (!o.empty() && uses_[o] && !vals_.count(o))
        throw Error(w + ": output '" + o + "' is used but the import does not produce it", BP_ERR_UNIMPLEMENTED);
  }
  current_ = nullptr;
  current_node_ = nullptr;

  for (const auto& o : g.output()) {
    auto it = vals_.find(o.name());
    if (it == vals_.end()) throw Error(label_ + ": output '" + o.name() + "' is not produced by any node");
    ValPtr v = it->second;
    ensure_in_graph(v);
    std::string name = v->name;
    const std::string want = sanitize(o.name());
    if (name != want && !used_.count(want)) {
      // An output that is an input, a constant or another output's value: a
      // view under the model's name (no copy).
      const std::string w = label_ + ": output '" + o.name() + "'";
      current_ = &w;
      Json p{{"shape", v->type.shape}};
      used_.insert(want);
      graph_.node(want, "reshape", {name}, p);
      origins_[want] = "output '" + o.name() + "'";
      name = want;
      current_ = nullptr;
    }
    graph_.output(name);
    result_.outputs.push_back(name);
    result_.onnx_names[name] = o.name();
  }
  result_.opset = opset_;
  result_.producer = model.producer_name() + (model.producer_version().empty() ? "" : " " + model.producer_version());
  result_.weight_bytes = weight_bytes_;
  if (folded_bn_) result_.notes.push_back(std::to_string(folded_bn_) + " BatchNormalization folded into the Conv before it");
  if (folded_) result_.notes.push_back(std::to_string(folded_) + " values computed at import (shapes and constants)");
  if (options_.map_compositions) {
    if (auto mapped = backplane::detail::map_compositions(graph_, {})) {
      graph_ = std::move(mapped->graph);
      result_.notes.insert(result_.notes.end(), mapped->notes.begin(), mapped->notes.end());
    }
  }
  result_.graph = std::move(graph_);
  return std::move(result_);
}

}  // namespace detail

namespace {

ImportedModel finish(::onnx::ModelProto& m, const ImportOptions& options, const std::string& label,
                     const std::filesystem::path& base) {
  detail::default_opset(m, label);  // before the checker: its complaint about an old opset is less clear
  detail::check_model(m, label, base);
  return detail::import_model(m, options, label, base);
}

}  // namespace

ImportedModel import_file(const std::filesystem::path& path, const ImportOptions& options) {
  ::onnx::ModelProto m;
  detail::read_model_file(path, m);
  return finish(m, options, path.string(), path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path());
}

ImportedModel import_bytes(std::string_view bytes, const ImportOptions& options, const std::string& label) {
  ::onnx::ModelProto m;
  detail::read_model_bytes(bytes, m, label);
  return finish(m, options, label, {});
}

std::vector<std::string> supported_ops() {
  std::vector<std::string> r;
  for (const auto& [op, h] : detail::handlers()) r.push_back(op);
  return r;
}

}  // namespace backplane::onnx
