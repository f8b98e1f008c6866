// The plugin's entry symbol and API table.
#include "device.hpp"
#include "kernels.hpp"

#include <backplane/sdk/api.hpp>

#include <cstring>
#include <mutex>
#include <unordered_map>

namespace {

using namespace backplane::vulkan;

// The plugin context is the Context: the Vulkan instance and its devices.
// The plugin is loaded once per process, so there is one at a time.
Context* context(void* plugin) { return static_cast<Context*>(plugin); }

bp_error* api_initialize(const bp_plugin_api*, const bp_host_api* host, void** out_plugin) {
  return sdk::guard([&] {
    Context::create(host);
    *out_plugin = Context::current();
  });
}

void api_shutdown(void*) {
  try {
    Context::destroy();
  } catch (...) {
  }
}

uint32_t api_device_count(void* plugin) {
  const Context* c = context(plugin);
  return c ? c->device_count() : 0;
}

bp_error* api_device_get(void* plugin, uint32_t index, bp_device** out) {
  return sdk::guard([&] {
    BP_SDK_CHECK(out != nullptr, BP_ERR_INVALID_ARGUMENT, "vulkan: device_get without out_device");
    Context* c = context(plugin);
    BP_SDK_CHECK(c != nullptr, BP_ERR_UNAVAILABLE, "vulkan: plugin not initialized");
    *out = c->device(index).handle();
  });
}

bp_error* api_device_info(void*, bp_device* device, bp_device_info* info) {
  return sdk::guard([&] {
    BP_SDK_CHECK(info != nullptr, BP_ERR_INVALID_ARGUMENT, "vulkan: device_info without out_info");
    Device& d = Device::from(device);
    bp_device_info out{};
    out.struct_size = sizeof(bp_device_info);
    out.name = sdk::to_bp(d.name);
    out.kind = sdk::to_bp(d.kind);
    out.description = sdk::to_bp(d.description);
    out.memory_kind = d.memory.host_mapped() ? BP_MEMORY_MAPPED : BP_MEMORY_DEVICE;
    out.buffer_alignment = d.memory.alignment();
    out.max_buffer_size = d.memory.max_allocation();
    // Write only the fields the host's struct has room for.
    const size_t n = info->struct_size && info->struct_size < sizeof out ? info->struct_size : sizeof out;
    std::memcpy(static_cast<void*>(info), &out, n);
    info->struct_size = n;
  });
}

bp_error* api_device_supports_kernel(void*, bp_device* device, uint32_t kernel_index, bool* out) {
  return sdk::guard([&] {
    BP_SDK_CHECK(out != nullptr, BP_ERR_INVALID_ARGUMENT, "vulkan: device_supports_kernel without out");
    Device& d = Device::from(device);
    const auto& rows = registry().rows();
    BP_SDK_CHECK(kernel_index < rows.size(), BP_ERR_INVALID_ARGUMENT, "vulkan: bad kernel index");
    bool ok = true;
    const Row& row = rows[kernel_index];
    for (size_t i = 0; i < row.dtypes.size(); ++i)
      if (!((row.index_mask >> i) & 1u)) ok = ok && d.supports_dtype(row.dtypes[i]);
    // A CPU device (lavapipe) declines attention: its workgroup-per-row form
    // ran the encoder's attention 20x slower there than the composed ops
    // (whose matmul has a direct form), so the host runs those instead.
    if (d.direct_forms && row.op == "scaled_dot_product_attention") ok = false;
    *out = ok;
  });
}

bp_error* api_buffer_allocate(void*, bp_device* device, uint64_t size, bp_buffer* out) {
  return sdk::guard([&] {
    BP_SDK_CHECK(out != nullptr, BP_ERR_INVALID_ARGUMENT, "vulkan: buffer_allocate without out_buffer");
    Device& d = Device::from(device);
    std::lock_guard<std::mutex> lock(d.mu);
    *out = d.memory.allocate(size);
  });
}

// Host memory as a buffer in place (VK_EXT_external_memory_host).
bp_error* api_buffer_import_host(void*, bp_device* device, void* host_ptr, uint64_t size, bp_buffer* out) {
  return sdk::guard([&] {
    BP_SDK_CHECK(out != nullptr, BP_ERR_INVALID_ARGUMENT, "vulkan: buffer_import_host without out_buffer");
    Device& d = Device::from(device);
    std::lock_guard<std::mutex> lock(d.mu);
    *out = d.memory.import_host(host_ptr, size);
  });
}

void api_buffer_free(void*, bp_device* device, uint64_t handle) {
  if (!device) return;
  try {
    Device& d = Device::from(device);
    std::lock_guard<std::mutex> lock(d.mu);
    d.memory.free(handle);
  } catch (...) {
  }
}

bp_error* api_buffer_write(void*, bp_device* device, uint64_t handle, uint64_t offset, const void* src, uint64_t size) {
  return sdk::guard([&] {
    BP_SDK_CHECK(src != nullptr || size == 0, BP_ERR_INVALID_ARGUMENT, "vulkan: buffer_write from NULL");
    Device& d = Device::from(device);
    std::lock_guard<std::mutex> lock(d.mu);
    d.memory.write(handle, offset, src, size);
  });
}

bp_error* api_buffer_read(void*, bp_device* device, uint64_t handle, uint64_t offset, void* dst, uint64_t size) {
  return sdk::guard([&] {
    BP_SDK_CHECK(dst != nullptr || size == 0, BP_ERR_INVALID_ARGUMENT, "vulkan: buffer_read into NULL");
    Device& d = Device::from(device);
    std::lock_guard<std::mutex> lock(d.mu);
    d.memory.read(handle, offset, dst, size);
  });
}

bp_error* api_begin(void*, bp_device* device, uint32_t flags, bp_run** out_run) {
  return sdk::guard([&] {
    BP_SDK_CHECK(out_run != nullptr, BP_ERR_INVALID_ARGUMENT, "vulkan: begin without out_run");
    *out_run = nullptr;
    Device& d = Device::from(device);
    std::lock_guard<std::mutex> lock(d.mu);
    *out_run = reinterpret_cast<bp_run*>(d.exec.begin((flags & BP_RUN_TIMED) != 0, (flags & BP_RUN_PREPARE) != 0));
  });
}

// The kernel call of each live error synchronize() returned for a data error
// (error_call_index). bp_error is the SDK's {code, message}, so the index
// lives here, keyed by the error, until error_destroy.
std::mutex g_calls_mu;
std::unordered_map<const bp_error*, int64_t>* g_calls = nullptr;  // never destroyed at exit

bp_error* api_synchronize(void*, bp_device* device, bp_run* run, uint64_t* out_ns, size_t n_calls) {
  int64_t call = -1;
  bp_error* e = sdk::guard([&] {
    Device& d = Device::from(device);
    try {
      d.exec.synchronize(run, out_ns, n_calls);  // takes d.mu itself, and not while waiting
    } catch (const DataError& de) {
      call = de.call();
      throw;
    }
  });
  if (e && call >= 0 && e != sdk::out_of_memory_error()) {
    try {
      std::lock_guard<std::mutex> lock(g_calls_mu);
      if (!g_calls) g_calls = new std::unordered_map<const bp_error*, int64_t>();
      (*g_calls)[e] = call;
    } catch (...) {
      // Without the index the host names the op only.
    }
  }
  return e;
}

int64_t api_error_call_index(void*, const bp_error* e) {
  if (!e) return -1;
  try {
    std::lock_guard<std::mutex> lock(g_calls_mu);
    if (!g_calls) return -1;
    auto it = g_calls->find(e);
    return it == g_calls->end() ? -1 : it->second;
  } catch (...) {
    return -1;
  }
}

void api_error_destroy(void* plugin, bp_error* e) {
  if (!e) return;
  try {
    std::lock_guard<std::mutex> lock(g_calls_mu);
    if (g_calls) g_calls->erase(e);
  } catch (...) {
  }
  sdk::error_destroy(plugin, e);
}

const bp_plugin_api* api_table() {
  static const bp_plugin_api api = [] {
    bp_plugin_api a = sdk::api_table("vulkan", "0.1.0", registry().table());
    a.error_destroy = api_error_destroy;
    a.error_call_index = api_error_call_index;
    a.initialize = api_initialize;
    a.shutdown = api_shutdown;
    a.device_count = api_device_count;
    a.device_get = api_device_get;
    a.device_info = api_device_info;
    a.device_supports_kernel = api_device_supports_kernel;
    a.buffer_allocate = api_buffer_allocate;
    a.buffer_free = api_buffer_free;
    a.buffer_import_host = api_buffer_import_host;
    a.buffer_write = api_buffer_write;
    a.buffer_read = api_buffer_read;
    a.begin = api_begin;
    a.synchronize = api_synchronize;
    // Timestamp queries time each call; a plan's pipelines are compiled when
    // it compiles (exec.cpp).
    a.run_flags = BP_RUN_TIMED | BP_RUN_PREPARE;
    return a;
  }();
  return &api;
}

}  // namespace

extern "C" BP_EXPORT bp_status_code backplane_plugin_entry(const bp_plugin_query* query, const bp_plugin_api** out_api) {
  try {
    return sdk::negotiate(query, api_table(), out_api);
  } catch (...) {
    if (out_api) *out_api = nullptr;
    return BP_ERR_INTERNAL;
  }
}
