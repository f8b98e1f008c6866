// Plugins of ABI major 1 in a host of major 2: the 1.x API table, and the
// shim that presents it as a 2.0 table so the rest of the host knows one
// shape. The 1.x table was the 2.0 one without a plugin context or run
// handles: devices were keyed on the calling thread, a run was begin() (or
// begin_timed()/begin_prepare()) then synchronize().
#pragma once

#include <backplane/abi.h>

#include <memory>
#include <string>

namespace backplane::v1 {

// The 1.x bp_plugin_api (1.5 is its last form; earlier minors stop sooner,
// as their struct_size says).
struct PluginApi {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  bp_string name;
  bp_string version;
  const bp_kernel_desc* kernels;
  size_t n_kernels;
  bp_status_code (*error_code)(const bp_error* error);
  bp_string (*error_message)(const bp_error* error);
  void (*error_destroy)(bp_error* error);
  bp_error* (*initialize)(const bp_host_api* host);
  void (*shutdown)(void);
  uint32_t (*device_count)(void);
  bp_error* (*device_get)(uint32_t index, bp_device** out_device);
  bp_error* (*device_info)(bp_device* device, bp_device_info* out_info);
  bp_error* (*device_supports_kernel)(bp_device* device, uint32_t kernel_index, bool* out_supported);
  bp_error* (*buffer_allocate)(bp_device* device, uint64_t size, bp_buffer* out_buffer);
  void (*buffer_free)(bp_device* device, uint64_t handle);
  bp_error* (*buffer_write)(bp_device* device, uint64_t handle, uint64_t offset, const void* src, uint64_t size);
  bp_error* (*buffer_read)(bp_device* device, uint64_t handle, uint64_t offset, void* dst, uint64_t size);
  bp_error* (*begin)(bp_device* device);
  bp_error* (*synchronize)(bp_device* device);
  bp_error* (*infer_custom_op)(bp_string op, const bp_dtype* in_dtypes, const bp_layout* in_layouts, size_t n_inputs,
                               const bp_op_params* params, bp_dtype* out_dtype, bp_layout* out_layout);
  bp_error* (*buffer_import_host)(bp_device* device, void* host_ptr, uint64_t size, bp_buffer* out_buffer);  // 1.1
  int64_t (*error_call_index)(const bp_error* error);                                                      // 1.2
  bp_error* (*begin_timed)(bp_device* device);                                                             // 1.3
  bp_error* (*call_device_times)(bp_device* device, uint64_t* out_ns, size_t n_calls);                      // 1.3
  bp_error* (*begin_prepare)(bp_device* device);                                                           // 1.4
};

// A 1.x table as a 2.0 one. The 2.0 table's functions are the shim's; its
// plugin context is the Shim itself, which reaches the 1.x functions. A 1.x
// plugin keys a run on the thread that began it; the host drives each run
// from one thread, begin to synchronize, so that still holds. Its run
// handles are NULL.
class Shim {
 public:
  // Checks the 1.x table's required entries and size; throws Error naming
  // `who` when it is unusable.
  Shim(const PluginApi* v1, const std::string& who);
  ~Shim();
  Shim(const Shim&) = delete;
  Shim& operator=(const Shim&) = delete;
  const bp_plugin_api* api() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace backplane::v1
