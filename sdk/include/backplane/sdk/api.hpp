// Building a plugin's API table, buffer functions for devices that work on
// host memory, and a whole one-device host-memory plugin. Header-only, like
// the rest of the SDK.
//
//   bp_plugin_api make_api() {
//     bp_plugin_api a = sdk::api_table("acme", "1.0.0", kernels());
//     a.initialize = initialize;
//     ...
//     sdk::HostBuffers<64>::install(a);
//     return a;
//   }
//
// or, for a plugin with one device that computes on host memory:
//
//   extern "C" BP_EXPORT bp_status_code backplane_plugin_entry(const bp_plugin_query* q,
//                                                             const bp_plugin_api** out) {
//     static sdk::HostDevicePlugin plugin("acme", "1.0.0", kernels(), {"acme0", "cpu", "what it is"});
//     return sdk::negotiate(q, plugin.api(), out);
//   }
#pragma once

#include <backplane/abi.h>
#include <backplane/sdk/plugin.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace backplane::sdk {

// A plugin API table with its size, the SDK's ABI version, the plugin's
// name and version (both must equal the manifest's), the kernel table and
// the SDK's error functions filled in. Everything else is NULL: the plugin
// sets its own functions. `name`, `version` and `kernels` must outlive the
// table (string literals and a function-local static table do). Table is a
// sdk::KernelTable or anything with data() and size() over bp_kernel_desc.
template <class Table> bp_plugin_api api_table(std::string_view name, std::string_view version, const Table& kernels) {
  bp_plugin_api a{};
  a.struct_size = sizeof a;
  a.abi_major = BP_ABI_VERSION_MAJOR;
  a.abi_minor = BP_ABI_VERSION_MINOR;
  a.name = to_bp(name);
  a.version = to_bp(version);
  a.kernels = kernels.data();
  a.n_kernels = kernels.size();
  a.error_code = error_code;
  a.error_message = error_message;
  a.error_destroy = error_destroy;
  return a;
}

// Buffers in host memory, aligned to Align bytes; the handle is the address
// (imported host memory: the address with the low bit set).
// For devices whose bp_device_info says BP_MEMORY_HOST.
template <size_t Align = 64> struct HostBuffers {
  static_assert(Align >= alignof(std::max_align_t) && (Align & (Align - 1)) == 0, "Align: a power of two");

  static bp_error* allocate(bp_device*, uint64_t size, bp_buffer* out) noexcept {
    if (out == nullptr) return make_error(BP_ERR_INVALID_ARGUMENT, "buffer_allocate: out_buffer is NULL");
    if (size > (uint64_t{1} << 62))
      return make_error(BP_ERR_OUT_OF_MEMORY, "buffer_allocate: " + std::to_string(size) + " bytes is too large");
    const uint64_t rounded = (size + Align - 1) / Align * Align;
    void* p = std::aligned_alloc(Align, rounded ? rounded : Align);
    if (p == nullptr)
      return make_error(BP_ERR_OUT_OF_MEMORY, "buffer_allocate: cannot allocate " + std::to_string(size) + " bytes");
    out->handle = reinterpret_cast<uint64_t>(p);
    out->host_ptr = p;
    out->size = size;
    return nullptr;
  }
  // Handles of imported memory are tagged with the low bit (allocations are
  // Align-aligned, so it is free): free() releases only what allocate() made.
  static void free(bp_device*, uint64_t handle) noexcept {
    if ((handle & 1u) == 0) std::free(reinterpret_cast<void*>(handle));
  }
  static bp_error* import_host(bp_device*, void* host_ptr, uint64_t size, bp_buffer* out) noexcept {
    if (out == nullptr || host_ptr == nullptr) return make_error(BP_ERR_INVALID_ARGUMENT, "buffer_import_host: NULL pointer");
    if (reinterpret_cast<uintptr_t>(host_ptr) % Align != 0)
      return make_error(BP_ERR_INVALID_ARGUMENT, "buffer_import_host: memory not aligned to " + std::to_string(Align) + " bytes");
    out->handle = reinterpret_cast<uint64_t>(host_ptr) | 1u;
    out->host_ptr = host_ptr;
    out->size = size;
    return nullptr;
  }
  static char* base(uint64_t handle) noexcept { return reinterpret_cast<char*>(handle & ~uint64_t{1}); }
  static bp_error* write(bp_device*, uint64_t handle, uint64_t offset, const void* src, uint64_t n) noexcept {
    if (handle == 0 || (n != 0 && src == nullptr)) return make_error(BP_ERR_INVALID_ARGUMENT, "buffer_write: NULL buffer or source");
    if (n) std::memcpy(base(handle) + offset, src, n);
    return nullptr;
  }
  static bp_error* read(bp_device*, uint64_t handle, uint64_t offset, void* dst, uint64_t n) noexcept {
    if (handle == 0 || (n != 0 && dst == nullptr)) return make_error(BP_ERR_INVALID_ARGUMENT, "buffer_read: NULL buffer or destination");
    if (n) std::memcpy(dst, base(handle) + offset, n);
    return nullptr;
  }
  // Sets the buffer functions of `a` (import of host memory included).
  static void install(bp_plugin_api& a) {
    a.buffer_import_host = [](void*, bp_device* d, void* p, uint64_t n, bp_buffer* o) { return import_host(d, p, n, o); };
    a.buffer_allocate = [](void*, bp_device* d, uint64_t n, bp_buffer* o) { return allocate(d, n, o); };
    a.buffer_free = [](void*, bp_device* d, uint64_t h) { free(d, h); };
    a.buffer_write = [](void*, bp_device* d, uint64_t h, uint64_t off, const void* src, uint64_t n) {
      return write(d, h, off, src, n);
    };
    a.buffer_read = [](void*, bp_device* d, uint64_t h, uint64_t off, void* dst, uint64_t n) {
      return read(d, h, off, dst, n);
    };
  }
};

// What a HostDevicePlugin's one device reports. The strings must outlive
// the plugin (string literals do).
struct HostDeviceInfo {
  std::string_view name;         // unique within the plugin, e.g. "acme0"
  std::string_view kind = "cpu";  // one the manifest lists
  std::string_view description = {};
  uint64_t buffer_alignment = 64;
};

// A whole plugin with one synchronous device on host memory: the API table
// (api_table's, plus initialize/shutdown, the device functions and
// HostBuffers<64>), ready for negotiate(). The plugin context is this
// object, the device handle points into it; kernels reach the host API
// through their bp_kernel_context. Set more entries (infer_custom_op, a
// begin/synchronize pair) on `table()` before the first negotiate().
// Construct it as a function-local static: it must not move once built.
class HostDevicePlugin {
 public:
  template <class Table>
  HostDevicePlugin(std::string_view name, std::string_view version, const Table& kernels, HostDeviceInfo device)
      : api_(api_table(name, version, kernels)), device_(device) {
    api_.initialize = [](const bp_plugin_api* self, const bp_host_api* host, void** out) -> bp_error* {
      auto* p = from(self);
      p->host_ = host;
      *out = p;
      return nullptr;
    };
    api_.shutdown = [](void* p) { static_cast<HostDevicePlugin*>(p)->host_ = nullptr; };
    api_.device_count = [](void*) -> uint32_t { return 1; };
    api_.device_get = [](void* p, uint32_t i, bp_device** out) -> bp_error* {
      if (i != 0 || out == nullptr) return make_error(BP_ERR_INVALID_ARGUMENT, "device_get: no such device");
      *out = static_cast<HostDevicePlugin*>(p)->device();
      return nullptr;
    };
    api_.device_info = [](void* p, bp_device*, bp_device_info* info) -> bp_error* {
      if (info == nullptr) return make_error(BP_ERR_INVALID_ARGUMENT, "device_info: out_info is NULL");
      const HostDeviceInfo& d = static_cast<HostDevicePlugin*>(p)->device_;
      info->name = to_bp(d.name);
      info->kind = to_bp(d.kind);
      info->description = to_bp(d.description);
      info->memory_kind = BP_MEMORY_HOST;
      info->buffer_alignment = d.buffer_alignment;
      info->max_buffer_size = 0;
      return nullptr;
    };
    HostBuffers<64>::install(api_);
  }
  HostDevicePlugin(const HostDevicePlugin&) = delete;
  HostDevicePlugin& operator=(const HostDevicePlugin&) = delete;

  const bp_plugin_api* api() const { return &api_; }
  bp_plugin_api& table() { return api_; }
  // The host API given to initialize (NULL before it and after shutdown).
  const bp_host_api* host() const { return host_; }
  bp_device* device() { return reinterpret_cast<bp_device*>(&device_); }

 private:
  // initialize() gets the table it was returned as; api_ is this object's
  // first member, so the object is found from it.
  static HostDevicePlugin* from(const bp_plugin_api* self) {
    return reinterpret_cast<HostDevicePlugin*>(const_cast<bp_plugin_api*>(self));
  }

  bp_plugin_api api_;  // first member (see from())
  HostDeviceInfo device_;
  const bp_host_api* host_ = nullptr;
};
static_assert(std::is_standard_layout_v<HostDevicePlugin>, "HostDevicePlugin is found from its first member");

}  // namespace backplane::sdk
