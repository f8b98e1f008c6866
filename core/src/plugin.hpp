// A plugin as the host sees it: its manifest, and once loaded, its library,
// API table and devices. All calls into the plugin go through here, so every
// bp_error* is turned into a message and freed by the plugin that made it.
#pragma once

#include <backplane/backplane.hpp>

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

  const bp_plugin_api* api() const { return api_; }
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
  const bp_host_api* host_ = nullptr;
  bool initialized_ = false;
  std::vector<std::unique_ptr<Device>> devices_;
  std::map<std::pair<std::string, std::vector<bp_dtype>>, int> index_;
};

// Whether a plugin API table has `member` (its struct_size covers it): the
// optional entries appended in later ABI minors are read only then.
template <typename T> bool has_field(const bp_plugin_api* api, T bp_plugin_api::*member) {
  const auto offset = reinterpret_cast<size_t>(&(static_cast<bp_plugin_api*>(nullptr)->*member));
  return api->struct_size >= offset + sizeof(T);
}

// Whether a plugin times its kernel calls on the device (ABI 1.3
// begin_timed and call_device_times, set together).
inline bool times_calls(const bp_plugin_api* api) {
  return has_field(api, &bp_plugin_api::call_device_times) && api->begin_timed && api->call_device_times;
}

// Whether a plugin prepares a plan's kernel calls when it is compiled (ABI
// 1.4 begin_prepare).
inline bool prepares_calls(const bp_plugin_api* api) {
  return has_field(api, &bp_plugin_api::begin_prepare) && api->begin_prepare && api->synchronize;
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
};

}  // namespace backplane
