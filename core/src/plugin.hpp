// A plugin as the host sees it: its manifest, and once loaded, its library,
// API table and devices. All calls into the plugin go through here, so every
// bp_error* is turned into a message and freed by the plugin that made it.
#pragma once

#include <backplane/backplane.hpp>

#include "abi_v1.hpp"

#include <boost/dll/shared_library.hpp>

#include <map>
#include <memory>
#include <mutex>

namespace backplane {

class Plugin {
 public:
  explicit Plugin(PluginInfo info) : info_(std::move(info)) {}
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  const PluginInfo& info() const { return info_; }
  // Before loading only (the runtime sets up isolation through it).
  PluginInfo& mutable_info() { return info_; }
  bool loaded() const { return info_.state == PluginState::Loaded; }
  bool rejected() const { return info_.state == PluginState::Rejected; }

  // Loads, negotiates, checks against the manifest, initializes and lists
  // devices. On any failure the plugin is marked Rejected with the reason
  // (and unloaded); no exception escapes.
  void load(const bp_host_api* host);
  // Shuts the plugin down and unloads it.
  void unload();

  // The plugin's API table in its 2.0 form (a 1.x plugin's through the
  // shim), and the context its initialize() returned: every entry but
  // initialize takes ctx() first.
  const bp_plugin_api* api() const { return api_; }
  void* ctx() const { return ctx_; }
  // The host API the plugin was initialized with (kernel contexts need it).
  const bp_host_api* host() const { return host_; }
  const std::vector<std::unique_ptr<Device>>& devices() const { return devices_; }

  // Kernel lookup by (op, dtype key): index into the table, or -1.
  int find_kernel(const std::string& op, const std::vector<bp_dtype>& key) const;

  // Turns a plugin error into text (and frees it); "" for NULL.
  std::string take_error(bp_error* e) const;
  // Throws Error("<what>: <plugin message>") when e is non-null.
  void check(bp_error* e, const std::string& what) const;

 private:
  void reject(const std::string& why);

  PluginInfo info_;
  boost::dll::shared_library lib_;
  const bp_plugin_api* api_ = nullptr;
  std::unique_ptr<v1::Shim> shim_;  // a plugin of ABI major 1
  // A 2.x plugin's table copied as far as its struct_size and ours go (the
  // rest zero), so no read goes past what the plugin filled.
  bp_plugin_api table_{};
  const bp_plugin_api* raw_ = nullptr;  // the table the plugin returned
  void* ctx_ = nullptr;
  const bp_host_api* host_ = nullptr;
  bool initialized_ = false;
  std::vector<std::unique_ptr<Device>> devices_;
  std::map<std::pair<std::string, std::vector<bp_dtype>>, int> index_;
};

// Whether a plugin's begin() honours BP_RUN_TIMED (a profiled run timed on
// the device) or BP_RUN_PREPARE (a preparing run when a plan compiles).
inline bool times_calls(const bp_plugin_api* api) { return (api->run_flags & BP_RUN_TIMED) && api->begin && api->synchronize; }
inline bool prepares_calls(const bp_plugin_api* api) {
  return (api->run_flags & BP_RUN_PREPARE) && api->begin && api->synchronize;
}

// Reads the table a plugin API registers.
std::vector<KernelInfo> kernels_of(const bp_plugin_api* api);

// Access for the core's own code to Device internals.
struct DeviceAccess {
  static bp_device* handle(const Device& d) { return d.handle_; }
  static Plugin& plugin(const Device& d) { return *d.plugin_; }
  static const bp_device_info& info(const Device& d) { return d.info_; }
  static bool supports(const Device& d, int kernel) {
    return kernel >= 0 && static_cast<size_t>(kernel) < d.supported_.size() && d.supported_[kernel];
  }
  // Whether the device runs a fixed-arity kernel of `op` for exactly these
  // dtypes (inputs, then output): the plugin's index, not a scan of the
  // table.
  static bool has_kernel(const Device& d, const std::string& op, const std::vector<bp_dtype>& key) {
    const int k = d.plugin_->find_kernel(op, key);
    return supports(d, k) && !d.plugin_->info().kernels[static_cast<size_t>(k)].variadic;
  }
};

}  // namespace backplane
