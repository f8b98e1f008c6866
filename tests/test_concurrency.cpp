// Concurrency: several plans at once on one runtime (one host thread pool),
// plans compiled concurrently, inputs shared between threads, a plan across
// two devices run from several threads. CI runs these under ThreadSanitizer
// ([concurrency]); loops are bounded.
#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <thread>

using namespace backplane;

namespace {

std::unique_ptr<Runtime> runtime_with_partial() {
  RuntimeOptions opts;
  opts.use_environment = false;
  opts.num_threads = 2;
  opts.plugin_paths = {std::string(BACKPLANE_FIXTURE_DIR) + "/partial"};
  return Runtime::create(opts);
}

// y = softmax(x * k + x) over rows; big enough for the pool to split it.
Graph mix_graph(int64_t rows) {
  Graph g;
  g.input("x", BP_DTYPE_F32, {rows, 256});
  g.input("k", BP_DTYPE_F32, {256});
  g.node("m", "mul", {"x", "k"});
  g.node("a", "add", {"m", "x"});
  g.node("y", "softmax", {"a"}, {{"dim", -1}});
  g.node("s", "sum", {"y"}, {{"dims", {-1}}});
  g.output("s");
  g.output("a");
  g.output("y");
  return g;
}

// Elements of a run's outputs that differ from mix_graph's answer for (x, k)
// computed here in f64: a = x * k + x exactly as f32 rounds it (two
// roundings), y = softmax(a) per row (relative 1e-5), s = 1. A thread given
// another's results, or a corrupted mul or add, is caught element by element.
int mismatches(const HostTensor& x, const HostTensor& k, std::map<std::string, HostTensor>& out) {
  const int64_t rows = x.shape[0], n = x.shape[1];
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> a(static_cast<size_t>(n));
    double mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c < n; ++c) {
      const float m = static_cast<float>(x.get(r * n + c)) * static_cast<float>(k.get(c));
      a[static_cast<size_t>(c)] = static_cast<float>(m + static_cast<float>(x.get(r * n + c)));
      mx = std::max(mx, a[static_cast<size_t>(c)]);
    }
    for (double v : a) sum += std::exp(v - mx);
    for (int64_t c = 0; c < n; ++c) {
      bad += out["a"].get(r * n + c) != a[static_cast<size_t>(c)];
      const double y = std::exp(a[static_cast<size_t>(c)] - mx) / sum;
      bad += !(std::abs(out["y"].get(r * n + c) - y) <= 1e-5 * y + 1e-9);
    }
    bad += !(std::abs(out["s"].get(r) - 1.0) <= 1e-4);
  }
  return bad;
}

HostTensor filled(Shape shape, float v) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v + static_cast<float>(i % 7) * 0.01f + static_cast<float>(i % 13) * 0.001f);
  return t;
}

}  // namespace

TEST_CASE("plans compiled and run concurrently on one runtime", "[concurrency]") {
  auto rt = runtime_with_partial();
  Device& cpu = rt->device("cpu");
  const HostTensor shared_k = filled({256}, 0.5f);  // read by every thread
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      try {
        Plan p = rt->compile(mix_graph(64 + 16 * t), cpu);
        const HostTensor x = filled({64 + 16 * t, 256}, static_cast<float>(t));
        for (int i = 0; i < 20; ++i) {
          auto out = p.run({{"x", x}, {"k", shared_k}});
          bad += mismatches(x, shared_k, out);
        }
      } catch (const std::exception&) {
        ++bad;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
}

TEST_CASE("one plan across two devices run from several threads", "[concurrency]") {
  auto rt = runtime_with_partial();
  Plan p = rt->compile(mix_graph(32), rt->select_devices("partial0,cpu"));
  REQUIRE(p.transfers().size() >= 1);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      const HostTensor x = filled({32, 256}, static_cast<float>(t));
      const HostTensor k = filled({256}, 0.25f * static_cast<float>(t));
      for (int i = 0; i < 20; ++i) {
        auto out = p.run({{"x", x}, {"k", k}});
        bad += mismatches(x, k, out);
      }
    });
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
}

TEST_CASE("separate calls on one plan from several threads stay consistent", "[concurrency]") {
  auto rt = runtime_with_partial();
  Plan p = rt->compile(mix_graph(16), rt->device("cpu"));
  const HostTensor x = filled({16, 256}, 1.0f), k = filled({256}, 2.0f);
  p.run({{"x", x}, {"k", k}});
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 30; ++i) {
        if (t == 0) p.set_input("x", x);
        else if (t == 1) p.execute();
        else {
          // x never changes here, so every run gives the same answer.
          std::map<std::string, HostTensor> out = {{"a", p.output("a")}, {"y", p.output("y")}, {"s", p.output("s")}};
          bad += mismatches(x, k, out);
        }
      }
    });
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
}
