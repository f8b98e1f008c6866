// diff_fuzz's generator: unary, binary, compare/where, cast and affine nodes.
#include "diff_fuzz.hpp"

namespace diff_fuzz {

void Generator::unary() {
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

void Generator::binary() {
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

void Generator::compare_where() {
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

void Generator::cast_or_affine() {
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

void Generator::add_node_nullable(const std::string& op, const std::vector<std::string>& ins, const Json& params, const Val& m) {
  // add_node takes names; an absent optional input is "" in Graph::node and
  // null in the graph file.
  const Val* v = add_node(op, op, ins, params, m);
  if (!v) return;
  Json& node = nodes_.back();
  Json inputs = Json::array();
  for (const auto& s : ins) inputs.push_back(s.empty() ? Json(nullptr) : Json(s));
  node["inputs"] = inputs;
}

}  // namespace diff_fuzz
