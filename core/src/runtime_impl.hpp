#pragma once

#include "plugin.hpp"
#include "thread_pool.hpp"

#include <mutex>

namespace backplane {

struct Runtime::Impl {
  RuntimeOptions options;
  std::unique_ptr<detail::ThreadPool> pool;
  bp_host_api host{};
  bp_log_level log_level = BP_LOG_WARNING;
  // RuntimeOptions::attention_cpu_min_bytes, resolved (pass_attention.hpp).
  uint64_t attention_cpu_min_bytes = uint64_t{4} << 20;
  std::vector<std::unique_ptr<Plugin>> plugins;
  std::vector<std::pair<std::filesystem::path, std::string>> manifest_errors;
  mutable std::vector<PluginInfo> infos;
  std::map<std::string, VendorOpInfo> vendor_ops;  // op -> first declaration on the search path
  std::mutex mu;  // plugin loading
};

std::filesystem::path default_plugin_dir();

}  // namespace backplane
