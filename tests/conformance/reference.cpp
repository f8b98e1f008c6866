#include "conformance/reference.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numbers>
#include <numeric>
#include <optional>

namespace backplane::conformance {

namespace {

[[noreturn]] void bad(const std::string& op, const std::string& what) {
  throw std::invalid_argument("reference " + op + ": " + what);
}

// ---------------------------------------------------------------------------
// Params (lenient: the reference does not police unknown names, the core does)

bool has(const Json& p, const char* name) { return p.is_object() && p.contains(name) && !p[name].is_null(); }

int64_t p_int(const Json& p, const char* name, int64_t def) {
  return has(p, name) ? p[name].get<int64_t>() : def;
}
bool p_bool(const Json& p, const char* name, bool def) { return has(p, name) ? p[name].get<bool>() : def; }
double p_double(const Json& p, const char* name, double def) {
  return has(p, name) ? p[name].get<double>() : def;
}
// An int or a list of ints; nullopt when absent.
std::optional<std::vector<int64_t>> p_ints(const Json& p, const char* name) {
  if (!has(p, name)) return std::nullopt;
  const Json& v = p[name];
  if (v.is_number_integer()) return std::vector<int64_t>{v.get<int64_t>()};
  return v.get<std::vector<int64_t>>();
}
int64_t require_int(const std::string& op, const Json& p, const char* name) {
  if (!has(p, name)) bad(op, std::string("missing param ") + name);
  return p[name].get<int64_t>();
}

int64_t norm_dim(const std::string& op, int64_t d, int64_t rank) {
  const int64_t r = d < 0 ? d + rank : d;
  if (r < 0 || r >= rank) bad(op, "dim " + std::to_string(d) + " out of range for rank " + std::to_string(rank));
  return r;
}

std::vector<int64_t> norm_dims(const std::string& op, const std::vector<int64_t>& dims, int64_t rank) {
  if (dims.empty()) bad(op, "dims: [] is ambiguous");
  std::vector<int64_t> out;
  for (int64_t d : dims) out.push_back(norm_dim(op, d, rank));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end()) bad(op, "repeated dim");
  return out;
}

int64_t rank_of(const HostTensor& t) { return static_cast<int64_t>(t.shape.size()); }

// ---------------------------------------------------------------------------
// Integer arithmetic with two's-complement wrap (no UB)

int64_t wadd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
int64_t wsub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
int64_t wmul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
int64_t wneg(int64_t a) { return static_cast<int64_t>(0 - static_cast<uint64_t>(a)); }

// ---------------------------------------------------------------------------
// Broadcasting (NumPy)

Shape broadcast_shapes(const std::string& op, const std::vector<Shape>& shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  Shape out(rank, 1);
  for (const auto& s : shapes) {
    for (size_t k = 0; k < s.size(); ++k) {
      const size_t o = rank - s.size() + k;
      if (s[k] == out[o]) continue;
      if (out[o] == 1) {
        out[o] = s[k];
      } else if (s[k] != 1) {
        bad(op, "shapes do not broadcast");
      }
    }
  }
  return out;
}

// Dense flat index into a tensor of shape `in` for an index of the
// broadcast output (aligned from the right; size-1 dims stretch).
int64_t broadcast_flat(const std::vector<int64_t>& out_idx, const Shape& in) {
  int64_t flat = 0;
  const size_t lead = out_idx.size() - in.size();
  for (size_t k = 0; k < in.size(); ++k) {
    const int64_t i = in[k] == 1 ? 0 : out_idx[lead + k];
    flat = flat * in[k] + i;
  }
  return flat;
}

int64_t flat_of(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t flat = 0;
  for (size_t k = 0; k < shape.size(); ++k) flat = flat * shape[k] + idx[k];
  return flat;
}

// outer x n x inner decomposition around one dim of a dense tensor.
struct Around {
  int64_t outer = 1, n = 1, inner = 1;
  int64_t at(int64_t o, int64_t j, int64_t i) const { return (o * n + j) * inner + i; }
};
Around around(const Shape& s, int64_t dim) {
  Around a;
  for (int64_t k = 0; k < dim; ++k) a.outer *= s[static_cast<size_t>(k)];
  a.n = s[static_cast<size_t>(dim)];
  for (size_t k = static_cast<size_t>(dim) + 1; k < s.size(); ++k) a.inner *= s[k];
  return a;
}

void copy_elem(RefTensor& out, int64_t k, const HostTensor& in, int64_t j) {
  if (out.is_float_dtype()) {
    out.f[static_cast<size_t>(k)] = round_to_dtype(load_f64(in, j), out.dtype);
  } else {
    out.i[static_cast<size_t>(k)] = wrap_to_dtype(load_i64(in, j), out.dtype);
  }
}

const HostTensor& need(const std::string& op, const std::vector<const HostTensor*>& in, size_t k) {
  if (k >= in.size() || in[k] == nullptr) bad(op, "missing input " + std::to_string(k));
  return *in[k];
}

// ---------------------------------------------------------------------------
// Views over a dense tensor: shape, strides and offset in elements.

struct RefView {
  Shape shape;
  std::vector<int64_t> strides;
  int64_t offset = 0;
};

RefView dense_view(const Shape& s) { return RefView{s, dense_strides(s), 0}; }

RefView apply_view(const std::string& op, const RefView& v, const Json& p) {
  const auto rank = static_cast<int64_t>(v.shape.size());
  RefView r = v;
  if (op == "contiguous") return r;
  if (op == "reshape") {
    if (v.strides != dense_strides(v.shape) || v.offset != 0) bad(op, "reference reshape needs dense input");
    Shape shape = p.at("shape").get<Shape>();
    int64_t known = 1, infer = -1;
    for (size_t k = 0; k < shape.size(); ++k) {
      if (shape[k] == -1) {
        if (infer >= 0) bad(op, "two -1 entries");
        infer = static_cast<int64_t>(k);
      } else if (shape[k] < 0) {
        bad(op, "negative size");
      } else {
        known *= shape[k];
      }
    }
    const int64_t n = shape_numel(v.shape);
    if (infer >= 0) {
      if (known == 0 || n % known != 0) bad(op, "cannot infer -1");
      shape[static_cast<size_t>(infer)] = n / known;
    }
    if (shape_numel(shape) != n) bad(op, "element count differs");
    return dense_view(shape);
  }
  if (op == "permute") {
    auto dims = p.at("dims").get<std::vector<int64_t>>();
    if (static_cast<int64_t>(dims.size()) != rank) bad(op, "dims must name every dim");
    std::vector<bool> used(static_cast<size_t>(rank), false);
    for (size_t k = 0; k < dims.size(); ++k) {
      const int64_t d = norm_dim(op, dims[k], rank);
      if (used[static_cast<size_t>(d)]) bad(op, "repeated dim");
      used[static_cast<size_t>(d)] = true;
      r.shape[k] = v.shape[static_cast<size_t>(d)];
      r.strides[k] = v.strides[static_cast<size_t>(d)];
    }
    return r;
  }
  if (op == "transpose") {
    const auto d0 = static_cast<size_t>(norm_dim(op, require_int(op, p, "dim0"), rank));
    const auto d1 = static_cast<size_t>(norm_dim(op, require_int(op, p, "dim1"), rank));
    std::swap(r.shape[d0], r.shape[d1]);
    std::swap(r.strides[d0], r.strides[d1]);
    return r;
  }
  if (op == "broadcast_to") {
    const Shape target = p.at("shape").get<Shape>();
    if (target.size() < v.shape.size()) bad(op, "target rank smaller than input rank");
    r.shape = target;
    r.strides.assign(target.size(), 0);
    const size_t lead = target.size() - v.shape.size();
    for (size_t k = 0; k < v.shape.size(); ++k) {
      if (v.shape[k] == target[lead + k]) {
        r.strides[lead + k] = v.strides[k];
      } else if (v.shape[k] != 1) {
        bad(op, "cannot broadcast");
      }
    }
    return r;
  }
  if (op == "slice") {
    const auto d = static_cast<size_t>(norm_dim(op, require_int(op, p, "dim"), rank));
    const int64_t step = p_int(p, "step", 1);
    if (step == 0) bad(op, "step 0");
    const int64_t n = v.shape[d];
    // NumPy's clamping.
    int64_t start, end;
    if (step > 0) {
      start = has(p, "start") ? p["start"].get<int64_t>() : 0;
      end = has(p, "end") ? p["end"].get<int64_t>() : n;
      if (start < 0) start += n;
      if (end < 0) end += n;
      start = std::clamp<int64_t>(start, 0, n);
      end = std::clamp<int64_t>(end, 0, n);
    } else {
      start = has(p, "start") ? p["start"].get<int64_t>() : n - 1;
      end = has(p, "end") ? p["end"].get<int64_t>() : -1 - n;  // "before index 0"
      if (start < 0) start += n;
      if (end < 0) end += n;
      start = std::clamp<int64_t>(start, -1, n - 1);
      end = std::clamp<int64_t>(end, -1, n - 1);
    }
    int64_t len = 0;
    if (step > 0 && end > start) len = (end - start + step - 1) / step;
    if (step < 0 && start > end) len = (start - end + (-step) - 1) / (-step);
    r.shape[d] = len;
    r.strides[d] = v.strides[d] * step;
    if (len > 0) r.offset = v.offset + start * v.strides[d];
    return r;
  }
  if (op == "squeeze") {
    auto dims = p_ints(p, "dims");
    std::vector<bool> drop(static_cast<size_t>(rank), false);
    if (dims) {
      for (int64_t d0 : *dims) {
        const auto d = static_cast<size_t>(norm_dim(op, d0, rank));
        if (v.shape[d] != 1) bad(op, "squeeze of a dim whose size is not 1");
        drop[d] = true;
      }
    } else {
      for (size_t k = 0; k < v.shape.size(); ++k) drop[k] = v.shape[k] == 1;
    }
    r.shape.clear();
    r.strides.clear();
    for (size_t k = 0; k < v.shape.size(); ++k) {
      if (drop[k]) continue;
      r.shape.push_back(v.shape[k]);
      r.strides.push_back(v.strides[k]);
    }
    return r;
  }
  if (op == "unsqueeze") {
    const int64_t d = norm_dim(op, require_int(op, p, "dim"), rank + 1);
    r.shape.insert(r.shape.begin() + d, 1);
    r.strides.insert(r.strides.begin() + d, 0);
    return r;
  }
  bad(op, "not a view op");
}

HostTensor materialize(const HostTensor& x, const RefView& v) {
  HostTensor out = make_tensor(x.dtype, v.shape);
  const size_t es = dtype_size(x.dtype);
  for (MultiIndex m(v.shape); m; ++m) {
    int64_t src = v.offset;
    for (size_t k = 0; k < v.shape.size(); ++k) src += m[k] * v.strides[k];
    std::memcpy(out.bytes.data() + static_cast<size_t>(m.flat()) * es, x.bytes.data() + static_cast<size_t>(src) * es,
                es);
  }
  return out;
}

bool is_view_op(const std::string& op) {
  static const char* const ops[] = {"contiguous", "reshape",  "permute", "transpose",
                                    "broadcast_to", "slice", "squeeze", "unsqueeze"};
  return std::find_if(std::begin(ops), std::end(ops), [&](const char* o) { return op == o; }) != std::end(ops);
}

// ---------------------------------------------------------------------------
// Elementwise

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }

// Round half to even, keeping the sign of zero.
double round_half_even(double x) {
  if (!std::isfinite(x)) return x;
  const double fl = std::floor(x);
  const double diff = x - fl;
  double r;
  if (diff > 0.5) {
    r = fl + 1.0;
  } else if (diff < 0.5) {
    r = fl;
  } else {
    r = std::fmod(fl, 2.0) == 0.0 ? fl : fl + 1.0;
  }
  return r == 0.0 ? std::copysign(0.0, x) : r;
}

std::optional<double> unary_float(const std::string& op, double x, const Json& p) {
  if (op == "neg") return -x;
  if (op == "abs") return std::fabs(x);
  if (op == "sign") {
    if (std::isnan(x)) return x;
    if (x > 0) return 1.0;
    if (x < 0) return -1.0;
    return x;  // +-0
  }
  if (op == "sqr") return x * x;
  if (op == "sqrt") return std::sqrt(x);
  if (op == "rsqrt") return 1.0 / std::sqrt(x);
  if (op == "recip") return 1.0 / x;
  if (op == "exp") return std::exp(x);
  if (op == "log") return std::log(x);
  if (op == "sin") return std::sin(x);
  if (op == "cos") return std::cos(x);
  if (op == "tanh") return std::tanh(x);
  if (op == "erf") return std::erf(x);
  if (op == "floor") return std::floor(x);
  if (op == "ceil") return std::ceil(x);
  if (op == "round") return round_half_even(x);
  if (op == "relu") {
    if (std::isnan(x)) return x;
    return x > 0 ? x : 0.0;
  }
  if (op == "sigmoid") return sigmoid(x);
  if (op == "silu") return x * sigmoid(x);
  if (op == "softplus") return softplus(x);
  if (op == "gelu") {
    const std::string approx = has(p, "approximate") ? p["approximate"].get<std::string>() : "none";
    if (approx == "tanh") {
      const double k = std::sqrt(2.0 / std::numbers::pi);
      return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
    }
    if (approx != "none") bad(op, "approximate must be none or tanh");
    return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  }
  if (op == "clamp") {
    if (std::isnan(x)) return x;
    double y = x;
    if (has(p, "min")) y = std::max(y, p["min"].get<double>());
    if (has(p, "max")) y = std::min(y, p["max"].get<double>());
    return y;
  }
  if (op == "affine") return p_double(p, "mul", 1.0) * x + p_double(p, "add", 0.0);
  return std::nullopt;
}

std::optional<int64_t> unary_int(const std::string& op, int64_t x, const Json& p) {
  if (op == "neg") return wneg(x);
  if (op == "abs") return x < 0 ? wneg(x) : x;
  if (op == "sign") return static_cast<int64_t>((x > 0) - (x < 0));
  if (op == "clamp") {
    int64_t y = x;
    if (has(p, "min")) y = std::max(y, p["min"].get<int64_t>());
    if (has(p, "max")) y = std::min(y, p["max"].get<int64_t>());
    return y;
  }
  return std::nullopt;
}

std::vector<RefTensor> ref_unary(const std::string& op, const HostTensor& x, const Json& p) {
  RefTensor out(x.dtype, x.shape);
  const int64_t n = shape_numel(x.shape);
  if (is_float(x.dtype)) {
    for (int64_t k = 0; k < n; ++k) {
      auto y = unary_float(op, load_f64(x, k), p);
      if (!y) bad(op, "not a unary op");
      out.set(k, *y);
    }
  } else if (is_int(x.dtype)) {
    for (int64_t k = 0; k < n; ++k) {
      auto y = unary_int(op, load_i64(x, k), p);
      if (!y) bad(op, "not defined on integer dtypes");
      out.set_int(k, *y);
    }
  } else {
    bad(op, "not defined on bool");
  }
  return {out};
}

bool is_compare(const std::string& op) {
  return op == "eq" || op == "ne" || op == "lt" || op == "le" || op == "gt" || op == "ge";
}

template <typename T> bool compare(const std::string& op, T a, T b) {
  if (op == "eq") return a == b;
  if (op == "ne") return a != b;  // NaN != NaN is true: the one comparison that holds
  if (op == "lt") return a < b;
  if (op == "le") return a <= b;
  if (op == "gt") return a > b;
  return a >= b;
}

double binary_float(const std::string& op, double a, double b) {
  if (op == "add") return a + b;
  if (op == "sub") return a - b;
  if (op == "mul") return a * b;
  if (op == "div") return a / b;
  if (op == "maximum") return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
  if (op == "minimum") return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::min(a, b);
  if (op == "pow") return std::pow(a, b);
  bad(op, "not a binary op");
}

int64_t binary_int(const std::string& op, int64_t a, int64_t b) {
  if (op == "add") return wadd(a, b);
  if (op == "sub") return wsub(a, b);
  if (op == "mul") return wmul(a, b);
  if (op == "div") {
    if (b == 0) throw ReferenceError("div: integer division by zero");
    if (b == -1) return wneg(a);  // INT_MIN / -1 wraps instead of trapping
    return a / b;                 // C++ truncates toward zero
  }
  if (op == "maximum") return std::max(a, b);
  if (op == "minimum") return std::min(a, b);
  bad(op, "not defined on integer dtypes");
}

std::vector<RefTensor> ref_binary(const std::string& op, const HostTensor& a, const HostTensor& b) {
  const Shape shape = broadcast_shapes(op, {a.shape, b.shape});
  const bool cmp = is_compare(op);
  RefTensor out(cmp ? BP_DTYPE_BOOL : a.dtype, shape);
  const bool fl = is_float(a.dtype);
  if (!cmp && !fl && !is_int(a.dtype)) bad(op, "not defined on bool");
  for (MultiIndex m(shape); m; ++m) {
    const int64_t ia = broadcast_flat(m.idx(), a.shape), ib = broadcast_flat(m.idx(), b.shape);
    if (cmp) {
      const bool r = fl ? compare(op, load_f64(a, ia), load_f64(b, ib)) : compare(op, load_i64(a, ia), load_i64(b, ib));
      out.set_int(m.flat(), r ? 1 : 0);
    } else if (fl) {
      out.set(m.flat(), binary_float(op, load_f64(a, ia), load_f64(b, ib)));
    } else {
      out.set_int(m.flat(), binary_int(op, load_i64(a, ia), load_i64(b, ib)));
    }
  }
  return {out};
}

std::vector<RefTensor> ref_where(const HostTensor& c, const HostTensor& a, const HostTensor& b) {
  const Shape shape = broadcast_shapes("where", {c.shape, a.shape, b.shape});
  RefTensor out(a.dtype, shape);
  for (MultiIndex m(shape); m; ++m) {
    const bool take_a = load_i64(c, broadcast_flat(m.idx(), c.shape)) != 0;
    const HostTensor& src = take_a ? a : b;
    copy_elem(out, m.flat(), src, broadcast_flat(m.idx(), src.shape));
  }
  return {out};
}

std::vector<RefTensor> ref_cast(const HostTensor& x, const Json& p) {
  const auto to = dtype_from_name(p.at("dtype").get<std::string>());
  if (!to) bad("cast", "unknown dtype");
  RefTensor out(*to, x.shape);
  const int64_t n = shape_numel(x.shape);
  for (int64_t k = 0; k < n; ++k) {
    if (is_float(x.dtype)) {
      const double v = load_f64(x, k);
      if (is_float(*to)) {
        out.set(k, v);
      } else if (*to == BP_DTYPE_BOOL) {
        out.set_int(k, v != 0.0 ? 1 : 0);  // NumPy/PyTorch/ONNX: nonzero is true
      } else {
        if (!std::isfinite(v)) throw ReferenceError("cast: NaN or infinity to an integer dtype");
        const double t = std::trunc(v);
        // Compare in double against the exact bounds (2^63 is exact in double).
        if (t < static_cast<double>(int_min(*to)) || t >= std::ldexp(static_cast<double>(int_max(*to) / 2 + 1), 1))
          throw ReferenceError("cast: value out of range of the integer dtype");
        out.set_int(k, static_cast<int64_t>(t));
      }
    } else {
      const int64_t v = load_i64(x, k);
      if (is_float(*to)) {
        out.set(k, static_cast<double>(v));
      } else {
        out.set_int(k, v);  // wraps; bool: v != 0
      }
    }
  }
  return {out};
}

// ---------------------------------------------------------------------------
// Reductions

struct ReducePlan {
  Shape out_shape;
  std::vector<bool> reduced;
  int64_t count = 1;  // elements per output
};

ReducePlan plan_reduce(const std::string& op, const Shape& in, const Json& p, const char* dims_name) {
  const auto rank = static_cast<int64_t>(in.size());
  ReducePlan r;
  r.reduced.assign(in.size(), false);
  auto dims = p_ints(p, dims_name);
  if (dims) {
    for (int64_t d : norm_dims(op, *dims, rank)) r.reduced[static_cast<size_t>(d)] = true;
  } else {
    r.reduced.assign(in.size(), true);
  }
  const bool keepdim = p_bool(p, "keepdim", false);
  for (size_t k = 0; k < in.size(); ++k) {
    if (r.reduced[k]) {
      r.count *= in[k];
      if (keepdim) r.out_shape.push_back(1);
    } else {
      r.out_shape.push_back(in[k]);
    }
  }
  return r;
}

int64_t reduce_out_flat(const ReducePlan& r, const std::vector<int64_t>& in_idx, const Shape& in) {
  int64_t flat = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    if (r.reduced[k]) continue;
    flat = flat * in[k] + in_idx[k];
  }
  return flat;
}

std::vector<RefTensor> ref_reduce(const std::string& op, const HostTensor& x, const Json& p) {
  const ReducePlan r = plan_reduce(op, x.shape, p, "dims");
  RefTensor out(x.dtype, r.out_shape);
  const int64_t n_out = shape_numel(r.out_shape);
  const bool fl = is_float(x.dtype);
  if (!fl && !is_int(x.dtype)) bad(op, "not defined on bool");
  if (op == "mean" && !fl) bad(op, "float only");
  if ((op == "max" || op == "min") && r.count == 0 && n_out > 0)
    throw ReferenceError(op + ": reduction over an empty axis");
  std::vector<double> facc(static_cast<size_t>(n_out));
  std::vector<int64_t> iacc(static_cast<size_t>(n_out));
  std::vector<bool> seen(static_cast<size_t>(n_out), false);
  const double finit = op == "prod" ? 1.0 : 0.0;
  std::fill(facc.begin(), facc.end(), finit);
  std::fill(iacc.begin(), iacc.end(), op == "prod" ? 1 : 0);
  for (MultiIndex m(x.shape); m; ++m) {
    const auto o = static_cast<size_t>(reduce_out_flat(r, m.idx(), x.shape));
    if (fl) {
      const double v = load_f64(x, m.flat());
      if (op == "sum" || op == "mean") {
        facc[o] += v;
      } else if (op == "prod") {
        facc[o] *= v;
      } else if (op == "max" || op == "min") {
        if (!seen[o] || std::isnan(v)) {
          facc[o] = v;  // the first value, or NaN, which then stays (see below)
        } else if (!std::isnan(facc[o])) {
          facc[o] = op == "max" ? std::max(facc[o], v) : std::min(facc[o], v);
        }
      } else {
        bad(op, "not a reduction");
      }
    } else {
      const int64_t v = load_i64(x, m.flat());
      if (op == "sum") {
        iacc[o] = wadd(iacc[o], v);
      } else if (op == "prod") {
        iacc[o] = wmul(iacc[o], v);
      } else if (op == "max") {
        iacc[o] = seen[o] ? std::max(iacc[o], v) : v;
      } else if (op == "min") {
        iacc[o] = seen[o] ? std::min(iacc[o], v) : v;
      } else {
        bad(op, "not a reduction");
      }
    }
    seen[o] = true;
  }
  for (int64_t k = 0; k < n_out; ++k) {
    if (fl) {
      double v = facc[static_cast<size_t>(k)];
      if (op == "mean") v /= static_cast<double>(r.count);
      out.set(k, v);
    } else {
      out.set_int(k, iacc[static_cast<size_t>(k)]);
    }
  }
  return {out};
}

std::vector<RefTensor> ref_argreduce(const std::string& op, const HostTensor& x, const Json& p) {
  const int64_t dim = norm_dim(op, require_int(op, p, "dim"), rank_of(x));
  const bool keepdim = p_bool(p, "keepdim", false), last = p_bool(p, "select_last_index", false);
  const bool is_max = op == "argmax";
  Shape shape = x.shape;
  if (keepdim) {
    shape[static_cast<size_t>(dim)] = 1;
  } else {
    shape.erase(shape.begin() + dim);
  }
  const Around a = around(x.shape, dim);
  if (a.n == 0 && a.outer * a.inner > 0) throw ReferenceError(op + ": reduction over an empty axis");
  RefTensor out(BP_DTYPE_I64, shape);
  const bool fl = is_float(x.dtype);
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t i = 0; i < a.inner; ++i) {
      int64_t best = 0;
      for (int64_t j = 0; j < a.n; ++j) {
        if (fl) {
          const double v = load_f64(x, a.at(o, j, i)), b = load_f64(x, a.at(o, best, i));
          if (std::isnan(v)) {  // the first NaN wins
            best = j;
            break;
          }
          if (j == 0) continue;
          const bool better = is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
          if (better) best = j;
        } else {
          if (j == 0) continue;
          const int64_t v = load_i64(x, a.at(o, j, i)), b = load_i64(x, a.at(o, best, i));
          const bool better = is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
          if (better) best = j;
        }
      }
      out.set_int(o * a.inner + i, best);
    }
  }
  return {out};
}

std::vector<RefTensor> ref_softmax(const std::string& op, const HostTensor& x, const Json& p) {
  const int64_t dim = norm_dim(op, require_int(op, p, "dim"), rank_of(x));
  const Around a = around(x.shape, dim);
  RefTensor out(x.dtype, x.shape);
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t i = 0; i < a.inner; ++i) {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < a.n; ++j) m = std::max(m, load_f64(x, a.at(o, j, i)));
      double s = 0;
      for (int64_t j = 0; j < a.n; ++j) s += std::exp(load_f64(x, a.at(o, j, i)) - m);
      for (int64_t j = 0; j < a.n; ++j) {
        const double v = load_f64(x, a.at(o, j, i));
        out.set(a.at(o, j, i), op == "softmax" ? std::exp(v - m) / s : v - m - std::log(s));
      }
    }
  }
  return {out};
}

std::vector<RefTensor> ref_cumsum(const HostTensor& x, const Json& p) {
  const int64_t dim = norm_dim("cumsum", require_int("cumsum", p, "dim"), rank_of(x));
  const bool exclusive = p_bool(p, "exclusive", false), reverse = p_bool(p, "reverse", false);
  const Around a = around(x.shape, dim);
  RefTensor out(x.dtype, x.shape);
  const bool fl = is_float(x.dtype);
  if (!fl && !is_int(x.dtype)) bad("cumsum", "not defined on bool");
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t i = 0; i < a.inner; ++i) {
      double fs = 0;
      int64_t is = 0;
      for (int64_t s = 0; s < a.n; ++s) {
        const int64_t j = reverse ? a.n - 1 - s : s;
        const int64_t at = a.at(o, j, i);
        if (exclusive) {
          if (fl) out.set(at, fs); else out.set_int(at, is);
        }
        if (fl) fs += load_f64(x, at); else is = wadd(is, load_i64(x, at));
        if (!exclusive) {
          if (fl) out.set(at, fs); else out.set_int(at, is);
        }
      }
    }
  }
  return {out};
}

std::vector<RefTensor> ref_layer_norm(const HostTensor& x, const HostTensor* w, const HostTensor* b, const Json& p) {
  auto dims = p_ints(p, "dims");
  if (!dims) bad("layer_norm", "dims is required");
  const auto rank = rank_of(x);
  const auto nd = norm_dims("layer_norm", *dims, rank);
  for (size_t k = 0; k < nd.size(); ++k)
    if (nd[k] != rank - static_cast<int64_t>(nd.size()) + static_cast<int64_t>(k)) bad("layer_norm", "dims must be trailing");
  const double eps = p_double(p, "eps", 1e-5);
  int64_t inner = 1;
  for (size_t k = x.shape.size() - nd.size(); k < x.shape.size(); ++k) inner *= x.shape[k];
  const int64_t outer = inner == 0 ? 0 : shape_numel(x.shape) / inner;
  RefTensor out(x.dtype, x.shape);
  for (int64_t o = 0; o < outer; ++o) {
    double mean = 0;
    for (int64_t i = 0; i < inner; ++i) mean += load_f64(x, o * inner + i);
    mean /= static_cast<double>(inner);
    double var = 0;
    for (int64_t i = 0; i < inner; ++i) {
      const double d = load_f64(x, o * inner + i) - mean;
      var += d * d;
    }
    var /= static_cast<double>(inner);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < inner; ++i) {
      double y = (load_f64(x, o * inner + i) - mean) * inv;
      if (w) y *= load_f64(*w, i);
      if (b) y += load_f64(*b, i);
      out.set(o * inner + i, y);
    }
  }
  return {out};
}

std::vector<RefTensor> ref_var_mean(const HostTensor& x, const Json& p) {
  const ReducePlan r = plan_reduce("var_mean", x.shape, p, "dims");
  const double correction = p_double(p, "correction", 1.0);
  const int64_t n_out = shape_numel(r.out_shape);
  std::vector<double> sum(static_cast<size_t>(n_out), 0.0), sq(static_cast<size_t>(n_out), 0.0);
  for (MultiIndex m(x.shape); m; ++m) sum[static_cast<size_t>(reduce_out_flat(r, m.idx(), x.shape))] += load_f64(x, m.flat());
  const auto count = static_cast<double>(r.count);
  for (MultiIndex m(x.shape); m; ++m) {
    const auto o = static_cast<size_t>(reduce_out_flat(r, m.idx(), x.shape));
    const double d = load_f64(x, m.flat()) - sum[o] / count;
    sq[o] += d * d;
  }
  RefTensor var(x.dtype, r.out_shape), mean(x.dtype, r.out_shape);
  for (int64_t k = 0; k < n_out; ++k) {
    mean.set(k, sum[static_cast<size_t>(k)] / count);
    var.set(k, sq[static_cast<size_t>(k)] / (count - correction));
  }
  return {var, mean};
}

// ---------------------------------------------------------------------------
// Linear algebra, convolution, indexing

std::vector<RefTensor> ref_matmul(const HostTensor& a, const HostTensor& b) {
  if (a.shape.empty() || b.shape.empty()) bad("matmul", "rank-0 operand");
  Shape as = a.shape, bs = b.shape;
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  if (bs[bs.size() - 2] != K) bad("matmul", "inner dims differ");
  const Shape ba(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const Shape batch = broadcast_shapes("matmul", {ba, bb});
  Shape full = batch;
  full.push_back(M);
  full.push_back(N);
  Shape shape = batch;
  if (!a1) shape.push_back(M);
  if (!b1) shape.push_back(N);
  RefTensor out(a.dtype, shape);
  const bool fl = is_float(a.dtype);
  int64_t flat = 0;
  for (MultiIndex bi(batch); bi; ++bi) {
    const int64_t oa = broadcast_flat(bi.idx(), ba) * M * K, ob = broadcast_flat(bi.idx(), bb) * K * N;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double fs = 0;
        int64_t is = 0;
        for (int64_t k = 0; k < K; ++k) {
          if (fl) {
            fs += load_f64(a, oa + m * K + k) * load_f64(b, ob + k * N + n);
          } else {
            is = wadd(is, wmul(load_i64(a, oa + m * K + k), load_i64(b, ob + k * N + n)));
          }
        }
        if (fl) out.set(flat, fs); else out.set_int(flat, is);
        ++flat;
      }
    }
  }
  return {out};
}

std::vector<int64_t> pair_param(const Json& p, const char* name, int64_t def) {
  if (!has(p, name)) return {def, def};
  auto v = p_ints(p, name).value();
  if (v.size() == 1) return {v[0], v[0]};
  if (v.size() != 2) bad("conv2d", std::string(name) + " takes 1 or 2 values");
  return v;
}

std::vector<RefTensor> ref_conv2d(const HostTensor& x, const HostTensor& w, const HostTensor* bias, const Json& p) {
  if (x.shape.size() != 4 || w.shape.size() != 4) bad("conv2d", "x and w must be rank 4");
  const auto stride = pair_param(p, "stride", 1), dil = pair_param(p, "dilation", 1);
  std::vector<int64_t> pad = {0, 0, 0, 0};  // top, left, bottom, right
  if (has(p, "padding")) {
    auto v = p_ints(p, "padding").value();
    if (v.size() == 1) pad = {v[0], v[0], v[0], v[0]};
    else if (v.size() == 2) pad = {v[0], v[1], v[0], v[1]};
    else if (v.size() == 4) pad = v;
    else bad("conv2d", "padding takes 1, 2 or 4 values");
  }
  const int64_t groups = p_int(p, "groups", 1);
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t O = w.shape[0], Cg = w.shape[1], KH = w.shape[2], KW = w.shape[3];
  if (groups < 1 || C % groups != 0 || O % groups != 0 || Cg != C / groups) bad("conv2d", "channels/groups mismatch");
  const int64_t OH = (H + pad[0] + pad[2] - dil[0] * (KH - 1) - 1) / stride[0] + 1;
  const int64_t OW = (W + pad[1] + pad[3] - dil[1] * (KW - 1) - 1) / stride[1] + 1;
  if (OH < 0 || OW < 0) bad("conv2d", "kernel larger than padded input");
  RefTensor out(x.dtype, {N, O, OH, OW});
  const int64_t Og = O / groups;
  for (MultiIndex m(out.shape); m; ++m) {
    const int64_t n = m[0], o = m[1], oh = m[2], ow = m[3];
    const int64_t g = o / Og;
    double s = bias ? load_f64(*bias, o) : 0.0;
    for (int64_t c = 0; c < Cg; ++c) {
      for (int64_t kh = 0; kh < KH; ++kh) {
        const int64_t ih = oh * stride[0] - pad[0] + kh * dil[0];
        if (ih < 0 || ih >= H) continue;
        for (int64_t kw = 0; kw < KW; ++kw) {
          const int64_t iw = ow * stride[1] - pad[1] + kw * dil[1];
          if (iw < 0 || iw >= W) continue;
          const int64_t xc = g * Cg + c;
          s += load_f64(x, ((n * C + xc) * H + ih) * W + iw) * load_f64(w, ((o * Cg + c) * KH + kh) * KW + kw);
        }
      }
    }
    out.set(m.flat(), s);
  }
  return {out};
}

// max_pool2d / avg_pool2d, straight from docs/ops.md: window positions in
// padded coordinates, H' with ceil_mode's rounding and its dropped last
// window, max over the positions inside x (-inf for none, NaN if any is
// NaN), avg = sum over x's positions / the positions counted.
std::vector<RefTensor> ref_pool2d(const std::string& op, const HostTensor& x, const Json& p) {
  if (x.shape.size() != 4) bad(op, "x must be rank 4");
  if (!has(p, "kernel_size")) bad(op, "kernel_size is required");
  const auto k = pair_param(p, "kernel_size", 1);
  const auto stride = has(p, "stride") ? pair_param(p, "stride", 1) : k;
  const auto dil = pair_param(p, "dilation", 1);
  std::vector<int64_t> pad = {0, 0, 0, 0};  // top, left, bottom, right
  if (has(p, "padding")) {
    auto v = p_ints(p, "padding").value();
    if (v.size() == 1) pad = {v[0], v[0], v[0], v[0]};
    else if (v.size() == 2) pad = {v[0], v[1], v[0], v[1]};
    else if (v.size() == 4) pad = v;
    else bad(op, "padding takes 1, 2 or 4 values");
  }
  const bool ceil_mode = p_bool(p, "ceil_mode", false);
  const bool avg = op == "avg_pool2d";
  const bool include_pad = avg && p_bool(p, "count_include_pad", true);
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t in[2] = {H, W};
  int64_t out_hw[2];
  for (int d = 0; d < 2; ++d) {
    const int64_t padded = in[d] + pad[d] + pad[d + 2];
    const int64_t span = dil[d] * (k[d] - 1) + 1;
    if (k[d] < 1 || stride[d] < 1 || dil[d] < 1 || padded < span) bad(op, "bad window");
    const int64_t q = padded - span;
    int64_t n = (ceil_mode ? (q + stride[d] - 1) / stride[d] : q / stride[d]) + 1;
    if (ceil_mode && (n - 1) * stride[d] >= in[d] + pad[d]) --n;
    out_hw[d] = n;
  }
  RefTensor out(x.dtype, {N, C, out_hw[0], out_hw[1]});
  const int64_t ph = H + pad[0] + pad[2], pw = W + pad[1] + pad[3];
  for (MultiIndex m(out.shape); m; ++m) {
    const int64_t n = m[0], c = m[1], oh = m[2], ow = m[3];
    double best = -std::numeric_limits<double>::infinity(), sum = 0;
    bool nan = false;
    int64_t count = 0;
    for (int64_t i = 0; i < k[0]; ++i) {
      const int64_t r = oh * stride[0] + i * dil[0];  // in the padded input
      for (int64_t j = 0; j < k[1]; ++j) {
        const int64_t q = ow * stride[1] + j * dil[1];
        const int64_t ih = r - pad[0], iw = q - pad[1];
        const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
        if (include_pad ? (r < ph && q < pw) : inside) ++count;
        if (!inside) continue;
        const double v = load_f64(x, ((n * C + c) * H + ih) * W + iw);
        if (std::isnan(v)) nan = true;
        if (v > best) best = v;
        sum += v;
      }
    }
    if (avg) out.set(m.flat(), count == 0 ? std::numeric_limits<double>::quiet_NaN() : sum / static_cast<double>(count));
    else out.set(m.flat(), nan ? std::numeric_limits<double>::quiet_NaN() : best);
  }
  return {out};
}

int64_t checked_index(const std::string& op, int64_t j, int64_t size) {
  const int64_t r = j < 0 ? j + size : j;
  if (r < 0 || r >= size)
    throw ReferenceError(op + ": index " + std::to_string(j) + " out of range for size " + std::to_string(size));
  return r;
}

std::vector<RefTensor> ref_gather(const HostTensor& x, const HostTensor& index, const Json& p) {
  const int64_t dim = norm_dim("gather", require_int("gather", p, "dim"), rank_of(x));
  if (index.shape.size() != x.shape.size()) bad("gather", "index rank must equal x rank");
  for (size_t k = 0; k < x.shape.size(); ++k)
    if (static_cast<int64_t>(k) != dim && index.shape[k] > x.shape[k]) bad("gather", "index dim larger than x dim");
  RefTensor out(x.dtype, index.shape);
  for (MultiIndex m(index.shape); m; ++m) {
    std::vector<int64_t> xi = m.idx();
    xi[static_cast<size_t>(dim)] = checked_index("gather", load_i64(index, m.flat()), x.shape[static_cast<size_t>(dim)]);
    copy_elem(out, m.flat(), x, flat_of(xi, x.shape));
  }
  return {out};
}

std::vector<RefTensor> ref_index_select(const HostTensor& x, const HostTensor& index, const Json& p) {
  const int64_t dim = norm_dim("index_select", require_int("index_select", p, "dim"), rank_of(x));
  const auto d = static_cast<size_t>(dim);
  Shape shape(x.shape.begin(), x.shape.begin() + dim);
  shape.insert(shape.end(), index.shape.begin(), index.shape.end());
  shape.insert(shape.end(), x.shape.begin() + dim + 1, x.shape.end());
  RefTensor out(x.dtype, shape);
  const size_t ri = index.shape.size();
  for (MultiIndex m(shape); m; ++m) {
    const std::vector<int64_t>& oi = m.idx();
    const std::vector<int64_t> mid(oi.begin() + dim, oi.begin() + dim + static_cast<int64_t>(ri));
    std::vector<int64_t> xi(oi.begin(), oi.begin() + dim);
    xi.push_back(checked_index("index_select", load_i64(index, flat_of(mid, index.shape)), x.shape[d]));
    xi.insert(xi.end(), oi.begin() + dim + static_cast<int64_t>(ri), oi.end());
    copy_elem(out, m.flat(), x, flat_of(xi, x.shape));
  }
  return {out};
}

std::vector<RefTensor> ref_concat(const std::vector<const HostTensor*>& in, const Json& p) {
  if (in.empty()) bad("concat", "no inputs");
  const HostTensor& first = need("concat", in, 0);
  const int64_t dim = norm_dim("concat", require_int("concat", p, "dim"), rank_of(first));
  const auto d = static_cast<size_t>(dim);
  Shape shape = first.shape;
  shape[d] = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    const HostTensor& t = need("concat", in, k);
    if (t.shape.size() != first.shape.size()) bad("concat", "ranks differ");
    for (size_t j = 0; j < shape.size(); ++j)
      if (j != d && t.shape[j] != first.shape[j]) bad("concat", "shapes differ outside dim");
    shape[d] += t.shape[d];
  }
  RefTensor out(first.dtype, shape);
  for (MultiIndex m(shape); m; ++m) {
    std::vector<int64_t> xi = m.idx();
    size_t k = 0;
    while (xi[d] >= in[k]->shape[d]) {
      xi[d] -= in[k]->shape[d];
      ++k;
    }
    copy_elem(out, m.flat(), *in[k], flat_of(xi, in[k]->shape));
  }
  return {out};
}

std::vector<RefTensor> ref_topk(const HostTensor& x, const Json& p) {
  const int64_t k = require_int("topk", p, "k");
  if (x.shape.empty()) bad("topk", "rank-0 input");
  const int64_t dim = norm_dim("topk", p_int(p, "dim", -1), rank_of(x));
  const bool largest = p_bool(p, "largest", true);
  const Around a = around(x.shape, dim);
  if (k < 0 || k > a.n) bad("topk", "k out of range");
  Shape shape = x.shape;
  shape[static_cast<size_t>(dim)] = k;
  RefTensor values(x.dtype, shape), indices(BP_DTYPE_I64, shape);
  const bool fl = is_float(x.dtype);
  // "a ranks before b": by value (NaN above every number), ties keep index
  // order because the sort is stable.
  auto before = [&](int64_t va_at, int64_t vb_at) {
    if (fl) {
      const double va = load_f64(x, va_at), vb = load_f64(x, vb_at);
      const bool na = std::isnan(va), nb = std::isnan(vb);
      if (largest) {
        if (na || nb) return na && !nb;
        return va > vb;
      }
      if (na || nb) return !na && nb;
      return va < vb;
    }
    const int64_t va = load_i64(x, va_at), vb = load_i64(x, vb_at);
    return largest ? va > vb : va < vb;
  };
  std::vector<int64_t> order(static_cast<size_t>(a.n));
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t i = 0; i < a.inner; ++i) {
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t j1, int64_t j2) { return before(a.at(o, j1, i), a.at(o, j2, i)); });
      for (int64_t r = 0; r < k; ++r) {
        const int64_t at = (o * k + r) * a.inner + i;
        copy_elem(values, at, x, a.at(o, order[static_cast<size_t>(r)], i));
        indices.set_int(at, order[static_cast<size_t>(r)]);
      }
    }
  }
  return {values, indices};
}

std::vector<RefTensor> ref_selective_scan(const std::vector<const HostTensor*>& in, const Json& p) {
  const HostTensor &u = need("selective_scan", in, 0), &delta = need("selective_scan", in, 1),
                   &A = need("selective_scan", in, 2), &Bm = need("selective_scan", in, 3),
                   &Cm = need("selective_scan", in, 4);
  if (u.shape.size() != 3 || A.shape.size() != 2) bad("selective_scan", "u is [B,L,D], a is [D,N]");
  const int64_t B = u.shape[0], L = u.shape[1], D = u.shape[2], N = A.shape[1];
  if (delta.shape != u.shape || A.shape[0] != D || Bm.shape != Shape{B, L, N} || Cm.shape != Shape{B, L, N})
    bad("selective_scan", "shapes do not agree");
  const bool sp = p_bool(p, "delta_softplus", false);
  RefTensor y(u.dtype, {B, L, D}), last(u.dtype, {B, D, N});
  std::vector<double> h(static_cast<size_t>(D * N));
  for (int64_t b = 0; b < B; ++b) {
    std::fill(h.begin(), h.end(), 0.0);
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t i = 0; i < D; ++i) {
        const int64_t ui = (b * L + t) * D + i;
        double d = load_f64(delta, ui);
        if (sp) d = softplus(d);
        double acc = 0;
        for (int64_t j = 0; j < N; ++j) {
          double& hij = h[static_cast<size_t>(i * N + j)];
          hij = std::exp(d * load_f64(A, i * N + j)) * hij + d * load_f64(Bm, (b * L + t) * N + j) * load_f64(u, ui);
          acc += hij * load_f64(Cm, (b * L + t) * N + j);
        }
        y.set(ui, acc);
      }
    }
    for (int64_t k = 0; k < D * N; ++k) last.set(b * D * N + k, h[static_cast<size_t>(k)]);
  }
  return {y, last};
}

bool in_list(const std::string& op, std::initializer_list<const char*> ops) {
  for (const char* o : ops)
    if (op == o) return true;
  return false;
}

}  // namespace

// ---------------------------------------------------------------------------
// Public helpers

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> dense_strides(const Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t k = shape.size(); k-- > 1;) s[k - 1] = s[k] * shape[k];
  return s;
}

MultiIndex::MultiIndex(Shape shape) : shape_(std::move(shape)), idx_(shape_.size(), 0) {
  done_ = shape_numel(shape_) == 0;
}

MultiIndex& MultiIndex::operator++() {
  ++flat_;
  for (size_t k = shape_.size(); k-- > 0;) {
    if (++idx_[k] < shape_[k]) return *this;
    idx_[k] = 0;
  }
  done_ = true;
  return *this;
}

HostTensor make_tensor(bp_dtype dtype, Shape shape) {
  HostTensor t;
  t.dtype = dtype;
  t.bytes.assign(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), std::byte{0});
  t.shape = std::move(shape);
  return t;
}

namespace {
template <typename T> T read_as(const HostTensor& t, int64_t i) {
  T v;
  std::memcpy(&v, t.bytes.data() + static_cast<size_t>(i) * sizeof(T), sizeof(T));
  return v;
}
template <typename T> void write_as(HostTensor& t, int64_t i, T v) {
  std::memcpy(t.bytes.data() + static_cast<size_t>(i) * sizeof(T), &v, sizeof(T));
}
}  // namespace

double load_f64(const HostTensor& t, int64_t i) {
  switch (t.dtype) {
    case BP_DTYPE_F32: return read_as<float>(t, i);
    case BP_DTYPE_F64: return read_as<double>(t, i);
    case BP_DTYPE_F16: return f16_to_float(read_as<uint16_t>(t, i));
    case BP_DTYPE_BF16: return bf16_to_float(read_as<uint16_t>(t, i));
    default: return static_cast<double>(load_i64(t, i));
  }
}

int64_t load_i64(const HostTensor& t, int64_t i) {
  switch (t.dtype) {
    case BP_DTYPE_I8: return read_as<int8_t>(t, i);
    case BP_DTYPE_I16: return read_as<int16_t>(t, i);
    case BP_DTYPE_I32: return read_as<int32_t>(t, i);
    case BP_DTYPE_I64: return read_as<int64_t>(t, i);
    case BP_DTYPE_U8: return read_as<uint8_t>(t, i);
    case BP_DTYPE_BOOL: return read_as<uint8_t>(t, i);
    default: throw std::invalid_argument("load_i64 on a float dtype");
  }
}

void store_f64(HostTensor& t, int64_t i, double v) {
  switch (t.dtype) {
    case BP_DTYPE_F32: write_as<float>(t, i, static_cast<float>(v)); return;
    case BP_DTYPE_F64: write_as<double>(t, i, v); return;
    case BP_DTYPE_F16: write_as<uint16_t>(t, i, float_to_f16(static_cast<float>(v))); return;
    case BP_DTYPE_BF16: write_as<uint16_t>(t, i, float_to_bf16(static_cast<float>(v))); return;
    default: throw std::invalid_argument("store_f64 on an integer dtype");
  }
}

void store_i64(HostTensor& t, int64_t i, int64_t v) {
  v = wrap_to_dtype(v, t.dtype);
  switch (t.dtype) {
    case BP_DTYPE_I8: write_as<int8_t>(t, i, static_cast<int8_t>(v)); return;
    case BP_DTYPE_I16: write_as<int16_t>(t, i, static_cast<int16_t>(v)); return;
    case BP_DTYPE_I32: write_as<int32_t>(t, i, static_cast<int32_t>(v)); return;
    case BP_DTYPE_I64: write_as<int64_t>(t, i, v); return;
    case BP_DTYPE_U8:
    case BP_DTYPE_BOOL: write_as<uint8_t>(t, i, static_cast<uint8_t>(v)); return;
    default: throw std::invalid_argument("store_i64 on a float dtype");
  }
}

double round_to_dtype(double v, bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F64: return v;
    case BP_DTYPE_F32: return static_cast<float>(v);
    case BP_DTYPE_F16: return f16_to_float(float_to_f16(static_cast<float>(v)));
    case BP_DTYPE_BF16: return bf16_to_float(float_to_bf16(static_cast<float>(v)));
    default: throw std::invalid_argument("round_to_dtype on an integer dtype");
  }
}

int64_t wrap_to_dtype(int64_t v, bp_dtype d) {
  switch (d) {
    case BP_DTYPE_I8: return static_cast<int8_t>(v);  // modular since C++20
    case BP_DTYPE_I16: return static_cast<int16_t>(v);
    case BP_DTYPE_I32: return static_cast<int32_t>(v);
    case BP_DTYPE_I64: return v;
    case BP_DTYPE_U8: return static_cast<uint8_t>(v);
    case BP_DTYPE_BOOL: return v != 0 ? 1 : 0;
    default: throw std::invalid_argument("wrap_to_dtype on a float dtype");
  }
}

int64_t int_min(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_I8: return std::numeric_limits<int8_t>::min();
    case BP_DTYPE_I16: return std::numeric_limits<int16_t>::min();
    case BP_DTYPE_I32: return std::numeric_limits<int32_t>::min();
    case BP_DTYPE_I64: return std::numeric_limits<int64_t>::min();
    default: return 0;  // u8, bool
  }
}

int64_t int_max(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_I8: return std::numeric_limits<int8_t>::max();
    case BP_DTYPE_I16: return std::numeric_limits<int16_t>::max();
    case BP_DTYPE_I32: return std::numeric_limits<int32_t>::max();
    case BP_DTYPE_I64: return std::numeric_limits<int64_t>::max();
    case BP_DTYPE_U8: return 255;
    default: return 1;  // bool
  }
}

RefTensor::RefTensor(bp_dtype dt, Shape s) : dtype(dt), shape(std::move(s)) {
  const auto n = static_cast<size_t>(shape_numel(shape));
  if (is_float(dtype)) f.assign(n, 0.0); else i.assign(n, 0);
}
bool RefTensor::is_float_dtype() const { return is_float(dtype); }
int64_t RefTensor::numel() const { return shape_numel(shape); }
double RefTensor::get(int64_t k) const {
  return is_float(dtype) ? f[static_cast<size_t>(k)] : static_cast<double>(i[static_cast<size_t>(k)]);
}
int64_t RefTensor::get_int(int64_t k) const {
  return is_float(dtype) ? static_cast<int64_t>(f[static_cast<size_t>(k)]) : i[static_cast<size_t>(k)];
}
void RefTensor::set(int64_t k, double v) {
  if (is_float(dtype)) {
    f[static_cast<size_t>(k)] = round_to_dtype(v, dtype);
  } else {
    i[static_cast<size_t>(k)] = wrap_to_dtype(static_cast<int64_t>(v), dtype);
  }
}
void RefTensor::set_int(int64_t k, int64_t v) {
  if (is_float(dtype)) {
    f[static_cast<size_t>(k)] = round_to_dtype(static_cast<double>(v), dtype);
  } else {
    i[static_cast<size_t>(k)] = wrap_to_dtype(v, dtype);
  }
}
HostTensor RefTensor::to_host() const {
  HostTensor t = make_tensor(dtype, shape);
  for (int64_t k = 0; k < numel(); ++k) {
    if (is_float(dtype)) store_f64(t, k, f[static_cast<size_t>(k)]); else store_i64(t, k, i[static_cast<size_t>(k)]);
  }
  return t;
}
RefTensor RefTensor::from_host(const HostTensor& t) {
  RefTensor r(t.dtype, t.shape);
  for (int64_t k = 0; k < r.numel(); ++k) {
    if (is_float(t.dtype)) r.f[static_cast<size_t>(k)] = load_f64(t, k); else r.i[static_cast<size_t>(k)] = load_i64(t, k);
  }
  return r;
}

HostTensor reference_view(const std::string& op, const HostTensor& x, const Json& params) {
  return materialize(x, apply_view(op, dense_view(x.shape), params));
}

std::vector<RefTensor> reference(const std::string& op, const std::vector<const HostTensor*>& in, const Json& p) {
  if (is_view_op(op)) return {RefTensor::from_host(reference_view(op, need(op, in, 0), p))};
  if (in_list(op, {"neg", "abs", "sign", "sqr", "sqrt", "rsqrt", "recip", "exp", "log", "sin", "cos", "tanh", "erf",
                   "floor", "ceil", "round", "relu", "sigmoid", "silu", "softplus", "gelu", "clamp", "affine"}))
    return ref_unary(op, need(op, in, 0), p);
  if (in_list(op, {"add", "sub", "mul", "div", "maximum", "minimum", "pow", "eq", "ne", "lt", "le", "gt", "ge"}))
    return ref_binary(op, need(op, in, 0), need(op, in, 1));
  if (op == "where") return ref_where(need(op, in, 0), need(op, in, 1), need(op, in, 2));
  if (op == "cast") return ref_cast(need(op, in, 0), p);
  if (in_list(op, {"sum", "mean", "prod", "max", "min"})) return ref_reduce(op, need(op, in, 0), p);
  if (op == "argmax" || op == "argmin") return ref_argreduce(op, need(op, in, 0), p);
  if (op == "softmax" || op == "log_softmax") return ref_softmax(op, need(op, in, 0), p);
  if (op == "cumsum") return ref_cumsum(need(op, in, 0), p);
  if (op == "layer_norm")
    return ref_layer_norm(need(op, in, 0), in.size() > 1 ? in[1] : nullptr, in.size() > 2 ? in[2] : nullptr, p);
  if (op == "matmul") return ref_matmul(need(op, in, 0), need(op, in, 1));
  if (op == "conv2d") return ref_conv2d(need(op, in, 0), need(op, in, 1), in.size() > 2 ? in[2] : nullptr, p);
  if (op == "max_pool2d" || op == "avg_pool2d") return ref_pool2d(op, need(op, in, 0), p);
  if (op == "gather") return ref_gather(need(op, in, 0), need(op, in, 1), p);
  if (op == "index_select") return ref_index_select(need(op, in, 0), need(op, in, 1), p);
  if (op == "concat") return ref_concat(in, p);
  if (op == "topk") return ref_topk(need(op, in, 0), p);
  if (op == "var_mean") return ref_var_mean(need(op, in, 0), p);
  if (op == "selective_scan") return ref_selective_scan(in, p);
  bad(op, "unknown op");
}

const std::vector<std::string>& reference_ops() {
  static const std::vector<std::string> ops = {
      "neg", "abs", "sign", "sqr", "sqrt", "rsqrt", "recip", "exp", "log", "sin", "cos", "tanh", "erf", "floor",
      "ceil", "round", "relu", "sigmoid", "silu", "softplus", "gelu", "clamp", "affine", "add", "sub", "mul", "div",
      "maximum", "minimum", "pow", "eq", "ne", "lt", "le", "gt", "ge", "where", "cast", "reshape", "permute",
      "transpose", "broadcast_to", "slice", "squeeze", "unsqueeze", "contiguous", "sum", "mean", "prod", "max", "min",
      "argmax", "argmin", "softmax", "log_softmax", "cumsum", "layer_norm", "matmul", "conv2d", "max_pool2d", "avg_pool2d", "gather",
      "index_select", "concat", "topk", "var_mean", "selective_scan"};
  return ops;
}

}  // namespace backplane::conformance
