// The standard op vocabulary (docs/ops.md) as one table: per op, its inputs
// (names, dtypes, ranks, optional ones), its params (kind, default or
// required, range or values), its outputs and bundle slots. One reader checks
// a node against its op's entry and hands the op's inference function typed
// values; the same table prints the op reference (`backplane ops`).
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

namespace backplane::detail {

namespace {

// ---- dtype sets --------------------------------------------------------------

constexpr unsigned bit(bp_dtype d) { return 1u << static_cast<unsigned>(d); }
constexpr unsigned kFloat = bit(BP_DTYPE_F32) | bit(BP_DTYPE_F16) | bit(BP_DTYPE_BF16) | bit(BP_DTYPE_F64);
constexpr unsigned kInt =
    bit(BP_DTYPE_I8) | bit(BP_DTYPE_I16) | bit(BP_DTYPE_I32) | bit(BP_DTYPE_I64) | bit(BP_DTYPE_U8);
constexpr unsigned kBool = bit(BP_DTYPE_BOOL);
constexpr unsigned kI64 = bit(BP_DTYPE_I64);
constexpr unsigned kFloatInt = kFloat | kInt;
constexpr unsigned kAll = kFloatInt | kBool;

bool in_set(bp_dtype d, unsigned set) {
  return d > BP_DTYPE_INVALID && d < BP_DTYPE_COUNT_ && (set & bit(d));
}

// "float", "float, int", "all", or the one dtype of a single-dtype set.
std::string set_name(unsigned set) {
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
std::string set_phrase(unsigned set) {
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
bool single_dtype(unsigned set) { return set && (set & (set - 1)) == 0; }

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
};

const char* kind_name(Kind k) {
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
ParamSpec param(std::string name, Kind kind) {
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
InputSpec input(std::string name, unsigned dtypes = kAll) {
  InputSpec s;
  s.name = std::move(name);
  s.dtypes = dtypes;
  return s;
}
InputSpec like(std::string name, int i) { return input(std::move(name)).same_as(i); }

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
      if (s.variadic && i > op_.inputs.size() - 1) ref = static_cast<int>(op_.inputs.size() - 1);
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

// ---- shape helpers ------------------------------------------------------------------

bp_op_params params_of(bp_params_kind kind) {
  bp_op_params p{};
  p.struct_size = sizeof(bp_op_params);
  p.kind = kind;
  return p;
}

// The NumPy broadcast of several shapes (a 0 against a 1 gives 0).
Shape broadcast_shapes(const Args& a, const std::vector<const Shape*>& shapes) {
  size_t rank = 0;
  for (auto* s : shapes) rank = std::max(rank, s->size());
  Shape out(rank, 1);
  for (auto* s : shapes) {
    const size_t lead = rank - s->size();
    for (size_t i = 0; i < s->size(); ++i) {
      const int64_t d = (*s)[i];
      int64_t& o = out[lead + i];
      if (d == o || d == 1) continue;
      if (o == 1) {
        o = d;
        continue;
      }
      std::string text;
      for (auto* w : shapes) text += (text.empty() ? "" : " and ") + shape_str(*w);
      a.fail("shapes " + text + " do not broadcast");
    }
  }
  return out;
}

// A shape the core can hold: its element count, and the product of its
// non-zero dims (the strides of its dense layout), within 2^62.
void check_counts(const Args& a, const Shape& shape) {
  int64_t n = 1;
  for (auto d : shape) {
    if (d < 0) a.fail("negative dim in " + shape_str(shape));
    n = checked_mul(n, std::max<int64_t>(d, 1), a.where() + ": the element count of " + shape_str(shape));
  }
}

Shape reduced_shape(const Shape& in, const std::vector<int32_t>& dims, bool keepdim) {
  Shape out;
  for (size_t i = 0; i < in.size(); ++i) {
    const bool r = std::find(dims.begin(), dims.end(), static_cast<int32_t>(i)) != dims.end();
    if (!r)
      out.push_back(in[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

// The dims param of reductions: given (normalised, sorted), or every dim.
std::vector<int32_t> reduce_dims(const Args& a, int64_t rank) {
  std::vector<int32_t> dims;
  if (!a.given("dims")) {
    for (int64_t i = 0; i < rank; ++i) dims.push_back(static_cast<int32_t>(i));
    return dims;
  }
  for (auto d : a.ints("dims")) dims.push_back(static_cast<int32_t>(d));
  std::sort(dims.begin(), dims.end());
  return dims;
}

// ---- inference, per op family ------------------------------------------------------------
// The reader has checked arity, input dtypes and ranks and every param; the
// generic code after these fills output dtypes from the table and checks
// output ranks and element counts.

void same_shape(const Args& a, InferredNode& r) { r.out.shape = a.x(0).shape; }

void gelu(const Args& a, InferredNode& r) {
  r.params.u.gelu.tanh_approximation = a.s("approximate") == "tanh";
  same_shape(a, r);
}

// Integer bounds must fit the input's dtype (a u8 clamped to 300 has no answer).
bool fits(bp_dtype d, int64_t v) {
  switch (d) {
    case BP_DTYPE_I8:
      return v >= INT8_MIN && v <= INT8_MAX;
    case BP_DTYPE_I16:
      return v >= INT16_MIN && v <= INT16_MAX;
    case BP_DTYPE_I32:
      return v >= INT32_MIN && v <= INT32_MAX;
    case BP_DTYPE_U8:
      return v >= 0 && v <= UINT8_MAX;
    default:
      return true;
  }
}

void clamp(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  auto& p = r.params.u.clamp;
  for (const char* name : {"min", "max"}) {
    if (!a.given(name)) continue;
    const bool is_min = name[1] == 'i';
    (is_min ? p.has_min : p.has_max) = true;
    (is_min ? p.min_f : p.max_f) = a.f(name);
    if (is_int(x.dtype)) {
      if (!a.integral(name))
        a.fail(std::string("param '") + name + "' must be an integer for an integer input");
      if (!fits(x.dtype, a.i(name)))
        a.fail(std::string("param '") + name + "' = " + std::to_string(a.i(name)) + " is out of range for " +
               std::string(dtype_name(x.dtype)));
      (is_min ? p.min_i : p.max_i) = a.i(name);
    }
  }
  same_shape(a, r);
}

void affine(const Args& a, InferredNode& r) {
  r.params.u.affine.mul = a.f("mul");
  r.params.u.affine.add = a.f("add");
  same_shape(a, r);
}

void cast(const Args& a, InferredNode& r) {
  r.params.u.cast.dtype = a.dtype("dtype");
  same_shape(a, r);
}

void broadcast_all(const Args& a, InferredNode& r) {
  std::vector<const Shape*> shapes;
  for (size_t i = 0; i < a.n_inputs(); ++i) shapes.push_back(&a.x(i).shape);
  r.out.shape = broadcast_shapes(a, shapes);
}

// ---- layout ops

void view_common(const Args& a, InferredNode& r, std::function<Layout(const Layout&)> f) {
  const auto& x = a.x(0);
  // Run the view once on a dense layout to check it and get the shape.
  Layout out;
  try {
    out = f(Layout::contiguous(x.shape));
  } catch (const Error& e) {
    a.fail(e.what());
  }
  r.out.shape = out.shape();
  r.view = [f](const Layout& l) -> std::optional<Layout> { return f(l); };
}

void permute(const Args& a, InferredNode& r) {
  const auto dims = a.ints("dims");
  view_common(a, r, [dims](const Layout& l) { return l.permute(dims); });
}
void transpose(const Args& a, InferredNode& r) {
  const auto d0 = a.i("dim0"), d1 = a.i("dim1");
  view_common(a, r, [d0, d1](const Layout& l) { return l.transpose(d0, d1); });
}
void broadcast_to(const Args& a, InferredNode& r) {
  const Shape shape = a.ints("shape");
  check_counts(a, shape);
  view_common(a, r, [shape](const Layout& l) { return l.broadcast_to(shape); });
}
void slice(const Args& a, InferredNode& r) {
  const auto dim = a.i("dim");
  std::optional<int64_t> start, end;
  if (a.given("start")) start = a.i("start");
  if (a.given("end")) end = a.i("end");
  // A step beyond the dim's size takes at most one element either way; bound
  // it by the size so that stride * step cannot overflow.
  const int64_t n = std::max<int64_t>(a.x(0).shape[static_cast<size_t>(dim)], 1);
  const int64_t step = std::clamp(a.i("step"), -n, n);
  view_common(a, r, [=](const Layout& l) { return l.slice(dim, start, end, step); });
}
void squeeze(const Args& a, InferredNode& r) {
  std::optional<std::vector<int64_t>> dims;
  if (a.given("dims")) dims = a.ints("dims");
  view_common(a, r, [dims](const Layout& l) { return l.squeeze(dims); });
}
void unsqueeze(const Args& a, InferredNode& r) {
  const auto dim = a.i("dim");
  view_common(a, r, [dim](const Layout& l) { return l.unsqueeze(dim); });
}
void reshape(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  Shape shape = a.ints("shape");
  if (shape.size() > BP_MAX_RANK) a.fail("rank " + std::to_string(shape.size()) + " exceeds 8");
  const std::string what = a.where() + ": shape " + shape_str(shape);
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer_at >= 0) a.fail("shape " + shape_str(shape) + " has more than one -1");
      infer_at = static_cast<int64_t>(i);
    } else {
      known = checked_mul(known, shape[i], what);
    }
  }
  const int64_t n = checked_numel(x.shape, a.where());
  if (infer_at >= 0) {
    if (known == 0 || n % known != 0)
      a.fail("cannot reshape " + shape_str(x.shape) + " to " + shape_str(shape));
    shape[static_cast<size_t>(infer_at)] = n / known;
  }
  check_counts(a, shape);
  if (checked_numel(shape, what) != n)
    a.fail("cannot reshape " + shape_str(x.shape) + " (" + std::to_string(n) + " elements) to " +
           shape_str(shape));
  r.out.shape = shape;
  r.view = [shape](const Layout& l) { return l.reshape(shape); };
}
void slot_view(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto slot = a.i("slot");
  if (slot >= static_cast<int64_t>(x.slots.size()))
    a.fail("slot " + std::to_string(slot) + " out of range (the producer has " +
           std::to_string(x.slots.size()) + " slots)");
  r.slot = slot;
  r.out = {x.slots[static_cast<size_t>(slot)].first, x.slots[static_cast<size_t>(slot)].second, {}};
}

// ---- reductions

void reduce(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  auto& p = r.params.u.reduce;
  const auto dims = reduce_dims(a, static_cast<int64_t>(x.shape.size()));
  p.n_dims = static_cast<uint32_t>(dims.size());
  std::copy(dims.begin(), dims.end(), p.dims);
  p.keepdim = a.b("keepdim");
  if (a.op().name == "max" || a.op().name == "min")
    for (auto d : dims)
      if (x.shape[static_cast<size_t>(d)] == 0)
        a.fail("reduction over the empty dim " + std::to_string(d) + " of " + shape_str(x.shape));
  r.out.shape = reduced_shape(x.shape, dims, p.keepdim);
}

void arg_reduce(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  auto& p = r.params.u.arg_reduce;
  p.dim = static_cast<int32_t>(a.i("dim"));
  p.keepdim = a.b("keepdim");
  p.select_last_index = a.b("select_last_index");
  if (x.shape.empty()) return;  // a scalar: its own index, shape []
  if (x.shape[static_cast<size_t>(p.dim)] == 0)
    a.fail("reduction over the empty dim " + std::to_string(p.dim));
  r.out.shape = reduced_shape(x.shape, {p.dim}, p.keepdim);
}

void dim_op(const Args& a, InferredNode& r) {
  r.params.u.dim.dim = static_cast<int32_t>(a.i("dim"));
  if (a.op().name == "cumsum") {
    r.params.u.dim.exclusive = a.b("exclusive");
    r.params.u.dim.reverse = a.b("reverse");
  }
  same_shape(a, r);
}

void layer_norm(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto rank = static_cast<int64_t>(x.shape.size());
  const auto& raw = a.ints("dims");
  const std::set<int64_t> s(raw.begin(), raw.end());
  if (*s.begin() != rank - static_cast<int64_t>(s.size()))
    a.fail("dims " + a.node().params["dims"].dump() + " must be the trailing dims of rank " +
           std::to_string(rank));
  const Shape norm_shape(x.shape.end() - static_cast<int64_t>(s.size()), x.shape.end());
  for (size_t i = 1; i < 3; ++i) {
    const ValueType* v = a.opt(i);
    if (v && v->shape != norm_shape)
      a.fail(a.label(i) + " has shape " + shape_str(v->shape) + ", expected " + shape_str(norm_shape));
  }
  r.params.u.layer_norm.n_dims = static_cast<uint32_t>(s.size());
  r.params.u.layer_norm.eps = a.f("eps");
  same_shape(a, r);
}

void var_mean(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  auto& p = r.params.u.var_mean;
  const auto dims = reduce_dims(a, static_cast<int64_t>(x.shape.size()));
  p.n_dims = static_cast<uint32_t>(dims.size());
  std::copy(dims.begin(), dims.end(), p.dims);
  p.correction = a.f("correction");
  p.keepdim = a.b("keepdim");
  const Shape out = reduced_shape(x.shape, dims, p.keepdim);
  r.out.slots = {{BP_DTYPE_INVALID, out}, {BP_DTYPE_INVALID, out}};
}

void topk(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  auto& p = r.params.u.topk;
  p.dim = static_cast<int32_t>(a.i("dim"));
  p.k = a.i("k");
  if (p.k > x.shape[static_cast<size_t>(p.dim)])
    a.fail("k=" + std::to_string(p.k) + " out of range for dim " + std::to_string(p.dim) + " of size " +
           std::to_string(x.shape[static_cast<size_t>(p.dim)]));
  p.largest = a.b("largest");
  p.sorted = a.b("sorted");
  Shape out = x.shape;
  out[static_cast<size_t>(p.dim)] = p.k;
  r.out.slots = {{BP_DTYPE_INVALID, out}, {BP_DTYPE_INVALID, out}};
}

void selective_scan(const Args& a, InferredNode& r) {
  const auto& u = a.x(0);
  const int64_t B = u.shape[0], L = u.shape[1], D = u.shape[2];
  const int64_t N = a.x(2).shape[1];
  auto expect = [&](size_t i, const Shape& s) {
    if (a.x(i).shape != s)
      a.fail(a.label(i) + " has shape " + shape_str(a.x(i).shape) + ", expected " + shape_str(s) + " (u is " +
             shape_str(u.shape) + ", a " + shape_str(a.x(2).shape) + ")");
  };
  expect(1, {B, L, D});
  expect(2, {D, N});
  expect(3, {B, L, N});
  expect(4, {B, L, N});
  r.params.u.selective_scan.delta_softplus = a.b("delta_softplus");
  r.out.slots = {{BP_DTYPE_INVALID, {B, L, D}}, {BP_DTYPE_INVALID, {B, D, N}}};
}

// ---- linear algebra, conv, indexing

void matmul(const Args& a, InferredNode& r) {
  const Shape& sa = a.x(0).shape;
  const Shape& sb = a.x(1).shape;
  Shape as = sa, bs = sb;
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  const int64_t M = as[as.size() - 2], K = as.back(), K2 = bs[bs.size() - 2], N = bs.back();
  if (K != K2)
    a.fail("shapes " + shape_str(sa) + " and " + shape_str(sb) + " do not match (" + std::to_string(K) +
           " vs " + std::to_string(K2) + ")");
  // Batch dims broadcast as NumPy's: a 0 against a 1 is 0.
  const Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  Shape out = broadcast_shapes(a, {&ab, &bb});
  if (!a1) out.push_back(M);
  if (!b1) out.push_back(N);
  r.out.shape = out;
}

void conv2d(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto& w = a.x(1);
  auto& p = r.params.u.conv2d;
  const auto& st = a.ints("stride");
  const auto& dl = a.ints("dilation");
  const auto& pd = a.ints("padding");
  std::copy(st.begin(), st.end(), p.stride);
  std::copy(dl.begin(), dl.end(), p.dilation);
  std::copy(pd.begin(), pd.end(), p.padding);
  p.groups = a.i("groups");
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t O = w.shape[0], Cg = w.shape[1], kH = w.shape[2], kW = w.shape[3];
  if (kH == 0 || kW == 0)
    a.fail(a.label(1) + " has shape " + shape_str(w.shape) + "; kH and kW must be >= 1");
  if (C % p.groups != 0 || O % p.groups != 0)
    a.fail("groups=" + std::to_string(p.groups) + " must divide C=" + std::to_string(C) +
           " and O=" + std::to_string(O));
  if (Cg != C / p.groups)
    a.fail("w has " + std::to_string(Cg) + " input channels per group, expected " +
           std::to_string(C / p.groups));
  if (const ValueType* bias = a.opt(2); bias && bias->shape != Shape{O})
    a.fail(a.label(2) + " has shape " + shape_str(bias->shape) + ", expected [" + std::to_string(O) + "]");
  // Output size per spatial dim, every step checked: padding and dilation come from the graph.
  const std::string what = a.where() + ": conv2d geometry";
  auto out_size = [&](int64_t in, int64_t pad0, int64_t pad1, int64_t dil, int64_t k,
                      int64_t stride) -> int64_t {
    const int64_t padded = checked_add(checked_add(in, pad0, what), pad1, what);
    const int64_t span = checked_add(checked_mul(dil, std::max<int64_t>(k - 1, 0), what), 1, what);
    if (padded < span) return -1;
    return (padded - span) / stride + 1;
  };
  const int64_t Ho = out_size(H, p.padding[0], p.padding[2], p.dilation[0], kH, p.stride[0]);
  const int64_t Wo = out_size(W, p.padding[1], p.padding[3], p.dilation[1], kW, p.stride[1]);
  if (Ho < 0 || Wo < 0)
    a.fail("kernel " + shape_str({kH, kW}) + " larger than padded input " + shape_str({H, W}));
  r.out.shape = {N, O, Ho, Wo};
}

// ABI 1.5 added bp_pool2d_params to the union without growing it (its
// largest member is still conv2d's): plugins built against 1.4 keep their
// bp_op_params size.
static_assert(sizeof(bp_pool2d_params) <= sizeof(bp_conv2d_params), "bp_op_params must not grow");

// max_pool2d, avg_pool2d: one window per output element, each of x's N·C
// planes on its own. H' as conv2d's, or rounded up with ceil_mode; a last
// window that would start in the bottom/right padding is dropped (PyTorch,
// ONNX). Every value must fit the int32 fields of bp_pool2d_params.
void pool2d(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  auto& p = r.params.u.pool2d;
  const auto& ks = a.ints("kernel_size");
  const auto& st = a.given("stride") ? a.ints("stride") : ks;  // absent: the kernel size, as PyTorch
  const auto& pd = a.ints("padding");
  const auto& dl = a.ints("dilation");
  auto i32 = [&](const char* name, int64_t v) {
    if (v > INT32_MAX)
      a.fail(std::string("param '") + name + "' = " + std::to_string(v) + " does not fit int32");
    return static_cast<int32_t>(v);
  };
  for (int i = 0; i < 2; ++i) {
    p.kernel[i] = i32("kernel_size", ks[static_cast<size_t>(i)]);
    p.stride[i] = i32(a.given("stride") ? "stride" : "kernel_size", st[static_cast<size_t>(i)]);
    p.dilation[i] = i32("dilation", dl[static_cast<size_t>(i)]);
  }
  for (int i = 0; i < 4; ++i) p.padding[i] = i32("padding", pd[static_cast<size_t>(i)]);
  p.ceil_mode = a.b("ceil_mode");
  p.count_include_pad = a.op().name == "avg_pool2d" && a.b("count_include_pad");
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const std::string what = a.where() + ": pool2d geometry";
  auto out_size = [&](int64_t in, int64_t pad0, int64_t pad1, int64_t dil, int64_t k, int64_t stride) -> int64_t {
    const int64_t padded = checked_add(checked_add(in, pad0, what), pad1, what);
    const int64_t span = checked_add(checked_mul(dil, k - 1, what), 1, what);
    if (padded < span) return -1;
    int64_t n = (padded - span) / stride + 1;
    if (p.ceil_mode && (padded - span) % stride != 0) {
      ++n;
      if ((n - 1) * stride >= in + pad0) --n;  // the last window would start past the input and top/left padding
    }
    return n;
  };
  const int64_t Ho = out_size(H, p.padding[0], p.padding[2], p.dilation[0], p.kernel[0], p.stride[0]);
  const int64_t Wo = out_size(W, p.padding[1], p.padding[3], p.dilation[1], p.kernel[1], p.stride[1]);
  if (Ho < 0 || Wo < 0)
    a.fail("kernel " + shape_str({p.kernel[0], p.kernel[1]}) + " with dilation " +
           shape_str({p.dilation[0], p.dilation[1]}) + " spans more than the padded input " +
           shape_str({H + p.padding[0] + p.padding[2], W + p.padding[1] + p.padding[3]}));
  r.out.shape = {N, C, Ho, Wo};
}

void gather(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto& idx = a.x(1);
  const auto rank = static_cast<int64_t>(x.shape.size());
  if (static_cast<int64_t>(idx.shape.size()) != rank)
    a.fail("index rank " + std::to_string(idx.shape.size()) + " differs from input rank " +
           std::to_string(rank));
  r.params.u.dim.dim = static_cast<int32_t>(a.i("dim"));
  for (int64_t i = 0; i < rank; ++i)
    if (i != r.params.u.dim.dim && idx.shape[static_cast<size_t>(i)] > x.shape[static_cast<size_t>(i)])
      a.fail("index shape " + shape_str(idx.shape) + " exceeds input shape " + shape_str(x.shape) +
             " in dim " + std::to_string(i));
  r.out.shape = idx.shape;
}

void index_select(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto& idx = a.x(1);
  const auto d = a.i("dim");
  r.params.u.dim.dim = static_cast<int32_t>(d);
  Shape out(x.shape.begin(), x.shape.begin() + d);
  out.insert(out.end(), idx.shape.begin(), idx.shape.end());
  out.insert(out.end(), x.shape.begin() + d + 1, x.shape.end());
  if (x.shape[static_cast<size_t>(d)] == 0 &&
      std::find(idx.shape.begin(), idx.shape.end(), 0) == idx.shape.end())
    a.fail("cannot select from the empty dim " + std::to_string(d));
  r.out.shape = out;
}

void concat(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto rank = static_cast<int64_t>(x.shape.size());
  const auto d = a.i("dim");
  Shape out = x.shape;
  out[static_cast<size_t>(d)] = 0;
  for (size_t i = 0; i < a.n_inputs(); ++i) {
    const auto& v = a.x(i);
    if (static_cast<int64_t>(v.shape.size()) != rank)
      a.fail(a.label(i) + " has rank " + std::to_string(v.shape.size()) + ", " + a.label(0) + " " +
             std::to_string(rank));
    for (int64_t k = 0; k < rank; ++k)
      if (k != d && v.shape[static_cast<size_t>(k)] != x.shape[static_cast<size_t>(k)])
        a.fail(a.label(i) + " has shape " + shape_str(v.shape) + ", " + a.label(0) + " " +
               shape_str(x.shape));
    out[static_cast<size_t>(d)] = checked_add(out[static_cast<size_t>(d)], v.shape[static_cast<size_t>(d)],
                                              a.where() + ": the size of dim " + std::to_string(d));
  }
  r.params.u.dim.dim = static_cast<int32_t>(d);
  r.out.shape = out;
}

// ---- the table ---------------------------------------------------------------------------------

const char* const kElementwise = "Elementwise";
const char* const kLayout = "Layout ops and views";
const char* const kReduce = "Reductions and normalisation";
const char* const kLinalg = "Linear algebra, convolution, indexing";
const char* const kMulti = "Multi-output ops (bundles)";

OutputSpec out(std::string name, OutDtype d, std::string shape, int like = 0) {
  return {std::move(name), d, like, std::move(shape)};
}

std::vector<OpSpec> build_table() {
  std::vector<OpSpec> t;
  auto general = [&](std::string name, const char* family, std::string summary, std::vector<InputSpec> ins,
                     std::vector<ParamSpec> params, std::vector<OutputSpec> outs, bp_params_kind kind,
                     InferFn f, OpClass cls = OpClass::Kernel, Canon canon = Canon::None) {
    OpSpec s;
    s.name = std::move(name);
    s.family = family;
    s.summary = std::move(summary);
    s.inputs = std::move(ins);
    s.params = std::move(params);
    s.outputs = std::move(outs);
    s.cls = cls;
    s.canon = canon;
    s.params_kind = kind;
    s.infer = f;
    t.push_back(std::move(s));
  };
  // Elementwise ops: the host broadcasts their inputs to the output's shape.
  auto elementwise = [&](std::string name, std::string summary, std::vector<InputSpec> ins,
                         std::vector<ParamSpec> params, bp_params_kind kind, InferFn f,
                         OutputSpec o = out("y", OutDtype::Like, "shape of x")) {
    general(std::move(name), kElementwise, std::move(summary), std::move(ins), std::move(params),
            {std::move(o)}, kind, f, OpClass::Kernel, Canon::Broadcast);
  };

  // ---- elementwise
  for (const auto& [n, what] : std::vector<std::pair<const char*, const char*>>{
           {"neg", "-x; integers wrap (neg of i8 -128 is -128)"},
           {"abs", "|x|; integers wrap (abs of i8 -128 is -128)"},
           {"sign", "-1, 0 or 1 (float: -0 stays -0, NaN stays NaN)"}})
    elementwise(n, what, {input("x", kFloatInt)}, {}, BP_PARAMS_NONE, same_shape);
  for (const auto& [n, what] : std::vector<std::pair<const char*, const char*>>{
           {"sqr", "x·x"},
           {"sqrt", "√x; NaN below 0"},
           {"rsqrt", "1/√x; inf at 0, NaN below 0"},
           {"recip", "1/x; ±inf at ±0"},
           {"exp", "e^x"},
           {"log", "ln x; -inf at 0, NaN below 0"},
           {"sin", "sin x"},
           {"cos", "cos x"},
           {"tanh", "tanh x"},
           {"erf", "the error function"},
           {"floor", "rounds down"},
           {"ceil", "rounds up"},
           {"round", "rounds to the nearest integer, half to even"},
           {"relu", "max(x, 0); NaN stays NaN"},
           {"sigmoid", "1/(1 + exp(-x))"},
           {"silu", "x·sigmoid(x)"},
           {"softplus", "max(x, 0) + log1p(exp(-|x|))"}})
    elementwise(n, what, {input("x", kFloat)}, {}, BP_PARAMS_NONE, same_shape);
  elementwise("gelu", "x·Φ(x) = 0.5x(1 + erf(x/√2)); with \"tanh\": 0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))",
              {input("x", kFloat)}, {param("approximate", Kind::Enum).one_of({"none", "tanh"}).def("none")},
              BP_PARAMS_GELU, gelu);
  elementwise(
      "clamp",
      "max(x, min), then min(·, max): min > max gives max; NaN stays NaN; integer bounds must be integers "
      "that fit x's dtype",
      {input("x", kFloatInt)},
      {param("min", Kind::Number).optional("no lower bound"),
       param("max", Kind::Number).optional("no upper bound")},
      BP_PARAMS_CLAMP, clamp);
  elementwise("affine", "mul·x + add", {input("x", kFloat)},
              {param("mul", Kind::Number).def(1.0), param("add", Kind::Number).def(0.0)}, BP_PARAMS_AFFINE,
              affine);
  elementwise("cast",
              "converts: float→int truncates toward zero (NaN, ±inf or out of range: an error for the run); "
              "int→int wraps; →bool is x ≠ 0; to f16/bf16 rounds to nearest even",
              {input("x", kAll)}, {param("dtype", Kind::DType)}, BP_PARAMS_CAST, cast,
              out("y", OutDtype::CastParam, "shape of x"));
  const std::string ab = "broadcast of a and b";
  for (const auto& [n, what] : std::vector<std::pair<const char*, const char*>>{
           {"add", "a + b; integers wrap"},
           {"sub", "a - b; integers wrap"},
           {"mul", "a·b; integers wrap"},
           {"div",
            "a / b; integers truncate toward zero, division by 0 is an error for the run, MIN / -1 wraps"},
           {"maximum", "the larger; NaN if either is NaN"},
           {"minimum", "the smaller; NaN if either is NaN"}})
    elementwise(n, what, {input("a", kFloatInt), like("b", 0)}, {}, BP_PARAMS_NONE, broadcast_all,
                out("y", OutDtype::Like, ab));
  elementwise("pow", "a^b (C's pow)", {input("a", kFloat), like("b", 0)}, {}, BP_PARAMS_NONE, broadcast_all,
              out("y", OutDtype::Like, ab));
  for (const auto& [n, what] :
       std::vector<std::pair<const char*, const char*>>{{"eq", "a = b"},
                                                        {"ne", "a ≠ b; true when either is NaN"},
                                                        {"lt", "a < b"},
                                                        {"le", "a ≤ b"},
                                                        {"gt", "a > b"},
                                                        {"ge", "a ≥ b"}})
    elementwise(n, std::string(what) + (std::string(n) == "ne" ? "" : "; false when either is NaN"),
                {input("a", kAll), like("b", 0)}, {}, BP_PARAMS_NONE, broadcast_all,
                out("y", OutDtype::Bool, ab));
  elementwise("where", "cond ? a : b", {input("cond", kBool), input("a", kAll), like("b", 1)}, {},
              BP_PARAMS_NONE, broadcast_all, out("y", OutDtype::Like, "broadcast of cond, a and b", 1));

  // ---- layout ops: views of their input's bytes (no kernel)
  general("reshape", kLayout, "a view when the strides allow one, else a dense copy; 0 is a real size",
          {input("x")},
          {param("shape", Kind::Ints).range(-1).says("the new shape; one entry may be -1 (inferred)")},
          {out("y", OutDtype::Like, "`shape`, its -1 inferred")}, BP_PARAMS_NONE, reshape, OpClass::Reshape);
  general("permute", kLayout, "reorders the dims: y.shape[i] = x.shape[dims[i]]", {input("x")},
          {param("dims", Kind::Dims).says("a permutation of every dim of x")},
          {out("y", OutDtype::Like, "x.shape permuted")}, BP_PARAMS_NONE, permute, OpClass::View);
  general("transpose", kLayout, "swaps two dims", {input("x")},
          {param("dim0", Kind::Dim), param("dim1", Kind::Dim)},
          {out("y", OutDtype::Like, "x.shape with dim0 and dim1 swapped")}, BP_PARAMS_NONE, transpose,
          OpClass::View);
  general("broadcast_to", kLayout, "NumPy broadcast to `shape` (stride 0 on stretched dims)", {input("x")},
          {param("shape", Kind::Ints).range(0)}, {out("y", OutDtype::Like, "`shape`")}, BP_PARAMS_NONE,
          broadcast_to, OpClass::View);
  general(
      "slice", kLayout,
      "x[start:end:step] along dim, with NumPy's clamping of start and end; a negative step walks backwards",
      {input("x").at_least_rank(1)},
      {param("dim", Kind::Dim), param("start", Kind::Int).optional("the first element in step's direction"),
       param("end", Kind::Int).optional("past the last element in step's direction"),
       param("step", Kind::Int).not_zero().def(1)},
      {out("y", OutDtype::Like, "x.shape with dim's size the slice's length")}, BP_PARAMS_NONE, slice,
      OpClass::View);
  general("squeeze", kLayout, "removes size-1 dims; naming a dim whose size is not 1 is an error",
          {input("x")}, {param("dims", Kind::Dims).optional("every size-1 dim")},
          {out("y", OutDtype::Like, "x.shape without dims")}, BP_PARAMS_NONE, squeeze, OpClass::View);
  general("unsqueeze", kLayout, "inserts a size-1 dim", {input("x")},
          {param("dim", Kind::Dim).of_output().says("counts against the output's rank (x's rank + 1)")},
          {out("y", OutDtype::Like, "x.shape with 1 inserted at dim")}, BP_PARAMS_NONE, unsqueeze,
          OpClass::View);
  general("contiguous", kLayout, "a dense copy of any strided layout (a device kernel)", {input("x")}, {},
          {out("y", OutDtype::Like, "shape of x")}, BP_PARAMS_NONE, same_shape, OpClass::Kernel,
          Canon::Broadcast);
  general("view", kLayout, "slot `slot` of a bundle, in place (no copy)", {input("bundle").bundled()},
          {param("slot", Kind::Int).range(0)}, {out("y", OutDtype::Slot, "")}, BP_PARAMS_NONE, slot_view,
          OpClass::Slot);
  general("view_owned", kLayout, "a dense copy of slot `slot` of a bundle", {input("bundle").bundled()},
          {param("slot", Kind::Int).range(0)}, {out("y", OutDtype::Slot, "")}, BP_PARAMS_NONE, slot_view,
          OpClass::SlotCopy);

  // ---- reductions and normalisation
  const std::string ambiguous = "dims: [] is ambiguous; leave 'dims' out to reduce over every dim";
  const std::string reduced = "x.shape without dims (size 1 with keepdim)";
  for (const auto& [n, what, set] : std::vector<std::tuple<const char*, const char*, unsigned>>{
           {"sum", "Σ; 0 over an empty dim; integers wrap", kFloatInt},
           {"prod", "Π; 1 over an empty dim; integers wrap", kFloatInt},
           {"max", "the largest; NaN if any is NaN; an empty dim is an error", kFloatInt},
           {"min", "the smallest; NaN if any is NaN; an empty dim is an error", kFloatInt},
           {"mean", "Σ / n; NaN over an empty dim", kFloat}})
    general(n, kReduce, what, {input("x", set)},
            {param("dims", Kind::Dims).optional("every dim").empty_error(ambiguous),
             param("keepdim", Kind::Bool).def(false)},
            {out("y", OutDtype::Like, reduced)}, BP_PARAMS_REDUCE, reduce);
  for (const char* n : {"argmax", "argmin"})
    general(
        n, kReduce,
        std::string("index of the ") + (std::string(n) == "argmax" ? "largest" : "smallest") +
            " along dim: the first of ties (the last with select_last_index), the first NaN if any; an empty "
            "dim is an error",
        {input("x", kFloatInt)},
        {param("dim", Kind::Dim).scalar_ok(), param("keepdim", Kind::Bool).def(false),
         param("select_last_index", Kind::Bool).def(false)},
        {out("y", OutDtype::I64, "x.shape without dim (size 1 with keepdim)")}, BP_PARAMS_ARG_REDUCE,
        arg_reduce);
  general("softmax", kReduce, "exp(x - max) / Σ exp(x - max) along dim", {input("x", kFloat)},
          {param("dim", Kind::Dim).scalar_ok()}, {out("y", OutDtype::Like, "shape of x")}, BP_PARAMS_DIM,
          dim_op);
  general("log_softmax", kReduce, "x - max - log Σ exp(x - max) along dim", {input("x", kFloat)},
          {param("dim", Kind::Dim).scalar_ok()}, {out("y", OutDtype::Like, "shape of x")}, BP_PARAMS_DIM,
          dim_op);
  general("cumsum", kReduce,
          "running sum along dim; exclusive: the sum of the elements before; reverse: from the end; integers "
          "wrap",
          {input("x", kFloatInt)},
          {param("dim", Kind::Dim).scalar_ok(), param("exclusive", Kind::Bool).def(false),
           param("reverse", Kind::Bool).def(false)},
          {out("y", OutDtype::Like, "shape of x")}, BP_PARAMS_DIM, dim_op);
  general("layer_norm", kReduce,
          "(x - mean) / √(var + eps) · weight + bias over the trailing dims (biased variance)",
          {input("x", kFloat), like("weight", 0).opt().shaped("x.shape[-len(dims):]"),
           like("bias", 0).opt().shaped("x.shape[-len(dims):]")},
          {param("dims", Kind::Dims).empty_error("dims must not be empty").says("the trailing dims of x"),
           param("eps", Kind::Number).def(1e-5)},
          {out("y", OutDtype::Like, "shape of x")}, BP_PARAMS_LAYER_NORM, layer_norm);

  // ---- linear algebra, convolution, indexing
  general(
      "matmul", kLinalg,
      "NumPy matmul: a 1-D a is [1, K] and a 1-D b is [K, 1] (the added dim dropped from the result); batch "
      "dims broadcast (a 0 against a 1 is 0)",
      {input("a", kFloatInt).at_least_rank(1), like("b", 0).at_least_rank(1)}, {},
      {out("y", OutDtype::Like, "[...batch, M, N]")}, BP_PARAMS_NONE, matmul, OpClass::Kernel, Canon::Matmul);
  general("conv2d", kLinalg,
          "2-D cross-correlation (PyTorch's conv2d), zero padding; H' = (H + top + bottom - dilation·(kH - "
          "1) - 1) "
          "/ stride + 1",
          {input("x", kFloat).of_rank(4, "[N, C, H, W]"), like("w", 0).of_rank(4, "[O, C/groups, kH, kW]"),
           like("bias", 0).opt().of_rank(1, "[O]")},
          {param("stride", Kind::Pair).range(1).def(1), param("padding", Kind::Padding).range(0).def(0),
           param("dilation", Kind::Pair).range(1).def(1), param("groups", Kind::Int).range(1).def(1)},
          {out("y", OutDtype::Like, "[N, O, H', W']")}, BP_PARAMS_CONV2D, conv2d);
  for (const char* n : {"max_pool2d", "avg_pool2d"}) {
    const bool avg = std::string(n) == "avg_pool2d";
    std::vector<ParamSpec> ps = {param("kernel_size", Kind::Pair).range(1),
                                 param("stride", Kind::Pair).range(1).optional("kernel_size"),
                                 param("padding", Kind::Padding).range(0).def(0),
                                 param("dilation", Kind::Pair).range(1).def(1),
                                 param("ceil_mode", Kind::Bool).def(false)};
    if (avg) ps.push_back(param("count_include_pad", Kind::Bool).def(true));
    general(n, kLinalg,
            avg ? "the mean of each kH x kW window (dilated) of each plane; divisor: the window's positions inside "
                  "the padded input with count_include_pad, else inside x (0 gives NaN); H' as max_pool2d's"
                : "the largest element of each kH x kW window (dilated) of each plane; padding is -inf, NaN "
                  "propagates; H' = floor (ceil with ceil_mode) of (H + top + bottom - dilation·(kH - 1) - 1) / "
                  "stride, + 1; with ceil_mode a last window starting past H + top is dropped",
            {input("x", kFloat).of_rank(4, "[N, C, H, W]")}, std::move(ps),
            {out("y", OutDtype::Like, "[N, C, H', W']")}, BP_PARAMS_POOL2D, pool2d);
  }
  general("gather", kLinalg,
          "y[i][j]... = x[...][index[i][j]...][...] along dim (torch.gather, ONNX GatherElements); negative "
          "indices count from the end, out of range is an error for the run",
          {input("x", kAll), input("index", kI64)}, {param("dim", Kind::Dim).scalar_ok()},
          {out("y", OutDtype::Like, "shape of index")}, BP_PARAMS_DIM, gather);
  general(
      "index_select", kLinalg,
      "picks entries of dim by index (ONNX Gather); negative indices count from the end, out of range is an "
      "error for the run",
      {input("x", kAll).at_least_rank(1), input("index", kI64)}, {param("dim", Kind::Dim)},
      {out("y", OutDtype::Like, "x.shape[:dim] + index.shape + x.shape[dim+1:]")}, BP_PARAMS_DIM,
      index_select);
  general("concat", kLinalg, "joins along dim; the other dims must agree",
          {input("x", kAll).repeats().at_least_rank(1)}, {param("dim", Kind::Dim)},
          {out("y", OutDtype::Like, "x0.shape with dim's sizes summed")}, BP_PARAMS_DIM, concat);

  // ---- multi-output ops: one bundled output, read through view / view_owned
  general(
      "topk", kMulti,
      "the k largest (smallest with largest: false) along dim; NaN ranks above every number; ties: the lower "
      "index first; sorted: false may return any order",
      {input("x", kFloatInt).at_least_rank(1)},
      {param("k", Kind::Int).range(0).says("at most dim's size"), param("dim", Kind::Dim).def(-1),
       param("largest", Kind::Bool).def(true), param("sorted", Kind::Bool).def(true)},
      {out("values", OutDtype::Like, "x.shape with dim's size k"),
       out("indices", OutDtype::I64, "x.shape with dim's size k")},
      BP_PARAMS_TOPK, topk);
  general("var_mean", kMulti,
          "variance Σ(x - mean)² / max(0, n - correction) and mean over dims; NaN over an empty dim",
          {input("x", kFloat)},
          {param("dims", Kind::Dims).optional("every dim").empty_error(ambiguous),
           param("correction", Kind::Number).def(1.0), param("keepdim", Kind::Bool).def(false)},
          {out("var", OutDtype::Like, reduced), out("mean", OutDtype::Like, reduced)}, BP_PARAMS_VAR_MEAN,
          var_mean);
  general("selective_scan", kMulti,
          "Mamba's S6 recurrence: state h [B, D, N] from 0; per step t: d = delta (softplus(delta) with "
          "delta_softplus), h = exp(d·a)·h + d·b·u, y = Σ_j h·c; last_state = h after the last step",
          {input("u", kFloat).of_rank(3, "[B, L, D]"), like("delta", 0).of_rank(3, "[B, L, D]"),
           like("a", 0).of_rank(2, "[D, N]"), like("b", 0).of_rank(3, "[B, L, N]"),
           like("c", 0).of_rank(3, "[B, L, N]")},
          {param("delta_softplus", Kind::Bool).def(false)},
          {out("y", OutDtype::Like, "[B, L, D]"), out("last_state", OutDtype::Like, "[B, D, N]")},
          BP_PARAMS_SELECTIVE_SCAN, selective_scan);
  return t;
}

const std::vector<OpSpec>& table() {
  static const std::vector<OpSpec> t = build_table();
  return t;
}

const std::unordered_map<std::string, const OpSpec*>& index() {
  static const std::unordered_map<std::string, const OpSpec*> m = [] {
    std::unordered_map<std::string, const OpSpec*> r;
    for (const auto& s : table()) r[s.name] = &s;
    return r;
  }();
  return m;
}

const OpSpec* find_op(const std::string& op) {
  const auto it = index().find(op);
  return it == index().end() ? nullptr : it->second;
}

}  // namespace

int64_t normalize_dim(int64_t dim, int64_t rank, const std::string& what) {
  if (dim < -rank || dim >= rank)
    throw Error(what + ": dim " + std::to_string(dim) + " out of range for rank " + std::to_string(rank));
  return dim < 0 ? dim + rank : dim;
}

bool is_known_op(const std::string& op) { return find_op(op) != nullptr; }

OptionalInputs optional_inputs(const std::string& op) {
  const OpSpec* s = find_op(op);
  if (!s || s->variadic() || s->required_inputs() == s->inputs.size()) return {};
  return {s->required_inputs(), s->inputs.size()};
}
bool is_custom_op(const std::string& op) { return op.find('.') != std::string::npos; }

std::vector<std::string> known_ops() {
  std::vector<std::string> v;
  for (const auto& s : table()) v.push_back(s.name);
  std::sort(v.begin(), v.end());
  return v;
}

InferredNode infer_node(const Node& node, const std::vector<const ValueType*>& inputs) {
  const OpSpec* op = find_op(node.op);
  if (!op) throw Error("node '" + node.name + "': unknown op '" + node.op + "'");
  Args a(node, *op, inputs);
  a.read();
  InferredNode r;
  r.cls = op->cls;
  r.canon = op->canon;
  r.params = params_of(op->params_kind);
  op->infer(a, r);
  // Output dtypes from the table.
  auto dtype_of = [&](const OutputSpec& o, bp_dtype current) {
    switch (o.dtype) {
      case OutDtype::Like:
        return a.x(static_cast<size_t>(o.like)).dtype;
      case OutDtype::Bool:
        return BP_DTYPE_BOOL;
      case OutDtype::I64:
        return BP_DTYPE_I64;
      case OutDtype::CastParam:
        return r.params.u.cast.dtype;
      case OutDtype::Slot:
        return current;
    }
    return current;
  };
  if (op->outputs.size() > 1) {
    for (size_t i = 0; i < r.out.slots.size(); ++i)
      r.out.slots[i].first = dtype_of(op->outputs[i], r.out.slots[i].first);
    r.out.dtype = r.out.slots[0].first;
    r.out.shape = r.out.slots[0].second;
  } else {
    r.out.dtype = dtype_of(op->outputs[0], r.out.dtype);
  }
  // Every result the core will hold: rank <= 8, element counts within 2^62.
  std::vector<const Shape*> shapes{&r.out.shape};
  for (const auto& s : r.out.slots) shapes.push_back(&s.second);
  for (const Shape* s : shapes) {
    if (s->size() > BP_MAX_RANK) a.fail("result rank exceeds 8");
    check_counts(a, *s);
  }
  return r;
}

}  // namespace backplane::detail

// ---- the public reference (backplane.hpp) ----------------------------------------------------------

namespace backplane {

namespace {

using detail::Kind;

std::string range_text(const detail::ParamSpec& s) {
  if (s.kind == Kind::Enum) {
    std::string v;
    for (size_t k = 0; k < s.values.size(); ++k)
      v += (k == 0 ? "" : k + 1 == s.values.size() ? " or " : ", ") + ("\"" + s.values[k] + "\"");
    return v;
  }
  const bool list = s.kind == Kind::Ints || s.kind == Kind::Pair || s.kind == Kind::Padding;
  std::string r;
  if (s.nonzero)
    r = "!= 0";
  else if (s.lo != INT64_MIN && s.hi != INT64_MAX)
    r = "in [" + std::to_string(s.lo) + ", " + std::to_string(s.hi) + "]";
  else if (s.lo != INT64_MIN)
    r = ">= " + std::to_string(s.lo);
  else if (s.hi != INT64_MAX)
    r = "<= " + std::to_string(s.hi);
  if (s.kind == Kind::Dims && !s.if_empty.empty()) r = "not []";
  return r.empty() || !list ? r : "each " + r;
}

std::string dtypes_text(const detail::OpSpec& op, const detail::InputSpec& s) {
  if (s.bundle) return "a bundle";
  if (s.like >= 0) return "like " + op.inputs[static_cast<size_t>(s.like)].name;
  return detail::set_name(s.dtypes) + (s.variadic ? " (one dtype)" : "");
}

std::string output_dtype_text(const detail::OpSpec& op, const detail::OutputSpec& o) {
  switch (o.dtype) {
    case detail::OutDtype::Like:
      return "like " + op.inputs[static_cast<size_t>(o.like)].name + (op.variadic() ? "0" : "");
    case detail::OutDtype::Bool:
      return "bool";
    case detail::OutDtype::I64:
      return "i64";
    case detail::OutDtype::CastParam:
      return "the dtype param";
    case detail::OutDtype::Slot:
      return "the slot's dtype and shape";
  }
  return "?";
}

std::string cell(std::string s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

}  // namespace

std::vector<OpInfo> op_reference() {
  std::vector<OpInfo> v;
  for (const auto& op : detail::table()) {
    OpInfo info;
    info.name = op.name;
    info.family = op.family;
    info.summary = op.summary;
    for (const auto& s : op.inputs)
      info.inputs.push_back({s.name, dtypes_text(op, s), s.shape, s.optional, s.variadic});
    for (const auto& s : op.params) {
      std::string kind = detail::kind_name(s.kind);
      info.params.push_back({s.name, kind, s.required, s.dflt, s.absent, range_text(s), s.doc});
    }
    for (const auto& o : op.outputs) info.outputs.push_back({o.name, output_dtype_text(op, o), o.shape});
    v.push_back(std::move(info));
  }
  return v;
}

std::string op_reference_markdown() {
  std::string md;
  std::string family;
  for (const auto& op : op_reference()) {
    if (op.family != family) {
      family = op.family;
      md += (md.empty() ? "" : "\n") + ("### " + family + "\n\n");
      md += "| op | inputs | params | output | semantics |\n| --- | --- | --- | --- | --- |\n";
    }
    std::string ins;
    for (const auto& i : op.inputs) {
      const std::string name = i.variadic ? "`" + i.name + "0`, `" + i.name + "1`, ..." : "`" + i.name + "`";
      ins += (ins.empty() ? "" : "<br>") + name + (i.optional ? "?" : "") +
             (i.shape.empty() ? "" : " " + i.shape) + ": " + i.dtypes;
    }
    std::string params;
    for (const auto& p : op.params) {
      std::string t = "`" + p.name + "`: " + (p.kind == "string" ? p.range : p.kind);
      if (p.kind != "string" && !p.range.empty()) t += ", " + p.range;
      if (p.required)
        t += "; required";
      else if (!p.default_value.is_null())
        t += "; default `" + p.default_value.dump() + "`";
      else
        t += "; absent: " + p.absent;
      if (!p.doc.empty()) t += "; " + p.doc;
      params += (params.empty() ? "" : "<br>") + t;
    }
    std::string outs;
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      const auto& o = op.outputs[k];
      const std::string head =
          op.outputs.size() > 1 ? "slot " + std::to_string(k) + " `" + o.name + "`: " : "";
      outs += (outs.empty() ? "" : "<br>") + head + o.dtype + (o.shape.empty() ? "" : "; " + o.shape);
    }
    md += "| `" + op.name + "` | " + cell(ins) + " | " + cell(params.empty() ? "—" : params) + " | " +
          cell(outs) + " | " + cell(op.summary) + " |\n";
  }
  return md;
}

Json op_reference_json() {
  Json ops = Json::array();
  for (const auto& op : op_reference()) {
    Json j = {{"name", op.name}, {"family", op.family}, {"summary", op.summary}};
    j["inputs"] = Json::array();
    for (const auto& i : op.inputs)
      j["inputs"].push_back({{"name", i.name},
                             {"dtypes", i.dtypes},
                             {"shape", i.shape},
                             {"optional", i.optional},
                             {"variadic", i.variadic}});
    j["params"] = Json::array();
    for (const auto& p : op.params)
      j["params"].push_back({{"name", p.name},
                             {"kind", p.kind},
                             {"required", p.required},
                             {"default", p.default_value},
                             {"absent", p.absent},
                             {"range", p.range},
                             {"doc", p.doc}});
    j["outputs"] = Json::array();
    for (const auto& o : op.outputs)
      j["outputs"].push_back({{"name", o.name}, {"dtype", o.dtype}, {"shape", o.shape}});
    ops.push_back(std::move(j));
  }
  return {{"ops", ops}};
}

}  // namespace backplane
