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
