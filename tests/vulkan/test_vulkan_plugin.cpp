// The Vulkan plugin through its C ABI, without the core: the kernel call a
// data error found at synchronize() belongs to (error_call_index),
// and the on-disk pipeline cache (written atomically; a corrupt, truncated or
// foreign file ignored with a log line; BACKPLANE_CACHE_DIR=off disables it).
#include <backplane/abi.h>
#include <catch2/catch.hpp>

#include "vulkan_test_support.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

using namespace backplane::vktest;

namespace {

namespace fs = std::filesystem;

std::vector<std::string> g_log;

void capture_log(void*, bp_log_level, bp_string m) { g_log.emplace_back(m.data ? m.data : "", m.len); }

// The plugin library loaded and initialized with capture_log as its log
// sink, vulkan0 taken.
struct Vk : VkAbi {
  Vk() : VkAbi(capture_log) {}
};

fs::path scratch_dir(const char* name) {
  fs::path p = fs::temp_directory_path() / ("bp_vk_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// Runs one f32 add on a fresh load of the plugin (so one pipeline is made).
void run_add_once() {
  Vk vk;
  if (!vk.ok) return;
  const float a[4] = {1, 2, 3, 4};
  auto x = vk.buffer(BP_DTYPE_F32, 4, a, 4);
  auto y = vk.buffer(BP_DTYPE_F32, 4, nullptr, 4);
  REQUIRE(vk.begin() == nullptr);
  REQUIRE(vk.call(vk.kernel("add", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32}), {&x, &x}, y) == nullptr);
  REQUIRE(vk.sync() == nullptr);
  float out[4] = {};
  REQUIRE(vk.api->buffer_read(vk.plugin, vk.dev, y.s.buffer_handle, 0, out, sizeof out) == nullptr);
  CHECK(out[3] == 8.0f);
}

std::vector<fs::path> cache_files(const fs::path& dir) {
  std::vector<fs::path> r;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir)) r.push_back(e.path());
  return r;
}

bool logged(const std::string& what) {
  for (const auto& m : g_log)
    if (m.find(what) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("vulkan: error_call_index names the kernel call whose dispatch failed", "[vulkan][abi]") {
  Vk vk;
  if (!vk.ready()) return;
  REQUIRE(vk.api->error_call_index != nullptr);
  const float f[4] = {1, 2, 3, 4};
  const int32_t num[4] = {7, 8, 9, 10}, den[4] = {1, 2, 0, 5};
  const float nan4[4] = {1, std::numeric_limits<float>::quiet_NaN(), 2, 3};
  auto x = vk.buffer(BP_DTYPE_F32, 4, f, 4);
  auto y = vk.buffer(BP_DTYPE_F32, 4, nullptr, 4);
  auto n = vk.buffer(BP_DTYPE_I32, 4, num, 4);
  auto d = vk.buffer(BP_DTYPE_I32, 4, den, 4);
  auto q = vk.buffer(BP_DTYPE_I32, 4, nullptr, 4);
  auto bad = vk.buffer(BP_DTYPE_F32, 4, nan4, 4);
  const uint32_t add = vk.kernel("add", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32});
  const uint32_t div = vk.kernel("div", {BP_DTYPE_I32, BP_DTYPE_I32, BP_DTYPE_I32});
  const uint32_t cast = vk.kernel("cast", {BP_DTYPE_F32, BP_DTYPE_I32});

  SECTION("integer division by zero in the second of three calls") {
    REQUIRE(vk.begin() == nullptr);
    REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);  // call 0
    REQUIRE(vk.call(div, {&n, &d}, q) == nullptr);  // call 1: 9 / 0
    REQUIRE(vk.call(add, {&y, &x}, y) == nullptr);  // call 2
    bp_error* e = vk.sync();
    REQUIRE(e != nullptr);
    CHECK(vk.api->error_code(vk.plugin, e) == BP_ERR_OUT_OF_RANGE);
    CHECK(error_text(vk.api, e).find("division by zero") != std::string::npos);
    CHECK(vk.api->error_call_index(vk.plugin, e) == 1);
    vk.api->error_destroy(vk.plugin, e);
  }
  SECTION("a cast of NaN to an integer in the fourth call; counting restarts at begin()") {
    REQUIRE(vk.begin() == nullptr);
    REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);
    REQUIRE(vk.sync() == nullptr);
    REQUIRE(vk.begin() == nullptr);
    for (int i = 0; i < 3; ++i) REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);  // calls 0-2
    REQUIRE(vk.call(cast, {&bad}, q) == nullptr);                               // call 3
    REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);                              // call 4
    bp_error* e = vk.sync();
    REQUIRE(e != nullptr);
    CHECK(error_text(vk.api, e).find("cast") != std::string::npos);
    CHECK(vk.api->error_call_index(vk.plugin, e) == 3);
    vk.api->error_destroy(vk.plugin, e);
  }
  SECTION("errors that are no data error of a call say -1") {
    bp_buffer b{};
    b.struct_size = sizeof b;
    bp_error* e = vk.api->buffer_read(vk.plugin, vk.dev, 987654321, 0, &b, 4);  // unknown handle
    REQUIRE(e != nullptr);
    CHECK(vk.api->error_call_index(vk.plugin, e) == -1);
    vk.api->error_destroy(vk.plugin, e);
    CHECK(vk.api->error_call_index(vk.plugin, nullptr) == -1);
  }
  // The device works on after a data error.
  REQUIRE(vk.begin() == nullptr);
  REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);
  REQUIRE(vk.sync() == nullptr);
}

TEST_CASE("vulkan: the pipeline cache is written once per device and reloaded", "[vulkan][cache]") {
  const fs::path dir = scratch_dir("cache");
  EnvVar env("BACKPLANE_CACHE_DIR", dir.string());
  EnvVar old("BACKPLANE_VULKAN_PIPELINE_CACHE", "1");
  {
    Vk probe;
    if (!probe.ready()) return;
  }
  fs::remove_all(dir);
  g_log.clear();
  run_add_once();
  auto files = cache_files(dir);
  REQUIRE(files.size() == 1);  // no temporary file left behind
  CHECK(files[0].extension() == ".pipelines");
  std::vector<char> bytes;
  {
    std::ifstream in(files[0], std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  REQUIRE(bytes.size() >= 8);
  CHECK(std::memcmp(bytes.data(), "BPVKPC", 6) == 0);

  // A good file loads without complaint.
  g_log.clear();
  run_add_once();
  CHECK_FALSE(logged("ignoring the pipeline cache"));

  const auto write = [&](const std::vector<char>& b) {
    std::ofstream out(files[0], std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  SECTION("corrupt data") {
    std::vector<char> b = bytes;
    b.back() = static_cast<char>(b.back() ^ 0x5a);
    write(b);
    g_log.clear();
    run_add_once();
    CHECK(logged("ignoring the pipeline cache"));
    CHECK(logged("corrupt"));
  }
  SECTION("truncated") {
    write(std::vector<char>(bytes.begin(), bytes.begin() + 20));
    g_log.clear();
    run_add_once();
    CHECK(logged("truncated"));
    std::vector<char> b(bytes.begin(), bytes.end() - 1);
    write(b);
    g_log.clear();
    run_add_once();
    CHECK(logged("ignoring the pipeline cache"));
  }
  SECTION("foreign: another device, another build, not ours at all") {
    std::vector<char> b = bytes;
    b[8] = static_cast<char>(b[8] ^ 1);  // vendor id
    write(b);
    g_log.clear();
    run_add_once();
    CHECK(logged("another device"));
    write(std::vector<char>(100, 'x'));
    g_log.clear();
    run_add_once();
    CHECK(logged("not a Backplane pipeline cache"));
  }
  // Whatever was there, a good file is back.
  std::vector<char> now;
  {
    std::ifstream in(files[0], std::ios::binary);
    now.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  CHECK(now.size() == bytes.size());
  fs::remove_all(dir);
}

TEST_CASE("vulkan: BACKPLANE_CACHE_DIR=off writes no pipeline cache", "[vulkan][cache]") {
  const fs::path dir = scratch_dir("off");
  EnvVar xdg("XDG_CACHE_HOME", dir.string());
  EnvVar env("BACKPLANE_CACHE_DIR", "off");
  run_add_once();
  CHECK(cache_files(dir / "backplane").empty());
  fs::remove_all(dir);
}
