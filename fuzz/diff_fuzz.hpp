// diff_fuzz (fuzz/diff_fuzz.cpp says what it does): the value metadata that
// keeps generated graphs within tolerance, and the graph generator, shared by
// diff_fuzz.cpp, diff_fuzz_generator.cpp, diff_fuzz_elementwise.cpp and
// diff_fuzz_structure.cpp.
#pragma once

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


namespace diff_fuzz {

using namespace backplane;

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
inline int float_bits(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F64: return 53;
    case BP_DTYPE_F16: return 11;
    case BP_DTYPE_BF16: return 8;
    default: return 24;
  }
}
inline double float_max(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F64: return 1.7e308;
    case BP_DTYPE_F16: return 65504;
    default: return 3.3e38;
  }
}
// An integer dtype's range.
inline double int_min(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_I8: return -128;
    case BP_DTYPE_I16: return -32768;
    case BP_DTYPE_I64: return -9223372036854775808.0;
    case BP_DTYPE_U8: return 0;
    default: return -2147483648.0;
  }
}
inline double int_max(bp_dtype d) {
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
inline bool fits_exact(double mag, int gran, int bits = 24) { return gran <= 60 && mag * std::ldexp(1.0, gran) < std::ldexp(1.0, bits); }

// Whether two correct devices' results for v are certain to pass the
// comparison (|a - b| <= max(1e-6, 1e-4 |ref|)), with a factor 2 to spare.
inline bool within_tolerance(const Val& v) {
  if (!v.is_float()) return true;
  if (!(v.mag() <= kMaxMag)) return false;
  // f16, bf16 and f64 only carry exact values here: computed in f32 (f64)
  // and rounded when stored, they then give the same bits on every device.
  if (v.dtype != BP_DTYPE_F32) return v.exact && !v.special && fits_exact(v.mag(), v.gran, float_bits(v.dtype));
  if (v.exact) return fits_exact(v.mag(), v.gran);
  if (v.ea <= 0.5e-6 && v.er <= 0.5e-4) return true;
  return v.rel_err() <= 0.5e-4;
}

inline std::string shape_text(const Shape& s) { return shape_str(s); }

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

  Case make();

 private:
  // ---- randomness
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <typename T> const T& one_of(const std::vector<T>& v) { return v[static_cast<size_t>(pick(0, static_cast<int>(v.size()) - 1))]; }

  Shape random_shape();

  std::string fresh(const std::string& stem) { return stem + std::to_string(counter_++); }

  const Val* find(const std::string& name) const;

  // ---- inputs

  // A new graph input of `dtype` and `shape`: f32 values either small dyadic
  // numbers (exact arithmetic) or arbitrary floats in a range; `positive`
  // keeps them in [0.5, 2].
  Val& new_input(bp_dtype dtype, const Shape& shape, bool positive = false);

  // An i64 index input with values in [-n, n-1] (n > 0) or empty.
  Val& index_input(const Shape& shape, int64_t n);

  // An inline constant; an empty one as a fill ({"value": 0, "shape": ...}):
  // nested lists cannot say [0, 3].
  static Json inline_spec(const std::vector<double>& data, const Shape& shape, const std::string& dtype);

  static Json nest(const std::vector<double>& data, const Shape& shape, size_t dim, size_t offset);

  // ---- nodes

  // Checks a proposed node with the core's own inference (on the graph so
  // far) and adds it with the metadata `meta` (name, dtype and shape are
  // filled in here). Returns the new value, or nullptr when refused.
  const Val* add_node(const std::string& stem, const std::string& op, const std::vector<std::string>& inputs, const Json& params, Val meta, bool bundle = false);

  // infer_graph has no shapes for vendor ops: it checks the partial
  // plugin's ones (tests/fixtures/partial.json.in) as standard ops of the
  // same shapes.
  static std::pair<std::string, Json> standard_twin(const std::string& op, const Json& params);

  // The partial plugin's vendor ops: its kernel on partial0, its manifest's
  // decomposition elsewhere (the CPU reference among them).
  void vendor();

  // An operand: the newest value half the time (chains), else any.
  const Val* operand(bool (*ok)(const Val&));

  static bool broadcastable(const Shape& a, const Shape& b);

  // A shape that broadcasts against s: s itself, a suffix of it, some dims set
  // to 1, a scalar, or with a new leading dim.
  Shape partner_shape(const Shape& s);

  // A partner for a binary op: an existing value of the same dtype whose
  // shape broadcasts (40%), else a new input.
  const Val* partner(const Val& a, bool positive = false);

  void step();

  // ---- unary ops

  void unary();

  // ---- binary elementwise

  void binary();

  // ---- compares and where

  void compare_where();

  // ---- views

  void view();

  Json reshape_target(const Val& x);

  // ---- reductions

  // Random reduction dims of `rank` (possibly all), as a list of positions.
  std::vector<int64_t> random_dims(int rank);

  int64_t reduced_count(const Val& x, const Json& dims) const;

  void reduce();

  void softmax_like();

  // ---- matmul

  void matmul();
  // Attention as exporters write it (transposed k, matmul, affine scale, an
  // optional mask, softmax over the keys, matmul by v): the optimizer fuses it
  // into scaled_dot_product_attention where the device has the op, and pins
  // leave it composed, so fused and composed meet in the comparison.
  void attention();

  // ---- concat

  void concat();

  // ---- bundles: topk and var_mean, read through view/view_owned

  void topk_or_var_mean();

  // ---- gather / index_select / layer_norm

  void index();

  // A node whose inputs may include "" (null).
  void add_node_nullable(const std::string& op, const std::vector<std::string>& ins, const Json& params, const Val& m);

  // ---- casts and affine

  void cast_or_affine();

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

}  // namespace diff_fuzz
