// Graphs built in code and graph files (docs/architecture.md).
#include "checked.hpp"
#include "input_files.hpp"
#include "ops.hpp"
#include "vendor_ops.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

namespace backplane {

void Graph::input(const std::string& name, bp_dtype dtype, Shape shape) {
  if (dtype_size(dtype) == 0) throw Error("graph input '" + name + "': invalid dtype");
  if (shape.size() > BP_MAX_RANK) throw Error("graph input '" + name + "': rank " + std::to_string(shape.size()) + " exceeds 8");
  for (auto d : shape)
    if (d < 0) throw Error("graph input '" + name + "': negative dim in " + shape_str(shape));
  inputs_.push_back({name, dtype, std::move(shape), nullptr, {}});
}

void Graph::input(const std::string& name, bp_dtype dtype, Shape shape, std::vector<std::string> dim_names) {
  if (dim_names.size() != shape.size())
    throw Error("graph input '" + name + "': " + std::to_string(dim_names.size()) + " dim names for rank " +
                std::to_string(shape.size()));
  bool dynamic = false;
  for (size_t i = 0; i < shape.size(); ++i)
    if (!dim_names[i].empty()) {
      for (char ch : dim_names[i])
        if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'))
          throw Error("graph input '" + name + "': dim name '" + dim_names[i] + "' (letters, digits and _ only)");
      shape[i] = 0;
      dynamic = true;
    }
  input(name, dtype, shape);
  if (!dynamic) return;
  for (size_t i = 0; i < shape.size(); ++i)
    if (!dim_names[i].empty()) inputs_.back().shape[i] = -1;
  inputs_.back().dim_names = std::move(dim_names);
}

void Graph::constant(const std::string& name, HostTensor value) {
  constant(name, std::make_shared<const HostTensor>(std::move(value)));
}

void Graph::constant(const std::string& name, std::shared_ptr<const HostTensor> value) {
  if (!value) throw Error("graph constant '" + name + "': no value");
  if (value->shape.size() > BP_MAX_RANK) throw Error("graph constant '" + name + "': rank exceeds 8");
  inputs_.push_back({name, value->dtype, value->shape, std::move(value), {}});
}

std::vector<std::string> Graph::dynamic_dims() const {
  std::vector<std::string> out;
  for (const auto& in : inputs_)
    for (const auto& d : in.dim_names)
      if (!d.empty() && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  return out;
}

Graph Graph::specialized(const std::map<std::string, int64_t>& dims) const {
  Graph g = *this;
  for (auto& in : g.inputs_) {
    for (size_t i = 0; i < in.dim_names.size(); ++i) {
      if (in.dim_names[i].empty()) continue;
      auto it = dims.find(in.dim_names[i]);
      if (it == dims.end())
        throw Error("graph input '" + in.name + "': no size given for its dynamic dim '" + in.dim_names[i] + "'");
      if (it->second < 0)
        throw Error("dynamic dim '" + it->first + "': size " + std::to_string(it->second) + " is negative");
      in.shape[i] = it->second;
    }
    in.dim_names.clear();
    detail::checked_numel(in.shape, "graph input '" + in.name + "'");
  }
  // A param value "$expr" (alone, or as an element of a list) is evaluated
  // over the dims' sizes as a decomposition's params are
  // (eval_param_expression): slice(cache, end="$ctx") follows ctx.
  Json sizes = Json::object();
  for (const auto& [name, size] : dims) sizes[name] = size;
  for (auto& n : g.nodes_) {
    if (!n.params.is_object()) continue;
    for (auto it = n.params.begin(); it != n.params.end(); ++it) {
      const std::string key = it.key();  // not a structured binding: the lambda captures it
      const auto sub = [&](Json& v) {
        if (!v.is_string()) return;
        const std::string& s = v.get_ref<const std::string&>();
        if (s.size() < 2 || s[0] != '$') return;
        const std::string where = "node '" + n.name + "' (" + n.op + "): param '" + key + "'";
        if (s.find_first_of("+-*/() ", 1) == std::string::npos && !dims.count(s.substr(1)))
          throw Error(where + " names '" + s + "', which is no dynamic dim of the graph");
        try {
          v = detail::eval_param_expression(s.substr(1), sizes, {});
        } catch (const Error& e) {
          throw Error(where + ": " + e.what());
        }
      };
      if (it.value().is_array())
        for (auto& e : it.value()) sub(e);
      else
        sub(it.value());
    }
  }
  return g;
}

void Graph::node(const std::string& name, const std::string& op, std::vector<std::string> inputs, Json params,
                 std::string device) {
  if (params.is_null()) params = Json::object();
  nodes_.push_back({name, op, std::move(inputs), std::move(params), std::move(device)});
}

void Graph::output(const std::string& name) { outputs_.push_back(name); }

void Graph::pin(const std::string& node, std::string device) {
  for (auto& n : nodes_)
    if (n.name == node) {
      n.device = std::move(device);
      return;
    }
  throw Error("pin: the graph has no node named '" + node + "'");
}

std::map<std::string, std::pair<bp_dtype, Shape>> infer_graph(const Graph& graph) {
  using detail::ValueType;
  std::map<std::string, ValueType> types;
  std::map<std::string, std::pair<bp_dtype, Shape>> out;
  for (const auto& in : graph.inputs()) {
    if (types.count(in.name)) throw Error("graph input '" + in.name + "' is defined twice");
    types[in.name] = {in.dtype, in.shape, {}};
    out[in.name] = {in.dtype, in.shape};
  }
  for (const auto& node : graph.nodes()) {
    if (node.name.empty()) throw Error("a node of op '" + node.op + "' has no name");
    if (types.count(node.name)) throw Error("node '" + node.name + "' (" + node.op + "): the name is already used");
    if (detail::is_custom_op(node.op) && !detail::is_known_op(node.op))
      throw Error("node '" + node.name + "': vendor op '" + node.op + "' needs its plugin's shape inference; compile it on a device");
    std::vector<const ValueType*> in;
    for (const auto& n : node.inputs) {
      if (n.empty()) {
        in.push_back(nullptr);
        continue;
      }
      auto it = types.find(n);
      if (it == types.end()) throw Error("node '" + node.name + "' (" + node.op + "): input '" + n + "' is not defined before this node");
      in.push_back(&it->second);
    }
    auto r = detail::infer_node(node, in);
    types[node.name] = r.out;
    out[node.name] = {r.out.dtype, r.out.shape};
  }
  for (const auto& o : graph.outputs()) {
    auto it = types.find(o);
    if (it == types.end()) throw Error("graph output '" + o + "' is not an input or a node of the graph");
    if (it->second.is_bundle()) throw Error("graph output '" + o + "' is a multi-output bundle; output its slots through 'view'");
  }
  return out;
}

namespace {

constexpr uint64_t kMaxInlineBytes = uint64_t{64} << 20;

// A JSON value for a message: scalars as written (64 characters at most),
// lists and objects by their kind.
std::string brief(const Json& v) {
  if (v.is_structured()) return v.is_array() ? "a list" : "an object";
  std::string s = v.dump();
  return s.size() <= 64 ? s : s.substr(0, 64) + "...";
}

// Nested JSON arrays -> shape + flat values.
// Once a number has been seen, the shape is closed: a list deeper than the
// numbers seen so far ([1, [2]], [[1, 2], [[3], [4]]]) is ragged.
void flatten(const Json& v, size_t depth, Shape& shape, std::vector<const Json*>& flat, const std::string& where) {
  if (v.is_array()) {
    if (depth == shape.size()) {
      if (!flat.empty()) throw Error(where + ": ragged nested lists (not a rectangular tensor)");
      if (depth >= BP_MAX_RANK) throw Error(where + ": nested deeper than rank 8");
      shape.push_back(static_cast<int64_t>(v.size()));
    } else if (shape[depth] != static_cast<int64_t>(v.size())) {
      throw Error(where + ": ragged nested lists (not a rectangular tensor)");
    }
    for (const auto& e : v) flatten(e, depth + 1, shape, flat, where);
    return;
  }
  if (depth != shape.size() || (depth > 0 && shape[depth - 1] == 0))
    throw Error(where + ": ragged nested lists (not a rectangular tensor)");
  if (depth != shape.size()) throw Error(where + ": ragged nested lists (not a rectangular tensor)");
  if (!v.is_number() && !v.is_boolean()) throw Error(where + ": values must be numbers or booleans, found " + std::string(v.type_name()));
  flat.push_back(&v);
}

// Stores JSON value e as element i of t, or throws naming the value: an
// integer must fit an integer dtype (its JSON kind, unsigned or signed, is
// used as is, so nothing wraps), bool takes true/false/0/1, and a float
// dtype takes any number that stays finite in it.
void set_element(HostTensor& t, int64_t i, const Json& e, const std::string& where) {
  const std::string dt(dtype_name(t.dtype));
  if (e.is_boolean()) return t.set_int(i, e.get<bool>() ? 1 : 0);
  if (is_float(t.dtype)) {
    t.set(i, e.get<double>());
    if (!std::isfinite(t.get(i)))
      throw Error(where + ": value " + brief(e) + " is out of the range of " + dt);
    return;
  }
  if (t.dtype == BP_DTYPE_BOOL) {
    const bool ok = (e.is_number_unsigned() && e.get<uint64_t>() <= 1) ||
                    (e.is_number_integer() && !e.is_number_unsigned() && (e.get<int64_t>() == 0 || e.get<int64_t>() == 1));
    if (!ok) throw Error(where + ": value " + brief(e) + " is not a bool (takes true, false, 0 or 1)");
    return t.set_int(i, e.get<int64_t>());
  }
  if (e.is_number_float()) throw Error(where + ": " + brief(e) + " is not an integer for dtype " + dt);
  int64_t lo = 0;
  uint64_t hi = 0;
  visit_dtype(t.dtype, [&](auto tag) {
    using T = dtype_t<decltype(tag)::value>;
    if constexpr (std::is_integral_v<T>) {
      lo = std::numeric_limits<T>::min();
      hi = std::numeric_limits<T>::max();
    }
  });
  bool fits = false;
  if (e.is_number_unsigned()) {
    fits = e.get<uint64_t>() <= hi;
  } else {
    const int64_t v = e.get<int64_t>();
    fits = v >= lo && (v < 0 || static_cast<uint64_t>(v) <= hi);
  }
  if (!fits)
    throw Error(where + ": value " + brief(e) + " does not fit " + dt + " (" + std::to_string(lo) + " to " +
                std::to_string(hi) + ")");
  // In range, so an unsigned value fits int64 too.
  t.set_int(i, e.is_number_unsigned() ? static_cast<int64_t>(e.get<uint64_t>()) : e.get<int64_t>());
}

HostTensor inline_value(const Json& spec, const std::string& where) {
  bp_dtype dtype = BP_DTYPE_F32;
  if (spec.contains("dtype")) {
    if (!spec["dtype"].is_string() || !dtype_from_name(spec["dtype"].get<std::string>()))
      throw Error(where + ": unknown dtype " + brief(spec["dtype"]));
    dtype = *dtype_from_name(spec["dtype"].get<std::string>());
  }
  for (auto it = spec.begin(); it != spec.end(); ++it)
    if (it.key() != "value" && it.key() != "dtype" && it.key() != "shape")
      throw Error(where + ": unknown key " + brief(it.key()) + " (takes value, dtype, shape)");
  Shape shape;
  std::vector<const Json*> flat;
  flatten(spec["value"], 0, shape, flat, where);
  if (static_cast<int64_t>(flat.size()) != detail::checked_numel(shape, where))
    throw Error(where + ": ragged nested lists (not a rectangular tensor)");
  // Inline constants are small by nature; big data belongs in .npy files.
  auto check_size = [&](const Shape& s) {
    const uint64_t bytes = detail::checked_bytes(s, dtype_size(dtype), where);
    if (bytes > kMaxInlineBytes)
      throw Error(where + ": an inline constant of " + shape_str(s) + " would take " + std::to_string(bytes) +
                  " bytes; the limit is 64 MiB (give a .npy file instead)");
  };
  if (spec.contains("shape")) {
    const Json& js = spec["shape"];
    if (!js.is_array()) throw Error(where + ": 'shape' must be a list of ints");
    if (js.size() > BP_MAX_RANK) throw Error(where + ": 'shape' has rank " + std::to_string(js.size()) + " (at most 8)");
    Shape want;
    for (auto& d : js) {
      const bool ok = d.is_number_integer() &&
                      (d.is_number_unsigned() ? d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX) : d.get<int64_t>() >= 0);
      if (!ok) throw Error(where + ": 'shape' must be a list of non-negative ints (of int64), found " + brief(d));
      want.push_back(d.get<int64_t>());
    }
    detail::checked_numel(want, where + ": 'shape'");
    check_size(want);
    if (!shape.empty()) {
      if (shape != want) throw Error(where + ": value has shape " + shape_str(shape) + " but 'shape' says " + shape_str(want));
    } else {
      // A scalar repeated to fill the shape: checked once, then copied.
      HostTensor one(dtype, {});
      set_element(one, 0, *flat.front(), where);
      HostTensor t(dtype, want);
      const size_t k = one.bytes.size();
      for (size_t at = 0; at < t.bytes.size(); at += k) std::memcpy(t.bytes.data() + at, one.bytes.data(), k);
      return t;
    }
  }
  check_size(shape);
  HostTensor t(dtype, shape);
  for (size_t i = 0; i < flat.size(); ++i) set_element(t, static_cast<int64_t>(i), *flat[i], where);
  return t;
}

}  // namespace

GraphFile parse_graph_json(const Json& j, const std::filesystem::path& base_dir) {
  GraphFile gf;
  if (!j.is_object()) throw Error("graph: the top level must be an object");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "inputs" && it.key() != "nodes" && it.key() != "outputs")
      throw Error("graph: unknown key '" + it.key() + "' (takes inputs, nodes, outputs)");
  if (!j.contains("nodes") || !j["nodes"].is_array()) throw Error("graph: 'nodes' (a list) is required");
  if (!j.contains("outputs") || !j["outputs"].is_array()) throw Error("graph: 'outputs' (a list of names) is required");
  if (j.contains("inputs")) {
    if (!j["inputs"].is_object()) throw Error("graph: 'inputs' must be an object of name: source");
    for (auto it = j["inputs"].begin(); it != j["inputs"].end(); ++it) {
      const std::string name = it.key();
      const std::string where = "graph input '" + name + "'";
      const Json& spec = it.value();
      if (spec.is_string() || (spec.is_object() && spec.contains("file"))) {
        std::optional<bp_dtype> override_dtype;
        std::string file;
        bool is_constant = false;
        if (spec.is_string()) {
          file = spec.get<std::string>();
        } else {
          if (!spec["file"].is_string()) throw Error(where + ": 'file' must be a path");
          file = spec["file"].get<std::string>();
          for (auto k = spec.begin(); k != spec.end(); ++k)
            if (k.key() != "file" && k.key() != "dtype" && k.key() != "constant")
              throw Error(where + ": unknown key '" + k.key() + "' (takes file, dtype, constant)");
          if (spec.contains("constant")) {
            if (!spec["constant"].is_boolean()) throw Error(where + ": 'constant' must be true or false");
            is_constant = spec["constant"].get<bool>();
          }
          if (spec.contains("dtype")) {
            auto d = spec["dtype"].is_string() ? dtype_from_name(spec["dtype"].get<std::string>()) : std::nullopt;
            if (!d) throw Error(where + ": unknown dtype " + brief(spec["dtype"]));
            override_dtype = d;
          }
        }
        std::filesystem::path path = file;
        if (path.is_relative()) path = base_dir / path;
        HostTensor t;
        try {
          t = read_npy(path, override_dtype);
        } catch (const Error& e) {
          throw Error(where + ": " + e.what());
        }
        if (is_constant) {
          gf.graph.constant(name, std::move(t));
        } else {
          gf.graph.input(name, t.dtype, t.shape);
          gf.inputs[name] = std::move(t);
        }
      } else if (spec.is_object() && spec.contains("value")) {
        gf.graph.constant(name, inline_value(spec, where));
      } else if (spec.is_object() && spec.contains("shape")) {
        // Declared only: the data comes with the run (backplane run --input).
        for (auto k = spec.begin(); k != spec.end(); ++k)
          if (k.key() != "shape" && k.key() != "dtype") throw Error(where + ": unknown key '" + k.key() + "' (takes dtype, shape)");
        auto d = spec.contains("dtype") && spec["dtype"].is_string() ? dtype_from_name(spec["dtype"].get<std::string>()) : std::nullopt;
        if (!d) throw Error(where + ": a declared input needs a known 'dtype'");
        const Json& js = spec["shape"];
        if (!js.is_array() || js.size() > BP_MAX_RANK) throw Error(where + ": 'shape' must be a list of at most 8 ints");
        Shape shape;
        std::vector<std::string> dim_names;
        bool dynamic = false;
        for (const auto& v : js) {
          if (v.is_string() && !v.get<std::string>().empty()) {  // a named dynamic dim
            dim_names.push_back(v.get<std::string>());
            shape.push_back(0);
            dynamic = true;
            continue;
          }
          if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
            throw Error(where + ": 'shape' must be a list of non-negative ints or dim names, found " + brief(v));
          shape.push_back(v.get<int64_t>());
          dim_names.emplace_back();
        }
        detail::checked_numel(shape, where + ": 'shape'");
        if (dynamic)
          gf.graph.input(name, *d, shape, dim_names);
        else
          gf.graph.input(name, *d, shape);
      } else {
        throw Error(where + ": expected a .npy path, {\"file\": ...}, {\"value\": ...} or {\"dtype\": ..., \"shape\": ...}");
      }
    }
  }
  size_t index = 0;
  for (const auto& n : j["nodes"]) {
    const std::string where = "graph node #" + std::to_string(index++);
    if (!n.is_object()) throw Error(where + ": must be an object");
    if (!n.contains("name") || !n["name"].is_string()) throw Error(where + ": 'name' (a string) is required");
    const std::string name = n["name"];
    const std::string w2 = "node '" + name + "'";
    if (!n.contains("op") || !n["op"].is_string()) throw Error(w2 + ": 'op' (a string) is required");
    for (auto it = n.begin(); it != n.end(); ++it)
      if (it.key() != "name" && it.key() != "op" && it.key() != "inputs" && it.key() != "params" && it.key() != "device")
        throw Error(w2 + ": unknown key '" + it.key() + "' (takes name, op, inputs, params, device)");
    std::string device;
    if (n.contains("device")) {
      if (!n["device"].is_string() || n["device"].get<std::string>().empty())
        throw Error(w2 + ": 'device' must be a device name (\"cpu\", \"vulkan0\")");
      device = n["device"].get<std::string>();
    }
    const std::string op = n["op"];
    if (!detail::is_known_op(op) && !detail::is_custom_op(op)) throw Error(w2 + ": unknown op '" + op + "'");
    std::vector<std::string> ins;
    if (n.contains("inputs")) {
      if (!n["inputs"].is_array()) throw Error(w2 + ": 'inputs' must be a list");
      for (const auto& i : n["inputs"]) {
        if (i.is_null()) ins.emplace_back();
        else if (i.is_string()) ins.push_back(i.get<std::string>());
        else throw Error(w2 + ": inputs must be names or null");
      }
    }
    Json params = n.value("params", Json::object());
    if (!params.is_object()) throw Error(w2 + ": 'params' must be an object");
    gf.graph.node(name, op, std::move(ins), std::move(params), std::move(device));
  }
  for (const auto& o : j["outputs"]) {
    if (!o.is_string()) throw Error("graph: outputs must be names");
    gf.graph.output(o.get<std::string>());
  }
  // Checked last, so a graph's other defects are named first.
  if (j["outputs"].empty()) throw Error("graph: 'outputs' is empty: nothing would run");
  return gf;
}

// The largest graph file read: far above any hand-written graph, and below
// what would exhaust memory as a parsed JSON tree (several times the text).
constexpr uint64_t kMaxGraphFile = uint64_t{256} << 20;

GraphFile load_graph_file(const std::filesystem::path& path) {
  const std::string prefix = "graph file " + path.string() + ": ";
  const Json j = detail::parse_json_bounded(detail::read_regular_file(path, kMaxGraphFile, "256 MiB", prefix), prefix);
  try {
    return parse_graph_json(j, path.parent_path());
  } catch (const Error& e) {
    throw Error(prefix + e.what(), e.code());
  }
}

}  // namespace backplane
