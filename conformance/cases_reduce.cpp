// Cases for reductions and normalisation: sum mean prod max min, argmax
// argmin, softmax log_softmax, cumsum, layer_norm.
#include "conformance/cases.hpp"

namespace backplane::conformance {

namespace {

void require(bool ok, const KernelSpec& k, const std::string& what) {
  if (!ok) throw NoCases(k.op + " " + k.key() + ": " + what + " (docs/ops.md)");
}

struct ShapeParams {
  Shape shape;
  Json params;
};

// Sum-like fills stay away from cancellation, so docs/ops.md's relative bound is
// meaningful for f32 sums of 64K elements (mixed signs all the same).
Fill sum_fill(bp_dtype d) { return is_float(d) ? fill_uniform(-0.25, 1.0) : fill_full_range(); }

void reduce_cases(CaseContext& ctx, const std::string& op) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 1 && k.in(0) == k.out(), k, "a reduction maps x to like x");
  const bp_dtype d = k.out();
  require(is_float(d) || (op != "mean" && is_int(d)), k, "dtype not defined for " + op);
  const bool empty_axis_ok = op == "sum" || op == "prod";
  std::vector<ShapeParams> list = {
      {{}, Json::object()},
      {{}, {{"keepdim", true}}},
      {{5}, Json::object()},
      {{5}, {{"dims", {0}}}},
      {{5}, {{"dims", {-1}}, {"keepdim", true}}},
      {{7, 13}, {{"dims", {1}}}},
      {{7, 13}, {{"dims", {0}}}},
      {{7, 13}, {{"dims", {0, 1}}}},
      {{7, 13}, {{"keepdim", true}}},
      {{7, 13}, {{"dims", {-2}}, {"keepdim", true}}},
      {{0, 5}, {{"dims", {1}}}},
      {{1, 1, 1}, {{"dims", {1}}}},
      {{2, 3, 4}, {{"dims", {0, 2}}}},
      {{2, 3, 4}, {{"dims", {2, 0}}, {"keepdim", true}}},
      {{2, 3, 4}, {{"dims", {1}}, {"keepdim", true}}},
      {{2, 1, 2, 1, 2, 1, 2, 3}, {{"dims", {1, 3, 5}}}},
      {{2, 1, 2, 1, 2, 1, 2, 3}, {{"dims", {0, 7}}}},
      {{2, 1, 2, 1, 2, 1, 2, 3}, Json::object()},
  };
  if (empty_axis_ok && op != "mean") {
    list.push_back({{0, 5}, {{"dims", {0}}}});  // an empty axis: sum 0, prod 1
    list.push_back({{0}, Json::object()});
  }
  if (ctx.large) {
    list.push_back({{256, 256}, {{"dims", {0}}}});
    list.push_back({{256, 256}, {{"dims", {1}}}});
    if (op != "prod") list.push_back({{256, 256}, Json::object()});
  }
  Fill fill;
  TolClass tol = TolClass::Compound;
  if (op == "sum" || op == "mean") {
    fill = sum_fill(d);
  } else if (op == "prod") {
    // Magnitudes near 1 keep products of 256 finite in f16.
    fill = is_float(d) ? fill_nonzero(0.8, 1.25) : fill_discrete({-2, -1, 1, 2, 3, 0});
  } else {
    tol = TolClass::Exact;
    fill = is_float(d) ? with_specials(fill_uniform(-10, 10), {kNaN, kInf, -kInf}, 0.02) : fill_full_range();
  }
  for (const auto& sp : list) {
    OpSpec s;
    s.op = op;
    s.params = sp.params;
    s.tol = tol;
    s.inputs = {{"x", d, sp.shape, fill}};
    ctx.add(s);
  }
}

void argreduce_cases(CaseContext& ctx, const std::string& op) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 1 && (is_float(k.in(0)) || is_int(k.in(0))) && k.out() == BP_DTYPE_I64, k,
          "argmax/argmin take a float or int x and return i64");
  const bp_dtype d = k.in(0);
  std::vector<ShapeParams> list = {
      {{5}, {{"dim", 0}}},
      {{1}, {{"dim", 0}}},
      {{7, 13}, {{"dim", 1}}},
      {{7, 13}, {{"dim", 0}}},
      {{7, 13}, {{"dim", -1}, {"keepdim", true}}},
      {{7, 13}, {{"dim", 1}, {"select_last_index", true}}},
      {{2, 3, 4}, {{"dim", 1}}},
      {{2, 3, 4}, {{"dim", 1}, {"keepdim", true}, {"select_last_index", true}}},
      {{0, 5}, {{"dim", 1}}},
      {{2, 1, 2, 1, 2, 1, 2, 3}, {{"dim", 3}}},
      {{2, 1, 2, 1, 2, 1, 2, 3}, {{"dim", 6}}},
  };
  if (ctx.large) {
    list.push_back({{256, 256}, {{"dim", 1}}});
    list.push_back({{256, 256}, {{"dim", 0}, {"select_last_index", true}}});
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const bool last = list[i].params.value("select_last_index", false);
    // Ties (few distinct values), and NaN where docs/ops.md fixes the answer
    // (the first NaN; with select_last_index NaN is left out).
    Fill fill;
    if (is_float(d)) {
      Fill base = i % 2 ? fill_discrete({-1.5, -1, 0, 0.5, 2}) : fill_uniform(-10, 10);
      fill = last ? base : with_specials(base, {kNaN, kInf, -kInf}, 0.03);
    } else {
      fill = i % 2 ? (d == BP_DTYPE_U8 ? fill_ints(0, 4) : fill_ints(-3, 3)) : fill_full_range();
    }
    OpSpec s;
    s.op = op;
    s.params = list[i].params;
    s.tol = TolClass::Exact;
    s.inputs = {{"x", d, list[i].shape, fill}};
    ctx.add(s);
  }
}

void softmax_cases(CaseContext& ctx, const std::string& op) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 1 && k.in(0) == k.out() && is_float(k.out()), k, op + " maps float x to like x");
  const bp_dtype d = k.out();
  std::vector<ShapeParams> list = {
      {{5}, {{"dim", 0}}},       {{7, 13}, {{"dim", 1}}},    {{7, 13}, {{"dim", 0}}},
      {{2, 3, 4}, {{"dim", 1}}}, {{2, 3, 4}, {{"dim", -1}}}, {{1, 1, 1}, {{"dim", 1}}},
      {{0, 5}, {{"dim", 1}}},    {{3, 0}, {{"dim", 1}}},     {{2, 1, 2, 1, 2, 1, 2, 3}, {{"dim", 4}}},
      {{2, 1, 2, 1, 2, 1, 2, 3}, {{"dim", 7}}},
  };
  if (ctx.large) {
    list.push_back({{64, 1024}, {{"dim", -1}}});
    list.push_back({{1024, 64}, {{"dim", 0}}});
  }
  for (const auto& sp : list) {
    OpSpec s;
    s.op = op;
    s.params = sp.params;
    s.tol = op == "softmax" ? TolClass::Probability : TolClass::Compound;
    s.inputs = {{"x", d, sp.shape, fill_uniform(-5, 5)}};
    ctx.add(s);
  }
}

void cumsum_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 1 && k.in(0) == k.out() && (is_float(k.out()) || is_int(k.out())), k,
          "cumsum maps float or int x to like x");
  const bp_dtype d = k.out();
  const std::vector<Json> flags = {Json::object(),
                                   {{"exclusive", true}},
                                   {{"reverse", true}},
                                   {{"exclusive", true}, {"reverse", true}}};
  std::vector<ShapeParams> list = {
      {{5}, {{"dim", 0}}},       {{7, 13}, {{"dim", 1}}}, {{7, 13}, {{"dim", 0}}},
      {{2, 3, 4}, {{"dim", -2}}}, {{0, 4}, {{"dim", 0}}},  {{3, 0}, {{"dim", 1}}},
      {{1}, {{"dim", 0}}},       {{2, 1, 2, 1, 2, 1, 2, 3}, {{"dim", 5}}},
  };
  if (ctx.large) {
    list.push_back({{64, 1024}, {{"dim", 1}}});
    list.push_back({{1024, 64}, {{"dim", 0}}});
  }
  for (size_t i = 0; i < list.size(); ++i) {
    for (size_t f = 0; f < flags.size(); ++f) {
      if (f > 0 && i % 2 != f % 2 && i != 1) continue;  // every flag combination, not on every shape
      Json p = list[i].params;
      p.update(flags[f]);
      OpSpec s;
      s.op = "cumsum";
      s.params = p;
      s.tol = is_float(d) ? TolClass::Compound : TolClass::Exact;
      s.inputs = {{"x", d, list[i].shape, sum_fill(d)}};
      ctx.add(s);
    }
  }
}

void layer_norm_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 3 && k.in(0) == k.out() && k.in(1) == k.out() && k.in(2) == k.out() &&
              is_float(k.out()),
          k, "layer_norm takes x, weight?, bias? of one float dtype");
  const bp_dtype d = k.out();
  struct LN {
    Shape x;
    std::vector<int64_t> dims;
    bool w, b;
    Json extra;
  };
  std::vector<LN> list = {
      {{7, 13}, {-1}, true, true, Json::object()},
      {{7, 13}, {-1}, false, false, Json::object()},
      {{7, 13}, {-1}, true, false, {{"eps", 1e-3}}},
      {{7, 13}, {-1}, false, true, Json::object()},
      {{2, 3, 4}, {-2, -1}, true, true, Json::object()},
      {{2, 3, 4}, {-1}, true, true, {{"eps", 1e-3}}},
      {{5}, {-1}, true, true, Json::object()},
      {{0, 8}, {-1}, true, true, Json::object()},
      {{1, 1}, {-1}, true, true, Json::object()},
      {{2, 1, 2, 1, 2, 1, 2, 3}, {-2, -1}, true, true, Json::object()},
  };
  if (ctx.large) list.push_back({{256, 256}, {-1}, true, true, Json::object()});
  for (const auto& ln : list) {
    const Shape norm(ln.x.end() - static_cast<int64_t>(ln.dims.size()), ln.x.end());
    Json p = {{"dims", ln.dims}};
    p.update(ln.extra);
    OpSpec s;
    s.op = "layer_norm";
    s.params = p;
    s.tol = TolClass::Compound;
    InputSpec w{"weight", d, norm, fill_uniform(0.5, 1.5)}, b{"bias", d, norm, fill_uniform(-1, 1)};
    w.absent = !ln.w;
    b.absent = !ln.b;
    s.inputs = {{"x", d, ln.x, fill_uniform(-2, 3)}, w, b};
    ctx.add(s);
  }
}

}  // namespace

void register_reduction_cases() {
  for (const char* op : {"sum", "mean", "prod", "max", "min"})
    register_op_cases(op, [op = std::string(op)](CaseContext& ctx) { reduce_cases(ctx, op); });
  for (const char* op : {"argmax", "argmin"})
    register_op_cases(op, [op = std::string(op)](CaseContext& ctx) { argreduce_cases(ctx, op); });
  for (const char* op : {"softmax", "log_softmax"})
    register_op_cases(op, [op = std::string(op)](CaseContext& ctx) { softmax_cases(ctx, op); });
  register_op_cases("cumsum", cumsum_cases);
  register_op_cases("layer_norm", layer_norm_cases);
}

}  // namespace backplane::conformance
