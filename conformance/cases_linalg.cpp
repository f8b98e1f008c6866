// Cases for linear algebra, convolution and indexing: matmul, conv2d,
// max_pool2d, avg_pool2d, gather, index_select, concat, slice_update.
#include "conformance/cases.hpp"

namespace backplane::conformance {

namespace {

void require(bool ok, const KernelSpec& k, const std::string& what) {
  if (!ok) throw NoCases(k.op + " " + k.key() + ": " + what + " (docs/ops.md)");
}

// Mostly positive values: dot products do not cancel to ~0, where docs/ops.md's
// relative bound would measure rounding noise.
Fill dot_fill() { return fill_uniform(-0.25, 1.0); }

void matmul_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  // docs/ops.md lists float; integer matmul (exact, wrapping like mul and sum) is
  // an extension the CPU plugin offers, checked exactly when claimed.
  require(k.declared_inputs() == 2 && k.in(0) == k.out() && k.in(1) == k.out() &&
              (is_float(k.out()) || is_int(k.out())),
          k, "matmul takes a, b of one float (or integer) dtype");
  const bp_dtype d = k.out();
  const bool fl = is_float(d);
  std::vector<std::pair<Shape, Shape>> list = {
      {{1, 1}, {1, 1}},       {{7, 13}, {13, 5}},         {{0, 3}, {3, 4}},          {{3, 0}, {0, 4}},
      {{5}, {5}},             {{5}, {5, 3}},              {{4, 5}, {5}},             {{2, 3, 4}, {4, 5}},
      {{2, 3, 4}, {2, 4, 5}}, {{2, 1, 3, 4}, {5, 4, 6}},  {{3, 4}, {2, 4, 5}},       {{1, 17}, {17, 1}},
      {{2, 1, 2, 1, 2, 1, 3, 4}, {2, 1, 2, 1, 2, 4, 2}},
      // One query row per head against its own b (attention over a cache).
      {{4, 1, 40}, {4, 40, 33}}, {{2, 3, 1, 24}, {2, 3, 24, 70}},
  };
  if (ctx.large) {
    list.push_back({{256, 256}, {256, 64}});
    list.push_back({{4, 64, 128}, {128, 48}});
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& [sa, sb] = list[i];
    // Integers: small values, and full-range ones where products wrap.
    const Fill f = fl ? dot_fill() : i % 3 == 2 ? fill_full_range() : d == BP_DTYPE_U8 ? fill_ints(0, 5) : fill_ints(-5, 5);
    OpSpec s;
    s.op = "matmul";
    s.tol = fl ? TolClass::Compound : TolClass::Exact;
    s.inputs = {{"a", d, sa, f}, {"b", d, sb, f}};
    ctx.add(s);
  }
}

void conv2d_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 3 && k.in(0) == k.out() && k.in(1) == k.out() && k.in(2) == k.out() &&
              is_float(k.out()),
          k, "conv2d takes x, w, bias? of one float dtype");
  const bp_dtype d = k.out();
  struct Conv {
    Shape x, w;
    bool bias;
    Json params;
  };
  std::vector<Conv> list = {
      {{2, 4, 7, 9}, {6, 4, 3, 3}, true, {{"stride", {1, 1}}, {"padding", {1, 1}}, {"dilation", {1, 1}}, {"groups", 1}}},
      {{2, 4, 7, 9}, {6, 4, 3, 3}, false, Json::object()},
      {{1, 3, 8, 8}, {4, 3, 3, 3}, true, {{"stride", 2}, {"padding", 1}}},
      {{1, 3, 8, 9}, {2, 3, 3, 2}, true, {{"stride", {2, 1}}, {"padding", {0, 1, 2, 1}}}},
      {{1, 4, 9, 9}, {4, 2, 3, 3}, true, {{"groups", 2}, {"dilation", 2}, {"padding", 2}}},
      {{2, 4, 6, 6}, {4, 1, 3, 3}, false, {{"groups", 4}, {"padding", {1, 1}}}},  // depthwise
      {{1, 2, 5, 5}, {3, 2, 1, 1}, true, Json::object()},
      {{1, 1, 1, 1}, {1, 1, 1, 1}, true, Json::object()},
      {{0, 3, 5, 5}, {2, 3, 3, 3}, true, Json::object()},
      {{1, 2, 4, 7}, {3, 2, 2, 3}, false, {{"stride", {1, 2}}, {"dilation", {2, 1}}}},
  };
  if (ctx.large) {
    list.push_back({{1, 16, 32, 32}, {16, 16, 3, 3}, true, {{"padding", 1}}});
    // Wide enough for the CPU plugin's Winograd F(2x2, 3x3) path: with and
    // without bias, and odd output sizes (tiles hanging over the edge) with
    // uneven padding.
    list.push_back({{2, 32, 12, 12}, {32, 32, 3, 3}, true, {{"padding", 1}}});
    list.push_back({{2, 32, 12, 12}, {32, 32, 3, 3}, false, {{"padding", 1}}});
    list.push_back({{2, 32, 13, 11}, {40, 32, 3, 3}, true, {{"padding", {0, 1, 2, 1}}}});
  }
  for (const auto& c : list) {
    OpSpec s;
    s.op = "conv2d";
    s.params = c.params;
    s.tol = TolClass::Compound;
    InputSpec bias{"bias", d, {c.w[0]}, dot_fill()};
    bias.absent = !c.bias;
    s.inputs = {{"x", d, c.x, dot_fill()}, {"w", d, c.w, dot_fill()}, bias};
    ctx.add(s);
  }
}

// scaled_dot_product_attention: single and many heads, Sq < Sk (a KV
// cache), Sq == 1, key counts that cross the CPU kernel's 128-key blocks,
// masks of every broadcast form (with -inf entries), causal with Sq == Sk,
// Sq < Sk and Sq > Sk (its first rows see no key: NaN, as the composed ops
// give), explicit scales, empty batches and empty key sets. v is mostly
// positive so a weighted average never cancels to ~0, where the relative
// bound would measure noise.
void attention_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  const size_t n = k.declared_inputs();
  require(n == 4 && k.in(0) == k.out() && k.in(1) == k.out() && k.in(2) == k.out() && k.in(3) == k.out() &&
              is_float(k.out()),
          k, "scaled_dot_product_attention takes q, k, v, mask? of one float dtype");
  const bp_dtype d = k.out();
  struct Att {
    Shape q, k, v;
    std::optional<Shape> mask;
    Json params;
  };
  std::vector<Att> list = {
      {{1, 1}, {1, 1}, {1, 1}, std::nullopt, Json::object()},
      {{5, 8}, {7, 8}, {7, 3}, std::nullopt, Json::object()},
      {{2, 3, 4, 16}, {2, 3, 9, 16}, {2, 3, 9, 16}, Shape{4, 9}, Json::object()},
      {{2, 1, 16}, {2, 200, 16}, {2, 200, 24}, Shape{2, 1, 200}, {{"scale", 0.3}}},
      {{3, 6, 32}, {3, 6, 32}, {3, 6, 32}, std::nullopt, {{"causal", true}}},
      {{2, 4, 8}, {2, 11, 8}, {2, 11, 5}, Shape{1, 1, 11}, {{"causal", true}}},
      {{1, 6, 8}, {1, 4, 8}, {1, 4, 8}, std::nullopt, {{"causal", true}}},
      {{1, 2, 140, 40}, {1, 2, 300, 40}, {1, 2, 300, 40}, Shape{2, 1, 1}, {{"causal", true}, {"scale", 0.2}}},
      {{0, 3, 8}, {0, 5, 8}, {0, 5, 4}, std::nullopt, Json::object()},
      {{2, 3, 8}, {2, 0, 8}, {2, 0, 4}, std::nullopt, Json::object()},
  };
  if (ctx.large) list.push_back({{1, 4, 256, 64}, {1, 4, 256, 64}, {1, 4, 256, 64}, std::nullopt, {{"causal", true}}});
  for (const auto& a : list) {
    OpSpec s;
    s.op = "scaled_dot_product_attention";
    s.params = a.params;
    s.tol = TolClass::Compound;
    InputSpec mask{"mask", d, a.mask.value_or(Shape{1}), with_specials(fill_uniform(-2.0, 0.5), {-INFINITY}, 0.1)};
    mask.absent = !a.mask;
    s.inputs = {{"q", d, a.q, fill_uniform(-1.0, 1.0)}, {"k", d, a.k, fill_uniform(-1.0, 1.0)},
                {"v", d, a.v, dot_fill()}, mask};
    ctx.add(s);
  }
}

// max_pool2d and avg_pool2d: the same windows (stride, padding of 1, 2 and
// 4 values, dilation, ceil_mode with and without a dropped last window,
// non-square kernels, N > 1, empty batches, windows wholly in padding);
// avg alternates count_include_pad. max sees NaN, infinities and -0 and is
// exact (it picks an element).
void pool2d_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  const bool avg = k.op == "avg_pool2d";
  require(k.declared_inputs() == 1 && k.in(0) == k.out() && is_float(k.out()), k,
          k.op + " takes one float x and returns like x");
  const bp_dtype d = k.out();
  struct Pool {
    Shape x;
    Json params;
  };
  std::vector<Pool> list = {
      {{2, 3, 8, 9}, {{"kernel_size", 2}}},  // stride absent: the kernel size
      {{1, 2, 7, 7}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}},
      {{1, 2, 7, 7}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"ceil_mode", true}}},
      {{2, 2, 6, 7}, {{"kernel_size", {2, 3}}, {"stride", {1, 2}}}},
      {{1, 3, 9, 8}, {{"kernel_size", 3}, {"stride", 2}, {"padding", {0, 1, 2, 1}}}},  // top, left, bottom, right
      {{1, 2, 9, 10}, {{"kernel_size", {2, 3}}, {"stride", 1}, {"dilation", {2, 1}}, {"padding", {1, 0}}}},
      {{1, 2, 5, 5}, {{"kernel_size", 2}, {"stride", 2}, {"padding", 1}, {"ceil_mode", true}}},  // last window dropped
      {{1, 2, 6, 6}, {{"kernel_size", 3}, {"stride", 2}, {"ceil_mode", true}}},  // last window hangs over
      {{2, 1, 7, 6}, {{"kernel_size", {3, 2}}, {"stride", {2, 3}}, {"padding", {1, 0, 1, 1}}, {"dilation", {1, 2}}, {"ceil_mode", true}}},
      {{3, 2, 4, 5}, {{"kernel_size", 1}, {"stride", 1}}},
      {{0, 2, 5, 5}, {{"kernel_size", 2}}},
      {{1, 1, 1, 1}, {{"kernel_size", 1}}},
      {{2, 4, 7, 7}, {{"kernel_size", 7}}},  // global pooling
      {{1, 1, 3, 3}, {{"kernel_size", 2}, {"stride", 1}, {"padding", 2}}},  // windows wholly in padding
  };
  if (ctx.large) {
    list.push_back({{2, 16, 32, 32}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}});  // ResNet's stem
    list.push_back({{1, 8, 64, 64}, {{"kernel_size", 2}, {"stride", 2}}});
    list.push_back({{1, 4, 300, 13}, {{"kernel_size", {3, 3}}, {"stride", 1}, {"padding", 1}}});  // several row blocks
  }
  for (size_t i = 0; i < list.size(); ++i) {
    OpSpec s;
    s.op = k.op;
    s.params = list[i].params;
    if (avg && i % 2 == 1) s.params["count_include_pad"] = false;
    s.tol = avg ? TolClass::Compound : TolClass::Selection;
    const Fill f = avg ? dot_fill() : with_specials(fill_uniform(-10, 10), {kNaN, kInf, -kInf, -0.0, 0.0}, 0.04);
    s.inputs = {{"x", d, list[i].x, f}};
    ctx.add(s);
  }
  if (!avg) {
    // Ties and signed zeros: windows of -0 and 0 (either may be picked; the
    // sign of a zero is not compared) and equal values.
    OpSpec s;
    s.op = k.op;
    s.params = {{"kernel_size", 2}, {"stride", 1}};
    s.tol = TolClass::Selection;
    s.inputs = {{"x", d, {1, 2, 5, 6}, fill_discrete({-0.0, 0.0, -1.0, 1.0})}};
    ctx.add(s);
  } else {
    // Values that do not cancel to ~0 are dot_fill's; here infinities pass
    // through a mean (inf, -inf, and NaN where both meet).
    OpSpec s;
    s.op = k.op;
    s.params = {{"kernel_size", 2}, {"stride", 2}, {"padding", 1}};
    s.tol = TolClass::Compound;
    s.inputs = {{"x", d, {1, 2, 6, 6}, with_specials(dot_fill(), {kNaN, kInf, -kInf}, 0.05)}};
    ctx.add(s);
  }
}

// Any value moves unchanged: NaN, infinities, -0 included.
Fill move_fill(bp_dtype d) {
  if (is_float(d)) return with_specials(fill_uniform(-10, 10), {kNaN, kInf, -kInf, -0.0}, 0.05);
  return fill_full_range();
}

void gather_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 2 && k.in(0) == k.out() && k.in(1) == BP_DTYPE_I64, k,
          "gather takes x and an i64 index and returns like x");
  const bp_dtype d = k.out();
  struct G {
    Shape x, index;
    int64_t dim;
  };
  std::vector<G> list = {
      {{7, 13}, {7, 5}, 1},  {{7, 13}, {4, 13}, 0},  {{7, 13}, {3, 5}, 1},   {{7, 13}, {7, 13}, -1},
      {{5}, {9}, 0},         {{2, 3, 4}, {2, 6, 4}, 1}, {{3, 4}, {0, 4}, 0},   {{1, 1}, {1, 1}, 0},
      {{2, 1, 2, 1, 2, 1, 2, 3}, {2, 1, 2, 1, 2, 1, 2, 5}, 7},
  };
  if (ctx.large) list.push_back({{256, 256}, {256, 256}, 0});
  for (const auto& g : list) {
    const int64_t n = g.x[static_cast<size_t>(g.dim < 0 ? g.dim + static_cast<int64_t>(g.x.size()) : g.dim)];
    OpSpec s;
    s.op = "gather";
    s.params = {{"dim", g.dim}};
    s.tol = TolClass::Exact;
    s.inputs = {{"x", d, g.x, move_fill(d)}, {"index", BP_DTYPE_I64, g.index, fill_ints(-n, n - 1)}};
    ctx.add(s);
  }
}

void index_select_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 2 && k.in(0) == k.out() && k.in(1) == BP_DTYPE_I64, k,
          "index_select takes x and an i64 index and returns like x");
  const bp_dtype d = k.out();
  struct IS {
    Shape x, index;
    int64_t dim;
  };
  std::vector<IS> list = {
      {{7, 13}, {4}, 1},      {{7, 13}, {4}, 0},     {{7, 13}, {}, 1},      {{7, 13}, {2, 3}, 0},
      {{7, 13}, {0}, -1},     {{5}, {8}, 0},         {{2, 3, 4}, {5}, 1},   {{2, 3, 4}, {2, 2}, -1},
      {{0, 3}, {2}, 1},       {{2, 1, 2, 1, 2, 1, 2, 3}, {4}, 7},
  };
  if (ctx.large) list.push_back({{256, 256}, {300}, 0});
  for (const auto& g : list) {
    const int64_t n = g.x[static_cast<size_t>(g.dim < 0 ? g.dim + static_cast<int64_t>(g.x.size()) : g.dim)];
    OpSpec s;
    s.op = "index_select";
    s.params = {{"dim", g.dim}};
    s.tol = TolClass::Exact;
    s.inputs = {{"x", d, g.x, move_fill(d)}, {"index", BP_DTYPE_I64, g.index, fill_ints(-n, n - 1)}};
    ctx.add(s);
  }
}

void concat_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.variadic && k.declared_inputs() >= 1, k, "concat is variadic");
  for (size_t i = 0; i < k.declared_inputs(); ++i) require(k.in(i) == k.out(), k, "concat inputs share the output dtype");
  const bp_dtype d = k.out();
  struct C {
    std::vector<Shape> xs;
    int64_t dim;
  };
  std::vector<C> list = {
      {{{7, 13}}, 0},
      {{{7, 13}, {2, 13}}, 0},
      {{{7, 13}, {7, 1}, {7, 5}}, 1},
      {{{0, 5}, {3, 5}}, 0},
      {{{3, 5}, {3, 0}, {3, 2}}, -1},
      {{{5}, {4}}, 0},
      {{{2, 3, 4}, {2, 1, 4}, {2, 2, 4}, {2, 3, 4}}, 1},
      {{{2, 1, 2, 1, 2, 1, 2, 3}, {2, 1, 2, 1, 2, 1, 2, 1}}, 7},
  };
  if (ctx.large) list.push_back({{{128, 256}, {127, 256}}, 0});
  for (const auto& c : list) {
    OpSpec s;
    s.op = "concat";
    s.params = {{"dim", c.dim}};
    s.tol = TolClass::Exact;
    for (size_t i = 0; i < c.xs.size(); ++i) s.inputs.push_back({"x" + std::to_string(i), d, c.xs[i], move_fill(d)});
    ctx.add(s);
  }
}

// start is drawn inside its range, so both edges (0 and size - len) come up
// over the cases; an update as long as x replaces it whole.
void slice_update_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  require(k.declared_inputs() == 3 && k.in(0) == k.out() && k.in(1) == k.out() && k.in(2) == BP_DTYPE_I64, k,
          "slice_update takes x, an update like x and an i64 start, and returns like x");
  const bp_dtype d = k.out();
  struct SU {
    Shape x, update, start;
    int64_t dim;
  };
  std::vector<SU> list = {
      {{16, 8}, {1, 8}, {1}, 0},       {{16, 8}, {3, 8}, {}, 0},         {{16, 8}, {16, 3}, {1}, 1},
      {{16, 8}, {16, 8}, {1}, -1},     {{2, 9, 4}, {2, 2, 4}, {1}, 1},   {{2, 9, 4}, {2, 0, 4}, {}, 1},
      {{7}, {7}, {1}, 0},              {{1, 4, 12, 2}, {1, 4, 5, 2}, {1, 1}, 2},
      {{2, 1, 2, 1, 2, 1, 2, 7}, {2, 1, 2, 1, 2, 1, 2, 2}, {1}, 7},
  };
  if (ctx.large) list.push_back({{512, 256}, {1, 256}, {1}, 0});
  for (const auto& g : list) {
    const size_t dim = static_cast<size_t>(g.dim < 0 ? g.dim + static_cast<int64_t>(g.x.size()) : g.dim);
    OpSpec s;
    s.op = "slice_update";
    s.params = {{"dim", g.dim}};
    s.tol = TolClass::Exact;
    s.inputs = {{"x", d, g.x, move_fill(d)},
                {"update", d, g.update, move_fill(d)},
                {"start", BP_DTYPE_I64, g.start, fill_ints(0, g.x[dim] - g.update[dim])}};
    ctx.add(s);
  }
}

}  // namespace

void register_linalg_cases() {
  register_op_cases("matmul", matmul_cases);
  register_op_cases("scaled_dot_product_attention", attention_cases);
  register_op_cases("conv2d", conv2d_cases);
  register_op_cases("max_pool2d", pool2d_cases);
  register_op_cases("avg_pool2d", pool2d_cases);
  register_op_cases("gather", gather_cases);
  register_op_cases("index_select", index_select_cases);
  register_op_cases("concat", concat_cases);
  register_op_cases("slice_update", slice_update_cases);
}

}  // namespace backplane::conformance
