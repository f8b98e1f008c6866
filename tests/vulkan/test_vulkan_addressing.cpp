// How vulkan0 passes operands (plugins/vulkan/README.md, "Operands:
// descriptors, and device addresses past maxStorageBufferRange"): a dispatch
// whose windows all fit a storage-buffer descriptor runs the kernel's _dsc
// module, one with a larger window the device-address module, and
// BACKPLANE_VULKAN_ADDRESSING=addresses makes every dispatch use addresses.
// The pipelines created are read from the plugin's debug log.
#include <backplane/abi.h>
#include <catch2/catch.hpp>

#include "vulkan_test_support.hpp"

#include <cstdint>
#include <string>
#include <vector>

using namespace backplane::vktest;

namespace {

bool any_ends_with(const std::vector<std::string>& v, const std::string& suffix) {
  for (const auto& s : v)
    if (s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0) return true;
  return false;
}

std::string description(VkAbi& vk) {
  bp_device_info info{};
  info.struct_size = sizeof info;
  REQUIRE(vk.api->device_info(vk.plugin, vk.dev, &info) == nullptr);
  return std::string(info.description.data, info.description.len);
}

// y = x + x on 1000 dense floats (x = 0, 1, ...): true when right.
bool small_add(VkAbi& vk) {
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  auto a = vk.buffer(BP_DTYPE_F32, 1000, x.data(), 4);
  auto y = vk.buffer(BP_DTYPE_F32, 1000, nullptr, 4);
  const uint32_t add = vk.kernel("add", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32});
  REQUIRE(vk.call(add, {&a, &a}, y) == nullptr);
  REQUIRE(vk.sync() == nullptr);
  std::vector<float> got(1000);
  REQUIRE(vk.api->buffer_read(vk.plugin, vk.dev, y.s.buffer_handle, 0, got.data(), 4000) == nullptr);
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != 2.0f * x[i]) return false;
  return true;
}

}  // namespace

TEST_CASE("vulkan: operands within maxStorageBufferRange are descriptors, larger ones addresses",
          "[vulkan][addressing]") {
  VkAbi vk(keep_log);
  if (!vk.ready()) return;
  created_pipelines();
  CHECK(small_add(vk));
  const auto small = created_pipelines();
  INFO("created: " << small.size() << " pipelines");
  CHECK(any_ends_with(small, "_dsc"));

  // Two elements 160 MiB apart: a window wider than lavapipe's 128 MiB
  // range (a GPU's 4 GiB range takes it as a descriptor).
  constexpr int64_t kStride = 40ll << 20;  // elements
  bp_buffer big{};
  big.struct_size = sizeof big;
  REQUIRE(vk.api->buffer_allocate(vk.plugin, vk.dev, static_cast<uint64_t>(kStride + 1) * 4, &big) == nullptr);
  const float v0 = 1.5f, v1 = -4.25f;
  REQUIRE(vk.api->buffer_write(vk.plugin, vk.dev, big.handle, 0, &v0, 4) == nullptr);
  REQUIRE(vk.api->buffer_write(vk.plugin, vk.dev, big.handle, static_cast<uint64_t>(kStride) * 4, &v1, 4) == nullptr);
  auto xs = VkAbi::view(big, BP_DTYPE_F32, kStride + 1, 4);
  xs.l.shape[0] = 2;
  xs.l.strides[0] = kStride;
  auto y = vk.buffer(BP_DTYPE_F32, 2, nullptr, 4);
  const uint32_t add = vk.kernel("add", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32});
  REQUIRE(vk.call(add, {&xs, &xs}, y) == nullptr);
  REQUIRE(vk.sync() == nullptr);
  float got[2] = {0, 0};
  REQUIRE(vk.api->buffer_read(vk.plugin, vk.dev, y.s.buffer_handle, 0, got, 8) == nullptr);
  CHECK(got[0] == 3.0f);
  CHECK(got[1] == -8.5f);
  const auto wide = created_pipelines();
  if (description(vk).find("llvmpipe") != std::string::npos) {
    REQUIRE_FALSE(wide.empty());
    CHECK_FALSE(any_ends_with(wide, "_dsc"));
  }
}

TEST_CASE("vulkan: BACKPLANE_VULKAN_ADDRESSING=addresses passes every operand by address",
          "[vulkan][addressing]") {
  EnvVar env("BACKPLANE_VULKAN_ADDRESSING", "addresses");
  VkAbi vk(keep_log);
  if (!vk.ready()) return;
  created_pipelines();
  CHECK(small_add(vk));
  const auto created = created_pipelines();
  REQUIRE_FALSE(created.empty());
  CHECK_FALSE(any_ends_with(created, "_dsc"));
}
