// Cases for the elementwise ops: unary, binary, comparisons, where, cast.
#include "conformance/cases.hpp"

#include <cmath>

namespace backplane::conformance {

namespace {

void require(bool ok, const KernelSpec& k, const std::string& what) {
  if (!ok) throw NoCases(k.op + " " + k.key() + ": " + what + " (docs/ops.md)");
}

// A unary op: x -> like x.
struct UnaryOp {
  const char* op;
  bool ints;  // also defined on integer dtypes
  double lo, hi;
  std::vector<double> specials;
  TolClass tol;
  std::vector<Json> params = {Json::object()};
  Fill float_fill = nullptr;  // overrides U[lo, hi)
};

const double kNegZero = -0.0;

// Half-integers and near-halves, so round's ties are exercised.
Fill fill_halves() {
  return [](HostTensor& t, Rng& rng) {
    fill_uniform(-10, 10)(t, rng);
    const int64_t n = shape_numel(t.shape);
    for (int64_t k = 0; k < n; k += 2) store_f64(t, k, static_cast<double>(static_cast<int64_t>(rng() % 41) - 20) / 2.0);
  };
}

std::vector<UnaryOp> unary_ops() {
  const std::vector<double> signs = {kNaN, kInf, -kInf, kNegZero, 0.0};
  const std::vector<double> nan_inf = {kNaN, kInf, -kInf, kNegZero};
  return {
      {"neg", true, -10, 10, signs, TolClass::Exact},
      {"abs", true, -10, 10, signs, TolClass::Exact},
      {"sign", true, -10, 10, signs, TolClass::Exact},
      {"sqr", false, -10, 10, {}, TolClass::Exact},
      {"sqrt", false, 0, 100, {0.0, kInf}, TolClass::Elementwise},
      {"rsqrt", false, 0.01, 100, {}, TolClass::Elementwise},
      {"recip", false, 0.1, 10, {}, TolClass::Exact, {Json::object()}, fill_nonzero(0.1, 10)},
      {"exp", false, -10, 10, {}, TolClass::Elementwise},
      {"log", false, 0.01, 100, {}, TolClass::Elementwise},
      {"sin", false, -10, 10, {}, TolClass::Elementwise},
      {"cos", false, -10, 10, {}, TolClass::Elementwise},
      {"tanh", false, -5, 5, {}, TolClass::Elementwise},
      {"erf", false, -3, 3, {}, TolClass::Elementwise},
      {"floor", false, -10, 10, {kInf, -kInf, kNegZero}, TolClass::Exact, {Json::object()}, fill_halves()},
      {"ceil", false, -10, 10, {kInf, -kInf, kNegZero}, TolClass::Exact, {Json::object()}, fill_halves()},
      {"round", false, -10, 10, {kInf, -kInf, kNegZero}, TolClass::Exact, {Json::object()}, fill_halves()},
      {"relu", false, -10, 10, nan_inf, TolClass::Selection},  // relu(-0): either zero
      {"sigmoid", false, -10, 10, {}, TolClass::Elementwise},
      {"silu", false, -10, 10, {}, TolClass::Elementwise},
      {"softplus", false, -20, 20, {}, TolClass::Elementwise},
      {"gelu", false, -6, 6, {}, TolClass::Elementwise,
       {Json::object(), {{"approximate", "none"}}, {{"approximate", "tanh"}}}},
      {"clamp", true, -10, 10, nan_inf, TolClass::Exact,
       {{{"min", -2.5}, {"max", 3.25}}, {{"min", -1.0}}, {{"max", 0.5}}, Json::object()}},
      {"affine", false, -10, 10, {}, TolClass::Elementwise,
       {{{"mul", 2.5}, {"add", -1.25}}, {{"mul", -0.5}, {"add", 3.0}}}},
  };
}

// Integer clamp bounds (exact integers in the JSON).
std::vector<Json> int_clamp_params(bp_dtype d) {
  if (d == BP_DTYPE_U8) return {{{"min", 3}, {"max", 200}}, {{"min", 100}}, {{"max", 17}}};
  return {{{"min", -5}, {"max", 7}}, {{"min", 0}}, {{"max", -3}}};
}

void unary_cases(CaseContext& ctx, const UnaryOp& u) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 1 && k.in(0) == k.out(), k, "a unary op maps x to like x");
  const bp_dtype d = k.out();
  require(is_float(d) || (u.ints && is_int(d)), k, std::string("dtype not defined for ") + u.op);
  Fill fill;
  if (is_float(d)) {
    fill = u.float_fill ? u.float_fill : fill_uniform(u.lo, u.hi);
    if (!u.specials.empty()) fill = with_specials(fill, u.specials, 0.05);
  } else {
    fill = fill_full_range();
  }
  std::vector<Json> params = u.params;
  if (std::string(u.op) == "clamp" && is_int(d)) params = int_clamp_params(d);
  const auto shapes = elementwise_shapes(ctx.large);
  for (size_t pi = 0; pi < params.size(); ++pi) {
    for (size_t si = 0; si < shapes.size(); ++si) {
      // Extra param variants get a few shapes, not all.
      if (pi > 0 && si % 3 != 1) continue;
      OpSpec s;
      s.op = u.op;
      s.params = params[pi];
      s.tol = u.tol;
      s.inputs = {{"x", d, shapes[si], fill}};
      ctx.add(s);
    }
  }
}

// Shape pairs where the op itself broadcasts (beyond equal shapes).
std::vector<std::pair<Shape, Shape>> broadcast_pairs() {
  return {{{7, 13}, {13}},       {{7, 1}, {1, 13}}, {{}, {4, 3}},          {{2, 1, 4}, {3, 1}},
          {{0, 3}, {1, 3}},      {{5}, {}},         {{3, 1, 1}, {1, 4, 5}}, {{1, 2, 1, 2, 1, 2, 1, 2}, {2, 1, 2, 1}}};
}

struct BinaryOp {
  const char* op;
  bool ints;
  Fill fa, fb;  // float fills
  TolClass tol;
};

void binary_cases(CaseContext& ctx, const BinaryOp& b) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 2 && k.in(0) == k.out() && k.in(1) == k.out(), k,
          "a binary op takes a, b of one dtype and returns like a");
  const bp_dtype d = k.out();
  require(is_float(d) || (b.ints && is_int(d)), k, std::string("dtype not defined for ") + b.op);
  Fill fa = b.fa, fb = b.fb;
  const std::string op = b.op;
  if (is_int(d)) {
    fa = fill_full_range();
    fb = fill_full_range();
    if (op == "div") {
      fa = fill_ints(int_min(d) + 1, int_max(d));  // INT_MIN / -1 is left to the implementation
      fb = fill_nonzero(1, 20);
    }
  }
  std::vector<std::pair<Shape, Shape>> pairs;
  for (const auto& s : elementwise_shapes(ctx.large)) pairs.emplace_back(s, s);
  for (const auto& p : broadcast_pairs()) pairs.push_back(p);
  for (const auto& [sa, sb] : pairs) {
    OpSpec s;
    s.op = op;
    s.tol = b.tol;
    s.inputs = {{"a", d, sa, fa}, {"b", d, sb, fb}};
    ctx.add(s);
  }
  if (op == "pow" && is_float(d)) {
    // Integer exponents of negative bases.
    OpSpec s;
    s.op = op;
    s.tol = b.tol;
    s.note = "integer exponents";
    s.inputs = {{"a", d, {7, 13}, fill_uniform(-3, 3)}, {"b", d, {7, 13}, fill_discrete({0, 1, 2, 3, -1, -2})}};
    ctx.add(s);
  }
}

std::vector<BinaryOp> binary_ops() {
  const std::vector<double> nan_inf = {kNaN, kInf, -kInf};
  return {
      {"add", true, fill_uniform(-50, 50), fill_uniform(-50, 50), TolClass::Exact},
      {"sub", true, fill_uniform(-50, 50), fill_uniform(-50, 50), TolClass::Exact},
      {"mul", true, fill_uniform(-50, 50), fill_uniform(-50, 50), TolClass::Exact},
      {"div", true, fill_uniform(-50, 50), with_specials(fill_nonzero(0.5, 20), {0.0}, 0.05), TolClass::Exact},
      {"maximum", true, with_specials(fill_uniform(-10, 10), nan_inf, 0.05),
       with_specials(fill_uniform(-10, 10), nan_inf, 0.05), TolClass::Exact},
      {"minimum", true, with_specials(fill_uniform(-10, 10), nan_inf, 0.05),
       with_specials(fill_uniform(-10, 10), nan_inf, 0.05), TolClass::Exact},
      {"pow", false, fill_uniform(0.1, 5), fill_uniform(-2, 3), TolClass::Elementwise},
  };
}

void compare_cases(CaseContext& ctx, const std::string& op) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 2 && k.in(0) == k.in(1) && k.out() == BP_DTYPE_BOOL, k,
          "a comparison takes a, b of one dtype and returns bool");
  const bp_dtype d = k.in(0);
  // Few distinct values, so equal pairs are common; NaN and infinities.
  Fill fill = is_float(d) ? with_specials(fill_discrete({-2, -1, -0.5, 0, 0.5, 1, 2}), {kNaN, kInf, -kInf}, 0.1)
              : d == BP_DTYPE_U8 ? fill_ints(0, 5)
                                 : fill_ints(-3, 3);
  std::vector<std::pair<Shape, Shape>> pairs;
  for (const auto& s : elementwise_shapes(ctx.large)) pairs.emplace_back(s, s);
  for (const auto& p : broadcast_pairs()) pairs.push_back(p);
  for (const auto& [sa, sb] : pairs) {
    OpSpec s;
    s.op = op;
    s.tol = TolClass::Exact;
    s.inputs = {{"a", d, sa, fill}, {"b", d, sb, fill}};
    ctx.add(s);
  }
  if (is_int(d)) {
    // Full-range values: comparisons must be exact (i64 beyond 2^53 too).
    OpSpec s;
    s.op = op;
    s.tol = TolClass::Exact;
    s.note = "full range";
    s.inputs = {{"a", d, {7, 13}, fill_full_range()}, {"b", d, {7, 13}, fill_full_range()}};
    ctx.add(s);
  }
}

Fill data_fill(bp_dtype d) {
  if (is_float(d)) return with_specials(fill_uniform(-10, 10), {kNaN, kInf, -kInf, kNegZero}, 0.05);
  return fill_full_range();
}

void where_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 3 && k.in(0) == BP_DTYPE_BOOL && k.in(1) == k.out() && k.in(2) == k.out(), k,
          "where takes cond (bool), a, b of one dtype");
  const bp_dtype d = k.out();
  std::vector<std::vector<Shape>> triples;
  for (const auto& s : elementwise_shapes(ctx.large)) triples.push_back({s, s, s});
  triples.push_back({{7, 1}, {7, 13}, {13}});
  triples.push_back({{}, {3, 4}, {3, 4}});
  triples.push_back({{2, 3}, {}, {2, 3}});
  triples.push_back({{1, 4}, {3, 1}, {}});
  for (const auto& t : triples) {
    OpSpec s;
    s.op = "where";
    s.tol = TolClass::Exact;
    s.inputs = {{"cond", BP_DTYPE_BOOL, t[0], fill_bools()}, {"a", d, t[1], data_fill(d)}, {"b", d, t[2], data_fill(d)}};
    ctx.add(s);
  }
}

// fused_elementwise: programs over every opcode, conditions from inputs and
// comparisons, broadcast inputs, a long program, and sizes past one block
// and one thread's share. Registers are values of x0's dtype, so the
// reference (each instruction as its op, rounded) and a device agree to the
// single ops' tolerance, except the long sum (Compound).
void fused_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 1 && k.in(0) == k.out() && is_float(k.out()), k,
          "fused_elementwise is keyed by (x0, y) of one float dtype");
  const bp_dtype d = k.out();
  const Json chain = Json::array({Json::array({"add", 0, 1}), Json::array({"relu", 2}), Json::array({"mul", 3, 1}),
                                  Json::array({"affine", 4, {{"mul", 0.5}, {"add", -1.0}}})});
  struct P {
    Json program;
    std::vector<std::pair<bp_dtype, Shape>> in;
    TolClass tol;
    Fill fill;
    std::vector<Fill> fills = {};  // per input, where not null
  };
  const Fill values = fill_uniform(-4, 4);
  std::vector<P> progs = {
      // add, relu, mul, affine; x1 broadcast along rows
      {chain, {{d, {7, 13}}, {d, {13}}}, TolClass::Elementwise, values},
      {chain, {{d, {300, 257}}, {d, {300, 1}}}, TolClass::Elementwise, values},
      {chain, {{d, {}}, {d, {}}}, TolClass::Elementwise, values},
      {chain, {{d, {0, 3}}, {d, {1, 3}}}, TolClass::Elementwise, values},
      // GELU's erf form as ONNX exports it: x/√2, erf, +1, ·x, ·0.5 (the
      // constants are inputs, as the optimizer leaves them)
      {Json::array({Json::array({"div", 0, 1}), Json::array({"erf", 4}), Json::array({"add", 5, 2}),
                    Json::array({"mul", 0, 6}), Json::array({"mul", 7, 3})}),
       {{d, {5, 1031}}, {d, {}}, {d, {1}}, {d, {}}},
       TolClass::Elementwise,
       fill_uniform(-6, 6),
       {nullptr, fill_discrete({std::sqrt(2.0)}), fill_discrete({1.0}), fill_discrete({0.5})}},
      // a condition input, a comparison's condition, where, clamp with one bound
      {Json::array({Json::array({"lt", 0, 2}), Json::array({"where", 1, 0, 2}), Json::array({"where", 3, 4, 0}),
                    Json::array({"clamp", 5, {{"min", -1.5}}}), Json::array({"maximum", 6, 2})}),
       {{d, {5, 4, 3}}, {BP_DTYPE_BOOL, {4, 1}}, {d, {3}}},
       TolClass::Exact,
       values},
  };
  // Every unary op on x0, summed: each opcode once.
  {
    Json prog = Json::array();
    const std::vector<std::pair<const char*, Json>> unary = {
        {"neg", {}},      {"abs", {}},      {"sign", {}},    {"sqr", {}},     {"sqrt", {}},
        {"rsqrt", {}},    {"recip", {}},    {"exp", {}},     {"log", {}},     {"sin", {}},
        {"cos", {}},      {"tanh", {}},     {"erf", {}},     {"floor", {}},   {"ceil", {}},
        {"round", {}},    {"relu", {}},     {"sigmoid", {}}, {"silu", {}},    {"softplus", {}},
        {"gelu", {}},     {"gelu", {{"approximate", "tanh"}}}, {"clamp", {{"min", 0.5}, {"max", 1.5}}},
        {"affine", {{"mul", -2.0}, {"add", 0.25}}}};
    for (const auto& [op, params] : unary) {
      Json one = Json::array({op, 0});
      if (!params.is_null()) one.push_back(params);
      prog.push_back(one);
    }
    // r2 .. r25: the unary results; then their sum, and the binary ops
    // against x1 on the running sum.
    int acc = 2;
    for (int r = 3; r < 2 + static_cast<int>(unary.size()); ++r) {
      prog.push_back(Json::array({"add", acc, r}));
      acc = 2 + static_cast<int>(prog.size()) - 1;
    }
    for (const char* op : {"sub", "mul", "div", "maximum", "minimum", "pow"}) {
      prog.push_back(Json::array({op, acc, 1}));
      acc = 2 + static_cast<int>(prog.size()) - 1;
    }
    progs.push_back({prog, {{d, {3, 331}}, {d, {331}}}, TolClass::Compound, fill_uniform(0.25, 2.0)});
  }
  // Every comparison, each selecting between x0 and x1.
  {
    Json prog = Json::array();
    int acc = 0;
    for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge"}) {
      prog.push_back(Json::array({op, acc, 1}));
      const int c = 2 + static_cast<int>(prog.size()) - 1;
      prog.push_back(Json::array({"where", c, 1, acc}));
      acc = 2 + static_cast<int>(prog.size()) - 1;
      prog.push_back(Json::array({"add", acc, 0}));
      acc = 2 + static_cast<int>(prog.size()) - 1;
    }
    progs.push_back({prog, {{d, {9, 65}}, {d, {9, 65}}}, TolClass::Exact, fill_discrete({-1.0, 0.0, 1.0, 2.0})});
  }
  for (const auto& p : progs) {
    OpSpec s;
    s.op = "fused_elementwise";
    s.params = {{"program", p.program}};
    s.tol = p.tol;
    for (size_t i = 0; i < p.in.size(); ++i)
      s.inputs.push_back({"x" + std::to_string(i), p.in[i].first, p.in[i].second,
                          p.in[i].first == BP_DTYPE_BOOL          ? fill_bools()
                          : i < p.fills.size() && p.fills[i] ? p.fills[i]
                                                              : p.fill});
    ctx.add(s);
  }
}

// Values a cast from `from` to `to` can take without the error docs/ops.md
// defines (float -> int of NaN, infinity or out of range).
Fill cast_fill(bp_dtype from, bp_dtype to) {
  if (from == BP_DTYPE_BOOL) return fill_bools();
  if (is_int(from)) return fill_full_range();
  if (to == BP_DTYPE_BOOL) return with_specials(fill_uniform(-2, 2), {0.0, kNegZero, kInf}, 0.2);
  if (is_float(to)) {
    // Wide magnitudes (overflow to inf in narrower types), NaN, infinities.
    return with_specials(
        [](HostTensor& t, Rng& rng) {
          std::uniform_real_distribution<double> e(-8, 6), u(-1000, 1000);
          for (int64_t k = 0; k < shape_numel(t.shape); ++k) {
            const double m = std::pow(10.0, e(rng));
            store_f64(t, k, k % 2 ? u(rng) : ((rng() & 1u) ? -m : m));
          }
        },
        {kNaN, kInf, -kInf, kNegZero}, 0.05);
  }
  // float -> int: in range after the source dtype's rounding, else 0.
  return [to](HostTensor& t, Rng& rng) {
    const double lo = static_cast<double>(int_min(to)) - 0.9, hi = static_cast<double>(int_max(to)) + 0.9;
    const double span_lo = std::max(lo, -70000.0), span_hi = std::min(hi, 70000.0);
    std::uniform_real_distribution<double> near(span_lo, span_hi), wide(lo, hi);
    for (int64_t k = 0; k < shape_numel(t.shape); ++k) {
      store_f64(t, k, k % 3 == 0 ? wide(rng) : near(rng));
      const double v = std::trunc(load_f64(t, k));
      if (!(v >= static_cast<double>(int_min(to)) && v <= static_cast<double>(int_max(to)) &&
            v < 9.2e18))  // 2^63 rounds into range in double: keep clear of it
        store_f64(t, k, 0.0);
    }
  };
}

void cast_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 1 && in_set(k.in(0), all_dtypes()) && in_set(k.out(), all_dtypes()), k,
          "cast takes one input");
  const bp_dtype from = k.in(0), to = k.out();
  std::vector<Shape> shapes = {{}, {0}, {5}, {7, 13}, {2, 1, 3, 1, 2}, {2, 1, 2, 1, 2, 1, 2, 3}};
  if (ctx.large) shapes.push_back({128, 255});
  for (const auto& sh : shapes) {
    OpSpec s;
    s.op = "cast";
    s.params = {{"dtype", std::string(dtype_name(to))}};
    s.tol = TolClass::Exact;
    s.inputs = {{"x", from, sh, cast_fill(from, to)}};
    ctx.add(s);
  }
}

}  // namespace

void register_elementwise_cases() {
  for (const UnaryOp& u : unary_ops()) register_op_cases(u.op, [u](CaseContext& ctx) { unary_cases(ctx, u); });
  for (const BinaryOp& b : binary_ops()) register_op_cases(b.op, [b](CaseContext& ctx) { binary_cases(ctx, b); });
  for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge"})
    register_op_cases(op, [op = std::string(op)](CaseContext& ctx) { compare_cases(ctx, op); });
  register_op_cases("where", where_cases);
  register_op_cases("fused_elementwise", fused_cases);
  register_op_cases("cast", cast_cases);
}

}  // namespace backplane::conformance
