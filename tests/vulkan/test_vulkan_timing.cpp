// Per-call device timing on vulkan0 (BP_RUN_TIMED runs,
// timestamp queries): a profiled plan gives every kernel row its time on the
// device, a node with far more work measures longer than a tiny one, the
// unprofiled path is unchanged, and the ABI refuses a wrong call count.
#include <backplane/abi.h>
#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>

#include "vulkan_test_support.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

using namespace backplane;
using namespace backplane::vktest;

namespace {

// matmul of two n x n matrices, then a 4-element add.
Graph heavy_and_tiny(int64_t n) {
  Graph g;
  g.input("a", BP_DTYPE_F32, {n, n});
  g.input("b", BP_DTYPE_F32, {n, n});
  g.input("x", BP_DTYPE_F32, {4});
  g.node("big", "matmul", {"a", "b"});
  g.node("small", "add", {"x", "x"});
  g.output("big");
  g.output("small");
  return g;
}

std::map<std::string, HostTensor> heavy_and_tiny_inputs(int64_t n) {
  std::vector<double> m(static_cast<size_t>(n * n));
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<double>(i % 7) - 3.0;
  return {{"a", HostTensor::from_doubles(BP_DTYPE_F32, {n, n}, m)},
          {"b", HostTensor::from_doubles(BP_DTYPE_F32, {n, n}, m)},
          {"x", HostTensor::from_doubles(BP_DTYPE_F32, {4}, {1, 2, 3, 4})}};
}

const Plan::StepTime* row_of(const std::vector<Plan::StepTime>& rows, const std::string& node) {
  for (const auto& r : rows)
    if (r.node == node && !r.transfer) return &r;
  return nullptr;
}

}  // namespace

TEST_CASE("vulkan: a profiled plan gives each kernel its time on the device", "[vulkan][timing]") {
  auto rt = default_runtime();
  Device* vk = find_device(*rt, "vulkan0");
  if (!vk) {
    WARN("SKIPPED: no vulkan0");
    return;
  }
  constexpr int64_t n = 512;  // 2 * 512^3 flops against 4 adds
  CompileOptions opts;
  opts.profile = true;
  Plan p = rt->compile(heavy_and_tiny(n), *vk, opts);
  auto out = p.run(heavy_and_tiny_inputs(n));
  CHECK(out["small"].get(3) == 8.0);
  // Runs of a reused plan are timed again (the calls counted from each begin).
  for (int run = 0; run < 2; ++run) {
    p.execute();
    const auto rows = p.profile();
    size_t kernels = 0;
    for (const auto& r : rows) {
      if (r.transfer || r.node.empty()) continue;
      ++kernels;
      CHECK(r.device_seconds >= 0);
    }
    CHECK(kernels == 2);
    const auto* big = row_of(rows, "big");
    const auto* small = row_of(rows, "small");
    REQUIRE(big);
    REQUIRE(small);
    CHECK(big->device_seconds > small->device_seconds);
    CHECK_THAT(p.profile_table(), Catch::Contains("[on the device"));
    CHECK(p.profile_json()["steps"][0].contains("device_seconds"));
  }
  // The values are right under timing.
  const auto big = p.output("big");
  double ref = 0;  // element (1, 2): sum_k a[1,k] * b[k,2]
  for (int64_t k = 0; k < n; ++k) ref += (static_cast<double>((n + k) % 7) - 3.0) * (static_cast<double>((k * n + 2) % 7) - 3.0);
  CHECK(big.get(n + 2) == Approx(ref).margin(1e-3));
}

TEST_CASE("vulkan: an unprofiled plan runs as before and has no device times", "[vulkan][timing]") {
  auto rt = default_runtime();
  Device* vk = find_device(*rt, "vulkan0");
  if (!vk) {
    WARN("SKIPPED: no vulkan0");
    return;
  }
  Plan p = rt->compile(heavy_and_tiny(8), *vk);
  auto out = p.run(heavy_and_tiny_inputs(8));
  CHECK(out["small"].get(0) == 2.0);
  CHECK(out["small"].get(3) == 8.0);
  CHECK(p.profile().empty());
}

// ---------------------------------------------------------------------------
// ABI level: the plugin without the core.

namespace {

void quiet_log(void*, bp_log_level, bp_string) {}

bp_status_code code_of(const bp_plugin_api* api, bp_error* e) {
  if (!e) return BP_OK;
  const bp_status_code c = api->error_code(nullptr, e);
  api->error_destroy(nullptr, e);
  return c;
}

}  // namespace

TEST_CASE("vulkan: a timed run gives one time per call and checks the count", "[vulkan][timing][abi]") {
  VkAbi vk(quiet_log);
  if (!vk.ready()) return;
  REQUIRE((vk.api->run_flags & BP_RUN_TIMED) != 0);
  const float a[4] = {1, 2, 3, 4};
  auto x = vk.buffer(BP_DTYPE_F32, 4, a, 4);
  auto y = vk.buffer(BP_DTYPE_F32, 4, nullptr, 4);
  const uint32_t add = vk.kernel("add", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32});
  auto timed_run = [&](size_t calls, size_t asked, uint64_t* ns) {
    REQUIRE(vk.begin(BP_RUN_TIMED) == nullptr);
    for (size_t i = 0; i < calls; ++i) REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);
    return code_of(vk.api, vk.sync(ns, asked));
  };

  std::vector<uint64_t> ns(4, 12345);
  // A count that is not the run's number of calls is refused (the run ends).
  CHECK(timed_run(3, 2, ns.data()) == BP_ERR_INVALID_ARGUMENT);
  CHECK(timed_run(3, 4, ns.data()) == BP_ERR_INVALID_ARGUMENT);
  REQUIRE(timed_run(3, 3, ns.data()) == BP_OK);
  for (size_t i = 0; i < 3; ++i) CHECK(ns[i] != 12345);  // each written: a time, or UINT64_MAX where unsupported
  CHECK(ns[3] == 12345);                                 // nothing past the count
  float out[4] = {};
  REQUIRE(vk.api->buffer_read(vk.plugin, vk.dev, y.s.buffer_handle, 0, out, sizeof out) == nullptr);
  CHECK(out[2] == 6.0f);

  // A run begun without BP_RUN_TIMED writes no times.
  std::fill(ns.begin(), ns.end(), 12345);
  REQUIRE(vk.begin() == nullptr);
  REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);
  REQUIRE(code_of(vk.api, vk.sync(ns.data(), 1)) == BP_OK);
  CHECK(ns[0] == 12345);

  // A timed run with no calls: nothing to write.
  CHECK(timed_run(0, 0, ns.data()) == BP_OK);
}
