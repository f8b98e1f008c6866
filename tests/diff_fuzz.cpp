// diff_fuzz: a graph-level differential fuzzer. It generates random valid
// graphs (chains and DAGs of elementwise ops with broadcasting, reductions,
// softmax, matmul, concat, views, topk and var_mean with their slots,
// gather/index_select, casts between every dtype, compares and where; with
// --partial-dir the test plugin's vendor ops too) over random inline
// constants or fed inputs, runs each on the CPU plugin (the reference) and on
//   vulkan0 alone            (when there is a Vulkan device and it has every kernel),
//   "vulkan0,cpu"            (some nodes pinned to one device or the other),
//   "partial0,cpu"           (with --partial-dir: the test plugin, some nodes pinned),
// and compares the results with docs/ops.md's tolerances: f32 relative 1e-4
// or absolute 1e-6 per element, NaN matches NaN, infinities exactly,
// integers and bools exactly. Every plan is also run twice (the same bits).
//
//   diff_fuzz [--seed N] [--count M] [--start K] [--max-nodes K] [--partial-dir DIR]
//             [--save DIR] [--no-scalar-dims] [--verbose]
//
// `diff_fuzz --graph FILE...` runs graph files (inline inputs) the same way:
// on the CPU without pins, on vulkan0 alone, and on the device lists with the
// file's own pins. tests/diff_fuzz_cases/ holds what it found, minimised.
//
// --no-scalar-dims leaves out rank-0 inputs to the ops that take dim 0 or -1
// on them (softmax, log_softmax, cumsum, argmax, argmin, gather).
//
// Graph i of seed N is the same graph on any machine: `--seed N --start i
// --count 1` regenerates it. A mismatch prints the graph as a graph file
// (every input inline, the pins of the device list that failed), which
// `backplane run graph.json --device <list>` replays; --save writes it too.
//
// The generator keeps, per value, bounds of its elements, whether it is exact
// (small dyadic values through exactly rounded arithmetic: the same bits on
// any correct device, whatever the order of a sum) and otherwise an estimate
// of how far two correct devices may drift apart; it only builds values whose
// drift stays well within the tolerance, so a mismatch means a bug, not
// rounding. Ops whose answer can flip on a last-bit difference (floor,
// compare, argmax, topk indices, casts, sign) only take exact values; f16,
// bf16 and f64 values are all exact (small dyadic numbers), integers exact
// (they wrap).
#include <backplane/backplane.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace backplane;

namespace {

// ---- value metadata -------------------------------------------------------------

constexpr double kU = 5.960464477539063e-08;  // 2^-24: f32's unit roundoff
constexpr double kT = 4e-7;                   // a transcendental's relative error (~7 ulp)
constexpr double kMaxMag = 1e6;               // finite elements stay below this
constexpr int64_t kMaxNumel = 2048;           // per value

struct Val {
  std::string name;
  bp_dtype dtype = BP_DTYPE_F32;
  Shape shape;
  double lo = 0, hi = 0;  // bounds of the finite elements
  bool exact = true;      // every element the same bits on any correct device
  int gran = 0;           // exact f32: every element a multiple of 2^-gran
  bool special = false;   // may hold NaN or infinities (at places every device agrees on)
  double ea = 0, er = 0;  // |device A - device B| <= ea + er * |value| (inexact f32)
  bool input = false;     // a graph input (its bits are given)

  double mag() const { return std::max(std::fabs(lo), std::fabs(hi)); }
  // The smallest |element| (0 when the bounds straddle 0).
  double min_abs() const { return lo > 0 ? lo : hi < 0 ? -hi : 0.0; }
  // The drift as an absolute bound.
  double abs_err() const { return ea + er * mag(); }
  // The drift relative to the value (infinite when it may be 0 and drift).
  double rel_err() const {
    if (ea == 0 && er == 0) return 0;
    const double m = min_abs();
    return m > 0 ? er + ea / m : INFINITY;
  }
  bool is_float() const {
    return dtype == BP_DTYPE_F32 || dtype == BP_DTYPE_F64 || dtype == BP_DTYPE_F16 || dtype == BP_DTYPE_BF16;
  }
  bool is_int() const {
    return dtype == BP_DTYPE_I8 || dtype == BP_DTYPE_I16 || dtype == BP_DTYPE_I32 || dtype == BP_DTYPE_I64 ||
           dtype == BP_DTYPE_U8;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

// A float dtype's significand bits and largest finite value.
int float_bits(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F64: return 53;
    case BP_DTYPE_F16: return 11;
    case BP_DTYPE_BF16: return 8;
    default: return 24;
  }
}
double float_max(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F64: return 1.7e308;
    case BP_DTYPE_F16: return 65504;
    default: return 3.3e38;
  }
}
// An integer dtype's range.
double int_min(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_I8: return -128;
    case BP_DTYPE_I16: return -32768;
    case BP_DTYPE_I64: return -9223372036854775808.0;
    case BP_DTYPE_U8: return 0;
    default: return -2147483648.0;
  }
}
double int_max(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_I8: return 127;
    case BP_DTYPE_I16: return 32767;
    case BP_DTYPE_I64: return 9223372036854775807.0;
    case BP_DTYPE_U8: return 255;
    default: return 2147483647.0;
  }
}

// Exact arithmetic stays exact while every value (and partial sum) below
// `mag` is a multiple of 2^-gran representable in `bits` bits (f32: 24).
bool fits_exact(double mag, int gran, int bits = 24) { return gran <= 60 && mag * std::ldexp(1.0, gran) < std::ldexp(1.0, bits); }

// Whether two correct devices' results for v are certain to pass the
// comparison (|a - b| <= max(1e-6, 1e-4 |ref|)), with a factor 2 to spare.
bool within_tolerance(const Val& v) {
  if (!v.is_float()) return true;
  if (!(v.mag() <= kMaxMag)) return false;
  // f16, bf16 and f64 only carry exact values here: computed in f32 (f64)
  // and rounded when stored, they then give the same bits on every device.
  if (v.dtype != BP_DTYPE_F32) return v.exact && !v.special && fits_exact(v.mag(), v.gran, float_bits(v.dtype));
  if (v.exact) return fits_exact(v.mag(), v.gran);
  if (v.ea <= 0.5e-6 && v.er <= 0.5e-4) return true;
  return v.rel_err() <= 0.5e-4;
}

std::string shape_text(const Shape& s) { return shape_str(s); }

// ---- the generator -----------------------------------------------------------------

struct Case {
  Json graph;                  // the graph file (inputs inline, no pins)
  std::set<std::string> fed;   // inputs fed at run time rather than constants
  std::vector<std::string> node_names;
  std::map<std::string, std::string> node_ops;
  std::map<std::string, bp_dtype> node_dtypes;
  int rejected = 0;  // proposals the core refused (a generator bug when > 0)
  std::vector<std::string> rejections;
};

class Generator {
 public:
  // scalar_dims: give softmax, log_softmax, cumsum, argmax, argmin and
  // gather rank-0 inputs too (dim 0 or -1, as docs/ops.md allows).
  // vendor_ops: the partial plugin's vendor ops too (its manifest is loaded).
  Generator(uint64_t seed, int max_nodes, bool scalar_dims, bool vendor_ops)
      : rng_(seed), max_nodes_(max_nodes), scalar_dims_(scalar_dims), vendor_ops_(vendor_ops) {}

  Case make() {
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

 private:
  // ---- randomness
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <typename T> const T& one_of(const std::vector<T>& v) { return v[static_cast<size_t>(pick(0, static_cast<int>(v.size()) - 1))]; }

  Shape random_shape() {
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

  std::string fresh(const std::string& stem) { return stem + std::to_string(counter_++); }

  const Val* find(const std::string& name) const {
    for (const auto& v : vals_)
      if (v.name == name) return &v;
    return nullptr;
  }

  // ---- inputs

  // A new graph input of `dtype` and `shape`: f32 values either small dyadic
  // numbers (exact arithmetic) or arbitrary floats in a range; `positive`
  // keeps them in [0.5, 2].
  Val& new_input(bp_dtype dtype, const Shape& shape, bool positive = false) {
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

  // An i64 index input with values in [-n, n-1] (n > 0) or empty.
  Val& index_input(const Shape& shape, int64_t n) {
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

  // An inline constant; an empty one as a fill ({"value": 0, "shape": ...}):
  // nested lists cannot say [0, 3].
  static Json inline_spec(const std::vector<double>& data, const Shape& shape, const std::string& dtype) {
    if (data.empty()) return Json{{"value", 0}, {"shape", shape}, {"dtype", dtype}};
    return Json{{"value", nest(data, shape, 0, 0)}, {"dtype", dtype}};
  }

  static Json nest(const std::vector<double>& data, const Shape& shape, size_t dim, size_t offset) {
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

  // ---- nodes

  // Checks a proposed node with the core's own inference (on the graph so
  // far) and adds it with the metadata `meta` (name, dtype and shape are
  // filled in here). Returns the new value, or nullptr when refused.
  const Val* add_node(const std::string& stem, const std::string& op, const std::vector<std::string>& inputs,
                      const Json& params, Val meta, bool bundle = false) {
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

  // infer_graph has no shapes for vendor ops: it checks the partial
  // plugin's ones (tests/fixtures/partial.json.in) as standard ops of the
  // same shapes.
  static std::pair<std::string, Json> standard_twin(const std::string& op, const Json& params) {
    if (op == "partial.scale_shift") return {"affine", Json::object()};
    if (op == "partial.norm_rows") return {"contiguous", Json::object()};
    if (op == "partial.minmax") return {"var_mean", Json{{"dims", {-1}}}};
    return {op, params};
  }

  // The partial plugin's vendor ops: its kernel on partial0, its manifest's
  // decomposition elsewhere (the CPU reference among them).
  void vendor() {
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

  // An operand: the newest value half the time (chains), else any.
  const Val* operand(bool (*ok)(const Val&)) {
    std::vector<const Val*> c;
    for (const auto& v : vals_)
      if (ok(v)) c.push_back(&v);
    if (c.empty()) return nullptr;
    if (chance(0.5)) return c.back();
    return c[static_cast<size_t>(pick(0, static_cast<int>(c.size()) - 1))];
  }

  static bool broadcastable(const Shape& a, const Shape& b) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      const int64_t x = a[a.size() - 1 - i], y = b[b.size() - 1 - i];
      if (x != y && x != 1 && y != 1) return false;
    }
    return true;
  }

  // A shape that broadcasts against s: s itself, a suffix of it, some dims set
  // to 1, a scalar, or with a new leading dim.
  Shape partner_shape(const Shape& s) {
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

  // A partner for a binary op: an existing value of the same dtype whose
  // shape broadcasts (40%), else a new input.
  const Val* partner(const Val& a, bool positive = false) {
    if (!positive && chance(0.4)) {
      std::vector<const Val*> c;
      for (const auto& v : vals_)
        if (v.dtype == a.dtype && v.name != a.name && broadcastable(v.shape, a.shape)) c.push_back(&v);
      if (!c.empty()) return c[static_cast<size_t>(pick(0, static_cast<int>(c.size()) - 1))];
    }
    return &new_input(a.dtype, partner_shape(a.shape), positive);
  }

  void step() {
    switch (pick(0, 16)) {
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
    }
  }

  // ---- unary ops

  void unary() {
    const Val* x = operand([](const Val& v) { return v.dtype != BP_DTYPE_BOOL && v.dtype != BP_DTYPE_I64; });
    if (!x) return;
    if (x->is_int()) {
      const std::string op = one_of(std::vector<std::string>{"neg", "abs", "sign", "clamp"});
      Val m = *x;
      Json p = Json::object();
      if (op == "neg") m.lo = -x->hi, m.hi = -x->lo;
      if (op == "abs") m.lo = x->min_abs(), m.hi = x->mag();
      if (op == "sign") m.lo = x->lo < 0 ? -1 : x->lo > 0 ? 1 : 0, m.hi = x->hi > 0 ? 1 : x->hi < 0 ? -1 : 0;
      if (op == "clamp") {
        const int lo = x->dtype == BP_DTYPE_U8 ? 0 : -5;
        const int a = pick(lo, 5), b = pick(lo, 5);
        if (chance(0.8)) p["min"] = a;
        if (chance(0.8)) p["max"] = b;
        if (p.contains("min")) m.lo = std::max(m.lo, double(a)), m.hi = std::max(m.hi, double(a));
        if (p.contains("max")) m.lo = std::min(m.lo, double(b)), m.hi = std::min(m.hi, double(b));
      }
      // neg and abs of INT_MIN wrap; the bounds stay small here.
      add_node(op, op, {x->name}, p, m);
      return;
    }
    std::vector<std::string> ops = {"neg", "abs", "relu", "sqr", "exp", "tanh", "sigmoid", "silu", "gelu", "softplus",
                                    "erf", "sin", "cos", "clamp"};
    if (x->exact && !x->special) ops.insert(ops.end(), {"floor", "ceil", "round", "sign"});
    if (x->min_abs() >= 0.25 || (x->input && x->exact)) ops.insert(ops.end(), {"recip", "rsqrt", "sqrt", "log"});
    if (x->special) ops = {"neg", "abs", "relu", "exp", "tanh", "sigmoid", "clamp"};
    const std::string op = one_of(ops);
    Val m = *x;
    const double M = x->mag(), E = x->abs_err();
    const double R = x->rel_err();
    Json p = Json::object();
    auto inexact = [&](double lo, double hi, double ea, double er) {
      m.exact = false;
      m.lo = lo;
      m.hi = hi;
      m.ea = ea;
      m.er = er;
    };
    if (op == "neg") {
      m.lo = -x->hi, m.hi = -x->lo;
    } else if (op == "abs") {
      m.lo = x->min_abs(), m.hi = M;
    } else if (op == "relu") {
      m.lo = std::max(x->lo, 0.0), m.hi = std::max(x->hi, 0.0);
    } else if (op == "sqr") {
      m.lo = x->min_abs() * x->min_abs(), m.hi = M * M;
      if (x->exact && fits_exact(m.hi, 2 * x->gran)) m.gran = 2 * x->gran;
      else inexact(m.lo, m.hi, 2 * x->ea * M, 2 * x->er + kU);
    } else if (op == "exp") {
      if (x->hi > 12) return;
      inexact(std::exp(x->lo), std::exp(x->hi), 0, E + kT);
    } else if (op == "tanh" || op == "sigmoid" || op == "erf") {
      auto f = [&](double v) { return op == "tanh" ? std::tanh(v) : op == "erf" ? std::erf(v) : 1 / (1 + std::exp(-v)); };
      inexact(f(x->lo), f(x->hi), 1.13 * E, kT);
    } else if (op == "silu" || op == "gelu" || op == "softplus") {
      if (op == "gelu") p["approximate"] = chance(0.5) ? "none" : "tanh";
      // Their smallest values lie near x = -1.28 (silu), -0.75 (gelu); bounds loose.
      const double lo = op == "softplus" ? std::log1p(std::exp(x->lo)) : std::min(-0.3, x->lo);
      const double hi = op == "softplus" ? std::log1p(std::exp(x->hi)) : std::max(0.0, x->hi);
      if (op != "softplus" && x->lo < -4) return;  // x·Φ(x) of large negative x: a tiny difference of large terms
      inexact(lo, hi, 1.13 * E + 2 * kU * M, kT);
    } else if (op == "sin" || op == "cos") {
      if (M > 4) return;  // argument reduction differs far from 0
      inexact(-1, 1, E + 4 * kU, kT);
    } else if (op == "clamp") {
      const double a = std::ldexp(pick(-8, 8), -2), b = std::ldexp(pick(-8, 8), -2);
      if (chance(0.8)) p["min"] = a;
      if (chance(0.8)) p["max"] = b;
      if (p.contains("min")) m.lo = std::max(m.lo, a), m.hi = std::max(m.hi, a);
      if (p.contains("max")) m.lo = std::min(m.lo, b), m.hi = std::min(m.hi, b);
      if (m.exact) m.gran = std::max(m.gran, 2);
    } else if (op == "floor" || op == "ceil" || op == "round") {
      m.lo = std::floor(x->lo), m.hi = std::ceil(x->hi), m.gran = 0;
    } else if (op == "sign") {
      m.lo = x->lo < 0 ? -1 : 0, m.hi = x->hi > 0 ? 1 : 0, m.gran = 0;
    } else {  // recip, rsqrt, sqrt, log
      const double lo = x->lo, hi = x->hi, mn = x->min_abs();
      if (mn >= 0.25 && !x->special) {
        if (op == "recip") inexact(1 / hi, 1 / lo, 0, R + 6 * kU);
        if (op == "rsqrt") {
          if (lo <= 0) return;
          inexact(1 / std::sqrt(hi), 1 / std::sqrt(lo), 0, R / 2 + kT);
        }
        if (op == "sqrt") {
          if (lo <= 0) return;
          inexact(std::sqrt(lo), std::sqrt(hi), 0, R / 2 + kT);
        }
        if (op == "log") {
          if (lo <= 0) return;
          inexact(std::log(lo), std::log(hi), R + 2 * kU + kT * std::max(std::fabs(std::log(lo)), std::fabs(std::log(hi))), kU);
        }
      } else {
        // An exact input whose elements may be 0 or negative: infinities and
        // NaNs at its zeros and negative elements, the same on every device.
        // Finite results: |x| >= 2^-gran.
        const double small = std::ldexp(1.0, -x->gran);
        const double big = std::max(M, small);
        m.special = true;
        if (op == "recip") inexact(-1 / small, 1 / small, 0, 6 * kU);
        if (op == "rsqrt") inexact(1 / std::sqrt(big), 1 / std::sqrt(small), 0, kT);
        if (op == "sqrt") inexact(0, std::sqrt(big), 0, kT);
        if (op == "log") {
          const double a = std::fabs(std::log(small)), b = std::fabs(std::log(big));
          inexact(-a, b, 2 * kU + kT * std::max(a, b), kU);
        }
      }
    }
    add_node(op, op, {x->name}, p, m);
  }

  // ---- binary elementwise

  void binary() {
    const Val* a = operand([](const Val& v) { return v.is_float() || v.is_int(); });
    if (!a) return;
    const Val A = *a;  // partner() may grow vals_
    std::vector<std::string> ops = {"add", "sub", "mul", "maximum", "minimum"};
    if (A.is_float() && !A.special) ops.insert(ops.end(), {"div", "pow"});
    if (A.is_int()) ops.push_back("div");
    const std::string op = one_of(ops);
    const bool positive = op == "div" || op == "pow";
    const Val* b = partner(A, positive);
    if (!b) return;
    const Val B = *b;
    const std::string an = A.name, bn = B.name;
    Val m = A;
    m.special = A.special || B.special;
    const double Ma = A.mag(), Mb = B.mag();
    if (A.is_int()) {
      // Integers wrap (add_node widens the bounds then); the bounds serve
      // div (no zero divisor) and casts.
      if (op == "div" && B.lo <= 0) return;
      double lo = 0, hi = 0;
      if (op == "add") lo = A.lo + B.lo, hi = A.hi + B.hi;
      if (op == "sub") lo = A.lo - B.hi, hi = A.hi - B.lo;
      if (op == "mul") hi = Ma * Mb, lo = -hi;
      if (op == "maximum") lo = std::max(A.lo, B.lo), hi = std::max(A.hi, B.hi);
      if (op == "minimum") lo = std::min(A.lo, B.lo), hi = std::min(A.hi, B.hi);
      if (op == "div") lo = -Ma, hi = Ma;
      m.lo = lo, m.hi = hi;
      add_node(op, op, {an, bn}, Json::object(), m);
      return;
    }
    // Specials meet exact zeros only: inf * 0 must be 0 on every device, not
    // inf * 1e-30 on one.
    if (m.special && op == "mul") {
      const Val& other = A.special ? B : A;
      if (!other.exact && other.min_abs() == 0) return;
      if (A.special && B.special) return;
    }
    m.exact = A.exact && B.exact;
    m.gran = std::max(A.gran, B.gran);
    m.ea = 0, m.er = 0;
    if (op == "add" || op == "sub") {
      m.lo = op == "add" ? A.lo + B.lo : A.lo - B.hi;
      m.hi = op == "add" ? A.hi + B.hi : A.hi - B.lo;
      if (!m.exact || !fits_exact(std::max(std::fabs(m.lo), std::fabs(m.hi)), m.gran)) {
        m.exact = false;
        const bool same_sign = (op == "add" && A.lo >= 0 && B.lo >= 0) || (op == "add" && A.hi <= 0 && B.hi <= 0);
        if (same_sign) {
          m.ea = A.ea + B.ea;
          m.er = std::max(A.er, B.er) + kU;
        } else {
          m.ea = A.abs_err() + B.abs_err() + kU * std::max(std::fabs(m.lo), std::fabs(m.hi));
        }
      }
    } else if (op == "mul") {
      const double c[] = {A.lo * B.lo, A.lo * B.hi, A.hi * B.lo, A.hi * B.hi};
      m.lo = *std::min_element(c, c + 4), m.hi = *std::max_element(c, c + 4);
      m.gran = A.gran + B.gran;
      if (!m.exact || !fits_exact(Ma * Mb, m.gran)) {
        m.exact = false;
        m.ea = A.ea * Mb + B.ea * Ma;
        m.er = A.er + B.er + kU;
      }
    } else if (op == "maximum" || op == "minimum") {
      m.lo = op == "maximum" ? std::max(A.lo, B.lo) : std::min(A.lo, B.lo);
      m.hi = op == "maximum" ? std::max(A.hi, B.hi) : std::min(A.hi, B.hi);
      if (!m.exact) m.ea = std::max(A.abs_err(), B.abs_err()), m.er = 0;
    } else if (op == "div") {
      // B in [0.5, 2] or bounded away from 0.
      const double mb = B.min_abs();
      if (mb < 0.25) return;
      const double c[] = {A.lo / B.lo, A.lo / B.hi, A.hi / B.lo, A.hi / B.hi};
      m.lo = *std::min_element(c, c + 4), m.hi = *std::max_element(c, c + 4);
      m.exact = false;
      m.ea = A.ea / mb;
      m.er = A.er + B.rel_err() + 6 * kU;
    } else {  // pow: a positive base, a small exponent
      if (A.lo < 0.25 || A.special || Mb > 3) return;
      const double c[] = {std::pow(A.lo, B.lo), std::pow(A.lo, B.hi), std::pow(A.hi, B.lo), std::pow(A.hi, B.hi)};
      m.lo = *std::min_element(c, c + 4), m.hi = *std::max_element(c, c + 4);
      m.exact = false;
      const double L = std::max(std::fabs(std::log(A.lo)), std::fabs(std::log(A.hi)));
      m.ea = 0;
      m.er = Mb * A.rel_err() + L * B.abs_err() + 2 * kT * (1 + Mb * L);
    }
    add_node(op, op, {an, bn}, Json::object(), m);
  }

  // ---- compares and where

  void compare_where() {
    const Val* a = operand([](const Val& v) { return v.exact && v.dtype != BP_DTYPE_I64; });
    if (!a) return;
    const Val A = *a;
    const Val* b = partner(A);
    if (!b || !b->exact) return;
    const std::string op = one_of(std::vector<std::string>{"eq", "ne", "lt", "le", "gt", "ge"});
    Val c;
    c.lo = 0, c.hi = 1;
    const Val* cond = add_node(op, op, {A.name, b->name}, Json::object(), c);
    if (!cond || chance(0.3)) return;
    // where(cond, x, y): x and y of one dtype, broadcasting with cond.
    const std::string cn = cond->name;
    const Shape cs = cond->shape;
    const Val* x = operand([](const Val& v) { return v.dtype != BP_DTYPE_BOOL; });
    if (!x || !broadcastable(x->shape, cs)) return;
    const Val X = *x;
    const Val* y = partner(X);
    if (!y || !broadcastable(y->shape, cs)) return;
    const Val Y = *y;
    Val m = X;
    m.lo = std::min(X.lo, Y.lo), m.hi = std::max(X.hi, Y.hi);
    m.exact = X.exact && Y.exact, m.gran = std::max(X.gran, Y.gran), m.special = X.special || Y.special;
    m.ea = m.exact ? 0 : std::max(X.abs_err(), Y.abs_err());
    m.er = 0;
    if (!m.exact && X.rel_err() < INFINITY && Y.rel_err() < INFINITY) m.ea = 0, m.er = std::max(X.rel_err(), Y.rel_err());
    add_node("where", "where", {cn, X.name, Y.name}, Json::object(), m);
  }

  // ---- views

  void view() {
    const Val* x = operand([](const Val&) { return true; });
    if (!x) return;
    const Val X = *x;
    const auto rank = static_cast<int>(X.shape.size());
    const int which = pick(0, 7);
    Json p = Json::object();
    std::string op;
    if (which == 0) {
      op = "reshape";
      p["shape"] = reshape_target(X);
    } else if (which == 1 && rank >= 1) {
      op = "permute";
      std::vector<int64_t> dims(static_cast<size_t>(rank));
      std::iota(dims.begin(), dims.end(), 0);
      std::shuffle(dims.begin(), dims.end(), rng_);
      if (chance(0.3)) dims[0] -= rank;  // a negative dim
      p["dims"] = dims;
    } else if (which == 2 && rank >= 2) {
      op = "transpose";
      p["dim0"] = pick(-rank, rank - 1);
      p["dim1"] = pick(-rank, rank - 1);
    } else if (which == 3) {
      op = "broadcast_to";
      Shape s = X.shape;
      for (auto& d : s)
        if (d == 1 && chance(0.6)) d = pick(2, 4);
      while (s.size() < 4 && chance(0.4)) s.insert(s.begin(), pick(1, 3));
      p["shape"] = s;
    } else if (which == 4 && rank >= 1) {
      op = "slice";
      const int d = pick(0, rank - 1);
      const int n = static_cast<int>(X.shape[static_cast<size_t>(d)]);
      p["dim"] = chance(0.3) ? d - rank : d;
      if (chance(0.7)) p["start"] = pick(-n - 2, n + 2);
      if (chance(0.7)) p["end"] = pick(-n - 2, n + 2);
      int step = pick(-3, 3);
      if (step == 0) step = 1;
      if (chance(0.5)) p["step"] = step;
    } else if (which == 5) {
      op = "squeeze";
      std::vector<int64_t> ones;
      for (int i = 0; i < rank; ++i)
        if (X.shape[static_cast<size_t>(i)] == 1 && chance(0.7)) ones.push_back(chance(0.3) ? i - rank : i);
      if (!ones.empty() && chance(0.7)) p["dims"] = ones;
    } else if (which == 6 && rank < 4) {
      op = "unsqueeze";
      p["dim"] = pick(-rank - 1, rank);
    } else {
      op = "contiguous";
    }
    add_node(op, op, {X.name}, p, X);
  }

  Json reshape_target(const Val& x) {
    const int64_t n = x.numel();
    std::vector<int64_t> dims;
    if (n == 0) {
      dims = chance(0.5) ? std::vector<int64_t>{0} : std::vector<int64_t>{pick(1, 3), 0};
      return dims;
    }
    int64_t rest = n;
    const int rank = pick(0, 4);
    for (int i = 0; i + 1 < rank; ++i) {
      std::vector<int64_t> divisors;
      for (int64_t d = 1; d <= rest; ++d)
        if (rest % d == 0) divisors.push_back(d);
      const int64_t d = divisors[static_cast<size_t>(pick(0, static_cast<int>(divisors.size()) - 1))];
      dims.push_back(d);
      rest /= d;
    }
    if (rank == 0 && rest != 1) dims.push_back(rest);
    else if (rank > 0) dims.push_back(rest);
    if (!dims.empty() && chance(0.3)) dims[static_cast<size_t>(pick(0, static_cast<int>(dims.size()) - 1))] = -1;
    return dims;
  }

  // ---- reductions

  // Random reduction dims of `rank` (possibly all), as a list of positions.
  std::vector<int64_t> random_dims(int rank) {
    std::vector<int64_t> d;
    for (int i = 0; i < rank; ++i)
      if (chance(0.5)) d.push_back(chance(0.3) ? i - rank : i);
    std::shuffle(d.begin(), d.end(), rng_);
    return d;
  }

  int64_t reduced_count(const Val& x, const Json& dims) const {
    const auto rank = static_cast<int64_t>(x.shape.size());
    if (!dims.is_array()) return x.numel();
    int64_t n = 1;
    for (const auto& d : dims) {
      int64_t i = d.get<int64_t>();
      if (i < 0) i += rank;
      n *= x.shape[static_cast<size_t>(i)];
    }
    return n;
  }

  void reduce() {
    const Val* x = operand([](const Val& v) { return v.is_float() || v.is_int(); });
    if (!x) return;
    const Val X = *x;
    const auto rank = static_cast<int>(X.shape.size());
    std::vector<std::string> ops = {"sum", "max", "min", "prod"};
    if (X.is_float()) ops.push_back("mean");
    if (X.exact) ops.insert(ops.end(), {"argmax", "argmin"});
    const std::string op = one_of(ops);
    Json p = Json::object();
    if (op == "argmax" || op == "argmin") {
      if (rank == 0 && !scalar_dims_) return;
      if (rank == 0 && chance(0.5)) p["dim"] = 0;
      else if (rank > 0) p["dim"] = pick(-rank, rank - 1);
      else p["dim"] = -1;
      if (rank > 0) {
        int64_t d = p["dim"].get<int64_t>();
        if (X.shape[static_cast<size_t>(d < 0 ? d + rank : d)] == 0) return;  // an error by the docs
      }
      if (chance(0.3)) p["keepdim"] = true;
      if (chance(0.3)) p["select_last_index"] = true;
      Val m;
      m.dtype = BP_DTYPE_I64;
      m.lo = 0, m.hi = 64;
      add_node(op, op, {X.name}, p, m);
      return;
    }
    const auto dims = random_dims(rank);
    if (!dims.empty() || (rank > 0 && chance(0.3))) p["dims"] = dims.empty() ? Json(std::vector<int64_t>{rank - 1}) : Json(dims);
    if (chance(0.3)) p["keepdim"] = true;
    const int64_t n = reduced_count(X, p.value("dims", Json()));
    Val m = X;
    const double M = X.mag();
    if (X.is_int()) {
      if (op == "sum") m.lo = std::min(0.0, X.lo * n), m.hi = std::max(0.0, X.hi * n);
      if (op == "prod") m.lo = int_min(X.dtype), m.hi = int_max(X.dtype);
      if ((op == "max" || op == "min") && n == 0) return;
      add_node(op, op, {X.name}, p, m);
      return;
    }
    if (op == "max" || op == "min") {
      if (n == 0) return;  // an error by the docs
    } else if (op == "sum" || op == "mean") {
      m.lo = op == "mean" ? X.lo : std::min(0.0, X.lo) * static_cast<double>(n);
      m.hi = op == "mean" ? X.hi : std::max(0.0, X.hi) * static_cast<double>(n);
      if (n == 0) m.lo = 0, m.hi = 0, m.special = m.special || op == "mean";  // mean of nothing: NaN
      const bool pow2 = n > 0 && (n & (n - 1)) == 0;
      if (X.exact && fits_exact(M * static_cast<double>(n), X.gran) && (op == "sum" || pow2)) {
        if (op == "mean") m.gran = X.gran + static_cast<int>(std::log2(static_cast<double>(n)));
        if (!fits_exact(M, m.gran)) m.exact = false;
      } else {
        m.exact = false;
      }
      if (!m.exact) {
        const double dn = std::max<double>(static_cast<double>(n), 1);
        const double scale = op == "mean" ? 1 / dn : 1.0;
        if (X.lo >= 0 || X.hi <= 0) {  // one sign: relative
          m.ea = X.ea * dn * scale;
          m.er = X.er + 2 * kU * std::sqrt(dn) + (op == "mean" ? 2 * kU : 0);
        } else {
          m.ea = (X.abs_err() * dn + 2 * kU * std::sqrt(dn) * dn * M) * scale;
          m.er = 0;
        }
      }
    } else {  // prod
      const double bound = std::pow(std::max(M, 1.0), static_cast<double>(n));
      m.lo = -bound, m.hi = bound;
      if (X.lo >= 0) m.lo = 0;
      if (n > 8) return;
      m.gran = X.gran * static_cast<int>(n);
      if (!(X.exact && fits_exact(bound, m.gran))) {
        m.exact = false;
        m.ea = 0;
        m.er = static_cast<double>(n) * (X.rel_err() + kU);
        if (!(m.er < 1)) return;
      }
    }
    add_node(op, op, {X.name}, p, m);
  }

  void softmax_like() {
    const Val* x = operand([](const Val& v) { return (v.is_float() && !v.special) || v.is_int(); });
    if (!x) return;
    const Val X = *x;
    const auto rank = static_cast<int>(X.shape.size());
    if (rank == 0 && !scalar_dims_) return;
    const int dim = rank == 0 ? (chance(0.5) ? 0 : -1) : pick(-rank, rank - 1);
    const int64_t n = rank == 0 ? 1 : X.shape[static_cast<size_t>(dim < 0 ? dim + rank : dim)];
    if (X.is_int() || chance(0.25)) {
      // cumsum (ints wrap; floats: a running sum)
      Json p{{"dim", dim}};
      if (chance(0.3)) p["exclusive"] = true;
      if (chance(0.3)) p["reverse"] = true;
      Val m = X;
      const double dn = static_cast<double>(std::max<int64_t>(n, 1));
      m.lo = std::min(0.0, X.lo) * dn, m.hi = std::max(0.0, X.hi) * dn;
      if (X.is_float() && !(X.exact && fits_exact(m.mag(), X.gran))) {
        m.exact = false;
        if (X.lo >= 0 || X.hi <= 0) m.ea = X.ea * dn, m.er = X.er + 2 * kU * std::sqrt(dn);
        else m.ea = X.abs_err() * dn + 2 * kU * std::sqrt(dn) * dn * X.mag(), m.er = 0;
      }
      add_node("cumsum", "cumsum", {X.name}, p, m);
      return;
    }
    const bool log = chance(0.4);
    const double span = X.hi - X.lo, E = X.abs_err();
    if (span > 20) return;
    Val m = X;
    m.exact = false;
    const double dn = static_cast<double>(std::max<int64_t>(n, 1));
    if (!log) {
      m.lo = std::exp(-span) / dn, m.hi = 1;
      m.ea = 0;
      m.er = 2 * E + kU * span + 2 * kT + 2 * kU * std::sqrt(dn) + 6 * kU;
    } else {
      m.lo = -span - std::log(dn), m.hi = 0;
      m.ea = 2 * E + 2 * kU * span + kT + 2 * kU * std::sqrt(dn) + kU * std::log(dn);
      m.er = kU;
    }
    add_node(log ? "log_softmax" : "softmax", log ? "log_softmax" : "softmax", {X.name}, Json{{"dim", dim}}, m);
  }

  // ---- matmul

  void matmul() {
    const Val* a = operand([](const Val& v) { return v.is_float() && !v.special && !v.shape.empty() && v.shape.size() <= 3; });
    if (!a) return;
    const Val A = *a;
    const int64_t K = A.shape.back();
    Shape bs;
    const int how = pick(0, 3);
    const int64_t N = pick(1, 5);
    if (how == 0) bs = {K};
    else if (how == 1 || A.shape.size() < 3) bs = {K, N};
    else bs = {chance(0.5) ? 1 : A.shape[0], K, N};
    const Val B = (chance(0.3) && K == A.shape.back() && A.shape.size() == 1) ? A : new_input(A.dtype, bs);
    const double Ma = A.mag(), Mb = B.mag(), dk = static_cast<double>(std::max<int64_t>(K, 1));
    Val m = A;
    m.hi = dk * Ma * Mb, m.lo = -m.hi;
    m.gran = A.gran + B.gran;
    m.exact = A.exact && B.exact && fits_exact(m.hi, m.gran);
    if (!m.exact) {
      if (A.lo >= 0 && B.lo >= 0) {
        m.lo = 0;
        m.ea = dk * (A.ea * Mb + B.ea * Ma);
        m.er = A.er + B.er + 2 * kU * std::sqrt(dk) + kU;
      } else {
        m.ea = dk * (A.abs_err() * Mb + B.abs_err() * Ma) + 2 * kU * std::sqrt(dk) * dk * Ma * Mb;
        m.er = 0;
      }
    }
    add_node("matmul", "matmul", {A.name, B.name}, Json::object(), m);
  }

  // ---- concat

  void concat() {
    const Val* a = operand([](const Val& v) { return !v.shape.empty() && v.dtype != BP_DTYPE_I64; });
    if (!a) return;
    const Val A = *a;
    const auto rank = static_cast<int>(A.shape.size());
    const int d = pick(0, rank - 1);
    std::vector<Val> parts = {A};
    const int extra = pick(1, 2);
    for (int i = 0; i < extra; ++i) {
      std::vector<const Val*> c;
      for (const auto& v : vals_) {
        if (v.dtype != A.dtype || v.shape.size() != A.shape.size()) continue;
        bool ok = true;
        for (int k = 0; k < rank; ++k) ok = ok && (k == d || v.shape[static_cast<size_t>(k)] == A.shape[static_cast<size_t>(k)]);
        if (ok) c.push_back(&v);
      }
      if (!c.empty() && chance(0.5)) {
        parts.push_back(*c[static_cast<size_t>(pick(0, static_cast<int>(c.size()) - 1))]);
      } else {
        Shape s = A.shape;
        s[static_cast<size_t>(d)] = pick(0, 3);
        parts.push_back(new_input(A.dtype, s));
      }
    }
    Val m = A;
    std::vector<std::string> names;
    for (const auto& p : parts) {
      names.push_back(p.name);
      m.lo = std::min(m.lo, p.lo), m.hi = std::max(m.hi, p.hi);
      m.exact = m.exact && p.exact;
      m.gran = std::max(m.gran, p.gran);
      m.special = m.special || p.special;
      m.ea = std::max(m.ea, p.ea), m.er = std::max(m.er, p.er);
    }
    if (!m.exact && A.is_float()) {
      // Mixed parts: the worst of their absolute drifts.
      double ea = 0;
      for (const auto& p : parts) ea = std::max(ea, p.abs_err());
      bool rel = true;
      double er = 0;
      for (const auto& p : parts) rel = rel && p.rel_err() < INFINITY, er = std::max(er, p.rel_err());
      if (rel) m.ea = 0, m.er = er;
      else m.ea = ea, m.er = 0;
    }
    add_node("concat", "concat", names, Json{{"dim", chance(0.3) ? d - rank : d}}, m);
  }

  // ---- bundles: topk and var_mean, read through view/view_owned

  void topk_or_var_mean() {
    if (chance(0.6)) {
      const Val* x = operand([](const Val& v) { return (v.is_float() || v.is_int()) && !v.shape.empty(); });
      if (!x) return;
      const Val X = *x;
      const auto rank = static_cast<int>(X.shape.size());
      const int dim = pick(-rank, rank - 1);
      const int64_t n = X.shape[static_cast<size_t>(dim < 0 ? dim + rank : dim)];
      Json p{{"k", pick(0, static_cast<int>(n))}};
      if (chance(0.7)) p["dim"] = dim;
      else p["k"] = pick(0, static_cast<int>(X.shape.back()));
      if (chance(0.4)) p["largest"] = false;
      const Val* t = add_node("topk", "topk", {X.name}, p, X, true);
      if (!t) return;
      const std::string tn = t->name;
      const Val values = X;
      add_node("values", chance(0.7) ? "view" : "view_owned", {tn}, Json{{"slot", 0}}, values);
      if (X.exact || chance(0.0)) {
        Val idx;
        idx.dtype = BP_DTYPE_I64;
        idx.lo = 0, idx.hi = static_cast<double>(n);
        if (chance(0.6)) add_node("indices", chance(0.7) ? "view" : "view_owned", {tn}, Json{{"slot", 1}}, idx);
      }
      return;
    }
    const Val* x = operand([](const Val& v) { return v.is_float() && !v.special; });
    if (!x) return;
    const Val X = *x;
    const auto rank = static_cast<int>(X.shape.size());
    Json p = Json::object();
    const auto dims = random_dims(rank);
    if (!dims.empty()) p["dims"] = dims;
    const double corr = one_of(std::vector<double>{0.0, 1.0, 0.5});
    if (corr != 1.0) p["correction"] = corr;
    if (chance(0.3)) p["keepdim"] = true;
    const int64_t n = reduced_count(X, p.value("dims", Json()));
    const double M = X.mag(), E = X.abs_err(), dn = static_cast<double>(std::max<int64_t>(n, 1));
    if (M > 2) return;
    const Val* t = add_node("var_mean", "var_mean", {X.name}, p, X, true);
    if (!t) return;
    const std::string tn = t->name;
    const bool empty_divisor = static_cast<double>(n) - corr <= 0;
    Val var = X;
    var.exact = false;
    var.lo = 0, var.hi = M * M * dn / std::max(static_cast<double>(n) - corr, 0.5);
    var.special = empty_divisor;
    var.ea = 4 * M * (kU * M + E) * dn / std::max(static_cast<double>(n) - corr, 0.5);
    var.er = 2 * kU * std::sqrt(dn) + 4 * kU;
    Val mean = X;
    mean.exact = false;
    mean.special = n == 0;
    mean.ea = E + 2 * kU * M * std::sqrt(dn);
    mean.er = 0;
    if (chance(0.7)) add_node("var", chance(0.7) ? "view" : "view_owned", {tn}, Json{{"slot", 0}}, var);
    if (chance(0.7)) add_node("mean", chance(0.7) ? "view" : "view_owned", {tn}, Json{{"slot", 1}}, mean);
  }

  // ---- gather / index_select / layer_norm

  void index() {
    if (scalar_dims_ && chance(0.1)) {
      // gather on a rank-0 input: index rank 0, dim 0 or -1.
      const Val* s = operand([](const Val& v) { return v.shape.empty() && v.dtype != BP_DTYPE_I64; });
      if (s) {
        const Val S = *s;
        const Val& idx = index_input({}, 1);
        add_node("gather", "gather", {S.name, idx.name}, Json{{"dim", chance(0.5) ? 0 : -1}}, S);
        return;
      }
    }
    const Val* x = operand([](const Val& v) { return !v.shape.empty() && v.dtype != BP_DTYPE_I64; });
    if (!x) return;
    const Val X = *x;
    const auto rank = static_cast<int>(X.shape.size());
    if (X.is_float() && !X.special && chance(0.3)) {
      // layer_norm over the trailing dims.
      const int k = pick(1, rank);
      std::vector<int64_t> dims;
      for (int i = rank - k; i < rank; ++i) dims.push_back(chance(0.3) ? i - rank : i);
      std::shuffle(dims.begin(), dims.end(), rng_);
      const Shape ns(X.shape.end() - k, X.shape.end());
      const double eps = one_of(std::vector<double>{0.1, 1.0});
      std::vector<std::string> ins = {X.name};
      double Mw = 1, Mb = 0;
      if (chance(0.5)) {
        const Val& w = new_input(X.dtype, ns);
        ins.push_back(w.name), Mw = w.mag();
      } else if (chance(0.5)) {
        ins.push_back("");
      }
      if (chance(0.3)) {
        if (ins.size() == 1) ins.push_back("");
        const Val& b = new_input(X.dtype, ns);
        ins.push_back(b.name), Mb = b.mag();
      }
      int64_t n = 1;
      for (auto d : ns) n *= d;
      const double dn = static_cast<double>(std::max<int64_t>(n, 1)), M = X.mag(), E = X.abs_err();
      if (M > 2) return;
      Val m = X;
      m.exact = false;
      m.special = false;
      const double z = std::sqrt(dn);  // the largest |normalized value|
      m.hi = z * Mw + Mb, m.lo = -m.hi;
      const double norm_abs = (2 * E + 2 * kU * M) / std::sqrt(eps) * (1 + 2 * kU * dn);
      const double norm_rel = 2 * kU * std::sqrt(dn) + kT + 4 * kU;
      m.ea = Mw * norm_abs + (Mb > 0 ? kU * m.hi + norm_rel * z * Mw : 0);
      m.er = Mb > 0 ? 0 : norm_rel + kU;
      Json inputs = Json::array();
      for (const auto& s : ins) inputs.push_back(s.empty() ? Json(nullptr) : Json(s));
      std::vector<std::string> names(ins.begin(), ins.end());
      add_node_nullable("layer_norm", names, Json{{"dims", dims}, {"eps", eps}}, m);
      return;
    }
    const int d = pick(0, rank - 1);
    const int64_t n = X.shape[static_cast<size_t>(d)];
    if (n == 0) return;
    if (chance(0.5)) {
      Shape is;
      const int irank = pick(0, 2);
      for (int i = 0; i < irank; ++i) is.push_back(pick(0, 4));
      const Val& idx = index_input(is, n);
      add_node("index_select", "index_select", {X.name, idx.name}, Json{{"dim", chance(0.3) ? d - rank : d}}, X);
    } else {
      Shape is = X.shape;
      for (int i = 0; i < rank; ++i)
        is[static_cast<size_t>(i)] = i == d ? pick(0, 5) : pick(0, static_cast<int>(X.shape[static_cast<size_t>(i)]));
      const Val& idx = index_input(is, n);
      add_node("gather", "gather", {X.name, idx.name}, Json{{"dim", chance(0.3) ? d - rank : d}}, X);
    }
  }

  // A node whose inputs may include "" (null).
  void add_node_nullable(const std::string& op, const std::vector<std::string>& ins, const Json& params, const Val& m) {
    // add_node takes names; an absent optional input is "" in Graph::node and
    // null in the graph file.
    const Val* v = add_node(op, op, ins, params, m);
    if (!v) return;
    Json& node = nodes_.back();
    Json inputs = Json::array();
    for (const auto& s : ins) inputs.push_back(s.empty() ? Json(nullptr) : Json(s));
    node["inputs"] = inputs;
  }

  // ---- casts and affine

  void cast_or_affine() {
    const Val* x = operand([](const Val& v) { return !v.special; });
    if (!x) return;
    const Val X = *x;
    if (X.is_float() && chance(0.5)) {
      const double mul = chance(0.7) ? std::ldexp(pick(-8, 8), -pick(0, 2)) : one_of(std::vector<double>{0.1, -0.3, 1.7});
      const double add = chance(0.7) ? std::ldexp(pick(-8, 8), -2) : one_of(std::vector<double>{0.05, -0.7});
      Json p = Json::object();
      if (mul != 1.0 || chance(0.5)) p["mul"] = mul;
      if (add != 0.0 || chance(0.5)) p["add"] = add;
      const double mul_v = p.value("mul", 1.0), add_v = p.value("add", 0.0);
      Val m = X;
      const double a = X.lo * mul_v + add_v, b = X.hi * mul_v + add_v;
      m.lo = std::min(a, b), m.hi = std::max(a, b);
      const bool dyadic = std::ldexp(mul_v, 2) == std::floor(std::ldexp(mul_v, 2)) &&
                          std::ldexp(add_v, 2) == std::floor(std::ldexp(add_v, 2));
      m.gran = X.gran + 2;
      if (!(X.exact && dyadic && fits_exact(std::max(m.mag(), X.mag() * std::fabs(mul_v)), m.gran))) {
        m.exact = false;
        // mul·x (+ add): the product's drift, then a sum that may cancel.
        const double prod_abs = X.abs_err() * std::fabs(mul_v) + kU * X.mag() * std::fabs(mul_v);
        if (add_v == 0 || (m.lo > 0 && X.lo * mul_v >= 0) || (m.hi < 0 && X.hi * mul_v <= 0)) {
          m.ea = X.ea * std::fabs(mul_v);
          m.er = X.er + 2 * kU;
        } else {
          m.ea = prod_abs + kU * std::max(m.mag(), std::fabs(add_v));
          m.er = 0;
        }
      }
      add_node("affine", "affine", {X.name}, p, m);
      return;
    }
    // cast: every pair of dtypes whose result is the same on every device:
    // exact values only; int->int wraps; float->int in range; to a float
    // only what it holds exactly.
    if (!X.exact) return;
    static const std::vector<bp_dtype> all = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64, BP_DTYPE_I8,
                                              BP_DTYPE_I16,  BP_DTYPE_I32, BP_DTYPE_I64,  BP_DTYPE_U8,  BP_DTYPE_BOOL};
    const bp_dtype to = one_of(all);
    Val m = X;
    m.dtype = to;
    m.special = false, m.ea = m.er = 0;
    if (to == BP_DTYPE_BOOL) {
      m.lo = 0, m.hi = 1, m.gran = 0;
    } else if (X.dtype == BP_DTYPE_BOOL) {
      m.lo = 0, m.hi = 1, m.gran = 0;
    } else if (m.is_int()) {
      if (X.is_float()) {
        // NaN, infinities and values out of range are an error for the run.
        if (std::trunc(X.lo) < int_min(to) || std::trunc(X.hi) > int_max(to)) return;
        m.lo = std::trunc(X.lo), m.hi = std::trunc(X.hi);
      }
      m.gran = 0;  // int->int: add_node widens the bounds if it may wrap
    } else {
      // To a float: exactly representable only.
      if (!fits_exact(X.mag(), X.is_int() ? 0 : X.gran, float_bits(to)) || X.mag() > float_max(to)) return;
      if (X.is_int()) m.gran = 0;
    }
    m.exact = true;
    add_node("cast", "cast", {X.name}, Json{{"dtype", std::string(dtype_name(to))}}, m);
  }

  std::mt19937_64 rng_;
  int max_nodes_;
  bool scalar_dims_;
  bool vendor_ops_;
  int counter_ = 0;
  Json inputs_ = Json::object();
  Json nodes_ = Json::array();
  std::vector<Val> vals_;
  std::map<std::string, Val> bundles_;
  Case case_;
};

// ---- running and comparing -----------------------------------------------------------

struct Outcome {
  std::map<std::string, HostTensor> outputs;
  std::string error;  // compile or run error ("" when it ran)
  bool compile_failed = false;
  bool escaped = false;  // an exception other than backplane::Error
};

Graph build_graph(const Json& graph, const std::set<std::string>& fed, std::map<std::string, HostTensor>& feeds) {
  GraphFile gf = parse_graph_json(graph, ".");
  Graph g;
  for (const auto& in : gf.graph.inputs()) {
    if (fed.count(in.name)) {
      g.input(in.name, in.dtype, in.shape);
      feeds[in.name] = *in.constant;
    } else {
      g.constant(in.name, *in.constant);
    }
  }
  for (const auto& n : gf.graph.nodes()) g.node(n.name, n.op, n.inputs, n.params, n.device);
  for (const auto& o : gf.graph.outputs()) g.output(o);
  return g;
}

Outcome run_on(Runtime& rt, const Json& graph, const std::set<std::string>& fed, const std::vector<Device*>& devices,
               std::string* determinism) {
  Outcome o;
  std::map<std::string, HostTensor> feeds;
  std::optional<Plan> plan;
  try {
    Graph g = build_graph(graph, fed, feeds);
    plan.emplace(rt.compile(g, devices));
  } catch (const Error& e) {
    o.error = e.what();
    o.compile_failed = true;
    return o;
  } catch (const std::exception& e) {  // every error must be a backplane::Error
    o.error = std::string("compile threw a non-backplane exception: ") + e.what();
    o.escaped = true;
    return o;
  }
  try {
    o.outputs = plan->run(feeds);
  } catch (const Error& e) {
    o.error = e.what();
    return o;
  } catch (const std::exception& e) {
    o.error = std::string("run threw a non-backplane exception: ") + e.what();
    o.escaped = true;
    return o;
  }
  // The same plan again: the same bits.
  try {
    auto again = plan->run(feeds);
    for (const auto& [name, t] : o.outputs)
      if (again.at(name).bytes != t.bytes) {
        *determinism = "output '" + name + "' differs between two runs of the same plan";
        break;
      }
  } catch (const Error& e) {
    *determinism = std::string("the second run failed: ") + e.what();
  }
  return o;
}

// A graph file as text: one input, node or output list per line.
std::string graph_text(const Json& g) {
  std::string s = "{\n  \"inputs\": {";
  bool first = true;
  for (const auto& [name, spec] : g["inputs"].items()) {
    s += std::string(first ? "" : ",") + "\n    " + Json(name).dump() + ": " + spec.dump();
    first = false;
  }
  s += "\n  },\n  \"nodes\": [";
  first = true;
  for (const auto& n : g["nodes"]) {
    s += std::string(first ? "" : ",") + "\n    " + n.dump();
    first = false;
  }
  return s + "\n  ],\n  \"outputs\": " + g["outputs"].dump() + "\n}";
}

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

// docs/ops.md's comparison for f32 (relative 1e-4 or absolute 1e-6), exact
// for the rest. Returns "" or the first difference.
std::string compare(const HostTensor& ref, const HostTensor& got) {
  if (ref.dtype != got.dtype || ref.shape != got.shape)
    return "type " + std::string(dtype_name(got.dtype)) + shape_text(got.shape) + ", the CPU gives " +
           std::string(dtype_name(ref.dtype)) + shape_text(ref.shape);
  const int64_t n = ref.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (ref.dtype == BP_DTYPE_F32 || ref.dtype == BP_DTYPE_F64 || ref.dtype == BP_DTYPE_F16 || ref.dtype == BP_DTYPE_BF16) {
      // f16, bf16 and f64 values are exact here (see within_tolerance).
      const double a = ref.get(i), b = got.get(i);
      const double tol = ref.dtype == BP_DTYPE_F32 ? std::max(1e-6, 1e-4 * std::fabs(a)) : 0.0;
      bool ok;
      if (std::isnan(a) || std::isnan(b)) ok = std::isnan(a) && std::isnan(b);
      else if (std::isinf(a) || std::isinf(b)) ok = a == b;
      else ok = std::fabs(a - b) <= tol;
      if (!ok) return "element " + std::to_string(i) + ": " + num(b) + ", the CPU gives " + num(a);
    } else if (ref.get_int(i) != got.get_int(i)) {
      return "element " + std::to_string(i) + ": " + std::to_string(got.get_int(i)) + ", the CPU gives " +
             std::to_string(ref.get_int(i));
    }
  }
  return "";
}

struct Options {
  uint64_t seed = 1;
  int count = 200;
  int start = 0;
  int max_nodes = 12;
  std::string partial_dir;
  std::string save_dir;
  bool verbose = false;
  bool scalar_dims = true;
  std::vector<std::string> graph_files;  // --graph: these instead of generated graphs
};

// The graph with pins on some nodes: "cpu" on any; `other` (the device
// besides the CPU) on those `other_runs` says it has a kernel for.
template <typename F>
Json with_pins(const Json& graph, std::mt19937_64& rng, const std::string& other, F other_runs) {
  Json g = graph;
  std::uniform_real_distribution<double> u(0, 1);
  // Views have no device of their own (the core refuses a pin on one).
  static const std::set<std::string> views = {"view", "reshape", "permute", "transpose", "broadcast_to",
                                              "slice", "squeeze", "unsqueeze"};
  for (auto& n : g["nodes"]) {
    const double r = u(rng);
    if (views.count(n["op"].get<std::string>())) continue;
    if (r < 0.25) n["device"] = "cpu";
    else if (r < 0.5 && other_runs(n)) n["device"] = other;
  }
  return g;
}

int usage() {
  std::cerr << "usage: diff_fuzz [--seed N] [--count M] [--start K] [--max-nodes K] [--partial-dir DIR] [--save DIR] "
               "[--no-scalar-dims] [--verbose]\n       diff_fuzz [--partial-dir DIR] --graph FILE [--graph FILE]...\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) std::exit(usage());
      return argv[++i];
    };
    if (a == "--seed") opt.seed = std::stoull(next());
    else if (a == "--count") opt.count = std::stoi(next());
    else if (a == "--start") opt.start = std::stoi(next());
    else if (a == "--max-nodes") opt.max_nodes = std::max(1, std::stoi(next()));
    else if (a == "--partial-dir") opt.partial_dir = next();
    else if (a == "--save") opt.save_dir = next();
    else if (a == "--verbose" || a == "-v") opt.verbose = true;
    else if (a == "--no-scalar-dims") opt.scalar_dims = false;
    else if (a == "--graph") opt.graph_files.push_back(next());
    else return usage();
  }

  RuntimeOptions ro;
  ro.use_environment = false;
  if (!opt.partial_dir.empty()) ro.plugin_paths.emplace_back(opt.partial_dir);
  auto rt = Runtime::create(ro);
  std::vector<Device*> cpu, vulkan, vulkan_list, partial_list;
  try {
    cpu = rt->select_devices("cpu");
  } catch (const Error& e) {
    std::cerr << "diff_fuzz: no CPU plugin: " << e.what() << "\n";
    return 1;
  }
  try {
    vulkan = rt->select_devices("vulkan0");
    vulkan_list = rt->select_devices("vulkan0,cpu");
  } catch (const Error& e) {
    std::printf("diff_fuzz: no vulkan0 (%s): CPU against the device lists only\n", e.what());
    vulkan.clear();
  }
  if (!opt.partial_dir.empty()) partial_list = rt->select_devices("partial0,cpu");

  int failures = 0, generator_rejections = 0, vulkan_skipped = 0, compared = 0;
  size_t nodes = 0;
  std::map<std::string, int> op_counts;
  // `label`: "graph 12 (--seed 1 --start 12 --count 1)" or a file name;
  // `stem`: the file name --save writes.
  std::string label, stem;
  auto report = [&](const std::string& config, const std::string& what, const Json& graph,
                    const std::set<std::string>& fed) {
    ++failures;
    std::printf("\nMISMATCH %s on %s: %s\n", label.c_str(), config.c_str(), what.c_str());
    std::string fed_list;
    for (const auto& f : fed) fed_list += (fed_list.empty() ? "" : ", ") + f;
    if (!fed_list.empty()) std::printf("(inputs fed at run time, inline below: %s)\n", fed_list.c_str());
    std::printf("replay: backplane run graph.json --device %s\n%s\n", config.c_str(), graph_text(graph).c_str());
    if (!opt.save_dir.empty()) {
      std::filesystem::create_directories(opt.save_dir);
      const auto path = std::filesystem::path(opt.save_dir) / (stem + ".json");
      std::ofstream(path) << graph_text(graph) << "\n";
      std::printf("saved: %s\n", path.c_str());
    }
  };

  // One graph: on the CPU, then on the other devices. A graph file (`from_file`)
  // keeps its own pins for the device lists and gets none added.
  auto run_case = [&](const Case& c, uint64_t graph_seed, bool from_file) {
    std::mt19937_64 pin_rng(graph_seed ^ 0x9e3779b97f4a7c15ULL);
    Json unpinned = c.graph;
    for (auto& n : unpinned["nodes"]) n.erase("device");
    std::string det;
    const Outcome ref = run_on(*rt, unpinned, c.fed, cpu, &det);
    if (!ref.error.empty()) {
      report("cpu", (ref.escaped ? "" : "the CPU refused a valid graph: ") + ref.error, unpinned, c.fed);
      return;
    }
    if (!det.empty()) report("cpu", det, unpinned, c.fed);
    auto check = [&](const std::string& config, const Json& graph, const std::vector<Device*>& devices,
                     bool may_lack_kernels) -> bool {
      std::string d;
      const Outcome o = run_on(*rt, graph, c.fed, devices, &d);
      if (o.compile_failed && may_lack_kernels && !o.escaped) return false;
      ++compared;
      if (!o.error.empty()) {
        report(config, (o.compile_failed ? "compile failed: " : "run failed: ") + o.error, graph, c.fed);
        return true;
      }
      if (!d.empty()) report(config, d, graph, c.fed);
      std::string diffs;  // every output that differs, one line each
      for (const auto& [name, t] : ref.outputs) {
        auto it = o.outputs.find(name);
        const std::string diff = it == o.outputs.end() ? "missing" : compare(t, it->second);
        if (diff.empty()) continue;
        const auto op = c.node_ops.find(name);
        diffs += std::string(diffs.empty() ? "" : "\n  ") + "output '" + name + "'" +
                 (op == c.node_ops.end() ? "" : " (" + op->second + ")") + ": " + diff;
      }
      if (!diffs.empty()) report(config, diffs, graph, c.fed);
      return true;
    };
    if (from_file) {
      if (!vulkan.empty()) {
        if (!check("vulkan0", unpinned, vulkan, true)) ++vulkan_skipped;
        check("vulkan0,cpu", c.graph, vulkan_list, false);
      }
      if (!partial_list.empty()) check("partial0,cpu", c.graph, partial_list, false);
      return;
    }
    if (!vulkan.empty()) {
      const bool alone = check("vulkan0", c.graph, vulkan, true);
      if (!alone) ++vulkan_skipped;
      check("vulkan0,cpu", with_pins(c.graph, pin_rng, "vulkan0", [&](const Json&) { return alone; }), vulkan_list,
            false);
    }
    if (!partial_list.empty()) {
      // The test plugin's f32 ops (tests/fixtures/partial.json.in).
      auto partial_runs = [&](const Json& n) {
        static const std::set<std::string> ops = {"add", "mul", "relu", "exp", "contiguous", "partial.scale_shift",
                                                  "partial.minmax", "partial.norm_rows"};
        const std::string name = n["name"];
        const std::string op = n["op"];
        return ops.count(op) && (c.node_dtypes.at(name) == BP_DTYPE_F32 || op == "partial.minmax") &&
               std::all_of(n["inputs"].begin(), n["inputs"].end(), [&](const Json& i) {
                 const std::string in = i.get<std::string>();
                 auto it = c.node_dtypes.find(in);
                 return it != c.node_dtypes.end() ? it->second == BP_DTYPE_F32
                                                  : c.graph["inputs"][in]["dtype"] == "f32";
               });
      };
      check("partial0,cpu", with_pins(c.graph, pin_rng, "partial0", partial_runs), partial_list, false);
    }
  };

  if (!opt.graph_files.empty()) {
    for (const auto& file : opt.graph_files) {
      label = file;
      stem = std::filesystem::path(file).stem().string();
      Case c;
      try {
        std::ifstream in(file);
        c.graph = Json::parse(in);
        for (const auto& n : c.graph.at("nodes")) c.node_ops[n.at("name").get<std::string>()] = n.at("op").get<std::string>();
      } catch (const std::exception& e) {
        std::printf("diff_fuzz: %s: %s\n", file.c_str(), e.what());
        ++failures;
        continue;
      }
      run_case(c, 0, true);
    }
    std::printf("diff_fuzz: %zu graph files: %d comparisons, %d failures\n", opt.graph_files.size(), compared, failures);
    return failures ? 1 : 0;
  }

  for (int index = opt.start; index < opt.start + opt.count; ++index) {
    const uint64_t graph_seed = opt.seed * 1000003ULL + static_cast<uint64_t>(index);
    Generator gen(graph_seed, opt.max_nodes, opt.scalar_dims, !partial_list.empty());
    const Case c = gen.make();
    generator_rejections += c.rejected;
    nodes += c.node_names.size();
    for (const auto& [name, op] : c.node_ops) ++op_counts[op];
    if (opt.verbose) {
      std::printf("graph %d: %zu nodes, %d proposals refused\n", index, c.node_names.size(), c.rejected);
      for (const auto& r : c.rejections) std::printf("  refused: %s\n", r.c_str());
    }
    label = "graph " + std::to_string(index) + " (--seed " + std::to_string(opt.seed) + " --start " +
            std::to_string(index) + " --count 1)";
    stem = "seed" + std::to_string(opt.seed) + "-graph" + std::to_string(index);
    run_case(c, graph_seed, false);
  }
  if (opt.verbose) {
    std::printf("ops generated:");
    for (const auto& [op, n] : op_counts) std::printf(" %s %d", op.c_str(), n);
    std::printf("\n");
  }
  std::printf("diff_fuzz: seed %llu, graphs %d..%d (%zu nodes): %d comparisons, %d failures; vulkan0 alone lacked a "
              "kernel for %d graphs; the core refused %d generated nodes\n",
              static_cast<unsigned long long>(opt.seed), opt.start, opt.start + opt.count - 1, nodes, compared, failures,
              vulkan_skipped, generator_rejections);
  return failures ? 1 : 0;
}
