// Helpers the Vulkan tests (tests/vulkan/test_vulkan_*.cpp) share: through the core
// (a runtime on the default plugin path, vulkan0 and the CPU plugin's device,
// graphs run on one device, kernels a device claims, random HostTensors,
// element checks within docs/ops.md's tolerances) and through the C ABI (the
// Vulkan plugin library loaded without the core, vulkan0 taken, its buffers
// and kernel calls). Dtype names and classes are the SDK's
// (backplane/sdk/dtype.hpp: dtype_name, is_float).
#pragma once

#include <backplane/abi.h>
#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace backplane::vktest {

// ---------------------------------------------------------------------------
// Through the core.

// A runtime that sees the install's own plugins (cpu, vulkan) and ignores the
// environment (BACKPLANE_PLUGIN_PATH, BACKPLANE_DEVICE, BACKPLANE_NUM_THREADS).
inline std::unique_ptr<Runtime> default_runtime() {
  RuntimeOptions opts;
  opts.use_environment = false;
  opts.use_default_path = true;  // cpu, vulkan
  return Runtime::create(opts);
}

// The first device of `plugin` ("vulkan", "cpu"); nullptr when there is none.
inline Device* find_plugin(Runtime& rt, const std::string& plugin) {
  for (auto* d : rt.all_devices())
    if (d->plugin_name() == plugin) return d;
  return nullptr;
}

// The device named `name` ("vulkan0"); nullptr when there is none.
inline Device* find_device(Runtime& rt, const std::string& name) {
  for (auto* d : rt.all_devices())
    if (d->name() == name) return d;
  return nullptr;
}

// A runtime with the Vulkan plugin's first device and the CPU plugin's.
struct Devices {
  std::unique_ptr<Runtime> rt = default_runtime();
  Device* vk = find_plugin(*rt, "vulkan");
  Device* cpu = find_plugin(*rt, "cpu");
  bool ok() const { return vk && cpu; }
  // ok(), with a WARN when a device is missing (the test then returns).
  bool ready() const {
    if (ok()) return true;
    WARN("SKIPPED: needs the vulkan and cpu plugins");
    return false;
  }
};

// g compiled for `d` alone and run once on `in`; the plan is gone after.
inline std::map<std::string, HostTensor> run_on(Runtime& rt, Device& d, const Graph& g,
                                                const std::map<std::string, HostTensor>& in) {
  Plan p = rt.compile(g, d);
  return p.run(in);
}

// Whether `d` has a kernel for `op` whose first input is `dt` (the device's
// features: f64, i64, 8/16-bit storage).
inline bool has_kernel(const Device& d, const std::string& op, bp_dtype dt) {
  for (const KernelInfo& k : d.kernels())
    if (k.op == op && !k.dtypes.empty() && k.dtypes[0] == dt) return true;
  return false;
}

// The dtypes a loop over a dtype list ran (those the device has `op` for):
// f32 must be among them, since every Vulkan device has f32 kernels, so a
// claim dropped from the manifest, or a loop that skipped everything, fails
// instead of passing with nothing checked.
class DtypesRun {
 public:
  explicit DtypesRun(std::string op) : op_(std::move(op)) {}
  bool take(const Device& d, const std::string& op, bp_dtype dt) {
    if (!has_kernel(d, op, dt)) return false;
    ++ran_;
    f32_ = f32_ || dt == BP_DTYPE_F32;
    return true;
  }
  void check() const {
    INFO("the loop over " << op_ << "'s dtypes ran " << ran_);
    CHECK(ran_ > 0);
    CHECK(f32_);
  }

 private:
  std::string op_;
  int ran_ = 0;
  bool f32_ = false;
};

inline constexpr bp_dtype kNumeric[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64, BP_DTYPE_I8,
                                        BP_DTYPE_I16, BP_DTYPE_I32, BP_DTYPE_I64,  BP_DTYPE_U8};
inline constexpr bp_dtype kFloats[] = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64};

// A 64-bit LCG step; the high bits.
inline uint64_t next(uint64_t& s) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return s >> 33;
}

// Small integers in [lo, hi]: exact in every dtype, and so are their sums
// (computed in f32 or wider before the one rounding of the result).
inline HostTensor ints(bp_dtype dt, Shape shape, uint64_t seed, int lo, int hi) {
  HostTensor t(dt, std::move(shape));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) t.set(i, lo + static_cast<int>(next(s) % (hi - lo + 1)));
  return t;
}

// Uniform in [-bound, bound] in steps of 1e-6, rounded into dt by set().
inline HostTensor reals(bp_dtype dt, Shape shape, uint64_t seed, int bound) {
  HostTensor t(dt, std::move(shape));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 3;
  const uint64_t steps = 2000000ull * static_cast<uint64_t>(bound) + 1;
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    t.set(i, static_cast<double>(next(s) % steps) / 1000000.0 - static_cast<double>(bound));
  return t;
}

// One CHECK that ok(i) holds for every i < n; the message names the first
// element that fails, got against want_at(i), and how many fail.
template <class Ok, class WantAt>
void check_elements(const HostTensor& got, int64_t n, Ok ok, WantAt want_at) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i)
    if (!ok(i)) {
      if (first < 0) first = i;
      ++bad;
    }
  INFO("first mismatch at " << first << ": " << (first >= 0 ? got.get(first) : 0.0) << " vs "
                            << (first >= 0 ? want_at(first) : 0.0) << " (" << bad << " bad)");
  CHECK(bad == 0);
}

// Every element of `got` equals `want` (small-integer data: exact on both).
inline void check_equal(const HostTensor& got, const HostTensor& want) {
  REQUIRE(got.dtype == want.dtype);
  REQUIRE(got.shape == want.shape);
  check_elements(
      got, got.numel(), [&](int64_t i) { return got.get(i) == want.get(i); },
      [&](int64_t i) { return want.get(i); });
}

// docs/ops.md's bound for a dtype: relative or absolute error within it (f32:
// the row for reductions, matmul, conv2d, softmax, norms and scans);
// integers exact.
struct Tolerance {
  double rel = 0, abs = 0;
};
inline Tolerance ops_tolerance(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F32: return {1e-4, 1e-6};
    case BP_DTYPE_F16: return {1e-2, 1e-2};
    case BP_DTYPE_BF16: return {2e-2, 2e-2};
    case BP_DTYPE_F64: return {1e-12, 1e-12};
    default: return {};
  }
}

// `got` matches `want` within ops_tolerance: relative OR absolute error;
// NaN meets NaN, inf the same inf.
inline void check_close(const HostTensor& got, const HostTensor& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.dtype == want.dtype);
  REQUIRE(got.shape == want.shape);
  const Tolerance tol = ops_tolerance(got.dtype);
  check_elements(
      got, got.numel(),
      [&](int64_t i) {
        const double g = got.get(i), w = want.get(i);
        if (std::isnan(w)) return std::isnan(g);
        if (std::isinf(w)) return g == w;
        return std::isfinite(g) && (std::fabs(g - w) <= tol.abs || std::fabs(g - w) <= tol.rel * std::fabs(w));
      },
      [&](int64_t i) { return want.get(i); });
}

// `got` against f64 references `ref` of sums (matmul, conv2d) where
// `scale` is the number of terms times the sum of their magnitudes: the
// error within docs/ops.md's bound (relative or absolute) plus what f32
// accumulation may add, unit roundoff (2^-24) times the scale. A dropped
// term (about sum / count) is far outside it, where a multiple of the sum
// (the old bound) let one through.
inline void check_close(const HostTensor& got, const std::vector<double>& ref, const std::vector<double>& scale,
                        bp_dtype d) {
  REQUIRE(got.numel() == static_cast<int64_t>(ref.size()));
  const Tolerance tol = ops_tolerance(d);
  check_elements(
      got, got.numel(),
      [&](int64_t i) {
        const double err = std::abs(got.get(i) - ref[i]);
        return err <= std::max(tol.abs, tol.rel * std::abs(ref[i])) + std::ldexp(scale[i], -24);
      },
      [&](int64_t i) { return ref[i]; });
}

// An environment variable set for the scope, the old value restored after.
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
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;
};

// ---------------------------------------------------------------------------
// Through the C ABI: the plugin without the core.

inline void serial_for(void*, int64_t n, int64_t, bp_parallel_fn fn, void* user) {
  if (n > 0) fn(user, 0, n);
}
inline uint32_t one_thread(void*) { return 1; }

inline std::string error_text(const bp_plugin_api* api, const bp_error* e) {
  const bp_string m = api->error_message(nullptr, e);
  return std::string(m.data ? m.data : "", m.len);
}

using LogFn = void (*)(void* host_ctx, bp_log_level level, bp_string message);

// The plugin's log lines: keep_log is a LogFn for VkAbi that keeps every
// line; created_pipelines() gives the shaders of the pipelines the plugin
// logged as created ("...: pipeline NAME created in ... ms") since the last
// call, in order.
struct KeptLog {
  std::mutex mu;
  std::vector<std::string> lines;
};
inline KeptLog& kept_log() {
  static KeptLog k;
  return k;
}
inline void keep_log(void*, bp_log_level, bp_string m) {
  std::lock_guard<std::mutex> lk(kept_log().mu);
  kept_log().lines.emplace_back(m.data, m.len);
}
inline std::vector<std::string> created_pipelines() {
  KeptLog& k = kept_log();
  std::lock_guard<std::mutex> lk(k.mu);
  std::vector<std::string> out;
  for (const auto& l : k.lines) {
    const auto p = l.find(": pipeline "), c = l.find(" created in ");
    if (p != std::string::npos && c != std::string::npos && c > p) out.push_back(l.substr(p + 11, c - p - 11));
  }
  k.lines.clear();
  return out;
}

// libbackplane_vulkan.so loaded through its entry symbol and initialized
// (one thread, serial parallel_for, `log` as the log sink: none by
// default), vulkan0 taken; ok says all of that worked.
struct VkAbi {
  void* lib = nullptr;
  const bp_plugin_api* api = nullptr;
  void* plugin = nullptr;  // what initialize returned
  bp_host_api host{};
  bp_device* dev = nullptr;
  bp_run* run = nullptr;  // the open run (begin() .. sync())
  bool ok = false;

  explicit VkAbi(LogFn log = nullptr) {
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
    host.log = log;
    host.parallel_for = serial_for;
    host.num_threads = one_thread;
    if (bp_error* e = api->initialize(api, &host, &plugin)) {
      api->error_destroy(plugin, e);
      api = nullptr;
      return;
    }
    if (api->device_count(plugin) == 0 || api->device_get(plugin, 0, &dev) != nullptr || !dev) return;
    ok = true;
  }
  ~VkAbi() {
    if (api) api->shutdown(plugin);
    if (lib) dlclose(lib);
  }
  VkAbi(const VkAbi&) = delete;
  VkAbi& operator=(const VkAbi&) = delete;

  // ok, with a WARN when there is no device (the test then returns).
  bool ready() const {
    if (ok) return true;
    WARN("SKIPPED: no Vulkan device");
    return false;
  }

  // The index of the kernel for `op` with exactly these dtypes (inputs then
  // output); FAILs when there is none.
  uint32_t kernel(const char* op, std::vector<bp_dtype> dtypes) const {
    for (uint32_t i = 0; i < api->n_kernels; ++i) {
      const bp_kernel_desc& k = api->kernels[i];
      if (std::string(k.op.data, k.op.len) != op || k.n_dtypes != dtypes.size()) continue;
      if (std::equal(dtypes.begin(), dtypes.end(), k.dtypes)) return i;
    }
    FAIL("no kernel " << op);
    return 0;
  }

  // A dense 1-D operand: its storage and layout.
  struct Buf {
    bp_storage s{};
    bp_layout l{};
  };
  // The buffer `b` seen as n elements of dtype (elem bytes each).
  static Buf view(const bp_buffer& b, bp_dtype dt, int64_t n, size_t elem) {
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
  // A new buffer of n elements of dtype, holding `bytes` unless null.
  Buf buffer(bp_dtype dt, int64_t n, const void* bytes, size_t elem) {
    bp_buffer b{};
    b.struct_size = sizeof b;
    REQUIRE(api->buffer_allocate(plugin, dev, static_cast<uint64_t>(n) * elem, &b) == nullptr);
    if (bytes) REQUIRE(api->buffer_write(plugin, dev, b.handle, 0, bytes, static_cast<uint64_t>(n) * elem) == nullptr);
    return view(b, dt, n, elem);
  }

  // Opens a run with BP_RUN_* flags (REQUIREs that no run is open).
  bp_error* begin(uint32_t flags = 0) {
    REQUIRE(run == nullptr);
    return api->begin(plugin, dev, flags, &run);
  }
  // Ends the open run (a timed one writing n call times to ns).
  bp_error* sync(uint64_t* ns = nullptr, size_t n = 0) {
    bp_run* r = run;
    run = nullptr;
    return api->synchronize(plugin, dev, r, ns, n);
  }

  // Calls kernel `k` on `in` writing `out` in the open run (one is opened
  // when none is); returns its error (nullptr: ok).
  bp_error* call(uint32_t k, std::vector<Buf*> in, Buf& out) {
    if (run == nullptr) REQUIRE(begin() == nullptr);
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
    ctx.plugin = plugin;
    ctx.run = run;
    return api->kernels[k].fn(&ctx, s.data(), s.size(), &out.s, 1, l.data(), nullptr);
  }
};

}  // namespace backplane::vktest
