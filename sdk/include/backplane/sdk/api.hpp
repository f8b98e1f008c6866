// Building a plugin's API table, and buffer functions for devices that work
// on host memory. Header-only, like the rest of the SDK.
//
//   bp_plugin_api make_api() {
//     bp_plugin_api a = sdk::api_table("acme", "1.0.0", kernels());
//     a.initialize = initialize;
//     ...
//     sdk::HostBuffers<64>::install(a);
//     return a;
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
    a.buffer_import_host = import_host;
    a.buffer_allocate = allocate;
    a.buffer_free = free;
    a.buffer_write = write;
    a.buffer_read = read;
  }
};

}  // namespace backplane::sdk
