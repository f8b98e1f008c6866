// Vendor ops declared in manifests and their decompositions.
#include "vendor_ops.hpp"

#include <cctype>
#include <cmath>
#include <limits>
#include <set>

#include "checked.hpp"
#include "ops.hpp"

namespace backplane::detail {

namespace {

// ---- "$expr" params: numbers, params, IN.shape[i], IN.rank, + - * / ( ) ----

struct Num {
  bool is_int = true;
  int64_t i = 0;
  double d = 0;
  double as_double() const { return is_int ? static_cast<double>(i) : d; }
};

class ExprParser {
 public:
  ExprParser(const std::string& text, const Json& params,
             const std::vector<std::pair<std::string, Shape>>& shapes)
      : s_(text), params_(params), shapes_(shapes) {}

  Num parse() {
    Num v = sum();
    skip();
    if (pos_ != s_.size()) fail("unexpected '" + s_.substr(pos_, 1) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw Error("param expression '$" + s_ + "': " + why);
  }
  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  Num sum() {
    Num v = product();
    for (;;) {
      if (eat('+'))
        v = arith(v, product(), '+');
      else if (eat('-'))
        v = arith(v, product(), '-');
      else
        return v;
    }
  }
  Num product() {
    Num v = unary();
    for (;;) {
      if (eat('*'))
        v = arith(v, unary(), '*');
      else if (eat('/'))
        v = arith(v, unary(), '/');
      else
        return v;
    }
  }
  Num unary() {
    if (eat('-')) {
      Num v = unary();
      if (v.is_int) {
        if (v.i == std::numeric_limits<int64_t>::min()) fail("integer overflow");
        v.i = -v.i;
      } else {
        v.d = -v.d;
      }
      return v;
    }
    return primary();
  }
  Num arith(Num a, Num b, char op) const {
    if (a.is_int && b.is_int) {
      Num r;
      bool overflow = false;
      switch (op) {
        case '+':
          overflow = __builtin_add_overflow(a.i, b.i, &r.i);
          break;
        case '-':
          overflow = __builtin_sub_overflow(a.i, b.i, &r.i);
          break;
        case '*':
          overflow = __builtin_mul_overflow(a.i, b.i, &r.i);
          break;
        default:
          if (b.i == 0) fail("division by zero");
          if (a.i == std::numeric_limits<int64_t>::min() && b.i == -1) fail("integer overflow");
          r.i = a.i / b.i;  // integer division truncates, as in C
      }
      if (overflow) fail("integer overflow");
      return r;
    }
    Num r;
    r.is_int = false;
    const double x = a.as_double(), y = b.as_double();
    switch (op) {
      case '+':
        r.d = x + y;
        break;
      case '-':
        r.d = x - y;
        break;
      case '*':
        r.d = x * y;
        break;
      default:
        r.d = x / y;
    }
    return r;
  }
  std::string ident() {
    skip();
    const size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_'))
      ++pos_;
    return s_.substr(start, pos_ - start);
  }
  Num primary() {
    skip();
    if (pos_ >= s_.size()) fail("ends too early");
    if (eat('(')) {
      Num v = sum();
      if (!eat(')')) fail("missing ')'");
      return v;
    }
    const char c = s_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      const size_t start = pos_;
      bool is_float = false;
      while (pos_ < s_.size() &&
             (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.' || s_[pos_] == 'e' ||
              s_[pos_] == 'E' ||
              ((s_[pos_] == '+' || s_[pos_] == '-') && (s_[pos_ - 1] == 'e' || s_[pos_ - 1] == 'E')))) {
        is_float = is_float || !std::isdigit(static_cast<unsigned char>(s_[pos_]));
        ++pos_;
      }
      const std::string lit = s_.substr(start, pos_ - start);
      Num v;
      try {
        if (is_float) {
          v.is_int = false;
          v.d = std::stod(lit);
        } else {
          v.i = std::stoll(lit);
        }
      } catch (const std::exception&) {
        fail("bad number '" + lit + "'");
      }
      return v;
    }
    const std::string name = ident();
    if (name.empty()) fail("unexpected '" + s_.substr(pos_, 1) + "'");
    skip();
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      const std::string field = ident();
      const Shape* shape = nullptr;
      for (const auto& [n, sh] : shapes_)
        if (n == name) shape = &sh;
      if (!shape) fail("'" + name + "' is not an input of the op");
      const auto rank = static_cast<int64_t>(shape->size());
      if (field == "rank") return Num{true, rank, 0};
      if (field != "shape") fail("an input has .shape[i] and .rank, not ." + field);
      if (!eat('[')) fail("expected '[' after .shape");
      Num idx = unary();
      if (!idx.is_int) fail("a shape index must be an integer");
      if (!eat(']')) fail("missing ']'");
      int64_t i = idx.i < 0 ? idx.i + rank : idx.i;
      if (i < 0 || i >= rank)
        fail(name + ".shape[" + std::to_string(idx.i) + "] is out of range for rank " + std::to_string(rank));
      return Num{true, (*shape)[static_cast<size_t>(i)], 0};
    }
    if (!params_.contains(name)) fail("'" + name + "' is neither a param nor an input of the op");
    const Json& p = params_[name];
    if (p.is_number_integer()) return Num{true, p.get<int64_t>(), 0};
    if (p.is_number()) return Num{false, 0, p.get<double>()};
    if (p.is_boolean()) return Num{true, p.get<bool>() ? 1 : 0, 0};
    fail("param '" + name + "' is not a number");
  }

  const std::string& s_;
  const Json& params_;
  const std::vector<std::pair<std::string, Shape>>& shapes_;
  size_t pos_ = 0;
};

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

// Replaces every "$expr" string inside `v` (objects and lists too).
Json substitute(const Json& v, const Json& params, const std::vector<std::pair<std::string, Shape>>& shapes) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s.size() > 1 && s[0] == '$') return eval_param_expression(s.substr(1), params, shapes);
    return v;
  }
  if (v.is_array() || v.is_object()) {
    Json out = v;
    for (auto it = out.begin(); it != out.end(); ++it) *it = substitute(*it, params, shapes);
    return out;
  }
  return v;
}

}  // namespace

Json eval_param_expression(const std::string& expr, const Json& params,
                           const std::vector<std::pair<std::string, Shape>>& shapes) {
  // A bare param name stands for the param's value, whatever its type.
  std::string trimmed = expr;
  while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.back()))) trimmed.pop_back();
  while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.front())))
    trimmed.erase(trimmed.begin());
  if (is_identifier(trimmed) && params.contains(trimmed)) return params[trimmed];
  const Num v = ExprParser(trimmed, params, shapes).parse();
  if (v.is_int) return v.i;
  return v.d;
}

namespace {
VendorOpInfo parse_vendor_op_unchecked(const Json& j, const std::string& where_in);
}  // namespace

VendorOpInfo parse_vendor_op(const Json& j, const std::string& where) {
  // The schema checked the shape of the entry; a JSON type error left over
  // (a decomposition node's fields are free-form) is still the manifest's.
  try {
    return parse_vendor_op_unchecked(j, where);
  } catch (const Json::exception& e) {
    throw Error(where + ": vendor op entry: " + e.what());
  }
}

namespace {

VendorOpInfo parse_vendor_op_unchecked(const Json& j, const std::string& where_in) {
  VendorOpInfo op;
  op.op = j["op"].get<std::string>();
  const std::string where = where_in + ": vendor op '" + op.op + "'";
  if (is_known_op(op.op)) throw Error(where + ": a standard op cannot be redeclared");
  std::set<std::string> names;
  for (const auto& i : j["inputs"]) {
    op.inputs.push_back(i.get<std::string>());
    if (!names.insert(op.inputs.back()).second)
      throw Error(where + ": input '" + op.inputs.back() + "' is named twice");
  }
  for (const auto& o : j["outputs"]) op.outputs.push_back(o.get<std::string>());
  if (op.outputs.size() > 16) throw Error(where + ": more than 16 outputs");
  if (j.contains("params")) op.params = j["params"];
  for (auto it = op.params.begin(); it != op.params.end(); ++it)
    if (!is_identifier(it.key())) throw Error(where + ": param name '" + it.key() + "' is not an identifier");
  op.tolerance = j.value("tolerance", "reduction");
  if (j.contains("test_params"))
    for (const auto& p : j["test_params"]) op.test_params.push_back(p);
  if (j.contains("test_range")) {
    op.test_range[0] = j["test_range"][0].get<double>();
    op.test_range[1] = j["test_range"][1].get<double>();
    if (!(op.test_range[0] < op.test_range[1]))
      throw Error(where + ": test_range must be [lo, hi] with lo < hi");
  }
  if (j.contains("test_ranges")) {
    if (!j["test_ranges"].is_array() || j["test_ranges"].size() != op.inputs.size())
      throw Error(where + ": test_ranges gives one [lo, hi] per input (" + std::to_string(op.inputs.size()) + ")");
    for (const auto& r : j["test_ranges"]) {
      if (!r.is_array() || r.size() != 2 || !r[0].is_number() || !r[1].is_number() ||
          !(r[0].get<double>() < r[1].get<double>()))
        throw Error(where + ": each test_ranges entry must be [lo, hi] with lo < hi, found " + r.dump());
      op.test_ranges.push_back({r[0].get<double>(), r[1].get<double>()});
    }
  }
  if (j.contains("test_shapes"))
    for (const auto& c : j["test_shapes"]) {
      if (c.size() != op.inputs.size())
        throw Error(where + ": each test_shapes entry gives one shape per input (" +
                    std::to_string(op.inputs.size()) + ")");
      std::vector<Shape> shapes;
      for (const auto& s : c) {
        if (s.size() > BP_MAX_RANK) throw Error(where + ": a test shape has rank above 8");
        Shape shape;
        for (const auto& d : s) {
          // Unsigned JSON integers above 2^63 would wrap to negative int64.
          if (!d.is_number_integer() || (d.is_number_unsigned() && d.get<uint64_t>() > uint64_t{1} << 32) ||
              (!d.is_number_unsigned() && (d.get<int64_t>() < 0 || d.get<int64_t>() > int64_t{1} << 32)))
            throw Error(where + ": test shape dims must be integers in [0, 2^32], found " + d.dump());
          shape.push_back(d.get<int64_t>());
        }
        detail::checked_numel(shape, where + ": a test shape");
        shapes.push_back(std::move(shape));
      }
      op.test_shapes.push_back(std::move(shapes));
    }
  if (!j.contains("decomposition")) return op;
  const Json& d = j["decomposition"];
  for (const auto& n : d["nodes"]) {
    const std::string nw = where + ": decomposition node " +
                           (n.contains("name") && n["name"].is_string() ? n["name"].get<std::string>() : std::string("?"));
    if (!n.contains("name") || !n["name"].is_string() || !is_identifier(n["name"].get<std::string>()))
      throw Error(nw + ": 'name' (an identifier) is required");
    if (!n.contains("op") || !n["op"].is_string()) throw Error(nw + ": 'op' is required");
    for (auto it = n.begin(); it != n.end(); ++it)
      if (it.key() != "name" && it.key() != "op" && it.key() != "inputs" && it.key() != "params")
        throw Error(nw + ": unknown key '" + it.key() + "' (takes name, op, inputs, params)");
    const std::string sub_op = n["op"];
    if (!is_known_op(sub_op))
      throw Error(nw + ": '" + sub_op + "' is not a standard op (a decomposition uses standard ops only)");
    if (n.contains("inputs")) {
      if (!n["inputs"].is_array()) throw Error(nw + ": 'inputs' must be a list");
      for (const auto& i : n["inputs"]) {
        if (i.is_null()) continue;
        if (!i.is_string() || !names.count(i.get<std::string>()))
          throw Error(nw + ": input " + i.dump() + " is not an op input or an earlier node");
      }
    }
    if (n.contains("params") && !n["params"].is_object()) throw Error(nw + ": 'params' must be an object");
    if (!names.insert(n["name"].get<std::string>()).second) throw Error(nw + ": the name is used twice");
  }
  if (d["outputs"].size() != op.outputs.size())
    throw Error(where + ": the decomposition gives " + std::to_string(d["outputs"].size()) +
                " outputs, the op declares " + std::to_string(op.outputs.size()));
  for (const auto& o : d["outputs"])
    if (!names.count(o.get<std::string>()))
      throw Error(where + ": decomposition output '" + o.get<std::string>() + "' is not defined");
  op.decomposition = d;
  return op;
}

}  // namespace

Json vendor_params(const VendorOpInfo& op, const Node& node) {
  Json p = op.params;
  for (auto it = node.params.begin(); it != node.params.end(); ++it) {
    if (!op.params.contains(it.key())) {
      std::string known;
      for (auto k = op.params.begin(); k != op.params.end(); ++k)
        known += (known.empty() ? "" : ", ") + k.key();
      throw Error("node '" + node.name + "' (" + node.op + "): unknown param '" + it.key() + "'" +
                  (known.empty() ? " (the op takes none)" : " (it takes " + known + ")"));
    }
    p[it.key()] = it.value();
  }
  return p;
}

Expansion expand_vendor_node(const VendorOpInfo& op, const Node& node,
                             const std::vector<std::pair<bp_dtype, Shape>>& input_types) {
  const std::string where = "node '" + node.name + "' (" + op.op + ")";
  if (!op.has_decomposition()) throw Error(where + ": the op has no decomposition");
  if (node.inputs.size() != op.inputs.size())
    throw Error(where + ": takes " + std::to_string(op.inputs.size()) + " inputs, the node gives " +
                std::to_string(node.inputs.size()));
  const Json params = vendor_params(op, node);
  std::vector<std::pair<std::string, Shape>> shapes;
  std::map<std::string, std::string> outer;  // decomposition name -> outer graph name
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    if (node.inputs[i].empty()) throw Error(where + ": input '" + op.inputs[i] + "' is null");
    shapes.emplace_back(op.inputs[i], input_types.at(i).second);
    outer[op.inputs[i]] = node.inputs[i];
  }
  Expansion e;
  for (const auto& n : op.decomposition["nodes"]) {
    Node sub;
    const std::string local = n["name"];
    sub.name = node.name + "/" + local;
    sub.op = n["op"];
    // The vendor node's pin holds for every node of its decomposition that
    // runs on a device; layout ops have no device of their own.
    static const std::set<std::string> layout_ops = {"reshape", "permute", "transpose", "broadcast_to",
                                                     "slice",   "squeeze", "unsqueeze", "view"};
    if (!layout_ops.count(sub.op)) sub.device = node.device;
    if (n.contains("inputs"))
      for (const auto& i : n["inputs"])
        sub.inputs.push_back(i.is_null() ? std::string() : outer.at(i.get<std::string>()));
    try {
      sub.params = substitute(n.value("params", Json::object()), params, shapes);
    } catch (const Error& err) {
      throw Error(where + ": decomposition node '" + local + "': " + err.what());
    }
    outer[local] = sub.name;
    e.nodes.push_back(std::move(sub));
  }
  for (const auto& o : op.decomposition["outputs"]) e.outputs.push_back(outer.at(o.get<std::string>()));
  return e;
}

std::vector<std::pair<bp_dtype, Shape>> decomposition_output_types(const VendorOpInfo& op, const Node& node,
                                                                   const std::vector<std::pair<bp_dtype, Shape>>& in) {
  const Expansion e = expand_vendor_node(op, node, in);
  Graph sub;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    bool seen = false;
    for (const auto& gi : sub.inputs()) seen = seen || gi.name == node.inputs[i];
    if (!seen) sub.input(node.inputs[i], in[i].first, in[i].second);
  }
  for (const auto& n : e.nodes) sub.node(n.name, n.op, n.inputs, n.params);
  for (const auto& o : e.outputs) sub.output(o);
  std::map<std::string, std::pair<bp_dtype, Shape>> types;
  try {
    types = infer_graph(sub);
  } catch (const Error& err) {
    throw Error("node '" + node.name + "' (" + node.op + "): its decomposition: " + err.what());
  }
  std::vector<std::pair<bp_dtype, Shape>> out;
  for (const auto& o : e.outputs) out.push_back(types[o]);
  return out;
}

}  // namespace backplane::detail
