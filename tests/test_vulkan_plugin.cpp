// The Vulkan plugin through its C ABI, without the core: the kernel call a
// data error found at synchronize() belongs to (ABI 1.2 error_call_index),
// and the on-disk pipeline cache (written atomically; a corrupt, truncated or
// foreign file ignored with a log line; BACKPLANE_CACHE_DIR=off disables it).
#include <backplane/abi.h>
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::vector<std::string> g_log;

void capture_log(void*, bp_log_level, bp_string m) { g_log.emplace_back(m.data ? m.data : "", m.len); }
void serial_for(void*, int64_t n, int64_t, bp_parallel_fn fn, void* user) {
  if (n > 0) fn(user, 0, n);
}
uint32_t one_thread(void*) { return 1; }

// BACKPLANE_CACHE_DIR set for the scope, the old value restored after.
struct EnvVar {
  std::string name;
  bool had = false;
  std::string old;
  EnvVar(std::string n, const std::string& value) : name(std::move(n)) {
    if (const char* o = std::getenv(name.c_str())) {
      had = true;
      old = o;
    }
    setenv(name.c_str(), value.c_str(), 1);
  }
  ~EnvVar() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
};

// The plugin library loaded and initialized (with a log sink), vulkan0 taken.
struct Vk {
  void* lib = nullptr;
  const bp_plugin_api* api = nullptr;
  bp_host_api host{};
  bp_device* dev = nullptr;
  bool ok = false;

  Vk() {
    const std::string path = std::string(BACKPLANE_PLUGIN_DIR) + "/libbackplane_vulkan.so";
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto entry = reinterpret_cast<bp_plugin_entry_fn>(dlsym(lib, BP_PLUGIN_ENTRY_SYMBOL));
    if (!entry) return;
    char err[256] = {};
    bp_plugin_query q{};
    q.struct_size = sizeof q;
    q.min_major = BP_ABI_VERSION_MAJOR;
    q.max_major = BP_ABI_VERSION_MAJOR;
    q.max_minor = BP_ABI_VERSION_MINOR;
    q.error_buffer = err;
    q.error_buffer_size = sizeof err;
    if (entry(&q, &api) != BP_OK || !api) return;
    host.struct_size = sizeof host;
    host.abi_major = BP_ABI_VERSION_MAJOR;
    host.abi_minor = BP_ABI_VERSION_MINOR;
    host.log = capture_log;
    host.parallel_for = serial_for;
    host.num_threads = one_thread;
    if (bp_error* e = api->initialize(&host)) {
      api->error_destroy(e);
      return;
    }
    if (api->device_count() == 0 || api->device_get(0, &dev) != nullptr || !dev) return;
    ok = true;
  }
  ~Vk() {
    if (api) api->shutdown();
    if (lib) dlclose(lib);
  }
  Vk(const Vk&) = delete;
  Vk& operator=(const Vk&) = delete;

  uint32_t kernel(const char* op, std::vector<bp_dtype> dtypes) const {
    for (uint32_t i = 0; i < api->n_kernels; ++i) {
      const bp_kernel_desc& k = api->kernels[i];
      if (std::string(k.op.data, k.op.len) != op || k.n_dtypes != dtypes.size()) continue;
      if (std::equal(dtypes.begin(), dtypes.end(), k.dtypes)) return i;
    }
    FAIL("no kernel " << op);
    return 0;
  }

  struct Buf {
    bp_storage s{};
    bp_layout l{};
  };
  // A 1-D buffer of n elements of dtype holding `bytes`.
  Buf buffer(bp_dtype dt, int64_t n, const void* bytes, size_t elem) {
    bp_buffer b{};
    b.struct_size = sizeof b;
    REQUIRE(api->buffer_allocate(dev, static_cast<uint64_t>(n) * elem, &b) == nullptr);
    if (bytes) REQUIRE(api->buffer_write(dev, b.handle, 0, bytes, static_cast<uint64_t>(n) * elem) == nullptr);
    Buf r;
    r.s.struct_size = sizeof r.s;
    r.s.data = b.host_ptr;
    r.s.buffer_handle = b.handle;
    r.s.byte_size = static_cast<uint64_t>(n) * elem;
    r.s.dtype = dt;
    r.l.rank = 1;
    r.l.shape[0] = n;
    r.l.strides[0] = 1;
    return r;
  }

  // Calls kernel `k` on `in` writing `out`; returns its error (nullptr: ok).
  bp_error* call(uint32_t k, std::vector<Buf*> in, Buf& out) {
    std::vector<bp_storage> s;
    std::vector<bp_layout> l;
    for (Buf* b : in) {
      s.push_back(b->s);
      l.push_back(b->l);
    }
    l.push_back(out.l);
    bp_kernel_context ctx{};
    ctx.struct_size = sizeof ctx;
    ctx.device = dev;
    ctx.host = &host;
    ctx.kernel_index = k;
    return api->kernels[k].fn(&ctx, s.data(), s.size(), &out.s, 1, l.data(), nullptr);
  }
};

std::string error_text(const bp_plugin_api* api, const bp_error* e) {
  const bp_string m = api->error_message(e);
  return std::string(m.data ? m.data : "", m.len);
}

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
  REQUIRE(vk.api->begin(vk.dev) == nullptr);
  REQUIRE(vk.call(vk.kernel("add", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32}), {&x, &x}, y) == nullptr);
  REQUIRE(vk.api->synchronize(vk.dev) == nullptr);
  float out[4] = {};
  REQUIRE(vk.api->buffer_read(vk.dev, y.s.buffer_handle, 0, out, sizeof out) == nullptr);
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
  if (!vk.ok) {
    WARN("no Vulkan device");
    return;
  }
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
    REQUIRE(vk.api->begin(vk.dev) == nullptr);
    REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);  // call 0
    REQUIRE(vk.call(div, {&n, &d}, q) == nullptr);  // call 1: 9 / 0
    REQUIRE(vk.call(add, {&y, &x}, y) == nullptr);  // call 2
    bp_error* e = vk.api->synchronize(vk.dev);
    REQUIRE(e != nullptr);
    CHECK(vk.api->error_code(e) == BP_ERR_OUT_OF_RANGE);
    CHECK(error_text(vk.api, e).find("division by zero") != std::string::npos);
    CHECK(vk.api->error_call_index(e) == 1);
    vk.api->error_destroy(e);
  }
  SECTION("a cast of NaN to an integer in the fourth call; counting restarts at begin()") {
    REQUIRE(vk.api->begin(vk.dev) == nullptr);
    REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);
    REQUIRE(vk.api->synchronize(vk.dev) == nullptr);
    REQUIRE(vk.api->begin(vk.dev) == nullptr);
    for (int i = 0; i < 3; ++i) REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);  // calls 0-2
    REQUIRE(vk.call(cast, {&bad}, q) == nullptr);                               // call 3
    REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);                              // call 4
    bp_error* e = vk.api->synchronize(vk.dev);
    REQUIRE(e != nullptr);
    CHECK(error_text(vk.api, e).find("cast") != std::string::npos);
    CHECK(vk.api->error_call_index(e) == 3);
    vk.api->error_destroy(e);
  }
  SECTION("errors that are no data error of a call say -1") {
    bp_buffer b{};
    b.struct_size = sizeof b;
    bp_error* e = vk.api->buffer_read(vk.dev, 987654321, 0, &b, 4);  // unknown handle
    REQUIRE(e != nullptr);
    CHECK(vk.api->error_call_index(e) == -1);
    vk.api->error_destroy(e);
    CHECK(vk.api->error_call_index(nullptr) == -1);
  }
  // The device works on after a data error.
  REQUIRE(vk.api->begin(vk.dev) == nullptr);
  REQUIRE(vk.call(add, {&x, &x}, y) == nullptr);
  REQUIRE(vk.api->synchronize(vk.dev) == nullptr);
}

TEST_CASE("vulkan: the pipeline cache is written once per device and reloaded", "[vulkan][cache]") {
  const fs::path dir = scratch_dir("cache");
  EnvVar env("BACKPLANE_CACHE_DIR", dir.string());
  EnvVar old("BACKPLANE_VULKAN_PIPELINE_CACHE", "1");
  {
    Vk probe;
    if (!probe.ok) {
      WARN("no Vulkan device");
      return;
    }
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
