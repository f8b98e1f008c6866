// softmax over rows that a causal mask filled with -inf, as attention does:
// a row whose leading elements are -inf must still give exp(x - max) / sum
// over its finite elements. The Vulkan plugin's one-read (online) softmax
// once made NaN there: a lane that had seen only -inf computed
// exp(-inf - -inf).
#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

using namespace backplane;

TEST_CASE("softmax of rows masked with -inf matches the f64 reference on every device", "[softmax][masked]") {
  auto rt = Runtime::create();
  const double inf = std::numeric_limits<double>::infinity();
  // Rows of 64 and 256 (4-vector rows) and 63 (not): row r keeps r % n + 1
  // elements, the rest -inf; in the second half the -inf come first.
  for (int64_t n : {64, 256, 63}) {
    const int64_t rows = 8;
    std::vector<double> x(static_cast<size_t>(rows * n));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t keep = (r * 37) % n + 1;
        const bool masked = r < rows / 2 ? j >= keep : j < n - keep;
        x[static_cast<size_t>(r * n + j)] = masked ? -inf : std::sin(static_cast<double>(r * n + j)) * 3;
      }
    std::vector<double> want(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double m = -inf, s = 0;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, x[static_cast<size_t>(r * n + j)]);
      for (int64_t j = 0; j < n; ++j) s += std::exp(x[static_cast<size_t>(r * n + j)] - m);
      for (int64_t j = 0; j < n; ++j) want[static_cast<size_t>(r * n + j)] = std::exp(x[static_cast<size_t>(r * n + j)] - m) / s;
    }
    Graph g;
    g.input("x", BP_DTYPE_F32, {rows, n});
    g.node("y", "softmax", {"x"}, {{"dim", -1}});
    g.output("y");
    for (const char* dev : {"cpu", "vulkan0"}) {
      Device* d = nullptr;
      try {
        d = &rt->device(dev);
      } catch (const Error&) {
        WARN("no device " << dev << ": skipped");
        continue;
      }
      if (d->name() != dev) continue;  // "cpu" may resolve to another CPU-kind device
      Plan plan = rt->compile(g, *d);
      auto y = plan.run({{"x", HostTensor::from_doubles(BP_DTYPE_F32, {rows, n}, x)}}).at("y");
      for (int64_t k = 0; k < rows * n; ++k) {
        INFO(dev << " n=" << n << " element " << k);
        REQUIRE(std::isfinite(y.get(k)));
        CHECK(y.get(k) == Approx(want[static_cast<size_t>(k)]).epsilon(1e-4).margin(1e-6));
      }
    }
  }
}
