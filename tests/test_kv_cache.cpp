// A cache updated in place: slice_update's output bound to the Tensor its x
// is read from (docs/host-guide.md, "State updated in place"). References
// are computed here on the host.
#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

#include <cstring>

using namespace backplane;

namespace {

std::unique_ptr<Runtime> make_runtime() {
  RuntimeOptions opts;
  opts.use_environment = false;
  return Runtime::create(opts);
}

HostTensor f32(Shape shape, const std::vector<float>& v) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  std::memcpy(t.data(), v.data(), t.nbytes());
  return t;
}

HostTensor i64(int64_t v) {
  HostTensor t(BP_DTYPE_I64, {1});
  std::memcpy(t.data(), &v, 8);
  return t;
}

std::vector<float> values(const HostTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data(), t.nbytes());
  return v;
}

bool has_line(const std::vector<std::string>& lines, const std::string& needle) {
  for (const auto& l : lines)
    if (l.find(needle) != std::string::npos) return true;
  return false;
}

constexpr int64_t kRows = 6, kCols = 4;

// cache' = slice_update(cache, row, pos); total = the column sums of cache'
// (read after the update, as attention reads the cache).
Graph cache_graph() {
  Graph g;
  g.input("cache", BP_DTYPE_F32, {kRows, kCols});
  g.input("row", BP_DTYPE_F32, {1, kCols});
  g.input("pos", BP_DTYPE_I64, {1});
  g.node("cache_out", "slice_update", {"cache", "row", "pos"}, {{"dim", 0}});
  g.node("total", "sum", {"cache_out"}, {{"dims", {0}}});
  g.output("cache_out");
  g.output("total");
  return g;
}

}  // namespace

// Catches: an update that is not in place (describe() would not say so, and
// the Tensor would keep its zeros: the plan wrote its own buffer), a kernel
// that skips x's copy when the buffers differ or copies x over the update
// when they are one, a row written at the wrong start, and an error that
// leaves the cache changed.
TEST_CASE("a slice_update bound to its input's Tensor appends rows in place on every device", "[kvcache]") {
  auto rt = make_runtime();
  int devices = 0;
  for (Device* dev : rt->all_devices()) {
    if (dev->plugin_name() != "cpu" && dev->plugin_name() != "vulkan") continue;
    ++devices;
    INFO("device " << dev->name());
    Plan plan = rt->compile(cache_graph(), *dev);
    std::vector<float> ref(static_cast<size_t>(kRows * kCols), -1.0f);  // rows not yet written stay -1
    Tensor cache = rt->upload(f32({kRows, kCols}, ref), *dev);
    plan.set_input("cache", cache);
    plan.bind_output("cache_out", cache);
    const auto lines = plan.describe();
    CHECK(has_line(lines, "in place (x is the output's buffer; moves 16 bytes)"));
    CHECK(has_line(lines, "input 'cache' f32[6, 4] on " + dev->name() + ": a Tensor on " + dev->name() + ", read in place"));
    for (int64_t step = 0; step < kRows; ++step) {
      std::vector<float> row(kCols);
      for (int64_t j = 0; j < kCols; ++j) row[static_cast<size_t>(j)] = static_cast<float>(10 * step + j + 1);
      const auto out = plan.run({{"row", f32({1, kCols}, row)}, {"pos", i64(step)}});
      std::copy(row.begin(), row.end(), ref.begin() + step * kCols);
      std::vector<float> sums(kCols, 0.0f);
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t j = 0; j < kCols; ++j) sums[static_cast<size_t>(j)] += ref[static_cast<size_t>(r * kCols + j)];
      CHECK(values(out.at("total")) == sums);
      CHECK(values(out.at("cache_out")) == ref);
      CHECK(values(cache.download()) == ref);
    }
    // One past the end: refused naming the op, and the cache is as it was.
    CHECK_THROWS_WITH(plan.run({{"row", f32({1, kCols}, {9, 9, 9, 9})}, {"pos", i64(kRows)}}),
                      Catch::Contains("slice_update"));
    CHECK(values(cache.download()) == ref);
  }
  REQUIRE(devices >= 1);
}

// Catches: a binding that lets a second reader of the input see rows the
// update already wrote (the in-place update is only allowed when the
// slice_update is the input's only reader), and one that accepts a Tensor
// other than the one x is read from.
TEST_CASE("an output shares its input's Tensor only for a slice_update that is the input's only reader",
          "[kvcache]") {
  auto rt = make_runtime();
  Device& cpu = rt->device("cpu");
  Graph g = cache_graph();
  g.node("old_total", "sum", {"cache"}, {{"dims", {0}}});  // reads the cache before the update
  g.output("old_total");
  Plan plan = rt->compile(g, cpu);
  Tensor cache = rt->upload(f32({kRows, kCols}, std::vector<float>(kRows * kCols, 1.0f)), cpu);
  plan.set_input("cache", cache);
  CHECK_THROWS_WITH(plan.bind_output("cache_out", cache), Catch::Contains("bound as this plan's input 'cache'"));

  Plan good = rt->compile(cache_graph(), cpu);
  Tensor other = rt->upload(f32({kRows, kCols}, std::vector<float>(kRows * kCols, 2.0f)), cpu);
  good.set_input("cache", cache);
  good.bind_output("cache_out", other);  // a different Tensor: written whole, not in place
  CHECK_FALSE(has_line(good.describe(), "in place (x is the output's buffer"));
  good.run({{"row", f32({1, kCols}, {5, 6, 7, 8})}, {"pos", i64(2)}});
  std::vector<float> want(kRows * kCols, 1.0f);
  for (int j = 0; j < kCols; ++j) want[static_cast<size_t>(2 * kCols + j)] = static_cast<float>(5 + j);
  CHECK(values(other.download()) == want);
  CHECK(values(cache.download()) == std::vector<float>(kRows * kCols, 1.0f));
  // Bound the other way round: the output first, then the input.
  Plan reverse = rt->compile(cache_graph(), cpu);
  reverse.bind_output("cache_out", other);
  reverse.set_input("cache", other);
  CHECK(has_line(reverse.describe(), "in place (x is the output's buffer; moves 16 bytes)"));
}
