// Dynamic dims kept through an import (ImportOptions::keep_dynamic and
// dynamic_dims). The importer folds a model's shape arithmetic (Shape,
// Gather, Concat, ...) into numbers, so a graph imported at one size holds
// params and constants computed from that size. To find which, the model is
// imported at the trial sizes and again with each kept dim alone at twice
// and three times its trial size (multiples, so that a model that needs a
// dim divisible by something imports there too). The imports must then
// agree node by node; where they differ:
//   - reshape's `shape` with one entry that changes: -1 there;
//   - slice's `start`/`end` that follow the sliced dim's size (n - c): -c,
//     or no `end` (through the last element);
//   - broadcast_to whose changing entries are x's own sizes: `where` over a
//     bool constant of the other entries (x broadcast against it);
// anything else (a constant whose data or size changes, another param, a
// node that only one of the imports has, an import that fails at another
// size) fixes the dim at its trial size with a note, or is an Error when
// dynamic_dims names the dim. Last, the graph with its dims named is
// inferred at every probe's sizes and each value's shape checked against
// that import's.
#include "importer.hpp"

#include <algorithm>
#include <optional>
#include <sstream>

namespace backplane::onnx::detail {

namespace {

using Shapes = std::map<std::string, std::pair<bp_dtype, Shape>>;

struct Probe {
  std::string dim;
  int64_t size = 0;
  Graph graph;
  Shapes shapes;
  bool comparable = true;  // false once its graph is found to differ in structure
};

// Why each dim cannot stay dynamic (the first reason found).
struct Problems {
  std::map<std::string, std::string> by_dim;
  void add(const std::string& dim, const std::string& why) { by_dim.emplace(dim, why); }
};

std::string at(const std::string& dim, int64_t size) { return dim + "=" + std::to_string(size); }

bool same_constant(const Graph::Input& a, const Graph::Input& b) {
  if (a.constant == b.constant) return true;
  if (!a.constant || !b.constant) return false;
  return a.dtype == b.dtype && a.constant->shape == b.constant->shape && a.constant->bytes == b.constant->bytes;
}

std::string describe(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

class Rewriter {
 public:
  Rewriter(const Graph& g0, const Shapes& s0, std::vector<Probe>& probes, const std::map<std::string, std::string>& origins,
           const std::map<std::string, int64_t>& trial, const std::vector<std::string>& keep,
           const std::set<std::string>& required, Problems& problems)
      : g0_(g0), s0_(s0), probes_(probes), origins_(origins), trial_(trial), keep_(keep), required_(required),
        problems_(problems) {}

  // The nodes with their params rewritten (and the constants that adds).
  struct Result {
    std::vector<Node> nodes;
    std::vector<std::pair<std::string, HostTensor>> constants;
  };

  Result run() {
    compare_inputs();
    Result r;
    const auto& nodes = g0_.nodes();
    for (auto& p : probes_)
      if (p.comparable && p.graph.nodes().size() != nodes.size()) {
        structural(p, "its graph has " + std::to_string(p.graph.nodes().size()) + " nodes, " +
                          std::to_string(nodes.size()) + " at the trial sizes");
      }
    for (size_t i = 0; i < nodes.size(); ++i) r.nodes.push_back(node(i, r));
    for (auto& p : probes_)
      if (p.comparable && p.graph.outputs() != g0_.outputs()) structural(p, "its outputs differ");
    return r;
  }

 private:
  std::string origin(const std::string& value) const {
    auto it = origins_.find(value);
    return it != origins_.end() ? it->second : "value '" + value + "'";
  }
  std::string trial_at(const std::string& dim) const { return at(dim, trial_.at(dim)); }

  void structural(Probe& p, const std::string& why) {
    problems_.add(p.dim, "the import at " + at(p.dim, p.size) + " differs from the one at " + trial_at(p.dim) + ": " + why);
    p.comparable = false;
  }

  void compare_inputs() {
    const auto& in0 = g0_.inputs();
    for (auto& p : probes_) {
      const auto& in = p.graph.inputs();
      if (in.size() != in0.size()) {
        structural(p, std::to_string(in.size()) + " inputs and constants, " + std::to_string(in0.size()) +
                          " at the trial sizes");
        continue;
      }
      for (size_t j = 0; j < in.size() && p.comparable; ++j) {
        if (in[j].name != in0[j].name || !in[j].constant != !in0[j].constant) {
          structural(p, "input or constant " + std::to_string(j) + " is '" + in[j].name + "' there, '" + in0[j].name + "' here");
          break;
        }
        if (in0[j].constant && !same_constant(in[j], in0[j]))
          problems_.add(p.dim, origin(in0[j].name) + " makes a constant that depends on it ('" + in0[j].name + "' " +
                                   shape_str(in0[j].constant->shape) + " at " + trial_at(p.dim) + ", " +
                                   shape_str(in[j].constant->shape) + " at " + at(p.dim, p.size) +
                                   (in0[j].constant->shape == in[j].constant->shape ? ", other values" : "") + ")");
      }
    }
  }

  const Shape& shape_in(const Shapes& s, const std::string& value) const { return s.at(value).second; }

  Node node(size_t i, Result& r) {
    const Node& n0 = g0_.nodes()[i];
    std::vector<Probe*> differ;
    for (auto& p : probes_) {
      if (!p.comparable) continue;
      const Node& n = p.graph.nodes()[i];
      if (n.name != n0.name || n.op != n0.op || n.inputs != n0.inputs) {
        structural(p, origin(n0.name) + " is imported as other nodes (" + n.op + " '" + n.name + "' there, " + n0.op + " '" +
                          n0.name + "' here)");
        continue;
      }
      if (n.params != n0.params) differ.push_back(&p);
    }
    if (differ.empty()) return n0;
    if (n0.op == "reshape") return reshape(n0, i, differ);
    if (n0.op == "slice") return slice(n0, i, differ);
    if (n0.op == "broadcast_to") return broadcast_to(n0, i, differ, r);
    param_problem(n0, i, differ);
    return n0;
  }

  // The first param that differs, for the message.
  void param_problem(const Node& n0, size_t i, const std::vector<Probe*>& differ, const std::set<std::string>& only = {}) {
    for (Probe* p : differ) {
      if (!only.empty() && !only.count(p->dim)) continue;
      const Json& pp = p->graph.nodes()[i].params;
      std::string key;
      for (const auto& [k, v] : n0.params.items())
        if (!pp.contains(k) || pp[k] != v) {
          key = k;
          break;
        }
      if (key.empty())
        for (const auto& [k, v] : pp.items())
          if (!n0.params.contains(k)) {
            key = k;
            break;
          }
      auto val = [&](const Json& j) { return j.contains(key) ? describe(j[key]) : std::string("absent"); };
      problems_.add(p->dim, origin(n0.name) + " needs it in a param (" + n0.op + " '" + key + "' " + val(n0.params) + " at " +
                                trial_at(p->dim) + ", " + val(pp) + " at " + at(p->dim, p->size) + ")");
    }
  }

  // A node's "shape" param in every import: the trial's, each probe's (in
  // differ's order), and the entries that change (all, and per dim);
  // nullopt, with the problem noted, when a probe's has another length.
  struct ShapeDiff {
    std::vector<int64_t> s0;
    std::vector<std::vector<int64_t>> probes;
    std::set<size_t> changed;
    std::map<std::string, std::set<size_t>> by_dim;
  };
  std::optional<ShapeDiff> shape_diff(const Node& n0, size_t i, const std::vector<Probe*>& differ) {
    ShapeDiff d;
    d.s0 = n0.params.at("shape").get<std::vector<int64_t>>();
    for (Probe* p : differ) {
      auto sp = p->graph.nodes()[i].params.at("shape").get<std::vector<int64_t>>();
      if (sp.size() != d.s0.size()) {
        param_problem(n0, i, differ);
        return std::nullopt;
      }
      for (size_t k = 0; k < d.s0.size(); ++k)
        if (sp[k] != d.s0[k]) {
          d.changed.insert(k);
          d.by_dim[p->dim].insert(k);
        }
      d.probes.push_back(std::move(sp));
    }
    return d;
  }

  Node reshape(const Node& n0, size_t i, const std::vector<Probe*>& differ) {
    const auto diff = shape_diff(n0, i, differ);
    if (!diff) return n0;
    const auto& s0 = diff->s0;
    const auto& changed = diff->changed;
    const auto& by_dim = diff->by_dim;
    const bool has_infer = std::count(s0.begin(), s0.end(), -1) > 0;
    if (changed.size() == 1 && !has_infer) {
      Node n = n0;
      auto s = s0;
      s[*changed.begin()] = -1;
      n.params["shape"] = s;
      return n;
    }
    // Entries that follow several dims: one of them may take the -1 when
    // each changes an entry of its own; the others are fixed. The one
    // kept: a dim dynamic_dims names, else the last of the model's.
    std::set<std::string> fix;
    for (const auto& [d, ks] : by_dim) fix.insert(d);
    bool separable = !has_infer && by_dim.size() >= 2;
    std::set<size_t> seen;
    for (const auto& [d, ks] : by_dim) {
      separable = separable && ks.size() == 1 && !seen.count(*ks.begin());
      seen.insert(ks.begin(), ks.end());
    }
    if (separable) {
      std::string keep_one;
      for (const auto& d : keep_)
        if (by_dim.count(d) && (keep_one.empty() || !required_.count(keep_one))) keep_one = d;
      fix.erase(keep_one);
    }
    param_problem(n0, i, differ, fix);
    return n0;
  }

  Node slice(const Node& n0, size_t i, const std::vector<Probe*>& differ) {
    Node n = n0;
    const int64_t step = n0.params.value("step", int64_t{1});
    for (const char* key : {"start", "end"}) {
      bool differs = false;
      for (Probe* p : differ) differs = differs || p->graph.nodes()[i].params.value(key, Json()) != n0.params.value(key, Json());
      if (!differs) continue;
      // The value as an offset from the sliced dim's size, the same in every import?
      auto offset = [&](const Node& nn, const Shapes& s) -> std::optional<int64_t> {
        if (!nn.params.contains(key) || !nn.params[key].is_number_integer()) return std::nullopt;
        const Shape& x = shape_in(s, nn.inputs.at(0));
        int64_t d = nn.params.at("dim").get<int64_t>();
        if (d < 0) d += static_cast<int64_t>(x.size());
        if (d < 0 || d >= static_cast<int64_t>(x.size())) return std::nullopt;
        return nn.params[key].get<int64_t>() - x[static_cast<size_t>(d)];
      };
      const auto c = offset(n0, s0_);
      bool ok = c && step > 0 && (*c < 0 || (*c == 0 && std::string(key) == "end"));
      for (Probe* p : differ) ok = ok && p->graph.nodes()[i].params.value("step", int64_t{1}) == step && offset(p->graph.nodes()[i], p->shapes) == c;
      if (!ok) {
        param_problem(n0, i, differ);
        return n0;
      }
      if (*c == 0) n.params.erase(key);
      else n.params[key] = *c;
    }
    for (Probe* p : differ) {
      Json a = n0.params, b = p->graph.nodes()[i].params;
      for (const char* key : {"start", "end"}) a.erase(key), b.erase(key);
      if (a != b) {
        param_problem(n0, i, differ);
        return n0;
      }
    }
    return n;
  }

  Node broadcast_to(const Node& n0, size_t i, const std::vector<Probe*>& differ, Result& r) {
    const auto diff = shape_diff(n0, i, differ);
    if (!diff) return n0;
    const auto& s0 = diff->s0;
    const auto& changed = diff->changed;
    std::vector<std::pair<const std::vector<int64_t>*, const Shape*>> all{{&s0, &shape_in(s0_, n0.inputs.at(0))}};
    for (size_t j = 0; j < differ.size(); ++j) all.push_back({&diff->probes[j], &shape_in(differ[j]->shapes, n0.inputs.at(0))});
    // Every changing entry is x's own size (right-aligned) in every import.
    for (const auto& [s, x] : all)
      for (size_t k : changed) {
        const int64_t xi = static_cast<int64_t>(k) - static_cast<int64_t>(s->size() - x->size());
        if (xi < 0 || (*x)[static_cast<size_t>(xi)] != (*s)[k]) {
          param_problem(n0, i, differ);
          return n0;
        }
      }
    Shape ones(s0.begin(), s0.end());
    for (size_t k : changed) ones[k] = 1;
    HostTensor t(BP_DTYPE_BOOL, ones);
    for (int64_t e = 0; e < t.numel(); ++e) t.set_int(e, 1);
    const std::string cname = n0.name + ".shape";
    r.constants.emplace_back(cname, std::move(t));
    return Node{n0.name, "where", {cname, n0.inputs.at(0), n0.inputs.at(0)}, Json::object(), n0.device};
  }

  const Graph& g0_;
  const Shapes& s0_;
  std::vector<Probe>& probes_;
  const std::map<std::string, std::string>& origins_;
  const std::map<std::string, int64_t>& trial_;
  const std::vector<std::string>& keep_;
  const std::set<std::string>& required_;
  Problems& problems_;
};

// The named dynamic dims of the model's inputs, in order of appearance.
std::vector<std::string> named_dims(const ::onnx::GraphProto& g, const Initializers& inits) {
  std::vector<std::string> r;
  for (const auto& vi : g.input()) {
    if (inits.count(vi.name()) || !vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) continue;
    for (const auto& d : vi.type().tensor_type().shape().dim())
      if (!(d.has_dim_value() && d.dim_value() > 0) && d.has_dim_param() && !d.dim_param().empty() &&
          std::find(r.begin(), r.end(), d.dim_param()) == r.end())
        r.push_back(d.dim_param());
  }
  return r;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "'" : ", '") + x + "'";
  return s.empty() ? "none" : s;
}

}  // namespace

ImportedModel import_model(::onnx::ModelProto& m, const ImportOptions& options, const std::string& label,
                           const std::filesystem::path& base) {
  // The initializers, once: every import below shares them.
  Initializers inits;
  for (auto& t : *m.mutable_graph()->mutable_initializer())
    inits[t.name()] = std::make_shared<HostTensor>(tensor_from_proto(t, base, label + ": initializer '" + t.name() + "'", true));

  const auto names = named_dims(m.graph(), inits);
  for (const auto& d : options.dynamic_dims)
    if (std::find(names.begin(), names.end(), d) == names.end())
      throw Error(label + ": dynamic_dims names '" + d + "', which is not a named dim of the model's inputs (they have " +
                  join(names) + ")");
  std::vector<std::string> keep;
  for (const auto& d : names)
    if (options.keep_dynamic || options.dynamic_dims.count(d)) keep.push_back(d);

  std::vector<std::string> notes;
  for (;;) {
    Importer primary(options, label, base);
    ImportedModel r = primary.run(m, inits);
    const auto& trial = primary.dim_values();
    r.fixed_dims = trial;
    if (keep.empty()) {
      r.notes.insert(r.notes.begin(), notes.begin(), notes.end());
      return r;
    }
    Problems problems;
    std::vector<Probe> probes;
    for (const auto& d : keep) {
      const int64_t t = trial.at(d);
      for (int64_t f : {2, 3}) {
        const int64_t size = t > 0 ? t * f : f;
        Importer imp(options, label, base, {{d, size}});
        try {
          Probe p{d, size, imp.run(m, inits).graph, {}};
          p.shapes = infer_graph(p.graph);
          probes.push_back(std::move(p));
        } catch (const Error& e) {
          problems.add(d, "the model does not import at " + at(d, size) + ": " + e.what());
          break;
        }
      }
    }
    const Shapes s0 = infer_graph(r.graph);
    Rewriter rw(r.graph, s0, probes, primary.origins(), trial, keep, options.dynamic_dims, problems);
    auto rewritten = rw.run();

    Graph g;
    if (problems.by_dim.empty()) {
      // The graph with the kept dims named: its inputs' dims from the model.
      std::map<std::string, std::vector<std::string>> dim_names;
      for (const auto& vi : m.graph().input()) {
        if (inits.count(vi.name()) || !vi.type().tensor_type().has_shape()) continue;
        std::vector<std::string> dn;
        bool any = false;
        for (const auto& d : vi.type().tensor_type().shape().dim()) {
          const bool kept = !(d.has_dim_value() && d.dim_value() > 0) && d.has_dim_param() &&
                            std::find(keep.begin(), keep.end(), d.dim_param()) != keep.end();
          dn.push_back(kept ? d.dim_param() : std::string());
          any = any || kept;
        }
        if (any) dim_names[vi.name()] = std::move(dn);
      }
      for (const auto& in : r.graph.inputs()) {
        if (in.constant) {
          g.constant(in.name, in.constant);
          continue;
        }
        auto onnx_name = r.onnx_names.find(in.name);
        auto dn = onnx_name == r.onnx_names.end() ? dim_names.end() : dim_names.find(onnx_name->second);
        if (dn == dim_names.end()) g.input(in.name, in.dtype, in.shape);
        else g.input(in.name, in.dtype, in.shape, dn->second);
      }
      for (auto& [name, t] : rewritten.constants) g.constant(name, std::move(t));
      for (auto& n : rewritten.nodes) g.node(n.name, n.op, n.inputs, n.params, n.device);
      for (const auto& o : r.graph.outputs()) g.output(o);
      // Every value's shape at every probe's sizes, as that import has it.
      for (const auto& p : probes) {
        auto sizes = trial;
        sizes[p.dim] = p.size;
        Shapes s;
        try {
          s = infer_graph(g.specialized(sizes));
        } catch (const Error& e) {
          problems.add(p.dim, std::string("the graph kept dynamic does not infer at ") + at(p.dim, p.size) + ": " + e.what());
          continue;
        }
        for (const auto& [name, ts] : p.shapes) {
          auto it = s.find(name);
          if (it == s.end() || it->second != ts) {
            problems.add(p.dim, "value '" + name + "' of " + (primary.origins().count(name) ? primary.origins().at(name) : "the graph") +
                                    " would be " + (it == s.end() ? "missing" : shape_str(it->second.second)) + " at " +
                                    at(p.dim, p.size) + ", " + shape_str(ts.second) + " as imported there");
            break;
          }
        }
      }
    }
    if (problems.by_dim.empty()) {
      r.graph = std::move(g);
      r.dynamic_dims = keep;
      for (const auto& d : keep) {
        r.dims[d] = trial.at(d);
        r.fixed_dims.erase(d);
      }
      std::string kept;
      for (const auto& d : keep) kept += (kept.empty() ? "" : ", ") + at(d, trial.at(d));
      notes.push_back("dynamic dims kept: " + kept + " (the sizes imported at; the graph runs at others)");
      r.notes.insert(r.notes.begin(), notes.begin(), notes.end());
      return r;
    }
    for (const auto& [d, why] : problems.by_dim) {
      if (options.dynamic_dims.count(d))
        throw Error(label + ": dynamic dim '" + d + "' cannot stay dynamic: " + why, BP_ERR_UNIMPLEMENTED);
      notes.push_back("dim '" + d + "' fixed at " + std::to_string(trial.at(d)) + ": " + why);
      keep.erase(std::find(keep.begin(), keep.end(), d));
    }
  }
}

}  // namespace backplane::onnx::detail
