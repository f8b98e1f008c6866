// diff_fuzz's generator: a case, its inputs and constants, nodes proposed to
// the core, vendor ops, operand choice.
#include "diff_fuzz.hpp"

namespace diff_fuzz {

Case Generator::make() {
  const int n_inputs = pick(1, 3);
  for (int i = 0; i < n_inputs; ++i) {
    const int r = pick(0, 99);
    const bp_dtype d = r < 60   ? BP_DTYPE_F32
                       : r < 68 ? BP_DTYPE_I32
                       : r < 80 ? one_of(std::vector<bp_dtype>{BP_DTYPE_I8, BP_DTYPE_I16, BP_DTYPE_I64, BP_DTYPE_U8})
                       : r < 88 ? BP_DTYPE_BOOL
                                : one_of(std::vector<bp_dtype>{BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64});
    new_input(d, random_shape());
  }
  const int target = pick(1, max_nodes_);
  int tries = 0;
  while (static_cast<int>(case_.node_names.size()) < target && tries++ < target * 20) step();
  // Outputs: the newest value and a few others (no bundles, no inputs).
  std::vector<std::string> values;
  for (const auto& n : case_.node_names)
    if (find(n)) values.push_back(n);
  if (values.empty()) {
    // Always something to compare.
    const Val x = vals_[0];
    const Val* v = add_node("copy", "contiguous", {x.name}, Json::object(), x);
    if (v) values.push_back(v->name);
  }
  std::vector<std::string> outs = {values.back()};
  const int extra = pick(0, 2);
  for (int i = 0; i < extra; ++i) {
    const std::string& n = one_of(values);
    if (std::find(outs.begin(), outs.end(), n) == outs.end()) outs.push_back(n);
  }
  case_.graph = Json{{"inputs", inputs_}, {"nodes", nodes_}, {"outputs", outs}};
  return case_;
}

Shape Generator::random_shape() {
  const int rank = pick(0, 4);
  Shape s;
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    int64_t d = chance(0.04) ? 0 : chance(0.25) ? 1 : pick(2, 6);
    if (n * std::max<int64_t>(d, 1) > 512) d = 1;
    n *= std::max<int64_t>(d, 1);
    s.push_back(d);
  }
  return s;
}

const Val* Generator::find(const std::string& name) const {
  for (const auto& v : vals_)
    if (v.name == name) return &v;
  return nullptr;
}

Val& Generator::new_input(bp_dtype dtype, const Shape& shape, bool positive) {
  Val v;
  v.name = fresh("in");
  v.dtype = dtype;
  v.shape = shape;
  v.input = true;
  const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
  std::vector<double> data(static_cast<size_t>(n));
  if (v.is_float()) {
    const bool dyadic = dtype != BP_DTYPE_F32 || chance(0.6);  // other floats: exact values only
    const double range = positive ? 2.0 : one_of(std::vector<double>{1.0, 2.0, 4.0});
    if (dyadic) {
      v.gran = pick(0, 3);
      const int steps = static_cast<int>(range * (1 << v.gran));
      for (auto& x : data) {
        int k = positive ? pick(std::max(1, steps / 4), steps) : pick(-steps, steps);
        x = std::ldexp(static_cast<double>(k), -v.gran);
      }
      v.exact = true;
    } else {
      std::uniform_real_distribution<float> d(positive ? 0.5f : static_cast<float>(-range), static_cast<float>(range));
      for (auto& x : data) x = static_cast<double>(d(rng_));
      v.exact = false;  // its bits are given; what is computed from it is not exact
    }
  } else if (v.is_int()) {
    const int range = static_cast<int>(std::min(static_cast<double>(one_of(std::vector<int>{3, 20, 1000})), int_max(dtype)));
    const int lo = dtype == BP_DTYPE_U8 ? 0 : -range;
    for (auto& x : data) x = positive ? pick(1, range) : pick(lo, range);
  } else if (dtype == BP_DTYPE_BOOL) {
    for (auto& x : data) x = pick(0, 1);
  }
  v.lo = data.empty() ? 0 : *std::min_element(data.begin(), data.end());
  v.hi = data.empty() ? 0 : *std::max_element(data.begin(), data.end());
  inputs_[v.name] = inline_spec(data, shape, std::string(dtype_name(dtype)));
  if (chance(0.4)) case_.fed.insert(v.name);
  vals_.push_back(v);
  return vals_.back();
}

Val& Generator::index_input(const Shape& shape, int64_t n) {
  Val v;
  v.name = fresh("idx");
  v.dtype = BP_DTYPE_I64;
  v.shape = shape;
  v.input = true;
  const int64_t count = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
  std::vector<double> data(static_cast<size_t>(count));
  for (auto& x : data) x = static_cast<double>(pick(-static_cast<int>(n), static_cast<int>(n) - 1));
  v.lo = -static_cast<double>(n);
  v.hi = static_cast<double>(n) - 1;
  inputs_[v.name] = inline_spec(data, shape, "i64");
  if (chance(0.4)) case_.fed.insert(v.name);
  vals_.push_back(v);
  return vals_.back();
}

Json Generator::inline_spec(const std::vector<double>& data, const Shape& shape, const std::string& dtype) {
  if (data.empty()) return Json{{"value", 0}, {"shape", shape}, {"dtype", dtype}};
  return Json{{"value", nest(data, shape, 0, 0)}, {"dtype", dtype}};
}

Json Generator::nest(const std::vector<double>& data, const Shape& shape, size_t dim, size_t offset) {
  if (dim == shape.size()) {
    const double x = data[offset];
    if (x == std::floor(x) && std::fabs(x) < 1e15) return Json(static_cast<int64_t>(x));
    return Json(x);
  }
  if (shape[dim] == 0) return Json::array();
  size_t stride = 1;
  for (size_t i = dim + 1; i < shape.size(); ++i) stride *= static_cast<size_t>(shape[i]);
  Json a = Json::array();
  for (int64_t i = 0; i < shape[dim]; ++i) a.push_back(nest(data, shape, dim + 1, offset + static_cast<size_t>(i) * stride));
  return a;
}

const Val* Generator::add_node(const std::string& stem, const std::string& op, const std::vector<std::string>& inputs, const Json& params, Val meta, bool bundle) {
  const std::string name = fresh(stem);
  Json node{{"name", name}, {"op", op}, {"inputs", inputs}};
  if (!params.empty()) node["params"] = params;
  Graph g;
  for (const auto& v : vals_)
    if (v.input) g.input(v.name, v.dtype, v.shape);
  for (const auto& n : nodes_) {
    std::vector<std::string> ins;
    for (const auto& i : n["inputs"]) ins.push_back(i.is_null() ? "" : i.get<std::string>());
    const auto [sop, sparams] = standard_twin(n["op"], n.value("params", Json::object()));
    g.node(n["name"], sop, ins, sparams);
  }
  std::vector<std::string> ins;
  for (const auto& i : inputs) ins.push_back(i);
  const auto [sop, sparams] = standard_twin(op, params);
  g.node(name, sop, ins, sparams);
  std::map<std::string, std::pair<bp_dtype, Shape>> types;
  try {
    types = infer_graph(g);
  } catch (const Error& e) {
    ++case_.rejected;
    case_.rejections.push_back(node.dump() + ": " + e.what());
    return nullptr;
  }
  meta.name = name;
  meta.input = false;
  if (!bundle) {
    meta.dtype = types[name].first;
    meta.shape = types[name].second;
    // Integers wrap: beyond their range the bounds are no longer known.
    if (meta.is_int() && (meta.lo < int_min(meta.dtype) || meta.hi > int_max(meta.dtype)))
      meta.lo = int_min(meta.dtype), meta.hi = int_max(meta.dtype);
    int64_t n = 1;
    for (auto d : meta.shape) n *= d;
    if (n > kMaxNumel || !within_tolerance(meta)) return nullptr;
  }
  nodes_.push_back(node);
  case_.node_names.push_back(name);
  case_.node_ops[name] = op;
  case_.node_dtypes[name] = bundle ? BP_DTYPE_INVALID : meta.dtype;
  if (!bundle) vals_.push_back(meta);
  else bundles_[name] = meta;
  return bundle ? &bundles_[name] : &vals_.back();
}

std::pair<std::string, Json> Generator::standard_twin(const std::string& op, const Json& params) {
  if (op == "partial.scale_shift") return {"affine", Json::object()};
  if (op == "partial.norm_rows") return {"contiguous", Json::object()};
  if (op == "partial.minmax") return {"var_mean", Json{{"dims", {-1}}}};
  return {op, params};
}

void Generator::vendor() {
  const Val* x = operand([](const Val& v) { return v.dtype == BP_DTYPE_F32 && !v.special && !v.shape.empty(); });
  if (!x) return;
  const Val X = *x;
  const int which = pick(0, 2);
  if (which == 0) {
    const double scale = std::ldexp(pick(-8, 8), -2), shift = std::ldexp(pick(-8, 8), -2);
    Json p = Json::object();
    if (chance(0.8)) p["scale"] = scale;
    if (chance(0.8)) p["shift"] = shift;
    const double sc = p.value("scale", 1.0), sh = p.value("shift", 0.0);
    Val m = X;
    const double a = X.lo * sc + sh, b = X.hi * sc + sh;
    m.lo = std::min(a, b), m.hi = std::max(a, b);
    m.gran = X.gran + 2;
    if (!(X.exact && fits_exact(std::max(m.mag(), X.mag() * std::fabs(sc)), m.gran))) {
      m.exact = false;
      m.ea = X.abs_err() * std::fabs(sc) + kU * (X.mag() * std::fabs(sc) + m.mag());
      m.er = 0;
    }
    add_node("scale_shift", "partial.scale_shift", {X.name}, p, m);
  } else if (which == 1) {
    if (X.shape.back() == 0) return;  // min and max over nothing: an error
    const Val* t = add_node("minmax", "partial.minmax", {X.name}, Json::object(), X, true);
    if (!t) return;
    const std::string tn = t->name;
    add_node("lo", chance(0.7) ? "view" : "view_owned", {tn}, Json{{"slot", 0}}, X);
    if (chance(0.7)) add_node("hi", chance(0.7) ? "view" : "view_owned", {tn}, Json{{"slot", 1}}, X);
  } else {
    // x / sum(x over the last dim): positive rows.
    if (X.lo < 0.25) return;
    const double n = static_cast<double>(X.shape.back());
    Val m = X;
    m.exact = false;
    m.lo = X.lo / (n * X.hi), m.hi = 1;
    m.ea = 0;
    m.er = 2 * X.rel_err() + 2 * kU * std::sqrt(std::max(n, 1.0)) + 8 * kU;
    add_node("norm_rows", "partial.norm_rows", {X.name}, Json::object(), m);
  }
}

const Val* Generator::operand(bool (*ok)(const Val&)) {
  std::vector<const Val*> c;
  for (const auto& v : vals_)
    if (ok(v)) c.push_back(&v);
  if (c.empty()) return nullptr;
  if (chance(0.5)) return c.back();
  return c[static_cast<size_t>(pick(0, static_cast<int>(c.size()) - 1))];
}

bool Generator::broadcastable(const Shape& a, const Shape& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const int64_t x = a[a.size() - 1 - i], y = b[b.size() - 1 - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

Shape Generator::partner_shape(const Shape& s) {
  Shape p = s;
  const int how = pick(0, 4);
  if (how == 1 && !p.empty()) p.erase(p.begin(), p.begin() + pick(0, static_cast<int>(p.size())));
  if (how == 2)
    for (auto& d : p)
      if (chance(0.5)) d = 1;
  if (how == 3) p.clear();
  if (how == 4 && p.size() < 4) p.insert(p.begin(), pick(1, 3));
  return p;
}

const Val* Generator::partner(const Val& a, bool positive) {
  if (!positive && chance(0.4)) {
    std::vector<const Val*> c;
    for (const auto& v : vals_)
      if (v.dtype == a.dtype && v.name != a.name && broadcastable(v.shape, a.shape)) c.push_back(&v);
    if (!c.empty()) return c[static_cast<size_t>(pick(0, static_cast<int>(c.size()) - 1))];
  }
  return &new_input(a.dtype, partner_shape(a.shape), positive);
}

void Generator::step() {
  switch (pick(0, 17)) {
    case 0: case 1: case 2: unary(); break;
    case 3: case 4: case 5: binary(); break;
    case 6: compare_where(); break;
    case 7: case 8: view(); break;
    case 9: reduce(); break;
    case 10: softmax_like(); break;
    case 11: matmul(); break;
    case 12: concat(); break;
    case 13: topk_or_var_mean(); break;
    case 14: index(); break;
    case 15: cast_or_affine(); break;
    case 16: if (vendor_ops_) vendor(); break;
    case 17: attention(); break;
  }
}

}  // namespace diff_fuzz
