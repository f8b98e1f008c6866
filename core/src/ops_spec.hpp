// The standard op vocabulary (docs/ops.md) as one table: per op, its inputs
// (names, dtypes, ranks, optional ones), its params (kind, default or
// required, range or values), its outputs and bundle slots. One reader checks
// a node against its op's entry and hands the op's inference function typed
// values; the same table prints the op reference (`backplane ops`).
//
// Files: ops_spec.hpp (the table's records and the argument reader),
// ops_infer.cpp (shape inference per op family), ops_table.cpp (the table
// and the core's entry points), ops_reference.cpp (the op reference it
// prints).
#pragma once

#include "ops.hpp"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>
#include "checked.hpp"

namespace backplane::detail::spec {


// ---- dtype sets --------------------------------------------------------------

inline constexpr unsigned bit(bp_dtype d) { return 1u << static_cast<unsigned>(d); }
constexpr unsigned kFloat = bit(BP_DTYPE_F32) | bit(BP_DTYPE_F16) | bit(BP_DTYPE_BF16) | bit(BP_DTYPE_F64);
constexpr unsigned kInt =
    bit(BP_DTYPE_I8) | bit(BP_DTYPE_I16) | bit(BP_DTYPE_I32) | bit(BP_DTYPE_I64) | bit(BP_DTYPE_U8);
constexpr unsigned kBool = bit(BP_DTYPE_BOOL);
constexpr unsigned kI64 = bit(BP_DTYPE_I64);
constexpr unsigned kFloatInt = kFloat | kInt;
constexpr unsigned kAll = kFloatInt | kBool;

inline bool in_set(bp_dtype d, unsigned set) {
  return d > BP_DTYPE_INVALID && d < BP_DTYPE_COUNT_ && (set & bit(d));
}

// "float", "float, int", "all", or the one dtype of a single-dtype set.
inline std::string set_name(unsigned set) {
  switch (set) {
    case kFloat:
      return "float";
    case kFloatInt:
      return "float, int";
    case kAll:
      return "all";
    case kInt:
      return "int";
    default:
      break;
  }
  std::string s;
  for (int d = 1; d < BP_DTYPE_COUNT_; ++d)
    if (set & bit(static_cast<bp_dtype>(d)))
      s += (s.empty() ? "" : ", ") + std::string(dtype_name(static_cast<bp_dtype>(d)));
  return s;
}
// For "this op takes ...": "float dtypes", "float and int dtypes", "every dtype".
inline std::string set_phrase(unsigned set) {
  switch (set) {
    case kFloat:
      return "float dtypes";
    case kFloatInt:
      return "float and int dtypes";
    case kAll:
      return "every dtype";
    default:
      return set_name(set);
  }
}
inline bool single_dtype(unsigned set) { return set && (set & (set - 1)) == 0; }

// ---- the table's records -------------------------------------------------------

enum class Kind {
  Int,      // an integer
  Ints,     // a list of integers (an integer alone is a list of one)
  Bool,     // true or false
  Number,   // any JSON number
  Enum,     // one of a few strings
  DType,    // a dtype name
  Dim,      // a dim of input 0 (negative counts from the end), normalised
  Dims,     // a list of dims of input 0, normalised, no repeats, in the order given
  Pair,     // an int or [h, w]
  Padding,  // an int, [h, w] or [top, left, bottom, right]
  Program,  // fused_elementwise's instruction list, read by its inference
};

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Int:
      return "int";
    case Kind::Ints:
      return "int list";
    case Kind::Bool:
      return "bool";
    case Kind::Number:
      return "number";
    case Kind::Enum:
      return "string";
    case Kind::DType:
      return "dtype";
    case Kind::Dim:
      return "dim";
    case Kind::Dims:
      return "dims";
    case Kind::Pair:
      return "int or [h, w]";
    case Kind::Padding:
      return "int, [h, w] or [top, left, bottom, right]";
    case Kind::Program:
      return "program: [[op, register, ...], ...]";
  }
  return "?";
}

struct ParamSpec {
  std::string name;
  Kind kind = Kind::Int;
  bool required = true;
  Json dflt;                               // the default when left out (null: none)
  std::string absent;                      // what leaving it out means when there is no default value
  int64_t lo = INT64_MIN, hi = INT64_MAX;  // every integer of Int, Ints, Pair, Padding
  bool nonzero = false;
  std::vector<std::string> values;  // Enum
  int rank_extra = 0;               // Dim: counts against input 0's rank + this (unsqueeze: 1)
  bool scalar_dim = false;          // Dim: a rank-0 input takes dim 0 or -1
  std::string if_empty;             // Dims: the error for [] ("" = [] is allowed)
  std::string doc;

  ParamSpec def(Json v) && {
    required = false;
    dflt = std::move(v);
    return std::move(*this);
  }
  ParamSpec optional(std::string meaning) && {
    required = false;
    absent = std::move(meaning);
    return std::move(*this);
  }
  ParamSpec range(int64_t l, int64_t h = INT64_MAX) && {
    lo = l;
    hi = h;
    return std::move(*this);
  }
  ParamSpec not_zero() && {
    nonzero = true;
    return std::move(*this);
  }
  ParamSpec one_of(std::vector<std::string> v) && {
    values = std::move(v);
    return std::move(*this);
  }
  ParamSpec of_output() && {
    rank_extra = 1;
    return std::move(*this);
  }
  ParamSpec scalar_ok() && {
    scalar_dim = true;
    return std::move(*this);
  }
  ParamSpec empty_error(std::string msg) && {
    if_empty = std::move(msg);
    return std::move(*this);
  }
  ParamSpec says(std::string d) && {
    doc = std::move(d);
    return std::move(*this);
  }
};
inline ParamSpec param(std::string name, Kind kind) {
  ParamSpec p;
  p.name = std::move(name);
  p.kind = kind;
  return p;
}

struct InputSpec {
  std::string name;
  unsigned dtypes = kAll;
  int like = -1;          // >= 0: same dtype as that input (dtypes then unused)
  bool optional = false;  // may be null or left out (trailing)
  bool variadic = false;  // repeats one or more times (concat)
  bool each_own = false;  // variadic: each repeat is checked against `dtypes` on its own
  bool bundle = false;    // must be a multi-output bundle (view, view_owned)
  int rank = -1;          // exact rank, or -1
  int min_rank = 0;
  std::string shape;  // for messages and the reference: "[N, C, H, W]"

  InputSpec same_as(int i) && {
    like = i;
    return std::move(*this);
  }
  InputSpec opt() && {
    optional = true;
    return std::move(*this);
  }
  InputSpec repeats() && {
    variadic = true;
    return std::move(*this);
  }
  InputSpec repeats_mixed() && {
    variadic = true;
    each_own = true;
    return std::move(*this);
  }
  InputSpec of_rank(int r, std::string s) && {
    rank = r;
    min_rank = r;
    shape = std::move(s);
    return std::move(*this);
  }
  InputSpec at_least_rank(int r) && {
    min_rank = r;
    return std::move(*this);
  }
  InputSpec bundled() && {
    bundle = true;
    return std::move(*this);
  }
  InputSpec shaped(std::string s) && {
    shape = std::move(s);
    return std::move(*this);
  }
};
inline InputSpec input(std::string name, unsigned dtypes = kAll) {
  InputSpec s;
  s.name = std::move(name);
  s.dtypes = dtypes;
  return s;
}
inline InputSpec like(std::string name, int i) { return input(std::move(name)).same_as(i); }

enum class OutDtype { Like, Bool, I64, CastParam, Slot };
struct OutputSpec {
  std::string name;
  OutDtype dtype = OutDtype::Like;
  int like = 0;  // Like: the input whose dtype the output has
  std::string shape;
};

class Args;
using InferFn = void (*)(const Args&, InferredNode&);
struct OpSpec;
const std::vector<OpSpec>& table();

struct OpSpec {
  std::string name;
  std::string family;
  std::string summary;
  std::vector<InputSpec> inputs;
  std::vector<ParamSpec> params;
  std::vector<OutputSpec> outputs;  // one: a plain output; more: the slots of a bundle
  OpClass cls = OpClass::Kernel;
  Canon canon = Canon::None;
  bp_params_kind params_kind = BP_PARAMS_NONE;
  InferFn infer = nullptr;

  size_t required_inputs() const {
    size_t n = 0;
    for (const auto& i : inputs) n += !i.optional;
    return n;
  }
  bool variadic() const { return !inputs.empty() && inputs.back().variadic; }
};

// ---- the reader ------------------------------------------------------------------

struct Value {
  bool given = false;  // given in the node, or by its default
  int64_t i = 0;
  double f = 0;
  bool integral = false;  // Number: the JSON value is an integer that fits int64_t
  bool b = false;
  std::string s;
  bp_dtype dtype = BP_DTYPE_INVALID;
  std::vector<int64_t> ints;
};

// A node's inputs and params, checked against its op's entry.
class Args {
 public:
  Args(const Node& node, const OpSpec& op, const std::vector<const ValueType*>& in)
      : node_(node), op_(op), in_(in) {}

  const Node& node() const { return node_; }
  const OpSpec& op() const { return op_; }
  size_t n_inputs() const { return in_.size(); }
  std::string where() const { return "node '" + node_.name + "' (" + node_.op + ")"; }
  [[noreturn]] void fail(const std::string& msg) const { throw Error(where() + ": " + msg); }

  // "input 1 (b)"; variadic inputs are "input 3 (x3)".
  std::string label(size_t i) const {
    const InputSpec& s = spec_of(i);
    const std::string name = s.variadic ? s.name + std::to_string(i - (op_.inputs.size() - 1)) : s.name;
    return "input " + std::to_string(i) + " (" + name + ")";
  }
  const ValueType& x(size_t i) const {
    if (i >= in_.size() || in_[i] == nullptr) fail(label(i) + " is missing");
    return *in_[i];
  }
  const ValueType* opt(size_t i) const { return i < in_.size() ? in_[i] : nullptr; }

  bool given(const char* name) const { return value(name).given; }
  int64_t i(const char* name) const { return value(name).i; }
  double f(const char* name) const { return value(name).f; }
  bool integral(const char* name) const { return value(name).integral; }
  bool b(const char* name) const { return value(name).b; }
  const std::string& s(const char* name) const { return value(name).s; }
  bp_dtype dtype(const char* name) const { return value(name).dtype; }
  const std::vector<int64_t>& ints(const char* name) const { return value(name).ints; }

  void read() {
    check_arity();
    check_param_names();
    check_inputs();
    values_.resize(op_.params.size());
    for (size_t k = 0; k < op_.params.size(); ++k) values_[k] = read_param(op_.params[k]);
  }

 private:
  const InputSpec& spec_of(size_t i) const { return op_.inputs[std::min(i, op_.inputs.size() - 1)]; }

  const Value& value(const char* name) const {
    for (size_t k = 0; k < op_.params.size(); ++k)
      if (op_.params[k].name == name) return values_.at(k);
    throw Error(where() + ": internal: the op table has no param '" + name + "'", BP_ERR_INTERNAL);
  }

  void check_arity() const {
    const size_t lo = op_.required_inputs(), n = in_.size();
    std::string names;
    for (const auto& s : op_.inputs)
      names += (names.empty() ? "" : ", ") + s.name +
               (s.variadic   ? "0, " + s.name + "1, ..."
                : s.optional ? "?"
                             : "");
    if (op_.variadic()) {
      if (n < lo)
        fail("takes " + std::to_string(lo) + " or more inputs (" + names + "), got " + std::to_string(n));
      return;
    }
    const size_t hi = op_.inputs.size();
    if (n < lo || n > hi)
      fail("takes " + (lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi)) +
           (hi == 1 ? " input (" : " inputs (") + names + "), got " + std::to_string(n));
  }

  void check_param_names() const {
    const Json& p = node_.params;
    if (p.is_null()) return;
    if (!p.is_object()) fail("params must be an object");
    for (auto it = p.begin(); it != p.end(); ++it) {
      bool known = false;
      for (const auto& s : op_.params) known = known || s.name == it.key();
      if (known) continue;
      std::string takes;
      for (const auto& s : op_.params) takes += (takes.empty() ? "" : ", ") + s.name;
      fail("unknown param '" + it.key() + "'" + (takes.empty() ? " (takes none)" : " (takes " + takes + ")"));
    }
  }

  void check_inputs() const {
    for (size_t i = 0; i < in_.size(); ++i) {
      const InputSpec& s = spec_of(i);
      const ValueType* v = in_[i];
      if (!v) {
        if (!s.optional) fail(label(i) + " is null but not optional");
        continue;
      }
      if (s.bundle && !v->is_bundle()) {
        std::string producers;
        for (const auto& spec : table())
          if (spec.outputs.size() > 1) producers += (producers.empty() ? "" : ", ") + spec.name;
        fail(label(i) + " is not a multi-output bundle; '" + op_.name + "' reads a slot of " + producers);
      }
      if (!s.bundle && v->is_bundle())
        fail(label(i) + " is a multi-output bundle; read it through 'view' or 'view_owned'");
    }
    for (size_t i = 0; i < in_.size(); ++i) {
      const InputSpec& s = spec_of(i);
      const ValueType* v = in_[i];
      if (!v || s.bundle) continue;
      // The dtype: a set, or like an earlier input (variadic repeats: like the first).
      int ref = s.like;
      if (s.variadic && !s.each_own && i > op_.inputs.size() - 1) ref = static_cast<int>(op_.inputs.size() - 1);
      if (ref >= 0 && opt(static_cast<size_t>(ref))) {
        const ValueType& r = *in_[static_cast<size_t>(ref)];
        if (v->dtype != r.dtype)
          fail(label(i) + " has dtype " + std::string(dtype_name(v->dtype)) + ", " +
               label(static_cast<size_t>(ref)) + " " + std::string(dtype_name(r.dtype)) +
               "; insert a cast (no implicit promotion)");
      } else if (ref < 0 && !in_set(v->dtype, s.dtypes)) {
        if (single_dtype(s.dtypes))
          fail(label(i) + " has dtype " + std::string(dtype_name(v->dtype)) + ", not " + set_name(s.dtypes));
        fail(label(i) + " has dtype " + std::string(dtype_name(v->dtype)) + "; this op takes " +
             set_phrase(s.dtypes));
      }
      const auto rank = static_cast<int>(v->shape.size());
      if (rank > BP_MAX_RANK) fail(label(i) + " has rank " + std::to_string(rank) + "; the limit is 8");
      if (s.rank >= 0 && rank != s.rank)
        fail(label(i) + " has shape " + shape_str(v->shape) + "; expected rank " + std::to_string(s.rank) +
             (s.shape.empty() ? "" : ", " + s.shape));
      if (rank < s.min_rank)
        fail(label(i) + " has rank " + std::to_string(rank) +
             "; this op takes rank >= " + std::to_string(s.min_rank));
    }
  }

  [[noreturn]] void bad(const ParamSpec& s, const std::string& msg) const {
    fail("param '" + s.name + "' " + msg);
  }

  int64_t integer(const ParamSpec& s, const Json& v, const char* what) const {
    if (!v.is_number_integer()) bad(s, std::string("must be ") + what);
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad(s, "= " + v.dump() + " is out of range (more than 2^63 - 1)");
    const auto i = v.get<int64_t>();
    const bool list = s.kind != Kind::Int;
    if (i < s.lo || i > s.hi || (s.nonzero && i == 0)) {
      std::string rule;
      if (s.nonzero)
        rule = "must not be 0";
      else if (s.hi == INT64_MAX)
        rule = "must be >= " + std::to_string(s.lo);
      else
        rule = "must be in [" + std::to_string(s.lo) + ", " + std::to_string(s.hi) + "]";
      bad(s, (list ? "entries " : "") + rule + (s.nonzero ? "" : ", got " + std::to_string(i)));
    }
    return i;
  }

  std::vector<int64_t> integers(const ParamSpec& s, const Json& v, const char* what) const {
    if (v.is_number_integer()) return {integer(s, v, what)};
    if (!v.is_array()) bad(s, std::string("must be ") + what);
    std::vector<int64_t> out;
    for (const auto& e : v) out.push_back(integer(s, e, what));
    return out;
  }

  int64_t dim(const ParamSpec& s, int64_t d) const {
    const auto rank = static_cast<int64_t>(x(0).shape.size()) + s.rank_extra;
    if (rank == 0 && s.scalar_dim && (d == 0 || d == -1)) return 0;
    if (d < -rank || d >= rank)
      fail("param '" + s.name + "': dim " + std::to_string(d) + " out of range for " +
           (s.rank_extra ? "output " : "") + "rank " + std::to_string(rank));
    return d < 0 ? d + rank : d;
  }

  Value read_param(const ParamSpec& s) const {
    Value out;
    const Json& p = node_.params;
    const bool present = p.is_object() && p.contains(s.name) && !p[s.name].is_null();
    if (!present && s.dflt.is_null()) {
      if (s.required) bad(s, "is required");
      return out;  // optional: not given
    }
    const Json& v = present ? p[s.name] : s.dflt;
    out.given = true;
    switch (s.kind) {
      case Kind::Int:
        out.i = integer(s, v, "an integer");
        break;
      case Kind::Ints:
        out.ints = integers(s, v, "a list of integers");
        break;
      case Kind::Bool:
        if (!v.is_boolean()) bad(s, "must be true or false");
        out.b = v.get<bool>();
        break;
      case Kind::Number:
        if (!v.is_number()) bad(s, "must be a number");
        out.f = v.get<double>();
        if (!std::isfinite(out.f)) bad(s, "must be a finite number");  // JSON has none, Json in C++ may
        out.integral = v.is_number_integer() &&
                       !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX));
        if (out.integral) out.i = v.get<int64_t>();
        break;
      case Kind::Enum: {
        if (v.is_string())
          for (const auto& e : s.values)
            if (v.get<std::string>() == e) out.s = e;
        if (out.s.empty()) {
          std::string alts;
          for (size_t k = 0; k < s.values.size(); ++k)
            alts += (k == 0 ? "" : k + 1 == s.values.size() ? " or " : ", ") + ("\"" + s.values[k] + "\"");
          bad(s, "must be " + alts);
        }
        break;
      }
      case Kind::DType: {
        if (!v.is_string()) bad(s, "must be a dtype name (f32, f16, bf16, f64, i8, i16, i32, i64, u8, bool)");
        const auto name = v.get<std::string>();
        const auto d = dtype_from_name(name);
        if (!d) fail("unknown dtype '" + name + "'");
        out.dtype = *d;
        break;
      }
      case Kind::Dim:
        out.i = dim(s, integer(s, v, "an integer (a dim)"));
        break;
      case Kind::Program:  // checked by the op's inference (fused_program.cpp)
        break;
      case Kind::Dims: {
        const auto raw = integers(s, v, "a list of integers (dims)");
        if (raw.empty() && !s.if_empty.empty()) fail(s.if_empty);
        std::set<int64_t> seen;
        for (auto d : raw) {
          const int64_t n = dim(s, d);
          if (!seen.insert(n).second) fail("dim " + std::to_string(d) + " repeated in " + s.name);
          out.ints.push_back(n);
        }
        break;
      }
      case Kind::Pair: {
        auto ints = integers(s, v, "an int or 2 values");
        if (ints.size() == 1) ints.push_back(ints[0]);
        if (ints.size() != 2) bad(s, "takes an int or 2 values");
        out.ints = std::move(ints);
        break;
      }
      case Kind::Padding: {
        auto ints = integers(s, v, "an int, 2 or 4 values");
        if (ints.size() == 1)
          ints = {ints[0], ints[0], ints[0], ints[0]};
        else if (ints.size() == 2)
          ints = {ints[0], ints[1], ints[0], ints[1]};
        else if (ints.size() != 4)
          bad(s, "takes an int, 2 or 4 values");
        out.ints = std::move(ints);
        break;
      }
    }
    return out;
  }

  const Node& node_;
  const OpSpec& op_;
  const std::vector<const ValueType*>& in_;
  std::vector<Value> values_;
};

// ---- inference (ops_infer.cpp) ---------------------------------------------------------------

bp_op_params params_of(bp_params_kind kind);
Shape broadcast_shapes(const Args& a, const std::vector<const Shape*>& shapes);
void check_counts(const Args& a, const Shape& shape);
Shape reduced_shape(const Shape& in, const std::vector<int32_t>& dims, bool keepdim);
std::vector<int32_t> reduce_dims(const Args& a, int64_t rank);
void same_shape(const Args& a, InferredNode& r);
void gelu(const Args& a, InferredNode& r);
bool fits(bp_dtype d, int64_t v);
void clamp(const Args& a, InferredNode& r);
void affine(const Args& a, InferredNode& r);
void cast(const Args& a, InferredNode& r);
void broadcast_all(const Args& a, InferredNode& r);
void fused_elementwise(const Args& a, InferredNode& r);
void view_common(const Args& a, InferredNode& r, std::function<Layout(const Layout&)> f);
void permute(const Args& a, InferredNode& r);
void transpose(const Args& a, InferredNode& r);
void broadcast_to(const Args& a, InferredNode& r);
void slice(const Args& a, InferredNode& r);
void squeeze(const Args& a, InferredNode& r);
void unsqueeze(const Args& a, InferredNode& r);
void reshape(const Args& a, InferredNode& r);
void slot_view(const Args& a, InferredNode& r);
void reduce(const Args& a, InferredNode& r);
void arg_reduce(const Args& a, InferredNode& r);
void dim_op(const Args& a, InferredNode& r);
void layer_norm(const Args& a, InferredNode& r);
void var_mean(const Args& a, InferredNode& r);
void topk(const Args& a, InferredNode& r);
void selective_scan(const Args& a, InferredNode& r);
void matmul(const Args& a, InferredNode& r);
void attention(const Args& a, InferredNode& r);
void conv2d(const Args& a, InferredNode& r);
void pool2d(const Args& a, InferredNode& r);
void gather(const Args& a, InferredNode& r);
void index_select(const Args& a, InferredNode& r);
void concat(const Args& a, InferredNode& r);
void slice_update(const Args& a, InferredNode& r);

// ---- the table (ops_table.cpp) ----------------------------------------------------------------

const std::vector<OpSpec>& table();
const OpSpec* find_op(const std::string& op);

}  // namespace backplane::detail::spec

namespace backplane::detail {
using namespace spec;
}  // namespace backplane::detail
