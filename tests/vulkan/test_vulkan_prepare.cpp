// A BP_RUN_PREPARE run on vulkan0: a preparing run compiles the pipelines
// of its kernel calls and runs nothing, so the run after it creates none;
// through the core, a compiled plan (CompileOptions::prepare, the default)
// and one compiled without preparing give the same, right values.
#include <backplane/abi.h>
#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>

#include "vulkan_test_support.hpp"

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

using namespace backplane;
using namespace backplane::vktest;

namespace {

// How many pipelines the plugin has logged as created so far.
size_t pipelines_created() {
  static size_t total = 0;
  total += created_pipelines().size();
  return total;
}

std::vector<float> read4(VkAbi& vk, const VkAbi::Buf& b) {
  std::vector<float> out(4, -1.0f);
  REQUIRE(vk.api->buffer_read(vk.plugin, vk.dev, b.s.buffer_handle, 0, out.data(), 16) == nullptr);
  return out;
}

}  // namespace

TEST_CASE("vulkan: a preparing run compiles its pipelines and runs nothing", "[vulkan][prepare][abi]") {
  VkAbi vk(keep_log);
  if (!vk.ready()) return;
  REQUIRE((vk.api->run_flags & BP_RUN_PREPARE) != 0);
  const float a[4] = {1, 2, 3, 4};
  const float sevens[4] = {7, 7, 7, 7};
  auto x = vk.buffer(BP_DTYPE_F32, 4, a, 4);
  auto y = vk.buffer(BP_DTYPE_F32, 4, sevens, 4);
  const uint32_t add = vk.kernel("add", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32});
  const uint32_t exp = vk.kernel("exp", {BP_DTYPE_F32, BP_DTYPE_F32});

  const size_t before = pipelines_created();
  REQUIRE(vk.begin(BP_RUN_PREPARE) == nullptr);
  REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);
  REQUIRE(vk.call(exp, {&x}, y) == nullptr);
  REQUIRE(vk.sync() == nullptr);
  const size_t prepared = pipelines_created();
  CHECK(prepared >= before + 2);  // add's and exp's, ready when synchronize returned
  CHECK(read4(vk, y) == std::vector<float>{7, 7, 7, 7});  // nothing ran

  // The real run: the same calls, no new pipeline, the values computed.
  REQUIRE(vk.begin() == nullptr);
  REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);
  REQUIRE(vk.sync() == nullptr);
  CHECK(read4(vk, y) == std::vector<float>{2, 4, 6, 8});
  REQUIRE(vk.begin() == nullptr);
  REQUIRE(vk.call(exp, {&x}, y) == nullptr);
  REQUIRE(vk.sync() == nullptr);
  const auto e = read4(vk, y);
  for (int i = 0; i < 4; ++i) CHECK(e[static_cast<size_t>(i)] == Approx(std::exp(static_cast<double>(a[i]))).epsilon(1e-6));
  CHECK(pipelines_created() == prepared);

  // A call the kernel refuses is refused while preparing too, and the device
  // keeps working; a preparing run with no calls is fine.
  auto stale = x;
  stale.s.buffer_handle = 0xdead0001;  // no such buffer
  REQUIRE(vk.begin(BP_RUN_PREPARE) == nullptr);
  bp_error* refused = vk.call(add, {&stale, &x}, y);
  CHECK(refused != nullptr);
  if (refused) vk.api->error_destroy(vk.plugin, refused);
  REQUIRE(vk.sync() == nullptr);
  REQUIRE(vk.begin(BP_RUN_PREPARE) == nullptr);
  REQUIRE(vk.sync() == nullptr);
  REQUIRE(vk.begin() == nullptr);
  REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);
  REQUIRE(vk.sync() == nullptr);
  CHECK(read4(vk, y) == std::vector<float>{2, 4, 6, 8});
}

TEST_CASE("vulkan: a plan compiled with and without preparing gives the same values", "[vulkan][prepare]") {
  Devices d;
  if (!d.ready()) return;
  // vulkan0's part and the CPU's part of one graph; softplus and matmul
  // have pipelines of their own.
  Graph g;
  g.input("x", BP_DTYPE_F32, {8, 16});
  g.input("w", BP_DTYPE_F32, {16, 4});
  g.node("h", "matmul", {"x", "w"});
  g.node("s", "softplus", {"h"});
  g.node("t", "neg", {"s"});
  g.output("s");
  g.output("t");
  std::vector<double> xv(128), wv(64);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<double>(i % 9) * 0.25 - 1.0;
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = static_cast<double>(i % 5) * 0.125 - 0.25;
  const std::map<std::string, HostTensor> in = {{"x", HostTensor::from_doubles(BP_DTYPE_F32, {8, 16}, xv)},
                                                {"w", HostTensor::from_doubles(BP_DTYPE_F32, {16, 4}, wv)}};
  for (bool prepare : {true, false}) {
    CAPTURE(prepare);
    CompileOptions opts;
    opts.prepare = prepare;
    Plan p = d.rt->compile(g, {d.vk, d.cpu}, opts);
    for (int run = 0; run < 2; ++run) {
      auto out = p.run(in);
      for (int64_t r = 0; r < 8; ++r)
        for (int64_t c = 0; c < 4; ++c) {
          double h = 0;
          for (int64_t k = 0; k < 16; ++k) h += xv[static_cast<size_t>(r * 16 + k)] * wv[static_cast<size_t>(k * 4 + c)];
          const double s = std::log1p(std::exp(h));
          CHECK(out["s"].get(r * 4 + c) == Approx(s).epsilon(1e-5).margin(1e-6));
          CHECK(out["t"].get(r * 4 + c) == Approx(-s).epsilon(1e-5).margin(1e-6));
        }
    }
  }
}
