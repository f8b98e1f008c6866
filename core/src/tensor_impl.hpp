// Device memory as plans and Tensors share it: a Cell is one buffer of one
// device; a Tensor is a Cell plus where in it its elements lie.
#pragma once

#include "runtime_impl.hpp"

#include <cstring>
#include <memory>
#include <shared_mutex>

namespace backplane {

// One device buffer (allocated, or host memory the device imported). Shared
// by a plan and the Tensors that name it; the last owner frees it. Readers
// and writers of its bytes during a run hold `mu` (kernels write, transfers
// and reads read), always in the order of the cells' addresses.
struct Cell {
  // First member: the plugin that owns the buffer stays loaded until the
  // buffer is freed, whoever (plan or Tensor) lets go last.
  std::shared_ptr<Runtime::Impl> runtime;
  Plugin* plugin = nullptr;
  Device* owner = nullptr;  // the device the buffer is on
  bp_device* device = nullptr;
  int dev = -1;  // the building plan's device index (meaningful to that plan only)
  uint64_t size = 0;
  uint64_t handle = 0;
  void* host_ptr = nullptr;
  // Imported application memory: what keeps it alive (released after the
  // device's buffer is freed: members go after the destructor's body).
  std::shared_ptr<void> keepalive;
  // The application's memory, imported in place (wrap_host, from_dlpack,
  // bind_output of host memory): what describe() tells apart from a buffer
  // of the device's own.
  bool host_memory = false;
  // A zero-copy transfer's buffer: the cell whose memory it imports (kept
  // while this one lives, e.g. in a Tensor after its plan is gone).
  std::shared_ptr<Cell> imports;
  std::shared_mutex mu;
  ~Cell() {
    if (handle && plugin->api()) plugin->api()->buffer_free(plugin->ctx(), device, handle);
  }

  void read(uint64_t offset, void* dst, uint64_t n) const {
    if (n == 0) return;
    if (host_ptr) {
      std::memcpy(dst, static_cast<const char*>(host_ptr) + offset, n);
    } else {
      plugin->check(plugin->api()->buffer_read(plugin->ctx(), device, handle, offset, dst, n),
                    "reading from device '" + owner->name() + "'");
    }
  }
  void write(uint64_t offset, const void* src, uint64_t n) {
    if (n == 0) return;
    if (host_ptr) {
      std::memcpy(static_cast<char*>(host_ptr) + offset, src, n);
    } else {
      plugin->check(plugin->api()->buffer_write(plugin->ctx(), device, handle, offset, src, n),
                    "writing to device '" + owner->name() + "'");
    }
  }
};

struct Tensor::Impl {
  std::shared_ptr<Cell> cell;
  bp_dtype dtype = BP_DTYPE_INVALID;
  Layout layout;             // in elements, from `byte_offset`
  uint64_t byte_offset = 0;  // bytes from the cell's start
};

namespace detail {

// A new buffer of `size` bytes on `dev`.
std::shared_ptr<Cell> allocate_cell(const std::shared_ptr<Runtime::Impl>& rt, Device& dev, uint64_t size);
// Application memory [data, data+size) imported by `dev` (no copy). Throws
// Error (BP_ERR_UNIMPLEMENTED) when the device cannot import host memory.
// The import may start before `data` (to the device's alignment); the bytes
// from the cell's start to `data` are returned in `lead`.
std::shared_ptr<Cell> import_cell(const std::shared_ptr<Runtime::Impl>& rt, Device& dev, void* data,
                                  uint64_t size, std::shared_ptr<void> keepalive, uint64_t& lead);
// Reads `layout` (elements, from byte `byte_offset` of the cell) into dense
// row-major `dst` (numel * element size bytes). The caller holds the cell's lock.
void gather(const Cell& c, uint64_t byte_offset, const Layout& layout, size_t elem_size, void* dst);
// Writes dense row-major `src` into `layout` of the cell (the inverse).
void scatter(Cell& c, uint64_t byte_offset, const Layout& layout, size_t elem_size, const void* src);
// Runtime::wrap_host, for the core's own callers.
Tensor wrap_host(const std::shared_ptr<Runtime::Impl>& rt, void* data, uint64_t bytes, bp_dtype dtype,
                 const Layout& layout, Device& device, std::shared_ptr<void> owner);
Tensor make_tensor(std::shared_ptr<Tensor::Impl> impl);
const std::shared_ptr<Tensor::Impl>& tensor_impl(const Tensor& t);

}  // namespace detail
}  // namespace backplane
