// Params parsing and shape/dtype inference for every op of OPS.md.
#include "ops.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>

namespace backplane::detail {

namespace {

enum DtypeClass : unsigned { kFloat = 1, kInt = 2, kBool = 4, kAll = 7, kFloatInt = 3 };

bool in_class(bp_dtype d, unsigned cls) {
  if (is_float(d)) return cls & kFloat;
  if (is_int(d)) return cls & kInt;
  if (d == BP_DTYPE_BOOL) return cls & kBool;
  return false;
}

std::string class_name(unsigned cls) {
  switch (cls) {
    case kFloat: return "float dtypes";
    case kFloatInt: return "float and int dtypes";
    default: return "every dtype";
  }
}

// Context for one node: error messages name the node and the op.
struct Ctx {
  const Node& node;
  const std::vector<const ValueType*>& in;

  [[noreturn]] void fail(const std::string& msg) const {
    throw Error("node '" + node.name + "' (" + node.op + "): " + msg);
  }
  const ValueType& input(size_t i) const {
    if (i >= in.size() || in[i] == nullptr) fail("input " + std::to_string(i) + " is missing");
    return *in[i];
  }
  void allow(std::initializer_list<const char*> names) const {
    if (!node.params.is_object()) fail("params must be an object");
    for (auto it = node.params.begin(); it != node.params.end(); ++it) {
      bool ok = false;
      for (auto* n : names) ok = ok || it.key() == n;
      if (!ok) {
        std::string allowed;
        for (auto* n : names) allowed += std::string(allowed.empty() ? "" : ", ") + n;
        fail("unknown param '" + it.key() + "'" + (allowed.empty() ? " (takes none)" : " (takes " + allowed + ")"));
      }
    }
  }
  bool has(const char* name) const { return node.params.contains(name) && !node.params[name].is_null(); }
  int64_t get_int(const char* name) const {
    if (!has(name)) fail("param '" + std::string(name) + "' is required");
    const auto& v = node.params[name];
    if (!v.is_number_integer()) fail("param '" + std::string(name) + "' must be an integer");
    return v.get<int64_t>();
  }
  int64_t get_int(const char* name, int64_t dflt) const { return has(name) ? get_int(name) : dflt; }
  double get_num(const char* name, double dflt) const {
    if (!has(name)) return dflt;
    const auto& v = node.params[name];
    if (!v.is_number()) fail("param '" + std::string(name) + "' must be a number");
    return v.get<double>();
  }
  bool get_bool(const char* name, bool dflt) const {
    if (!has(name)) return dflt;
    const auto& v = node.params[name];
    if (!v.is_boolean()) fail("param '" + std::string(name) + "' must be true or false");
    return v.get<bool>();
  }
  std::vector<int64_t> get_ints(const char* name) const {
    if (!has(name)) fail("param '" + std::string(name) + "' is required");
    const auto& v = node.params[name];
    if (v.is_number_integer()) return {v.get<int64_t>()};
    if (!v.is_array()) fail("param '" + std::string(name) + "' must be a list of integers");
    std::vector<int64_t> out;
    for (auto& e : v) {
      if (!e.is_number_integer()) fail("param '" + std::string(name) + "' must be a list of integers");
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  void arity(size_t lo, size_t hi) const {
    if (in.size() < lo || in.size() > hi) {
      fail("takes " + (lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi)) +
           " inputs, got " + std::to_string(in.size()));
    }
  }
  void dtype_in(const ValueType& v, unsigned cls, const char* which) const {
    if (!in_class(v.dtype, cls))
      fail(std::string(which) + " has dtype " + std::string(dtype_name(v.dtype)) + "; this op takes " +
           class_name(cls));
  }
  void not_bundle() const {
    for (size_t i = 0; i < in.size(); ++i)
      if (in[i] && in[i]->is_bundle())
        fail("input " + std::to_string(i) + " is a multi-output bundle; read it through 'view' or 'view_owned'");
  }
  int64_t dim(int64_t d, int64_t rank) const {
    if (rank == 0 && (d == 0 || d == -1)) return 0;
    if (d < -rank || d >= rank) fail("dim " + std::to_string(d) + " out of range for rank " + std::to_string(rank));
    return d < 0 ? d + rank : d;
  }
};

Shape broadcast_shapes(const Ctx& c, const std::vector<const ValueType*>& vs) {
  size_t rank = 0;
  for (auto* v : vs) rank = std::max(rank, v->shape.size());
  Shape out(rank, 1);
  for (auto* v : vs) {
    const size_t lead = rank - v->shape.size();
    for (size_t i = 0; i < v->shape.size(); ++i) {
      const int64_t d = v->shape[i];
      int64_t& o = out[lead + i];
      if (d == o || d == 1) continue;
      if (o == 1) {
        o = d;
        continue;
      }
      std::string shapes;
      for (auto* w : vs) shapes += (shapes.empty() ? "" : " and ") + shape_str(w->shape);
      c.fail("shapes " + shapes + " do not broadcast");
    }
  }
  return out;
}

bp_op_params params_of(bp_params_kind kind) {
  bp_op_params p{};
  p.struct_size = sizeof(bp_op_params);
  p.kind = kind;
  return p;
}

// dims param of reductions: absent = all; [] is an error (OPS.md).
std::vector<int32_t> reduce_dims(const Ctx& c, int64_t rank) {
  std::vector<int32_t> dims;
  if (!c.has("dims")) {
    for (int64_t i = 0; i < rank; ++i) dims.push_back(static_cast<int32_t>(i));
    return dims;
  }
  const auto raw = c.get_ints("dims");
  if (raw.empty()) c.fail("dims: [] is ambiguous; leave 'dims' out to reduce over every dim");
  std::set<int32_t> s;
  for (auto d : raw) {
    const auto n = static_cast<int32_t>(c.dim(d, rank));
    if (!s.insert(n).second) c.fail("dim " + std::to_string(d) + " repeated in dims");
  }
  dims.assign(s.begin(), s.end());
  return dims;
}

Shape reduced_shape(const Shape& in, const std::vector<int32_t>& dims, bool keepdim) {
  Shape out;
  for (size_t i = 0; i < in.size(); ++i) {
    const bool r = std::find(dims.begin(), dims.end(), static_cast<int32_t>(i)) != dims.end();
    if (!r) out.push_back(in[i]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

using InferFn = void (*)(const Ctx&, InferredNode&);

struct OpDef {
  InferFn infer;
};

// ---- elementwise -----------------------------------------------------------

template <unsigned Cls> void unary(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  c.allow({});
  const auto& x = c.input(0);
  c.dtype_in(x, Cls, "input");
  r.canon = Canon::Broadcast;
  r.params = params_of(BP_PARAMS_NONE);
  r.out = {x.dtype, x.shape, {}};
}

void gelu(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  c.allow({"approximate"});
  const auto& x = c.input(0);
  c.dtype_in(x, kFloat, "input");
  r.params = params_of(BP_PARAMS_GELU);
  if (c.has("approximate")) {
    const auto& a = c.node.params["approximate"];
    if (!a.is_string() || (a != "none" && a != "tanh")) c.fail("param 'approximate' must be \"none\" or \"tanh\"");
    r.params.u.gelu.tanh_approximation = a == "tanh";
  }
  r.canon = Canon::Broadcast;
  r.out = {x.dtype, x.shape, {}};
}

void clamp(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  c.allow({"min", "max"});
  const auto& x = c.input(0);
  c.dtype_in(x, kFloatInt, "input");
  r.params = params_of(BP_PARAMS_CLAMP);
  auto& p = r.params.u.clamp;
  for (const char* name : {"min", "max"}) {
    if (!c.has(name)) continue;
    const auto& v = c.node.params[name];
    if (!v.is_number()) c.fail(std::string("param '") + name + "' must be a number");
    const bool is_min = name[1] == 'i';
    (is_min ? p.has_min : p.has_max) = true;
    (is_min ? p.min_f : p.max_f) = v.get<double>();
    if (is_int(x.dtype)) {
      if (!v.is_number_integer()) c.fail(std::string("param '") + name + "' must be an integer for an integer input");
      (is_min ? p.min_i : p.max_i) = v.get<int64_t>();
    }
  }
  r.canon = Canon::Broadcast;
  r.out = {x.dtype, x.shape, {}};
}

void affine(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  c.allow({"mul", "add"});
  const auto& x = c.input(0);
  c.dtype_in(x, kFloat, "input");
  r.params = params_of(BP_PARAMS_AFFINE);
  r.params.u.affine.mul = c.get_num("mul", 1.0);
  r.params.u.affine.add = c.get_num("add", 0.0);
  r.canon = Canon::Broadcast;
  r.out = {x.dtype, x.shape, {}};
}

void cast(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  c.allow({"dtype"});
  const auto& x = c.input(0);
  if (!c.has("dtype") || !c.node.params["dtype"].is_string()) c.fail("param 'dtype' (a dtype name) is required");
  const auto name = c.node.params["dtype"].get<std::string>();
  auto d = dtype_from_name(name);
  if (!d) c.fail("unknown dtype '" + name + "'");
  r.params = params_of(BP_PARAMS_CAST);
  r.params.u.cast.dtype = *d;
  r.canon = Canon::Broadcast;
  r.out = {*d, x.shape, {}};
}

template <unsigned Cls, bool Compare> void binary(const Ctx& c, InferredNode& r) {
  c.arity(2, 2);
  c.allow({});
  const auto& a = c.input(0);
  const auto& b = c.input(1);
  c.dtype_in(a, Cls, "input 0");
  if (a.dtype != b.dtype)
    c.fail("inputs have dtypes " + std::string(dtype_name(a.dtype)) + " and " + std::string(dtype_name(b.dtype)) +
           "; insert a cast (no implicit promotion)");
  r.canon = Canon::Broadcast;
  r.params = params_of(BP_PARAMS_NONE);
  r.out = {Compare ? BP_DTYPE_BOOL : a.dtype, broadcast_shapes(c, {&a, &b}), {}};
}

void where(const Ctx& c, InferredNode& r) {
  c.arity(3, 3);
  c.allow({});
  const auto& cond = c.input(0);
  const auto& a = c.input(1);
  const auto& b = c.input(2);
  if (cond.dtype != BP_DTYPE_BOOL) c.fail("condition has dtype " + std::string(dtype_name(cond.dtype)) + ", not bool");
  if (a.dtype != b.dtype)
    c.fail("a and b have dtypes " + std::string(dtype_name(a.dtype)) + " and " + std::string(dtype_name(b.dtype)));
  r.canon = Canon::Broadcast;
  r.params = params_of(BP_PARAMS_NONE);
  r.out = {a.dtype, broadcast_shapes(c, {&cond, &a, &b}), {}};
}

// ---- layout ops ------------------------------------------------------------

void view_common(const Ctx& c, InferredNode& r, std::function<Layout(const Layout&)> f) {
  c.arity(1, 1);
  const auto& x = c.input(0);
  // Run the view once on a contiguous layout to check params and get the shape.
  Layout out;
  try {
    out = f(Layout::contiguous(x.shape));
  } catch (const Error& e) {
    c.fail(e.what());
  }
  r.cls = OpClass::View;
  r.out = {x.dtype, out.shape(), {}};
  r.view = [f](const Layout& l) -> std::optional<Layout> { return f(l); };
}

void permute(const Ctx& c, InferredNode& r) {
  c.allow({"dims"});
  auto dims = c.get_ints("dims");
  view_common(c, r, [dims](const Layout& l) { return l.permute(dims); });
}
void transpose(const Ctx& c, InferredNode& r) {
  c.allow({"dim0", "dim1"});
  const auto d0 = c.get_int("dim0"), d1 = c.get_int("dim1");
  view_common(c, r, [d0, d1](const Layout& l) { return l.transpose(d0, d1); });
}
void broadcast_to(const Ctx& c, InferredNode& r) {
  c.allow({"shape"});
  auto shape = c.get_ints("shape");
  for (auto d : shape)
    if (d < 0) c.fail("shape " + shape_str(shape) + " has a negative dim");
  view_common(c, r, [shape](const Layout& l) { return l.broadcast_to(shape); });
}
void slice(const Ctx& c, InferredNode& r) {
  c.allow({"dim", "start", "end", "step"});
  const auto dim = c.get_int("dim");
  std::optional<int64_t> start, end;
  if (c.has("start")) start = c.get_int("start");
  if (c.has("end")) end = c.get_int("end");
  const auto step = c.get_int("step", 1);
  if (step == 0) c.fail("step must not be 0");
  view_common(c, r, [=](const Layout& l) { return l.slice(dim, start, end, step); });
}
void squeeze(const Ctx& c, InferredNode& r) {
  c.allow({"dims"});
  std::optional<std::vector<int64_t>> dims;
  if (c.has("dims")) dims = c.get_ints("dims");
  view_common(c, r, [dims](const Layout& l) { return l.squeeze(dims); });
}
void unsqueeze(const Ctx& c, InferredNode& r) {
  c.allow({"dim"});
  const auto dim = c.get_int("dim");
  view_common(c, r, [dim](const Layout& l) { return l.unsqueeze(dim); });
}
void reshape(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  c.allow({"shape"});
  const auto& x = c.input(0);
  auto shape = c.get_ints("shape");
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer_at >= 0) c.fail("shape " + shape_str(shape) + " has more than one -1");
      infer_at = static_cast<int64_t>(i);
    } else if (shape[i] < 0) {
      c.fail("shape " + shape_str(shape) + " has a negative dim");
    } else {
      known *= shape[i];
    }
  }
  int64_t n = 1;
  for (auto d : x.shape) n *= d;
  if (infer_at >= 0) {
    if (known == 0 || n % known != 0) c.fail("cannot reshape " + shape_str(x.shape) + " to " + shape_str(shape));
    shape[infer_at] = n / known;
  }
  if (shape.size() > BP_MAX_RANK) c.fail("rank " + std::to_string(shape.size()) + " exceeds 8");
  if (known * (infer_at >= 0 ? shape[infer_at] : 1) != n)
    c.fail("cannot reshape " + shape_str(x.shape) + " (" + std::to_string(n) + " elements) to " + shape_str(shape));
  r.cls = OpClass::Reshape;
  r.out = {x.dtype, shape, {}};
  r.view = [shape](const Layout& l) { return l.reshape(shape); };
}
void contiguous(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  c.allow({});
  const auto& x = c.input(0);
  r.canon = Canon::Broadcast;
  r.params = params_of(BP_PARAMS_NONE);
  r.out = {x.dtype, x.shape, {}};
}
template <bool Owned> void slot_view(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  c.allow({"slot"});
  const auto& x = c.input(0);
  if (!x.is_bundle()) c.fail("input is not a multi-output op; 'view' reads a slot of topk, var_mean or selective_scan");
  const auto slot = c.get_int("slot");
  if (slot < 0 || slot >= static_cast<int64_t>(x.slots.size()))
    c.fail("slot " + std::to_string(slot) + " out of range (the producer has " + std::to_string(x.slots.size()) +
           " slots)");
  r.cls = Owned ? OpClass::SlotCopy : OpClass::Slot;
  r.slot = slot;
  r.out = {x.slots[slot].first, x.slots[slot].second, {}};
}

// ---- reductions ------------------------------------------------------------

template <unsigned Cls> void reduce(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  c.allow({"dims", "keepdim"});
  const auto& x = c.input(0);
  c.dtype_in(x, Cls, "input");
  r.params = params_of(BP_PARAMS_REDUCE);
  auto& p = r.params.u.reduce;
  const auto dims = reduce_dims(c, static_cast<int64_t>(x.shape.size()));
  p.n_dims = static_cast<uint32_t>(dims.size());
  std::copy(dims.begin(), dims.end(), p.dims);
  p.keepdim = c.get_bool("keepdim", false);
  if (c.node.op == "max" || c.node.op == "min")
    for (auto d : dims)
      if (x.shape[d] == 0) c.fail("reduction over the empty dim " + std::to_string(d) + " of " + shape_str(x.shape));
  r.out = {x.dtype, reduced_shape(x.shape, dims, p.keepdim), {}};
}

void arg_reduce(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  c.allow({"dim", "keepdim", "select_last_index"});
  const auto& x = c.input(0);
  c.dtype_in(x, kFloatInt, "input");
  r.params = params_of(BP_PARAMS_ARG_REDUCE);
  auto& p = r.params.u.arg_reduce;
  const auto rank = static_cast<int64_t>(x.shape.size());
  p.dim = static_cast<int32_t>(c.dim(c.get_int("dim"), rank));
  p.keepdim = c.get_bool("keepdim", false);
  p.select_last_index = c.get_bool("select_last_index", false);
  if (rank > 0 && x.shape[p.dim] == 0) c.fail("reduction over the empty dim " + std::to_string(p.dim));
  if (rank == 0) {
    r.out = {BP_DTYPE_I64, {}, {}};
    return;
  }
  r.out = {BP_DTYPE_I64, reduced_shape(x.shape, {p.dim}, p.keepdim), {}};
}

template <unsigned Cls> void dim_op(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  const bool is_cumsum = c.node.op == "cumsum";
  if (is_cumsum) c.allow({"dim", "exclusive", "reverse"});
  else c.allow({"dim"});
  const auto& x = c.input(0);
  c.dtype_in(x, Cls, "input");
  r.params = params_of(BP_PARAMS_DIM);
  r.params.u.dim.dim = static_cast<int32_t>(c.dim(c.get_int("dim"), static_cast<int64_t>(x.shape.size())));
  r.params.u.dim.exclusive = c.get_bool("exclusive", false);
  r.params.u.dim.reverse = c.get_bool("reverse", false);
  r.out = {x.dtype, x.shape, {}};
}

void layer_norm(const Ctx& c, InferredNode& r) {
  c.arity(1, 3);
  c.allow({"dims", "eps"});
  const auto& x = c.input(0);
  c.dtype_in(x, kFloat, "input");
  const auto rank = static_cast<int64_t>(x.shape.size());
  auto raw = c.get_ints("dims");
  if (raw.empty()) c.fail("dims must not be empty");
  std::set<int64_t> s;
  for (auto d : raw) s.insert(c.dim(d, rank));
  if (s.size() != raw.size() || *s.begin() != rank - static_cast<int64_t>(s.size()))
    c.fail("dims " + shape_str(raw) + " must be the trailing dims of rank " + std::to_string(rank));
  const Shape norm_shape(x.shape.end() - static_cast<int64_t>(s.size()), x.shape.end());
  for (size_t i = 1; i < c.in.size(); ++i) {
    if (!c.in[i]) continue;
    if (c.in[i]->dtype != x.dtype) c.fail((i == 1 ? "weight" : "bias") + std::string(" dtype differs from x"));
    if (c.in[i]->shape != norm_shape)
      c.fail((i == 1 ? "weight" : "bias") + std::string(" has shape ") + shape_str(c.in[i]->shape) + ", expected " +
             shape_str(norm_shape));
  }
  r.params = params_of(BP_PARAMS_LAYER_NORM);
  r.params.u.layer_norm.n_dims = static_cast<uint32_t>(s.size());
  r.params.u.layer_norm.eps = c.get_num("eps", 1e-5);
  r.out = {x.dtype, x.shape, {}};
}

void var_mean(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  c.allow({"dims", "correction", "keepdim"});
  const auto& x = c.input(0);
  c.dtype_in(x, kFloat, "input");
  r.params = params_of(BP_PARAMS_VAR_MEAN);
  auto& p = r.params.u.var_mean;
  const auto dims = reduce_dims(c, static_cast<int64_t>(x.shape.size()));
  p.n_dims = static_cast<uint32_t>(dims.size());
  std::copy(dims.begin(), dims.end(), p.dims);
  p.correction = c.get_num("correction", 1.0);
  p.keepdim = c.get_bool("keepdim", false);
  const Shape out = reduced_shape(x.shape, dims, p.keepdim);
  r.out = {x.dtype, out, {{x.dtype, out}, {x.dtype, out}}};
}

void topk(const Ctx& c, InferredNode& r) {
  c.arity(1, 1);
  c.allow({"k", "dim", "largest", "sorted"});
  const auto& x = c.input(0);
  c.dtype_in(x, kFloatInt, "input");
  const auto rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) c.fail("input must have rank >= 1");
  r.params = params_of(BP_PARAMS_TOPK);
  auto& p = r.params.u.topk;
  p.dim = static_cast<int32_t>(c.dim(c.get_int("dim", -1), rank));
  p.k = c.get_int("k");
  if (p.k < 0 || p.k > x.shape[p.dim])
    c.fail("k=" + std::to_string(p.k) + " out of range for dim " + std::to_string(p.dim) + " of size " +
           std::to_string(x.shape[p.dim]));
  p.largest = c.get_bool("largest", true);
  p.sorted = c.get_bool("sorted", true);
  Shape out = x.shape;
  out[p.dim] = p.k;
  r.out = {x.dtype, out, {{x.dtype, out}, {BP_DTYPE_I64, out}}};
}

void selective_scan(const Ctx& c, InferredNode& r) {
  c.arity(5, 5);
  c.allow({"delta_softplus"});
  const char* names[] = {"u", "delta", "a", "b", "c"};
  const auto& u = c.input(0);
  c.dtype_in(u, kFloat, "u");
  for (size_t i = 0; i < 5; ++i) {
    const auto& v = c.input(i);
    if (v.dtype != u.dtype) c.fail(std::string(names[i]) + " dtype differs from u");
    if (v.shape.size() != (i == 2 ? 2u : 3u))
      c.fail(std::string(names[i]) + " has shape " + shape_str(v.shape) + "; expected rank " + (i == 2 ? "2" : "3"));
  }
  const int64_t B = u.shape[0], L = u.shape[1], D = u.shape[2];
  const int64_t N = c.input(2).shape[1];
  auto expect = [&](size_t i, const Shape& s) {
    if (c.input(i).shape != s)
      c.fail(std::string(names[i]) + " has shape " + shape_str(c.input(i).shape) + ", expected " + shape_str(s));
  };
  expect(1, {B, L, D});
  expect(2, {D, N});
  expect(3, {B, L, N});
  expect(4, {B, L, N});
  r.params = params_of(BP_PARAMS_SELECTIVE_SCAN);
  r.params.u.selective_scan.delta_softplus = c.get_bool("delta_softplus", false);
  r.out = {u.dtype, {B, L, D}, {{u.dtype, {B, L, D}}, {u.dtype, {B, D, N}}}};
}

// ---- linear algebra, conv, indexing ----------------------------------------

void matmul(const Ctx& c, InferredNode& r) {
  c.arity(2, 2);
  c.allow({});
  const auto& a = c.input(0);
  const auto& b = c.input(1);
  c.dtype_in(a, kFloatInt, "input 0");
  if (a.dtype != b.dtype) c.fail("inputs have dtypes " + std::string(dtype_name(a.dtype)) + " and " + std::string(dtype_name(b.dtype)));
  if (a.shape.empty() || b.shape.empty()) c.fail("matmul does not take rank-0 inputs");
  Shape as = a.shape, bs = b.shape;
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  const int64_t M = as[as.size() - 2], K = as.back(), K2 = bs[bs.size() - 2], N = bs.back();
  if (K != K2) c.fail("shapes " + shape_str(a.shape) + " and " + shape_str(b.shape) + " do not match (" + std::to_string(K) + " vs " + std::to_string(K2) + ")");
  ValueType ab{a.dtype, Shape(as.begin(), as.end() - 2), {}}, bb{b.dtype, Shape(bs.begin(), bs.end() - 2), {}};
  Shape out = broadcast_shapes(c, {&ab, &bb});
  if (!a1) out.push_back(M);
  if (!b1) out.push_back(N);
  if (out.size() > BP_MAX_RANK) c.fail("result rank exceeds 8");
  r.canon = Canon::Matmul;
  r.params = params_of(BP_PARAMS_NONE);
  r.out = {a.dtype, out, {}};
}

std::array<int64_t, 2> pair_param(const Ctx& c, const char* name, int64_t dflt) {
  if (!c.has(name)) return {dflt, dflt};
  auto v = c.get_ints(name);
  if (v.size() == 1) return {v[0], v[0]};
  if (v.size() == 2) return {v[0], v[1]};
  c.fail(std::string("param '") + name + "' takes an int or 2 values");
}

void conv2d(const Ctx& c, InferredNode& r) {
  c.arity(2, 3);
  c.allow({"stride", "padding", "dilation", "groups"});
  const auto& x = c.input(0);
  const auto& w = c.input(1);
  c.dtype_in(x, kFloat, "x");
  if (w.dtype != x.dtype) c.fail("w dtype differs from x");
  if (x.shape.size() != 4) c.fail("x has shape " + shape_str(x.shape) + "; expected [N, C, H, W]");
  if (w.shape.size() != 4) c.fail("w has shape " + shape_str(w.shape) + "; expected [O, C/groups, kH, kW]");
  r.params = params_of(BP_PARAMS_CONV2D);
  auto& p = r.params.u.conv2d;
  const auto st = pair_param(c, "stride", 1), dl = pair_param(c, "dilation", 1);
  p.stride[0] = st[0]; p.stride[1] = st[1];
  p.dilation[0] = dl[0]; p.dilation[1] = dl[1];
  if (c.has("padding")) {
    auto v = c.get_ints("padding");
    if (v.size() == 1) v = {v[0], v[0], v[0], v[0]};
    else if (v.size() == 2) v = {v[0], v[1], v[0], v[1]};
    else if (v.size() != 4) c.fail("param 'padding' takes an int, 2 or 4 values");
    std::copy(v.begin(), v.end(), p.padding);
  }
  p.groups = c.get_int("groups", 1);
  if (p.stride[0] < 1 || p.stride[1] < 1 || p.dilation[0] < 1 || p.dilation[1] < 1) c.fail("stride and dilation must be >= 1");
  for (auto v : p.padding)
    if (v < 0) c.fail("padding must be >= 0");
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t O = w.shape[0], Cg = w.shape[1], kH = w.shape[2], kW = w.shape[3];
  if (p.groups < 1 || C % p.groups != 0 || O % p.groups != 0)
    c.fail("groups=" + std::to_string(p.groups) + " must divide C=" + std::to_string(C) + " and O=" + std::to_string(O));
  if (Cg != C / p.groups) c.fail("w has " + std::to_string(Cg) + " input channels per group, expected " + std::to_string(C / p.groups));
  if (c.in.size() == 3 && c.in[2]) {
    if (c.in[2]->dtype != x.dtype) c.fail("bias dtype differs from x");
    if (c.in[2]->shape != Shape{O}) c.fail("bias has shape " + shape_str(c.in[2]->shape) + ", expected [" + std::to_string(O) + "]");
  }
  const int64_t Ho = (H + p.padding[0] + p.padding[2] - p.dilation[0] * (kH - 1) - 1) / p.stride[0] + 1;
  const int64_t Wo = (W + p.padding[1] + p.padding[3] - p.dilation[1] * (kW - 1) - 1) / p.stride[1] + 1;
  if (Ho < 0 || Wo < 0 || H + p.padding[0] + p.padding[2] < p.dilation[0] * (kH - 1) + 1 ||
      W + p.padding[1] + p.padding[3] < p.dilation[1] * (kW - 1) + 1)
    c.fail("kernel " + shape_str({kH, kW}) + " larger than padded input " + shape_str({H, W}));
  r.out = {x.dtype, {N, O, Ho, Wo}, {}};
}

void gather(const Ctx& c, InferredNode& r) {
  c.arity(2, 2);
  c.allow({"dim"});
  const auto& x = c.input(0);
  const auto& idx = c.input(1);
  if (idx.dtype != BP_DTYPE_I64) c.fail("index has dtype " + std::string(dtype_name(idx.dtype)) + ", not i64");
  const auto rank = static_cast<int64_t>(x.shape.size());
  if (static_cast<int64_t>(idx.shape.size()) != rank)
    c.fail("index rank " + std::to_string(idx.shape.size()) + " differs from input rank " + std::to_string(rank));
  r.params = params_of(BP_PARAMS_DIM);
  r.params.u.dim.dim = static_cast<int32_t>(c.dim(c.get_int("dim"), rank));
  for (int64_t i = 0; i < rank; ++i)
    if (i != r.params.u.dim.dim && idx.shape[i] > x.shape[i])
      c.fail("index shape " + shape_str(idx.shape) + " exceeds input shape " + shape_str(x.shape) + " in dim " + std::to_string(i));
  r.out = {x.dtype, idx.shape, {}};
}

void index_select(const Ctx& c, InferredNode& r) {
  c.arity(2, 2);
  c.allow({"dim"});
  const auto& x = c.input(0);
  const auto& idx = c.input(1);
  if (idx.dtype != BP_DTYPE_I64) c.fail("index has dtype " + std::string(dtype_name(idx.dtype)) + ", not i64");
  const auto rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) c.fail("input must have rank >= 1");
  r.params = params_of(BP_PARAMS_DIM);
  const auto d = c.dim(c.get_int("dim"), rank);
  r.params.u.dim.dim = static_cast<int32_t>(d);
  Shape out(x.shape.begin(), x.shape.begin() + d);
  out.insert(out.end(), idx.shape.begin(), idx.shape.end());
  out.insert(out.end(), x.shape.begin() + d + 1, x.shape.end());
  if (out.size() > BP_MAX_RANK) c.fail("result rank exceeds 8");
  if (x.shape[d] == 0 && !idx.shape.empty() && std::find(idx.shape.begin(), idx.shape.end(), 0) == idx.shape.end())
    c.fail("cannot select from the empty dim " + std::to_string(d));
  r.out = {x.dtype, out, {}};
}

void concat(const Ctx& c, InferredNode& r) {
  if (c.in.empty()) c.fail("takes at least one input");
  c.allow({"dim"});
  const auto& x = c.input(0);
  const auto rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) c.fail("inputs must have rank >= 1");
  const auto d = c.dim(c.get_int("dim"), rank);
  Shape out = x.shape;
  out[d] = 0;
  for (size_t i = 0; i < c.in.size(); ++i) {
    const auto& v = c.input(i);
    if (v.dtype != x.dtype) c.fail("input " + std::to_string(i) + " has dtype " + std::string(dtype_name(v.dtype)) + ", input 0 " + std::string(dtype_name(x.dtype)));
    if (static_cast<int64_t>(v.shape.size()) != rank) c.fail("input " + std::to_string(i) + " has rank " + std::to_string(v.shape.size()));
    for (int64_t k = 0; k < rank; ++k)
      if (k != d && v.shape[k] != x.shape[k])
        c.fail("input " + std::to_string(i) + " has shape " + shape_str(v.shape) + ", input 0 " + shape_str(x.shape));
    out[d] += v.shape[d];
  }
  r.params = params_of(BP_PARAMS_DIM);
  r.params.u.dim.dim = static_cast<int32_t>(d);
  r.out = {x.dtype, out, {}};
}

const std::unordered_map<std::string, OpDef>& registry() {
  static const std::unordered_map<std::string, OpDef> ops = [] {
    std::unordered_map<std::string, OpDef> m;
    for (auto* n : {"neg", "abs", "sign"}) m[n] = {unary<kFloatInt>};
    for (auto* n : {"sqr", "sqrt", "rsqrt", "recip", "exp", "log", "sin", "cos", "tanh", "erf", "floor", "ceil",
                    "round", "relu", "sigmoid", "silu", "softplus"})
      m[n] = {unary<kFloat>};
    m["gelu"] = {gelu};
    m["clamp"] = {clamp};
    m["affine"] = {affine};
    m["cast"] = {cast};
    for (auto* n : {"add", "sub", "mul", "div", "maximum", "minimum"}) m[n] = {binary<kFloatInt, false>};
    m["pow"] = {binary<kFloat, false>};
    for (auto* n : {"eq", "ne", "lt", "le", "gt", "ge"}) m[n] = {binary<kAll, true>};
    m["where"] = {where};
    m["reshape"] = {reshape};
    m["permute"] = {permute};
    m["transpose"] = {transpose};
    m["broadcast_to"] = {broadcast_to};
    m["slice"] = {slice};
    m["squeeze"] = {squeeze};
    m["unsqueeze"] = {unsqueeze};
    m["contiguous"] = {contiguous};
    m["view"] = {slot_view<false>};
    m["view_owned"] = {slot_view<true>};
    for (auto* n : {"sum", "prod", "max", "min"}) m[n] = {reduce<kFloatInt>};
    m["mean"] = {reduce<kFloat>};
    m["argmax"] = m["argmin"] = {arg_reduce};
    m["softmax"] = m["log_softmax"] = {dim_op<kFloat>};
    m["cumsum"] = {dim_op<kFloatInt>};
    m["layer_norm"] = {layer_norm};
    m["matmul"] = {matmul};
    m["conv2d"] = {conv2d};
    m["gather"] = {gather};
    m["index_select"] = {index_select};
    m["concat"] = {concat};
    m["topk"] = {topk};
    m["var_mean"] = {var_mean};
    m["selective_scan"] = {selective_scan};
    return m;
  }();
  return ops;
}

}  // namespace

int64_t normalize_dim(int64_t dim, int64_t rank, const std::string& what) {
  if (dim < -rank || dim >= rank)
    throw Error(what + ": dim " + std::to_string(dim) + " out of range for rank " + std::to_string(rank));
  return dim < 0 ? dim + rank : dim;
}

bool is_known_op(const std::string& op) { return registry().count(op) > 0; }

// Only layer_norm (weight, bias) and conv2d (bias) have optional inputs.
OptionalInputs optional_inputs(const std::string& op) {
  if (op == "layer_norm") return {1, 3};
  if (op == "conv2d") return {2, 3};
  return {};
}
bool is_custom_op(const std::string& op) { return op.find('.') != std::string::npos; }

std::vector<std::string> known_ops() {
  std::vector<std::string> v;
  for (auto& [k, _] : registry()) v.push_back(k);
  std::sort(v.begin(), v.end());
  return v;
}

InferredNode infer_node(const Node& node, const std::vector<const ValueType*>& inputs) {
  const auto it = registry().find(node.op);
  if (it == registry().end()) throw Error("node '" + node.name + "': unknown op '" + node.op + "'");
  Ctx c{node, inputs};
  const OptionalInputs opt = optional_inputs(node.op);
  const size_t first_optional = opt.total ? opt.first : inputs.size();
  for (size_t i = 0; i < std::min(first_optional, inputs.size()); ++i)
    if (!inputs[i]) c.fail("input " + std::to_string(i) + " is null but not optional");
  const bool slot_op = node.op == "view" || node.op == "view_owned";
  if (!slot_op) c.not_bundle();
  InferredNode r;
  it->second.infer(c, r);
  if (r.out.shape.size() > BP_MAX_RANK) c.fail("result rank exceeds 8");
  return r;
}

}  // namespace backplane::detail
