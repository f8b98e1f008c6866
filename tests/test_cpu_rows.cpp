// The CPU plugin's row kernels for contiguous f32 (rowops.cpp, taken at
// avx2 and wider): layer_norm's vector path (the mean, the moments about it
// in double, then (x - mean) * rstd * w + b in f32 with the mean split in two
// floats) and softmax, on transformer shapes over two threads, against an
// f64 reference within docs/ops.md's f32 bound (1e-4 relative or 1e-6
// absolute). The rows sit far from zero with a small spread, where an f32
// mean alone would cost the spread its digits.
#include <catch2/catch.hpp>

#include <backplane/backplane.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

using backplane::Graph;
using backplane::HostTensor;
using backplane::Shape;

namespace {

backplane::Runtime& runtime() {
  static backplane::Runtime* rt = [] {
    backplane::RuntimeOptions o;
    o.num_threads = 2;
    return backplane::Runtime::create(o).release();
  }();
  return *rt;
}

HostTensor normal(Shape shape, double mean, double sd, uint32_t seed) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(mean, sd);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
  return t;
}

void check_close(const HostTensor& got, const std::vector<double>& want) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want[static_cast<size_t>(i)], err = std::abs(g - w);
    if (err <= 1e-6 || err <= 1e-4 * std::abs(w)) continue;
    if (bad++ == 0) first = "at " + std::to_string(i) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
  }
  INFO(first);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("cpu layer_norm and softmax: f32 rows of transformer shapes on two threads", "[cpu][rows]") {
  auto& rt = runtime();
  auto& dev = rt.device("cpu");
  SECTION("layer_norm over the last dim (no weight, bias) and over the last two, rows far from zero") {
    for (int nd : {1, 2}) {
      const Shape shape = nd == 2 ? Shape{4, 32, 96, 8} : Shape{4, 32, 768};
      const int64_t n = 768, rows = 4 * 32;
      const Shape wshape = nd == 2 ? Shape{96, 8} : Shape{1};
      const HostTensor x = normal(shape, 1000.0, 0.01, 1);
      const HostTensor w = normal(nd == 2 ? wshape : Shape{1}, 1.0, 0.5, 2);
      const HostTensor b = normal(nd == 2 ? wshape : Shape{1}, 0.0, 0.5, 3);
      Graph g;
      g.input("x", BP_DTYPE_F32, shape);
      std::map<std::string, HostTensor> in{{"x", x}};
      if (nd == 2) {
        g.input("w", BP_DTYPE_F32, wshape);
        g.input("b", BP_DTYPE_F32, wshape);
        in["w"] = w;
        in["b"] = b;
        g.node("y", "layer_norm", {"x", "w", "b"}, {{"dims", {-2, -1}}});
      } else {
        g.node("y", "layer_norm", {"x", "", ""}, {{"dims", {-1}}});
      }
      g.output("y");
      auto plan = rt.compile(g, dev);
      std::vector<double> want(static_cast<size_t>(rows * n));
      for (int64_t r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (int64_t k = 0; k < n; ++k) mean += x.get(r * n + k);
        mean /= static_cast<double>(n);
        for (int64_t k = 0; k < n; ++k) var += (x.get(r * n + k) - mean) * (x.get(r * n + k) - mean);
        var /= static_cast<double>(n);
        for (int64_t k = 0; k < n; ++k)
          want[static_cast<size_t>(r * n + k)] = (x.get(r * n + k) - mean) / std::sqrt(var + 1e-5) *
                                                     (nd == 2 ? w.get(k) : 1.0) + (nd == 2 ? b.get(k) : 0.0);
      }
      check_close(plan.run(in).at("y"), want);
    }
  }
  SECTION("softmax over the last dim: attention scores and a hidden state") {
    for (const Shape& shape : {Shape{4, 128, 128}, Shape{128, 768}}) {
      const HostTensor x = normal(shape, 0.0, 3.0, 4);
      const int64_t n = shape.back(), rows = x.numel() / n;
      Graph g;
      g.input("x", BP_DTYPE_F32, shape);
      g.node("y", "softmax", {"x"}, {{"dim", -1}});
      g.output("y");
      auto plan = rt.compile(g, dev);
      std::vector<double> want(static_cast<size_t>(x.numel()));
      for (int64_t r = 0; r < rows; ++r) {
        double m = -INFINITY, s = 0;
        for (int64_t k = 0; k < n; ++k) m = std::max(m, x.get(r * n + k));
        for (int64_t k = 0; k < n; ++k) s += std::exp(x.get(r * n + k) - m);
        for (int64_t k = 0; k < n; ++k) want[static_cast<size_t>(r * n + k)] = std::exp(x.get(r * n + k) - m) / s;
      }
      check_close(plan.run({{"x", x}}).at("y"), want);
    }
  }
}

// gelu (erf form) over dense f32 takes the plugin's vector path (a fitted
// erfc, rowops.cpp) on avx2 machines. Every f32 step of x in [-14, 14] from
// a fine grid, the range where the result leaves 0, against 0.5 x erfc(-x /
// sqrt 2) in long double, within docs/ops.md's single-op f32 bound
// (relative 1e-5 or absolute 1e-6); and the special values: NaN stays NaN,
// +inf stays +inf, -0 and the far negative tail give 0. Wrong answers this
// catches: a polynomial fitted for the wrong variable or range, the erfc
// branch taken for the wrong sign (1 - erf cancelling for x << 0: relative
// error 1 in the tail), a tail cut too early.
TEST_CASE("cpu gelu: the f32 vector path against long double over its whole range", "[cpu][rows]") {
  auto& rt = runtime();
  const int64_t n = 2 * 280001 + 7;  // an odd count: the last partial vector too
  HostTensor x(BP_DTYPE_F32, {n});
  for (int64_t i = 0; i < n - 7; ++i) x.set(i, -14.0 + 28.0 * static_cast<double>(i) / static_cast<double>(n - 8));
  const double specials[7] = {std::nan(""), HUGE_VAL, -0.0, -30.0, 1e-30, -1e-30, 50.0};
  for (int i = 0; i < 7; ++i) x.set(n - 7 + i, specials[i]);
  Graph g;
  g.input("x", BP_DTYPE_F32, {n});
  g.node("y", "gelu", {"x"});
  g.output("y");
  const HostTensor y = rt.run_graph(g, rt.device("cpu"), {{"x", x}}).at("y");
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < n; ++i) {
    const long double v = static_cast<long double>(static_cast<float>(x.get(i)));
    const double want = static_cast<double>(0.5L * v * std::erfc(-v / std::sqrt(2.0L)));
    const double got = y.get(i);
    bool ok;
    if (std::isnan(want)) ok = std::isnan(got);
    else if (std::isinf(want)) ok = got == want;
    else ok = std::abs(got - want) <= 1e-6 || std::abs(got - want) <= 1e-5 * std::abs(want);
    if (!ok && bad++ == 0) first = "x = " + std::to_string(x.get(i)) + ": got " + std::to_string(got) + ", want " + std::to_string(want);
  }
  INFO(first);
  CHECK(bad == 0);
}
