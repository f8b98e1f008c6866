// Tensors larger than lavapipe's maxStorageBufferRange (128 MiB) through every
// op family on vulkan0, against the CPU plugin (plugins/vulkan/README.md:
// operands are buffer device addresses). Each case moves a 200-256 MiB tensor
// and takes a few seconds on lavapipe; all carry the tag [big] so a quick run
// can leave them out (`backplane_tests "~[big]"`, `ctest -E big`).
#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>

#include "vulkan_test_support.hpp"

#include <cmath>
#include <cstring>
#include <limits>

using namespace backplane;
using namespace backplane::vktest;

namespace {

constexpr uint64_t kRange = 128ull << 20;  // lavapipe's maxStorageBufferRange

// Uniform in [lo, hi), cheap enough for 50M elements.
HostTensor fill_f32(Shape shape, uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  float* p = t.as<float>();
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  const float scale = (hi - lo) / 16777216.0f;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = lo + static_cast<float>(s >> 40) * scale;
  }
  return t;
}

// `got` matches `want` within docs/ops.md's f32 bounds (rel, or abs 1e-6; a
// NaN meets a NaN); integers exactly. One CHECK, not one per element.
void check_matches(const HostTensor& got, const HostTensor& want, double rel) {
  REQUIRE(got.dtype == want.dtype);
  REQUIRE(got.shape == want.shape);
  const auto want_at = [&](int64_t i) { return want.get(i); };
  if (got.dtype == BP_DTYPE_F32) {
    const float* g = got.as<float>();
    const float* w = want.as<float>();
    check_elements(
        got, got.numel(),
        [&](int64_t i) {
          const double x = g[i], y = w[i];
          if (std::isnan(x) || std::isnan(y)) return std::isnan(x) == std::isnan(y);
          return std::abs(x - y) <= 1e-6 || std::abs(x - y) <= rel * std::abs(y);
        },
        want_at);
  } else {
    REQUIRE(got.nbytes() == want.nbytes());
    const bool same = std::memcmp(got.data(), want.data(), got.nbytes()) == 0;
    check_elements(
        got, got.numel(), [&](int64_t i) { return same || got.get_int(i) == want.get_int(i); }, want_at);
  }
}

// Runs `g` on vulkan0 and on the CPU and compares every output.
void vulkan_matches_cpu(const Graph& g, const std::map<std::string, HostTensor>& in, double rel = 1e-4) {
  Devices dv;
  if (!dv.ready()) return;
  const auto want = run_on(*dv.rt, *dv.cpu, g, in);
  const auto got = run_on(*dv.rt, *dv.vk, g, in);
  for (const auto& [name, t] : want) {
    INFO("output " << name);
    REQUIRE(got.count(name) == 1);
    check_matches(got.at(name), t, rel);
  }
}

}  // namespace

TEST_CASE("vulkan big: add with row and column broadcast over 200 MiB", "[vulkan][big]") {
  Graph g;
  g.input("x", BP_DTYPE_F32, {6400, 8192});  // 200 MiB
  g.input("b", BP_DTYPE_F32, {8192});
  g.input("c", BP_DTYPE_F32, {6400, 1});
  g.node("y", "add", {"x", "b"});
  g.node("z", "mul", {"y", "c"});
  g.output("z");
  REQUIRE(6400ull * 8192 * 4 > kRange);
  vulkan_matches_cpu(g, {{"x", fill_f32({6400, 8192}, 1)}, {"b", fill_f32({8192}, 2)}, {"c", fill_f32({6400, 1}, 3)}},
                     1e-5);
}

TEST_CASE("vulkan big: sum and max and the var_mean bundle over 200 MiB", "[vulkan][big]") {
  Graph g;
  g.input("x", BP_DTYPE_F32, {6400, 8192});
  g.node("s", "sum", {"x"}, {{"dims", {1}}});
  g.node("m", "max", {"x"}, {{"dims", {0}}});
  g.node("vm", "var_mean", {"x"}, {{"dims", {0}}});
  g.node("var", "view", {"vm"}, {{"slot", 0}});
  g.node("mean", "view", {"vm"}, {{"slot", 1}});
  g.node("all", "sum", {"x"});
  g.output("s");
  g.output("m");
  g.output("var");
  g.output("mean");
  g.output("all");
  vulkan_matches_cpu(g, {{"x", fill_f32({6400, 8192}, 4, 0.0f, 1.0f)}});
}

TEST_CASE("vulkan big: softmax along rows of 200 MiB", "[vulkan][big]") {
  Graph g;
  g.input("x", BP_DTYPE_F32, {6400, 8192});
  g.node("y", "softmax", {"x"}, {{"dim", -1}});
  g.output("y");
  vulkan_matches_cpu(g, {{"x", fill_f32({6400, 8192}, 5)}});
}

TEST_CASE("vulkan big: matmul with a 200 MiB operand", "[vulkan][big]") {
  Graph g;
  g.input("a", BP_DTYPE_F32, {25600, 2048});  // 200 MiB
  g.input("b", BP_DTYPE_F32, {2048, 8});
  g.node("c", "matmul", {"a", "b"});
  g.output("c");
  // Non-negative terms: two f32 sums of 2048 products then agree to 1e-4
  // relative (with signs, cancellation leaves results near 0 whose f32
  // rounding differences exceed docs/ops.md's bound against an f64 reference).
  vulkan_matches_cpu(g, {{"a", fill_f32({25600, 2048}, 6, 0.0f, 1.0f)}, {"b", fill_f32({2048, 8}, 7, 0.0f, 1.0f)}});
}

TEST_CASE("vulkan big: gather and index_select from a 200 MiB table", "[vulkan][big]") {
  const int64_t rows = 409600, cols = 128;  // 200 MiB
  Graph g;
  g.input("x", BP_DTYPE_F32, {rows, cols});
  g.input("i", BP_DTYPE_I64, {4096});
  g.input("j", BP_DTYPE_I64, {64, cols});
  g.node("sel", "index_select", {"x", "i"}, {{"dim", 0}});
  g.node("gat", "gather", {"x", "j"}, {{"dim", 0}});
  g.output("sel");
  g.output("gat");
  HostTensor i(BP_DTYPE_I64, {4096}), j(BP_DTYPE_I64, {64, cols});
  // Rows all over the table, the last ones included, some counted from the end.
  for (int64_t k = 0; k < 4096; ++k) i.set_int(k, k % 7 == 0 ? -(k * 97 % rows) - 1 : (k * 100003) % rows);
  i.set_int(1, rows - 1);
  for (int64_t k = 0; k < j.numel(); ++k) j.set_int(k, (k * 7919 + 13) % rows);
  vulkan_matches_cpu(g, {{"x", fill_f32({rows, cols}, 8)}, {"i", i}, {"j", j}});
}

TEST_CASE("vulkan big: concat into 200 MiB and topk over it", "[vulkan][big]") {
  Graph g;
  g.input("a", BP_DTYPE_F32, {3200, 8192});  // 100 MiB each, 200 MiB joined
  g.input("b", BP_DTYPE_F32, {3200, 8192});
  g.node("c", "concat", {"a", "b"}, {{"dim", 0}});
  g.node("t", "topk", {"c"}, {{"k", 8}, {"dim", -1}});
  g.node("v", "view", {"t"}, {{"slot", 0}});
  g.node("ix", "view", {"t"}, {{"slot", 1}});
  g.node("tc", "transpose", {"c"}, {{"dim0", 0}, {"dim1", 1}});
  g.node("s", "sum", {"tc"}, {{"dims", {1}}});
  g.output("v");
  g.output("ix");
  g.output("s");
  g.output("c");
  // Non-negative, so the column sums do not cancel (see the matmul case).
  vulkan_matches_cpu(g, {{"a", fill_f32({3200, 8192}, 9, 0.0f, 1.0f)}, {"b", fill_f32({3200, 8192}, 10, 0.0f, 1.0f)}});
}

TEST_CASE("vulkan big: a tensor larger than the device can allocate is refused before anything runs",
          "[vulkan][big]") {
  auto rt = default_runtime();
  Device* vk = find_plugin(*rt, "vulkan");
  if (!vk) {
    WARN("SKIPPED: needs the vulkan plugin");
    return;
  }
  Graph g;
  g.input("x", BP_DTYPE_F32, {262144, 1});
  g.input("y", BP_DTYPE_F32, {1, 262144});
  g.node("huge", "add", {"x", "y"});  // 256 GiB
  g.node("s", "sum", {"huge"});
  g.output("s");
  try {
    (void)rt->compile(g, *vk);
    FAIL("compile accepted a 256 GiB buffer");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("huge") != std::string::npos);
    CHECK(msg.find("274877906944 bytes") != std::string::npos);
    CHECK(msg.find(vk->name()) != std::string::npos);
  }
}

// 600 MiB through an add, a sum, a softmax and a topk (about 3.2 GiB of host
// memory across both devices, ~9 s on lavapipe): not discovered with the
// rest; ctest runs it as vulkan_huge_600MiB in unsanitized builds.
TEST_CASE("vulkan big: 600 MiB through add and sum and softmax and topk", "[vulkan][huge][.]") {
  Graph g;
  g.input("x", BP_DTYPE_F32, {19200, 8192});  // 600 MiB
  g.input("b", BP_DTYPE_F32, {8192});
  g.node("y", "add", {"x", "b"});
  g.node("s", "sum", {"y"}, {{"dims", {1}}});
  g.node("p", "softmax", {"y"}, {{"dim", -1}});
  g.node("pm", "max", {"p"}, {{"dims", {1}}});
  g.node("t", "topk", {"y"}, {{"k", 4}, {"dim", -1}});
  g.node("tv", "view", {"t"}, {{"slot", 0}});
  g.node("ti", "view", {"t"}, {{"slot", 1}});
  g.output("s");
  g.output("pm");
  g.output("tv");
  g.output("ti");
  vulkan_matches_cpu(g, {{"x", fill_f32({19200, 8192}, 11, 0.0f, 1.0f)}, {"b", fill_f32({8192}, 12, 0.0f, 1.0f)}});
}

// Not big: many long contiguous rows, which a CPU device (lavapipe) gives one
// invocation each (kernels_common.cpp row_header); conformance's shapes have
// too few rows to reach that path.
TEST_CASE("vulkan: row kernels over many long rows match the cpu", "[vulkan]") {
  Graph g;
  g.input("x", BP_DTYPE_F32, {4096, 300});
  g.node("s", "sum", {"x"}, {{"dims", {-1}}});
  g.node("mx", "max", {"x"}, {{"dims", {-1}}});
  g.node("am", "argmax", {"x"}, {{"dim", -1}});
  g.node("ls", "log_softmax", {"x"}, {{"dim", -1}});
  g.node("ln", "layer_norm", {"x"}, {{"dims", {-1}}});
  g.node("vm", "var_mean", {"x"}, {{"dims", {-1}}});
  g.node("v", "view", {"vm"}, {{"slot", 0}});
  g.node("m", "view", {"vm"}, {{"slot", 1}});
  for (const char* o : {"s", "mx", "am", "ls", "ln", "v", "m"}) g.output(o);
  vulkan_matches_cpu(g, {{"x", fill_f32({4096, 300}, 13, 0.0f, 1.0f)}});
}

// topk's one-pass path (many rows, k <= 16, a CPU device): ties (lower index
// first) and NaN (above every number) as on the cpu.
TEST_CASE("vulkan: topk over many rows with ties and NaN matches the cpu", "[vulkan]") {
  Graph g;
  g.input("x", BP_DTYPE_F32, {2048, 100});
  g.node("hi", "topk", {"x"}, {{"k", 6}, {"dim", -1}});
  g.node("lo", "topk", {"x"}, {{"k", 3}, {"dim", -1}, {"largest", false}});
  g.node("hv", "view", {"hi"}, {{"slot", 0}});
  g.node("hx", "view", {"hi"}, {{"slot", 1}});
  g.node("lv", "view", {"lo"}, {{"slot", 0}});
  g.node("lx", "view", {"lo"}, {{"slot", 1}});
  for (const char* o : {"hv", "hx", "lv", "lx"}) g.output(o);
  HostTensor x = fill_f32({2048, 100}, 14, 0.0f, 1.0f);
  float* p = x.as<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    p[i] = std::floor(p[i] * 8.0f) / 8.0f;  // many ties
    if (i % 97 == 3) p[i] = std::numeric_limits<float>::quiet_NaN();
  }
  vulkan_matches_cpu(g, {{"x", x}});
}

// The same one-pass topk path and the many-rows row kernels (max, argmax)
// for every other dtype the manifest claims them for: small integers, exact
// in each dtype, with many ties.
TEST_CASE("vulkan: topk max and argmax over many rows match the cpu for every dtype", "[vulkan]") {
  HostTensor x = fill_f32({2048, 100}, 15, 0.0f, 1.0f);
  float* p = x.as<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = std::floor(p[i] * 64.0f);  // 0..63
  for (const char* dt : {"f16", "bf16", "f64", "i8", "i16", "i32", "i64", "u8"}) {
    INFO("dtype " << dt);
    Graph g;
    g.input("x", BP_DTYPE_F32, {2048, 100});
    g.node("c", "cast", {"x"}, {{"dtype", dt}});
    g.node("hi", "topk", {"c"}, {{"k", 6}, {"dim", -1}});
    g.node("lo", "topk", {"c"}, {{"k", 3}, {"dim", -1}, {"largest", false}});
    g.node("hv", "view", {"hi"}, {{"slot", 0}});
    g.node("hx", "view", {"hi"}, {{"slot", 1}});
    g.node("lv", "view", {"lo"}, {{"slot", 0}});
    g.node("lx", "view", {"lo"}, {{"slot", 1}});
    g.node("mx", "max", {"c"}, {{"dims", {-1}}});
    g.node("am", "argmax", {"c"}, {{"dim", -1}});
    for (const char* o : {"hv", "hx", "lv", "lx", "mx", "am"}) g.output(o);
    vulkan_matches_cpu(g, {{"x", x}});
  }
}
