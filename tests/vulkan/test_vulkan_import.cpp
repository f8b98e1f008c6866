// Host memory used in place by the Vulkan plugin (buffer_import_host,
// VK_EXT_external_memory_host): through the C ABI (a kernel reads what the
// host wrote and writes into host memory; buffer_free releases the wrapper
// only; pointers the device cannot import refused with the reason), and
// through the core (wrap_host inputs and bind_output read and written in
// place on vulkan0, described so; a CPU value read by vulkan0 zero-copy; the
// copy when the plugin refuses).
#include <backplane/abi.h>
#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>

#include "vulkan_test_support.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace backplane;
using namespace backplane::vktest;

namespace {

// Page-aligned host memory; the tests place their data at chosen offsets in it.
struct Pages {
  explicit Pages(size_t bytes) : size((bytes + 4095) / 4096 * 4096) {
    p = static_cast<char*>(std::aligned_alloc(4096, size));
    std::memset(p, 0, size);
  }
  ~Pages() { std::free(p); }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;
  float* f(size_t byte_offset) { return reinterpret_cast<float*>(p + byte_offset); }
  char* p;
  size_t size;
};

// The plugin loaded through its entry symbol and initialized, vulkan0 taken,
// its buffer_alignment known.
struct Vk : VkAbi {
  uint64_t align = 0;

  Vk() {
    if (!ok) return;
    ok = false;
    bp_device_info info{};
    info.struct_size = sizeof info;
    if (bp_error* e = api->device_info(plugin, dev, &info)) {
      api->error_destroy(plugin, e);
      return;
    }
    align = info.buffer_alignment;
    ok = true;
  }

  // Imports n floats at p; the error (nullptr: imported into *out).
  bp_error* import(void* p, uint64_t bytes, bp_buffer* out) {
    *out = bp_buffer{};
    out->struct_size = sizeof *out;
    return api->buffer_import_host(plugin, dev, p, bytes, out);
  }

  // out = a + b (f32, n elements), one run: begin, the call, synchronize.
  void add(const bp_buffer& a, const bp_buffer& b, const bp_buffer& out, int64_t n) {
    const uint32_t k = kernel("add", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32});
    Buf x = view(a, BP_DTYPE_F32, n, 4), y = view(b, BP_DTYPE_F32, n, 4), o = view(out, BP_DTYPE_F32, n, 4);
    REQUIRE(begin() == nullptr);
    bp_error* e = call(k, {&x, &y}, o);
    if (e) FAIL(error_text(api, e));
    e = sync();
    if (e) FAIL(error_text(api, e));
  }
};

bool has_line(const std::vector<std::string>& lines, const std::string& what) {
  for (const auto& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

void fill(float* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (size_t i = 0; i < n; ++i) p[i] = u(rng);
}

// y = x * w + x, elementwise.
Graph mul_add(int64_t n) {
  Graph g;
  g.input("x", BP_DTYPE_F32, {n});
  g.input("w", BP_DTYPE_F32, {n});
  g.node("t", "mul", {"x", "w"});
  g.node("y", "add", {"t", "x"});
  g.output("y");
  return g;
}

void check_mul_add(const float* y, const float* x, const float* w, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double want = static_cast<double>(x[i]) * w[i] + x[i];
    if (std::abs(y[i] - want) > 1e-6 + 1e-6 * std::abs(want) && bad++ < 5)
      FAIL_CHECK("y[" << i << "] = " << y[i] << ", want " << want);
  }
  CHECK(bad == 0);
}

bool can_import(Vk& vk) {
  Pages mem(4096);
  bp_buffer b{};
  bp_error* e = vk.import(mem.p, 4096, &b);
  if (e) {
    WARN("SKIPPED: vulkan0 imports no host memory: " << error_text(vk.api, e));
    vk.api->error_destroy(vk.plugin, e);
    return false;
  }
  vk.api->buffer_free(vk.plugin, vk.dev, b.handle);
  return true;
}

bool can_import(Runtime& rt, Device& vk) {
  Pages mem(4096);
  try {
    (void)rt.wrap_host(mem.p, 16, BP_DTYPE_F32, Shape{4}, vk);
    return true;
  } catch (const Error& e) {
    WARN("SKIPPED: " << vk.name() << " imports no host memory: " << e.what());
    return false;
  }
}

// The Vulkan plugin's first device when it imports host memory; nullptr
// (with a WARN saying why) when there is none or it does not.
Device* importing_vulkan(Runtime& rt) {
  Device* vk = find_plugin(rt, "vulkan");
  if (!vk) {
    WARN("SKIPPED: no Vulkan device");
    return nullptr;
  }
  return can_import(rt, *vk) ? vk : nullptr;
}

}  // namespace

TEST_CASE("vulkan: imported host memory is what a kernel reads and writes", "[vulkan][import][abi]") {
  Vk vk;
  if (!vk.ready()) return;
  REQUIRE(vk.api->buffer_import_host != nullptr);
  if (!can_import(vk)) return;
  constexpr int64_t n = 1001;  // 4004 bytes: the output spans a page boundary below and ends in a partial 4-vector
  Pages mem(4 * 4096);
  // a at a page start, out 16 bytes into the second page and ending inside
  // the third (neither start nor size a multiple of the 4 KiB import unit).
  float* a = mem.f(0);
  float* out = mem.f(4096 + 16);
  float* after = out + n;  // bytes of the same pages that are not the buffer's
  float* before = out - 4;
  fill(a, n, 1);
  for (int i = 0; i < 4; ++i) before[i] = after[i] = 12345.f;
  std::vector<float> bvals(n);
  fill(bvals.data(), n, 2);

  bp_buffer ba{}, bo{}, bb{};
  REQUIRE(vk.import(a, n * 4, &ba) == nullptr);
  REQUIRE(vk.import(out, n * 4, &bo) == nullptr);
  CHECK(ba.host_ptr == a);
  CHECK(bo.host_ptr == out);
  CHECK(ba.size == n * 4);
  CHECK(ba.handle != bo.handle);
  bb.struct_size = sizeof bb;
  REQUIRE(vk.api->buffer_allocate(vk.plugin, vk.dev, n * 4, &bb) == nullptr);
  REQUIRE(vk.api->buffer_write(vk.plugin, vk.dev, bb.handle, 0, bvals.data(), n * 4) == nullptr);

  vk.add(ba, bb, bo, n);
  // The kernel's output is in the host's memory, and nowhere around it.
  for (int64_t i = 0; i < n; ++i)
    if (out[i] != a[i] + bvals[i]) FAIL("out[" << i << "] = " << out[i] << ", want " << a[i] + bvals[i]);
  for (int i = 0; i < 4; ++i) {
    CHECK(before[i] == 12345.f);
    CHECK(after[i] == 12345.f);
  }
  // buffer_read/write go to the same bytes.
  float got = 0;
  REQUIRE(vk.api->buffer_read(vk.plugin, vk.dev, bo.handle, 4 * 7, &got, 4) == nullptr);
  CHECK(got == out[7]);
  const float nine = 9.f;
  REQUIRE(vk.api->buffer_write(vk.plugin, vk.dev, ba.handle, 4 * 3, &nine, 4) == nullptr);
  CHECK(a[3] == 9.f);

  // The host writes through its pointer; the next run reads it, no copy.
  for (int64_t i = 0; i < n; ++i) a[i] = static_cast<float>(i);
  vk.add(ba, bb, bo, n);
  for (int64_t i = 0; i < n; ++i)
    if (out[i] != static_cast<float>(i) + bvals[i]) FAIL("second run: out[" << i << "] = " << out[i]);

  // Freeing releases the wrapper only: the memory stays the host's, intact
  // and usable (imported again, even).
  vk.api->buffer_free(vk.plugin, vk.dev, ba.handle);
  vk.api->buffer_free(vk.plugin, vk.dev, bo.handle);
  CHECK(out[5] == 5.f + bvals[5]);
  out[5] = -1.f;
  CHECK(out[5] == -1.f);
  CHECK(a[10] == 10.f);
  bp_buffer again{};
  REQUIRE(vk.import(a, n * 4, &again) == nullptr);
  vk.add(again, bb, bb, n);  // bb = a + bb, read back through the plugin
  std::vector<float> sum(n);
  REQUIRE(vk.api->buffer_read(vk.plugin, vk.dev, bb.handle, 0, sum.data(), n * 4) == nullptr);
  CHECK(sum[10] == 10.f + bvals[10]);
  vk.api->buffer_free(vk.plugin, vk.dev, again.handle);
  vk.api->buffer_free(vk.plugin, vk.dev, bb.handle);
  // Many imports and frees of the same memory: nothing accumulates.
  for (int i = 0; i < 200; ++i) {
    bp_buffer t{};
    REQUIRE(vk.import(mem.p + 4096, 2 * 4096, &t) == nullptr);
    vk.api->buffer_free(vk.plugin, vk.dev, t.handle);
  }
}

TEST_CASE("vulkan: host memory the device cannot import is refused with the reason", "[vulkan][import][abi]") {
  Vk vk;
  if (!vk.ready()) return;
  if (!can_import(vk)) return;
  Pages mem(2 * 4096);
  bp_buffer b{};
  // Not aligned to the device's buffer_alignment (the ABI's promise broken).
  bp_error* e = vk.import(mem.p + 4, 64, &b);
  REQUIRE(e != nullptr);
  CHECK(vk.api->error_code(vk.plugin, e) == BP_ERR_INVALID_ARGUMENT);
  CHECK_THAT(error_text(vk.api, e), Catch::Contains("not aligned to") &&
                                  Catch::Contains("buffer_alignment (" + std::to_string(vk.align) + " bytes)"));
  vk.api->error_destroy(vk.plugin, e);
  CHECK(b.handle == 0);
  e = vk.import(nullptr, 64, &b);
  REQUIRE(e != nullptr);
  CHECK(vk.api->error_code(vk.plugin, e) == BP_ERR_INVALID_ARGUMENT);
  vk.api->error_destroy(vk.plugin, e);
  // More than one allocation may hold.
  e = vk.import(mem.p, uint64_t{1} << 62, &b);
  REQUIRE(e != nullptr);
  CHECK(vk.api->error_code(vk.plugin, e) == BP_ERR_OUT_OF_MEMORY);
  CHECK_THAT(error_text(vk.api, e), Catch::Contains("allocates at most"));
  vk.api->error_destroy(vk.plugin, e);
  {
    // Switched off: refused, so the host copies.
    EnvVar off("BACKPLANE_VULKAN_HOST_IMPORT", "0");
    e = vk.import(mem.p, 4096, &b);
    REQUIRE(e != nullptr);
    CHECK(vk.api->error_code(vk.plugin, e) == BP_ERR_UNAVAILABLE);
    CHECK_THAT(error_text(vk.api, e), Catch::Contains("BACKPLANE_VULKAN_HOST_IMPORT=0"));
    vk.api->error_destroy(vk.plugin, e);
  }
  // An aligned pointer still imports after all those refusals.
  REQUIRE(vk.import(mem.p + vk.align, 100, &b) == nullptr);
  vk.api->buffer_free(vk.plugin, vk.dev, b.handle);
}

TEST_CASE("vulkan0 reads a wrap_host input and writes a bound host output in place", "[vulkan][import][tensor]") {
  auto rt = default_runtime();
  Device* vk = importing_vulkan(*rt);
  if (!vk) return;
  constexpr int64_t n = 3000;
  Pages xmem(n * 4 + 4096), ymem(n * 4 + 4096);
  // Aligned to the elements and to 16 bytes, not to a page.
  float* x = xmem.f(48);
  float* y = ymem.f(272);
  std::vector<float> w(n);
  fill(x, n, 3);
  fill(w.data(), n, 4);
  Plan p = rt->compile(mul_add(n), *vk);
  Tensor tx = rt->wrap_host(x, n * 4, BP_DTYPE_F32, Shape{n}, *vk);
  CHECK(tx.data() == x);
  CHECK(&tx.device() == vk);
  p.set_input("x", tx);
  p.set_input("w", w.data(), n * 4);
  p.bind_output("y", y, n * 4);
  const auto d = p.describe();
  INFO(joined(d));
  CHECK(has_line(d, "input 'x' f32[3000] on " + vk->name() + ": the application's memory, imported by " + vk->name() +
                        ", read in place (no copy)"));
  CHECK(has_line(d, "input 'w' f32[3000] on " + vk->name() + ": host data copied in by set_input"));
  CHECK(has_line(d, "output 'y': written in place into a bound buffer on " + vk->name() +
                        " (the application's memory, imported: no copy)"));
  p.execute();
  check_mul_add(y, x, w.data(), n);
  CHECK(p.output_tensor("y").data() == y);
  // The application changes its memory; the next run reads it without
  // set_input (the input stays bound to the memory until set again).
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * static_cast<float>(i % 17) - 3.f;
  p.execute();
  check_mul_add(y, x, w.data(), n);
  // output() reads the bound memory too.
  const HostTensor out = p.output("y");
  CHECK(std::memcmp(out.data(), y, n * 4) == 0);
  // Unbound: the plan's own buffers again, the results still right.
  p.bind_output("y", Tensor{});
  p.set_input("x", x, n * 4);
  CHECK(has_line(p.describe(), "input 'x' f32[3000] on " + vk->name() + ": host data copied in"));
  std::fill(y, y + n, 0.f);
  p.execute();
  CHECK(y[1] == 0.f);
  const HostTensor again = p.output("y");
  check_mul_add(static_cast<const float*>(again.data()), x, w.data(), n);
}

TEST_CASE("a CPU value crosses to vulkan0 zero-copy or by a copy when the import is refused", "[vulkan][import][multidevice]") {
  auto rt = default_runtime();
  Device* vk = importing_vulkan(*rt);
  if (!vk) return;
  constexpr int64_t n = 4096;
  // a = exp(x) on the cpu, read by vulkan0 (b = -a); c = sqrt(|x|) on the cpu
  // afterwards, which the CPU writes before vulkan0's queued work runs (at
  // the end of the run): a's memory must not be reused for c.
  Graph g;
  g.input("x", BP_DTYPE_F32, {n});
  g.node("a", "exp", {"x"}, {}, "cpu");
  g.node("b", "neg", {"a"}, {}, vk->name());
  g.node("ax", "abs", {"x"}, {}, "cpu");
  g.node("c", "sqrt", {"ax"}, {}, "cpu");
  g.node("d", "mul", {"c", "c"}, {}, "cpu");
  g.output("b");
  g.output("d");
  HostTensor x(BP_DTYPE_F32, {n});
  fill(static_cast<float*>(x.data()), n, 5);
  auto check = [&](const std::map<std::string, HostTensor>& out) {
    const auto* xs = static_cast<const float*>(x.data());
    const auto* b = static_cast<const float*>(out.at("b").data());
    const auto* dd = static_cast<const float*>(out.at("d").data());
    size_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double wb = -std::exp(static_cast<double>(xs[i]));
      const double wd = std::abs(static_cast<double>(xs[i]));
      if (std::abs(b[i] - wb) > 1e-5 * std::abs(wb) && bad++ < 5) FAIL_CHECK("b[" << i << "] = " << b[i] << ", want " << wb);
      if (std::abs(dd[i] - wd) > 1e-5 * wd + 1e-6 && bad++ < 5) FAIL_CHECK("d[" << i << "] = " << dd[i] << ", want " << wd);
    }
    CHECK(bad == 0);
  };
  const std::string list = "cpu," + vk->name();
  {
    Plan p = rt->compile(g, rt->select_devices(list));
    const auto t = p.transfers();
    INFO(joined(p.describe()));
    REQUIRE(t.size() == 1);
    CHECK(t[0].value == "a");
    CHECK(t[0].to == vk->name());
    CHECK(t[0].zero_copy);
    CHECK(t[0].bytes == 0);
    CHECK(has_line(p.describe(), "zero-copy (" + vk->name() + " reads cpu's memory in place)"));
    for (int run = 0; run < 3; ++run) {
      fill(static_cast<float*>(x.data()), n, 10 + static_cast<uint64_t>(run));
      check(p.run({{"x", x}}));
    }
  }
  {
    // The plugin refuses (as a driver without the extension would): the
    // plan copies instead, and says why.
    EnvVar off("BACKPLANE_VULKAN_HOST_IMPORT", "0");
    Plan p = rt->compile(g, rt->select_devices(list));
    const auto t = p.transfers();
    INFO(joined(p.describe()));
    REQUIRE(t.size() == 1);
    CHECK_FALSE(t[0].zero_copy);
    CHECK(t[0].bytes == n * 4);
    CHECK(has_line(p.describe(), "16384 bytes (the destination refused to import the memory)"));
    check(p.run({{"x", x}}));
    // wrap_host on vulkan0 is refused with the plugin's reason and code.
    Pages mem(4096);
    try {
      (void)rt->wrap_host(mem.p, 16, BP_DTYPE_F32, Shape{4}, *vk);
      FAIL("imported with the import switched off");
    } catch (const Error& e) {
      CHECK(e.code() == BP_ERR_UNAVAILABLE);
      CHECK_THAT(e.what(), Catch::Contains("refused the host memory") && Catch::Contains("BACKPLANE_VULKAN_HOST_IMPORT=0"));
    }
  }
}

// A graph reading a 64 MiB host input on vulkan0, imported (wrap_host, read
// in place) and copied in by set_input each run, alternating in one process:
// both give the same bytes and the exact sum (would catch an import that
// reads stale or partial pages of a large input). Also prints the per-run
// medians of both (a measurement, not asserted): run it alone with
// backplane_tests "[vulkan_import_bench]".
TEST_CASE("vulkan0 host input imported against copied (64 MiB)", "[vulkan][vulkan_import_bench]") {
  auto rt = default_runtime();
  Device* vk = find_plugin(*rt, "vulkan");
  if (!vk) {
    WARN("SKIPPED: no Vulkan device here");
    return;
  }
  if (!can_import(*rt, *vk)) {
    WARN("SKIPPED: " << vk->name() << " cannot import host memory");
    return;
  }
  constexpr int64_t n = int64_t{16} << 20;  // 64 MiB of f32
  Pages mem(static_cast<size_t>(n) * 4);
  float* x = mem.f(0);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 7) - 3.f;
  // Two graphs: a sum reads every byte; a 16-element slice reads almost
  // none, so its run is the input's handling alone.
  for (const bool whole : {true, false}) {
    Graph g;
    g.input("x", BP_DTYPE_F32, {n});
    if (whole) {
      g.node("y", "sum", {"x"});
    } else {
      g.node("s", "slice", {"x"}, {{"dim", 0}, {"start", 0}, {"end", 16}});
      g.node("y", "neg", {"s"});
    }
    g.output("y");
    Plan imported = rt->compile(g, *vk);
    Plan copied = rt->compile(g, *vk);
    imported.set_input("x", rt->wrap_host(x, n * 4, BP_DTYPE_F32, Shape{n}, *vk));
    copied.set_input("x", x, n * 4);
    imported.execute();  // first runs: pipelines
    copied.execute();
    std::vector<double> ti, tc;
    using Clock = std::chrono::steady_clock;
    for (int r = 0; r < 7; ++r) {
      auto t0 = Clock::now();
      imported.execute();
      auto t1 = Clock::now();
      copied.set_input("x", x, n * 4);
      copied.execute();
      auto t2 = Clock::now();
      ti.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      tc.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::sort(ti.begin(), ti.end());
    std::sort(tc.begin(), tc.end());
    std::printf("%s: per run, imported %.2f ms (min %.2f), copied %.2f ms (min %.2f)\n",
                whole ? "sum over 64 MiB" : "16-element slice of 64 MiB", ti[3], ti[0], tc[3], tc[0]);
    const HostTensor a = imported.output("y"), b = copied.output("y");
    REQUIRE(a.nbytes() == b.nbytes());
    CHECK(std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
    if (whole) {
      double want = 0;  // small integers: the f32 sum is exact
      for (int64_t i = 0; i < n; ++i) want += x[i];
      CHECK(a.get(0) == want);
    }
  }
}
