// Exported LayerNorm and GELU compositions as layer_norm and gelu (see
// pass_compositions.hpp). A match needs every intermediate value read only
// inside the pattern and the constants to have the values the formula
// needs; anything else is left as it was.
#include "pass_compositions.hpp"

#include "pass_patterns.hpp"

#include <cmath>
#include <map>
#include <set>

namespace backplane::detail {

namespace {

struct View {
  const Graph& g;
  std::map<std::string, size_t> producer;          // value -> node index
  std::map<std::string, int> uses;                 // value -> reads (+1 for a graph output)
  std::map<std::string, std::vector<const Node*>> readers;  // value -> the nodes reading it
  std::map<std::string, const HostTensor*> consts;  // graph constants
  std::map<std::string, Shape> shapes;
  std::map<std::string, bp_dtype> dtypes;

  View(const Graph& graph, const std::vector<std::string>& keep) : g(graph) {
    for (const auto& in : graph.inputs()) {
      if (in.constant) consts[in.name] = &*in.constant;
    }
    for (size_t i = 0; i < graph.nodes().size(); ++i) {
      producer[graph.nodes()[i].name] = i;
      for (const auto& v : graph.nodes()[i].inputs) {
        ++uses[v];
        readers[v].push_back(&graph.nodes()[i]);
      }
    }
    for (const auto& o : graph.outputs()) ++uses[o];
    for (const auto& k : keep) ++uses[k];
    try {
      for (auto& [name, t] : infer_graph(graph)) {
        dtypes[name] = t.first;
        shapes[name] = t.second;
      }
    } catch (const Error&) {
      // A graph the core refuses: no rewrites (compile will say why).
      shapes.clear();
    }
  }
  const Node* node(const std::string& value, const char* op) const {
    auto it = producer.find(value);
    if (it == producer.end()) return nullptr;
    const Node& n = g.nodes()[it->second];
    return n.op == op ? &n : nullptr;
  }
  int use_count(const std::string& v) const {
    auto it = uses.find(v);
    return it == uses.end() ? 0 : it->second;
  }
  // The single-element constant `v`, if it is one.
  std::optional<double> scalar(const std::string& v) const {
    auto it = consts.find(v);
    if (it == consts.end() || it->second->numel() != 1 || !is_float(it->second->dtype)) return std::nullopt;
    return it->second->get(0);
  }
  // The one node reading `v`, if exactly one does.
  const Node* sole_reader(const std::string& v, const char* op) const {
    if (use_count(v) != 1) return nullptr;
    auto it = readers.find(v);
    if (it == readers.end() || it->second.empty()) return nullptr;
    return it->second.front()->op == op ? it->second.front() : nullptr;
  }
  // The other input of a binary node, given one of them.
  static std::optional<std::string> other(const Node& n, const std::string& v) {
    if (n.inputs.size() != 2) return std::nullopt;
    if (n.inputs[0] == v) return n.inputs[1];
    if (n.inputs[1] == v) return n.inputs[0];
    return std::nullopt;
  }
  bool is_last_dim_mean(const Node& n) const {
    if (n.op != "mean" || !n.params.value("keepdim", false) || !n.params.contains("dims")) return false;
    const auto& d = n.params["dims"];
    if (!d.is_array() || d.size() != 1 || !d[0].is_number_integer()) return false;
    auto s = shapes.find(n.inputs.at(0));
    if (s == shapes.end()) return false;
    const int64_t dim = d[0].get<int64_t>(), rank = static_cast<int64_t>(s->second.size());
    return rank > 0 && (dim == -1 || dim == rank - 1);
  }
};

struct Rewrite {
  std::set<std::string> removed;       // nodes replaced
  std::map<std::string, Node> replace;  // at this node's place, this node instead
};

// mean -> sub -> sqr -> mean -> add eps -> sqrt -> div [-> mul w] [-> add b]
void match_layer_norm(const View& v, const Node& m1, Rewrite& rw, int& count) {
  if (!v.is_last_dim_mean(m1) || rw.removed.count(m1.name)) return;
  const std::string x = m1.inputs[0];
  // An f16/bf16 chain rounds after every step and layer_norm once: only
  // f32/f64 chains are taken (there the two differ within rounding).
  if (v.dtypes.at(x) != BP_DTYPE_F32 && v.dtypes.at(x) != BP_DTYPE_F64) return;
  const Node* sub = v.sole_reader(m1.name, "sub");
  if (!sub || sub->inputs[0] != x || sub->inputs[1] != m1.name || v.use_count(sub->name) != 2) return;
  const Node* sq = nullptr;
  const Node* div = nullptr;
  for (const Node* n : v.readers.at(sub->name)) {
    if (n->op == "sqr") sq = n;
    else if (n->op == "div" && n->inputs[0] == sub->name) div = n;
  }
  if (!sq || !div) return;
  const Node* m2 = v.sole_reader(sq->name, "mean");
  if (!m2 || !v.is_last_dim_mean(*m2)) return;
  const Node* add = v.sole_reader(m2->name, "add");
  if (!add) return;
  auto eps_name = View::other(*add, m2->name);
  auto eps = eps_name ? v.scalar(*eps_name) : std::nullopt;
  if (!eps || !(*eps >= 0)) return;
  const Node* sqrt = v.sole_reader(add->name, "sqrt");
  if (!sqrt || div->inputs[1] != sqrt->name || v.use_count(sqrt->name) != 1) return;
  const Shape& xs = v.shapes.at(x);
  const Shape tail{xs.back()};
  auto affine_operand = [&](const Node* n, const std::string& from) -> std::optional<std::string> {
    if (!n) return std::nullopt;
    auto o = View::other(*n, from);
    if (!o || !v.consts.count(*o) || v.shapes.count(*o) == 0 || v.shapes.at(*o) != tail) return std::nullopt;
    return o;
  };
  std::string last = div->name;
  std::string w, b;
  const Node* mul = v.sole_reader(div->name, "mul");
  if (auto o = affine_operand(mul, div->name)) {
    w = *o;
    last = mul->name;
    const Node* badd = v.sole_reader(mul->name, "add");
    if (auto ob = affine_operand(badd, mul->name)) {
      b = *ob;
      last = badd->name;
    }
  }
  for (const Node* n : {&m1, sub, sq, m2, add, sqrt, div, mul})
    if (n && !n->device.empty() && (n != mul || !w.empty())) return;  // a pin is the application's
  if (!b.empty() && !v.g.nodes()[v.producer.at(last)].device.empty()) return;
  for (const Node* n : {&m1, sub, sq, m2, add, sqrt, div}) rw.removed.insert(n->name);
  if (!w.empty()) rw.removed.insert(mul->name);
  if (!b.empty()) rw.removed.insert(last);
  rw.removed.erase(last);
  rw.replace[last] = Node{last, "layer_norm", {x, w, b}, Json{{"dims", {-1}}, {"eps", *eps}}, ""};
  ++count;
}

// div(x, √2) -> erf -> add 1 -> mul x -> mul 0.5
void match_gelu(const View& v, const Node& erf, Rewrite& rw, int& count) {
  if (erf.op != "erf" || rw.removed.count(erf.name)) return;
  const Node* div = v.node(erf.inputs[0], "div");
  if (!div || v.use_count(div->name) != 1) return;
  if (v.dtypes.at(div->inputs[0]) != BP_DTYPE_F32 && v.dtypes.at(div->inputs[0]) != BP_DTYPE_F64) return;
  auto k = v.scalar(div->inputs[1]);
  if (!k || std::fabs(*k - std::sqrt(2.0)) > 1e-6) return;
  const std::string x = div->inputs[0];
  const Node* add = v.sole_reader(erf.name, "add");
  if (!add) return;
  auto one = View::other(*add, erf.name);
  if (!one || v.scalar(*one) != 1.0) return;
  const Node* mul = v.sole_reader(add->name, "mul");
  if (!mul || View::other(*mul, add->name) != x) return;
  const Node* half = v.sole_reader(mul->name, "mul");
  if (!half) return;
  auto h = View::other(*half, mul->name);
  if (!h || v.scalar(*h) != 0.5) return;
  for (const Node* n : {div, &erf, add, mul, half})
    if (!n->device.empty()) return;  // a pin is the application's
  for (const Node* n : {div, &erf, add, mul}) rw.removed.insert(n->name);
  rw.replace[half->name] = Node{half->name, "gelu", {x}, Json::object(), ""};
  ++count;
}

}  // namespace

std::optional<CompositionResult> map_compositions(const Graph& g, const std::vector<std::string>& keep) {
  Rewrite rw;
  int ln = 0, gelu = 0;
  {
    const View v(g, keep);
    if (v.shapes.empty()) return std::nullopt;
    for (const auto& n : g.nodes()) {
      match_layer_norm(v, n, rw, ln);
      match_gelu(v, n, rw, gelu);
    }
  }
  if (!ln && !gelu) return std::nullopt;
  // Constants no node reads any more are dropped.
  std::map<std::string, int> reads;
  std::vector<Node> nodes;
  for (const auto& n : g.nodes()) {
    if (rw.removed.count(n.name)) continue;
    const auto it = rw.replace.find(n.name);
    nodes.push_back(it == rw.replace.end() ? n : it->second);
    for (const auto& in : nodes.back().inputs) ++reads[in];
  }
  for (const auto& o : g.outputs()) ++reads[o];
  for (const auto& k : keep) ++reads[k];
  std::set<std::string> unread;
  for (const auto& in : g.inputs())
    if (in.constant && !reads[in.name]) unread.insert(in.name);
  CompositionResult r{rebuilt_graph(g, nodes, {}, unread), {}};
  if (ln)
    r.notes.push_back("compositions: " + std::to_string(ln) + " exported LayerNorm chain" + (ln == 1 ? "" : "s") +
                      " (mean, sub, sqr, mean, add, sqrt, div[, mul, add]) run as layer_norm");
  if (gelu)
    r.notes.push_back("compositions: " + std::to_string(gelu) + " exported GELU chain" + (gelu == 1 ? "" : "s") +
                      " (div by √2, erf, add 1, mul, mul by 0.5) run as gelu");
  return r;
}

}  // namespace backplane::detail
