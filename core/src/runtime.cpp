// Runtime: manifest discovery, lazy plugin loading, device selection and the
// host API table handed to plugins.
#include "runtime_impl.hpp"

#include <boost/dll/runtime_symbol_info.hpp>

#include <sys/auxv.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <set>

namespace backplane {

namespace {

// Environment variables are ignored in set-uid/set-gid programs.
const char* safe_getenv(const char* name) {
  if (getauxval(AT_SECURE)) return nullptr;
  return std::getenv(name);
}

void host_log(void* ctx, bp_log_level level, bp_string message) {
  auto* impl = static_cast<Runtime::Impl*>(ctx);
  if (level < impl->log_level) return;
  static const char* names[] = {"debug", "info", "warning", "error"};
  const int li = std::clamp(static_cast<int>(level), 0, 3);
  std::fprintf(stderr, "backplane [%s] %.*s\n", names[li], static_cast<int>(message.len), message.data ? message.data : "");
}

void host_parallel_for(void* ctx, int64_t n, int64_t grain, bp_parallel_fn fn, void* user) {
  static_cast<Runtime::Impl*>(ctx)->pool->parallel_for(n, grain, fn, user);
}

uint32_t host_num_threads(void* ctx) { return static_cast<Runtime::Impl*>(ctx)->pool->size(); }

// Comma-separated names, each trimmed of spaces (empty entries kept).
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    std::string part = s.substr(start, end - start);
    while (!part.empty() && part.back() == ' ') part.pop_back();
    while (!part.empty() && part.front() == ' ') part.erase(part.begin());
    out.push_back(part);
    start = end + 1;
  }
  return out;
}

std::vector<std::string> split_path_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = s.find(':', start);
    const std::string part = s.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!part.empty()) out.push_back(part);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

}  // namespace

std::filesystem::path default_plugin_dir() {
  // The folder beside the core library: <libdir>/backplane.
  const auto self = boost::dll::this_line_location();
  return std::filesystem::path(self.parent_path().string()) / "backplane";
}

namespace {

// Plugins that run in a private child process: those whose manifest asks,
// those RuntimeOptions::isolate and BACKPLANE_ISOLATE name. Each keeps its
// name, version and kernel table; its library becomes the remote plugin's,
// loaded as an instance that starts `backplane serve` for it (docs/remote.md).
void setup_isolation(Runtime::Impl& impl) {
  const auto& options = impl.options;
  if (!options.allow_isolation) return;
  std::set<std::string> wanted(options.isolate.begin(), options.isolate.end());
  int64_t deadline = options.isolate_deadline_ms;
  if (options.use_environment) {
    if (const char* env = safe_getenv("BACKPLANE_ISOLATE"))
      for (const auto& names : split_list(env))  // ',' (and ':')
        for (auto& n : split_path_list(names)) wanted.insert(n);
    if (const char* env = safe_getenv("BACKPLANE_ISOLATE_DEADLINE_MS"); env && !deadline) deadline = std::atoll(env);
  }
  const Plugin* remote = nullptr;
  for (auto& p : impl.plugins)
    if (p->info().name == "remote") remote = p.get();
  std::filesystem::path server;
  if (options.use_environment)
    if (const char* env = safe_getenv("BACKPLANE_SERVER"); env && *env) server = env;
  if (server.empty()) {
    // As installed (the libdir may be two levels deep), else the build tree
    // (lib/ beside bin/).
    const auto libdir = default_plugin_dir().parent_path();
    server = libdir / BACKPLANE_LIB_TO_BIN / "backplane";
    std::error_code ec;
    if (!std::filesystem::exists(server, ec)) server = libdir.parent_path() / "bin" / "backplane";
  }
  std::set<std::string> seen;
  for (auto& p : impl.plugins) {
    PluginInfo& info = p->mutable_info();
    seen.insert(info.name);
    if (info.isolation != "process" && !wanted.count(info.name)) continue;
    if (info.name == "remote" || info.instances) continue;  // it is the way in, not a thing to isolate
    if (!remote) {
      info.state = PluginState::Rejected;
      info.rejection = "isolation was asked for, but the remote plugin (remote.json) is not on the search path";
      continue;
    }
    Json inst;
    inst["isolate"] = info.name;
    inst["version"] = info.version;
    inst["server"] = server.string();
    inst["manifest_dir"] = info.manifest_path.parent_path().string();
    inst["deadline_ms"] = deadline;
    info.isolated = true;
    info.instance = inst.dump();
    info.library_path = remote->info().library_path;
  }
  for (const auto& n : wanted)
    if (!seen.count(n))
      impl.manifest_errors.emplace_back(std::filesystem::path("BACKPLANE_ISOLATE"),
                                        "names plugin '" + n + "', which no manifest on the search path declares");
}

}  // namespace

Runtime::Runtime(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
// Plans may still hold the Impl; the last owner unloads the plugins (before
// the pool, which they may use: see the member order of Runtime::Impl).
Runtime::~Runtime() = default;

std::unique_ptr<Runtime> Runtime::create(RuntimeOptions options) {
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  // Threads.
  int threads = options.num_threads;
  if (threads <= 0 && options.use_environment)
    if (const char* env = safe_getenv("BACKPLANE_NUM_THREADS")) threads = std::atoi(env);
  if (threads <= 0) threads = static_cast<int>(detail::available_cores());
  impl->pool = std::make_unique<detail::ThreadPool>(static_cast<unsigned>(threads));
  if (options.use_environment)
    if (const char* env = safe_getenv("BACKPLANE_LOG")) impl->log_level = static_cast<bp_log_level>(std::atoi(env));
  if (options.attention_cpu_min_bytes >= 0) {
    impl->attention_cpu_min_bytes = static_cast<uint64_t>(options.attention_cpu_min_bytes);
  } else if (const char* env = options.use_environment ? safe_getenv("BACKPLANE_ATTENTION_CPU_MIN_BYTES") : nullptr;
             env && *env) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(env, &end, 10);
    if (end && *end == '\0') impl->attention_cpu_min_bytes = static_cast<uint64_t>(n);
  }

  impl->host.struct_size = sizeof(bp_host_api);
  impl->host.abi_major = BP_ABI_VERSION_MAJOR;
  impl->host.abi_minor = BP_ABI_VERSION_MINOR;
  impl->host.host_ctx = impl.get();
  impl->host.log = host_log;
  impl->host.parallel_for = host_parallel_for;
  impl->host.num_threads = host_num_threads;

  // Search path: the install's own folder, BACKPLANE_PLUGIN_PATH, then code.
  std::vector<std::filesystem::path> dirs;
  if (options.use_default_path) dirs.push_back(default_plugin_dir());
  if (options.use_environment)
    if (const char* env = safe_getenv("BACKPLANE_PLUGIN_PATH"))
      for (auto& p : split_path_list(env)) dirs.emplace_back(p);
  for (auto& p : options.plugin_paths) dirs.push_back(p);

  std::set<std::string> seen_names;
  std::set<std::filesystem::path> seen_files;
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) continue;
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      if (e.path().extension() == ".json") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      const auto canon = std::filesystem::weakly_canonical(f, ec);
      if (!seen_files.insert(canon).second) continue;
      // Only regular files (or links to them): opening a FIFO blocks until a
      // writer comes, and every command scans these folders.
      const auto st = std::filesystem::status(f, ec);
      if (!std::filesystem::is_regular_file(st)) {
        impl->manifest_errors.emplace_back(f, std::filesystem::exists(st) ? "not a regular file; ignored"
                                                                          : "not a regular file (a dangling link?); ignored");
        continue;
      }
      try {
        PluginInfo info = parse_manifest(f);
        if (!seen_names.insert(info.name).second) {
          // First one on the search path wins, like PATH.
          impl->manifest_errors.emplace_back(f, "plugin '" + info.name + "' already found earlier on the search path; ignored");
          continue;
        }
        for (const auto& v : info.vendor_ops)
          if (!impl->vendor_ops.emplace(v.op, v).second)
            impl->manifest_errors.emplace_back(f, "vendor op '" + v.op + "' is already declared by a manifest earlier on the search path; this declaration is ignored");
        impl->plugins.push_back(std::make_unique<Plugin>(std::move(info)));
      } catch (const std::exception& e) {
        impl->manifest_errors.emplace_back(f, e.what());
      }
    }
  }
  setup_isolation(*impl);
  return std::unique_ptr<Runtime>(new Runtime(std::move(impl)));
}

const std::vector<PluginInfo>& Runtime::plugins() const {
  impl_->infos.clear();
  for (auto& p : impl_->plugins) impl_->infos.push_back(p->info());
  return impl_->infos;
}

const std::vector<std::pair<std::filesystem::path, std::string>>& Runtime::manifest_errors() const {
  return impl_->manifest_errors;
}

uint32_t Runtime::num_threads() const { return impl_->pool->size(); }

void Runtime::load_all() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  for (auto& p : impl_->plugins) p->load(&impl_->host);
}

std::vector<DeviceListing> Runtime::devices() const {
  std::vector<DeviceListing> out;
  for (auto& p : impl_->plugins) {
    const auto& info = p->info();
    if (p->loaded()) {
      for (auto& d : p->devices()) {
        DeviceListing l{d->name(), d->kind(), d->description(), info.name, info.manifest_path, info.state, "", d->kernels().size()};
        out.push_back(std::move(l));
      }
      if (p->devices().empty())
        out.push_back({info.name, info.device_kind, "no devices found", info.name, info.manifest_path, info.state, "", 0});
    } else {
      // Before loading, every kind the manifest allows (a Vulkan plugin's
      // devices may be GPUs or a software rasteriser, a CPU-kind device).
      std::string kinds;
      for (const auto& k : info.device_kinds) kinds += (kinds.empty() ? "" : "|") + k;
      out.push_back({info.name, kinds, info.description, info.name, info.manifest_path, info.state,
                     info.rejection, info.kernels.size()});
    }
  }
  return out;
}

std::vector<Device*> Runtime::all_devices() {
  load_all();
  std::vector<Device*> out;
  for (auto& p : impl_->plugins)
    if (p->loaded())
      for (auto& d : p->devices()) out.push_back(d.get());
  return out;
}

const VendorOpInfo* Runtime::vendor_op(const std::string& op) const {
  auto it = impl_->vendor_ops.find(op);
  return it == impl_->vendor_ops.end() ? nullptr : &it->second;
}

std::vector<Device*> Runtime::select_devices(const std::string& list) {
  std::vector<Device*> out;
  auto add = [&](Device* d) {
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  };
  const auto parts = split_list(list);
  for (const auto& part : parts) {
    if (part.empty()) throw Error("device list '" + list + "': an empty entry (write names separated by commas)");
    if (part != "auto") {
      add(&device(part));
      continue;
    }
    if (impl_->options.use_environment)
      if (const char* env = safe_getenv("BACKPLANE_DEVICE"); env && *env)
        for (const auto& e : split_list(env)) {
          if (e == "auto" || e.empty()) continue;
          try {
            add(&device(e));
          } catch (const Error& err) {
            throw Error(std::string("BACKPLANE_DEVICE: ") + err.what(), err.code());
          }
        }
    // Then GPUs, accelerators, CPU-kind devices; among CPU-kind devices the
    // ones on host memory (the CPU plugin) before emulated ones (lavapipe).
    const auto all = all_devices();
    for (const char* kind : {"gpu", "accelerator"})
      for (auto* d : all)
        if (d->kind() == kind) add(d);
    for (bool host : {true, false})
      for (auto* d : all)
        if (d->kind() == "cpu" && (DeviceAccess::info(*d).memory_kind == BP_MEMORY_HOST) == host) add(d);
    for (auto* d : all) add(d);  // any kind this host does not know
  }
  if (out.empty()) {
    std::string why;
    for (auto& p : impl_->plugins)
      if (p->rejected()) why += "\n  plugin '" + p->info().name + "' was rejected: " + p->info().rejection;
    throw Error("device list '" + list + "' selects no device" +
                    (impl_->plugins.empty() ? " (no plugin manifests were found; set BACKPLANE_PLUGIN_PATH)" : "") + why,
                BP_ERR_UNAVAILABLE);
  }
  return out;
}

Device& Runtime::device(const std::string& selector_in) {
  // auto: the first of select_devices("auto") (BACKPLANE_DEVICE's first,
  // then GPUs, accelerators, the CPU plugin before emulated CPU-kind
  // devices), so C++, the CLI and Python pick the same device.
  if (selector_in == "auto") return *select_devices("auto").front();
  const std::string& selector = selector_in;
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto ensure = [&](Plugin& p) { p.load(&impl_->host); };
  std::string rejected;
  std::set<const Plugin*> noted;
  auto note_rejection = [&](const Plugin& p) {
    if (p.rejected() && noted.insert(&p).second)
      rejected += "\n  plugin '" + p.info().name + "' was rejected: " + p.info().rejection;
  };
  // Exact device name or plugin name; plugin names and device names are
  // matched without loading unrelated plugins where the name says which.
  for (auto& p : impl_->plugins) {
    const auto& name = p->info().name;
    const bool plugin_match = name == selector;
    const bool prefix_match = selector.rfind(name, 0) == 0;  // "vulkan0" starts with "vulkan"
    if (!plugin_match && !prefix_match) continue;
    ensure(*p);
    note_rejection(*p);
    // The plugin's own name, or one of its device names (name + index),
    // while the plugin is rejected: an error with the reason, never another
    // plugin's device of a kind that happens to share the name ("cpu" on
    // lavapipe's vulkan0).
    const bool names_its_device =
        plugin_match || (selector.size() > name.size() &&
                         selector.find_first_not_of("0123456789", name.size()) == std::string::npos);
    if (p->rejected() && names_its_device)
      throw Error("device '" + selector + "': plugin '" + name + "' was rejected: " + p->info().rejection,
                  BP_ERR_UNAVAILABLE);
    if (!p->loaded()) continue;
    for (auto& d : p->devices())
      if (d->name() == selector) return *d;
    if (plugin_match && !p->devices().empty()) return *p->devices().front();
  }
  if (selector == "auto" || selector == "gpu" || selector == "cpu" || selector == "accelerator") {
    for (auto& p : impl_->plugins) {
      ensure(*p);
      note_rejection(*p);
    }
    auto pick = [&](const std::string& kind) -> Device* {
      for (auto& p : impl_->plugins)
        if (p->loaded())
          for (auto& d : p->devices())
            if (d->kind() == kind) return d.get();
      return nullptr;
    };
    if (selector != "auto") {
      if (auto* d = pick(selector)) return *d;
    } else {
      for (const char* kind : {"gpu", "accelerator", "cpu"})
        if (auto* d = pick(kind)) return *d;
    }
  } else {
    // Any other device name: load everything and look.
    for (auto& p : impl_->plugins) {
      ensure(*p);
      if (p->loaded())
        for (auto& d : p->devices())
          if (d->name() == selector) return *d;
    }
  }
  std::string known;
  for (auto& p : impl_->plugins) {
    note_rejection(*p);
    if (p->loaded())
      for (auto& d : p->devices()) known += (known.empty() ? "" : ", ") + d->name();
  }
  // A manifest that could not be read may be the device the user meant.
  std::string unusable;
  for (const auto& [path, why] : impl_->manifest_errors)
    unusable += "\n  manifest " + path.string() + " is unusable: " + why;
  throw Error("no device matches '" + selector + "'" + (known.empty() ? "" : " (devices: " + known + ")") +
                  (impl_->plugins.empty() ? " (no plugin manifests were found; set BACKPLANE_PLUGIN_PATH)" : "") +
                  rejected + unusable,
              BP_ERR_UNAVAILABLE);
}

std::map<std::string, HostTensor> Runtime::run_graph(const Graph& graph, Device& device,
                                                     const std::map<std::string, HostTensor>& inputs) {
  Plan plan = compile(graph, device);
  return plan.run(inputs);
}

}  // namespace backplane
