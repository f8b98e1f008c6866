// The skeleton of a Backplane plugin. Every entry answers "unimplemented":
// replace them one by one, keeping the manifest (skeleton.json) equal to the
// kernel table (`backplane manifest <lib> --check skeleton.json` tells).
#include <backplane/abi.h>
#include <backplane/sdk/api.hpp>
#include <backplane/sdk/plugin.hpp>

namespace sdk = backplane::sdk;

namespace {

bp_error* unimplemented(const char* what) {
  return sdk::make_error(BP_ERR_UNIMPLEMENTED, std::string("skeleton: ") + what + " is not implemented yet");
}

// A kernel: read inputs through layouts[0..n_inputs), write every element of
// the outputs (layouts after the inputs). Wrap the body in sdk::guard so no
// exception crosses the boundary.
bp_error* add_f32(const bp_kernel_context*, const bp_storage*, size_t, const bp_storage*, size_t, const bp_layout*,
                  const bp_op_params*) {
  return unimplemented("add(f32, f32) -> f32");
}

const sdk::KernelTable& kernels() {
  static const sdk::KernelTable table = [] {
    sdk::KernelTable t;
    t.add("add", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32}, {BP_LAYOUT_STRIDED, BP_LAYOUT_STRIDED}, add_f32);
    return t;
  }();
  return table;
}

// The plugin's state: everything initialize() sets up. The host passes it
// back as the first argument of every other entry.
struct Plugin {
  const bp_host_api* host = nullptr;
};

// Heavy set-up goes here (device handles, pools), not in the entry symbol.
bp_error* initialize(const bp_plugin_api*, const bp_host_api* host, void** out_plugin) {
  return sdk::guard([&] { *out_plugin = new Plugin{host}; });
}
void shutdown(void* plugin) { delete static_cast<Plugin*>(plugin); }
// Report zero devices until device discovery is written.
uint32_t device_count(void*) { return 0; }
bp_error* device_get(void*, uint32_t, bp_device**) { return unimplemented("device_get"); }
bp_error* device_info(void*, bp_device*, bp_device_info*) { return unimplemented("device_info"); }
bp_error* buffer_allocate(void*, bp_device*, uint64_t, bp_buffer*) { return unimplemented("buffer_allocate"); }
void buffer_free(void*, bp_device*, uint64_t) {}
bp_error* buffer_write(void*, bp_device*, uint64_t, uint64_t, const void*, uint64_t) {
  return unimplemented("buffer_write");
}
bp_error* buffer_read(void*, bp_device*, uint64_t, uint64_t, void*, uint64_t) { return unimplemented("buffer_read"); }

// The table: size, ABI version, name, version, kernels and error functions
// from the SDK, then the plugin's own functions. (A plugin with one device
// on host memory can start from sdk::HostDevicePlugin instead, which fills
// all of these; a device working on host memory can take
// sdk::HostBuffers<>::install(a) for its buffer functions.)
bp_plugin_api make_api() {
  bp_plugin_api a = sdk::api_table("skeleton", "0.0.1", kernels());  // name and version as in the manifest
  a.initialize = initialize;
  a.shutdown = shutdown;
  a.device_count = device_count;
  a.device_get = device_get;
  a.device_info = device_info;
  a.buffer_allocate = buffer_allocate;
  a.buffer_free = buffer_free;
  a.buffer_write = buffer_write;
  a.buffer_read = buffer_read;
  return a;
}

}  // namespace

// The one exported symbol: cheap and pure, it only picks the ABI version.
extern "C" BP_EXPORT bp_status_code backplane_plugin_entry(const bp_plugin_query* query, const bp_plugin_api** out) {
  static const bp_plugin_api api = make_api();
  return sdk::negotiate(query, &api, out);
}
