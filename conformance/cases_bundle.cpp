// Cases for the multi-output (bundled) ops: topk, var_mean, selective_scan.
// Every slot is read through `view` and through `view_owned` (see
// CaseContext::add); slots of different dtypes (topk's i64 indices) too.
#include "conformance/cases.hpp"

namespace backplane::conformance {

namespace {

void require(bool ok, const KernelSpec& k, const std::string& what) {
  if (!ok) throw NoCases(k.op + " " + k.key() + ": " + what + " (docs/ops.md)");
}

void topk_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 1 && k.in(0) == k.out() && (is_float(k.out()) || is_int(k.out())), k,
          "topk takes a float or int x; its primary slot is like x");
  const bp_dtype d = k.out();
  struct T {
    Shape x;
    Json params;
  };
  std::vector<T> list = {
      {{7, 13}, {{"k", 3}}},
      {{7, 13}, {{"k", 3}, {"dim", 0}}},
      {{7, 13}, {{"k", 4}, {"largest", false}}},
      {{7, 13}, {{"k", 5}, {"sorted", false}}},
      {{7, 13}, {{"k", 2}, {"largest", false}, {"sorted", false}, {"dim", -2}}},
      {{7, 13}, {{"k", 13}}},
      {{7, 13}, {{"k", 0}}},
      {{5}, {{"k", 1}}},
      {{5}, {{"k", 5}, {"largest", false}}},
      {{2, 3, 4}, {{"k", 2}, {"dim", 1}}},
      {{0, 5}, {{"k", 2}}},
      {{1, 1}, {{"k", 1}, {"dim", 0}}},
      {{2, 1, 2, 1, 2, 1, 2, 3}, {{"k", 2}, {"dim", 7}}},
  };
  if (ctx.large) {
    list.push_back({{256, 256}, {{"k", 8}}});
    list.push_back({{256, 256}, {{"k", 8}, {"dim", 0}, {"sorted", false}}});
  }
  for (size_t i = 0; i < list.size(); ++i) {
    // Ties (lower index first) and NaN (ranks above every number).
    Fill fill;
    if (is_float(d)) {
      Fill base = i % 2 ? fill_discrete({-1.5, -1, 0, 0.5, 2, 3}) : fill_uniform(-10, 10);
      fill = i % 3 == 0 ? with_specials(base, {kNaN, kInf, -kInf}, 0.05) : base;
    } else {
      fill = i % 2 ? (d == BP_DTYPE_U8 ? fill_ints(0, 4) : fill_ints(-3, 3)) : fill_full_range();
    }
    OpSpec s;
    s.op = "topk";
    s.params = list[i].params;
    s.tol = TolClass::Exact;
    s.inputs = {{"x", d, list[i].x, fill}};
    if (!list[i].params.value("sorted", true)) {
      s.unordered = true;
      s.unordered_dim = list[i].params.value("dim", int64_t{-1});
    }
    ctx.add(s);
  }
}

void var_mean_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 1 && k.in(0) == k.out() && is_float(k.out()), k,
          "var_mean takes a float x; both slots are like x");
  const bp_dtype d = k.out();
  struct V {
    Shape x;
    Json params;
  };
  // Every reduced group has more elements than the correction.
  std::vector<V> list = {
      {{7, 13}, Json::object()},
      {{7, 13}, {{"dims", {1}}}},
      {{7, 13}, {{"dims", {0}}, {"correction", 0}}},
      {{7, 13}, {{"dims", {-1}}, {"keepdim", true}, {"correction", 2}}},
      {{2, 3, 4}, {{"dims", {0, 2}}, {"keepdim", true}}},
      {{2, 3, 4}, {{"dims", {1}}, {"correction", 0.5}}},
      {{5}, Json::object()},
      {{0, 5}, {{"dims", {1}}}},
      {{3, 1}, {{"dims", {1}}, {"correction", 0}}},
      {{2, 1, 2, 1, 2, 1, 2, 3}, {{"dims", {0, 7}}}},
  };
  if (ctx.large) {
    list.push_back({{256, 256}, {{"dims", {1}}}});
    list.push_back({{256, 256}, Json::object()});
  }
  for (const auto& v : list) {
    OpSpec s;
    s.op = "var_mean";
    s.params = v.params;
    s.tol = TolClass::Compound;
    s.inputs = {{"x", d, v.x, fill_uniform(-2, 3)}};
    ctx.add(s);
  }
}

void selective_scan_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 5 && is_float(k.out()), k, "selective_scan takes u, delta, a, b, c of a float dtype");
  for (size_t i = 0; i < 5; ++i) require(k.in(i) == k.out(), k, "selective_scan inputs share one dtype");
  const bp_dtype d = k.out();
  struct S {
    int64_t B, L, D, N;
    bool softplus;
  };
  std::vector<S> list = {
      {2, 5, 3, 4, false}, {2, 5, 3, 4, true}, {1, 1, 1, 1, false}, {1, 7, 2, 1, true},
      {3, 0, 2, 3, false},  // no steps: y is empty, last_state is zero
      {1, 3, 5, 2, false},
  };
  if (ctx.large) list.push_back({2, 128, 64, 16, true});
  // a = -exp(A_log) as Mamba passes it; values that keep y away from 0.
  Fill a_fill = [](HostTensor& t, Rng& rng) {
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (int64_t i = 0; i < shape_numel(t.shape); ++i) store_f64(t, i, -std::exp(u(rng)));
  };
  for (const auto& c : list) {
    OpSpec s;
    s.op = "selective_scan";
    s.params = {{"delta_softplus", c.softplus}};
    s.tol = TolClass::Compound;
    s.inputs = {
        {"u", d, {c.B, c.L, c.D}, fill_uniform(-0.25, 1.0)},
        {"delta", d, {c.B, c.L, c.D}, c.softplus ? fill_uniform(-2, 1) : fill_uniform(0.01, 0.5)},
        {"a", d, {c.D, c.N}, a_fill},
        {"b", d, {c.B, c.L, c.N}, fill_uniform(-0.25, 1.0)},
        {"c", d, {c.B, c.L, c.N}, fill_uniform(-0.25, 1.0)},
    };
    ctx.add(s);
  }
}

}  // namespace

void register_bundle_cases() {
  register_op_cases("topk", topk_cases);
  register_op_cases("var_mean", var_mean_cases);
  register_op_cases("selective_scan", selective_scan_cases);
}

}  // namespace backplane::conformance
