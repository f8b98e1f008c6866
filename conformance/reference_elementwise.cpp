// The f64 reference: unary, binary, compare, where and cast.
#include "conformance/reference_impl.hpp"

namespace backplane::conformance::refimpl {

// ---------------------------------------------------------------------------
// Elementwise

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

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
    return x < 0 ? 0.0 : x;  // -0 stays -0 (PyTorch's relu; the sign is not compared)
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

std::vector<RefTensor> ref_fused(const std::vector<const HostTensor*>& in, const Json& p) {
  // Registers: the inputs, then one per instruction, each as the named op's
  // reference gives it (rounded to its dtype, as docs/ops.md defines).
  std::vector<HostTensor> regs;
  std::vector<Shape> shapes;
  for (const HostTensor* t : in) {
    if (!t) bad("fused_elementwise", "an input is missing");
    regs.push_back(*t);
    shapes.push_back(t->shape);
  }
  const Json& prog = p.at("program");
  if (!prog.is_array() || prog.empty()) bad("fused_elementwise", "an empty program");
  for (const Json& ins : prog) {
    const std::string op = ins.at(0).get<std::string>();
    std::vector<const HostTensor*> args;
    Json params = Json::object();
    for (size_t k = 1; k < ins.size(); ++k) {
      if (ins[k].is_object()) {
        params = ins[k];
        continue;
      }
      const auto r = ins[k].get<size_t>();
      if (r >= regs.size()) bad("fused_elementwise", "a register not defined yet");
      args.push_back(&regs[r]);
    }
    regs.push_back(reference(op, args, params).at(0).to_host());
  }
  const Shape out = broadcast_shapes("fused_elementwise", shapes);
  return {RefTensor::from_host(reference_view("broadcast_to", regs.back(), {{"shape", out}}))};
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

}  // namespace backplane::conformance::refimpl
