// Manifests, plugin loading through Boost.DLL, version negotiation and the
// check that a library registers exactly what its manifest says.
#include "plugin.hpp"

#include "input_files.hpp"
#include "json_schema.hpp"
#include "vendor_ops.hpp"

#include <algorithm>
#include <boost/dll/import.hpp>

#include <cstring>
#include <fstream>
#include <sstream>

namespace backplane {

namespace {

std::string sv(bp_string s) { return s.data ? std::string(s.data, s.len) : std::string(); }

// A string from a plugin, at most `cap` bytes of it: a plugin's message or
// name cannot flood the host's memory or its user's terminal.
std::string capped(bp_string s, size_t cap) {
  if (!s.data) return {};
  if (s.len <= cap) return std::string(s.data, s.len);
  return std::string(s.data, cap) + "... (" + std::to_string(s.len - cap) + " more bytes cut)";
}

constexpr size_t kMaxMessage = 64 * 1024;
constexpr uint32_t kMaxDevices = 1024;

const char* layout_name(bp_layout_capability c) { return c == BP_LAYOUT_STRIDED ? "strided" : "contiguous"; }

using EntryFn = bp_status_code(const bp_plugin_query*, const bp_plugin_api**);

}  // namespace

std::string kernel_signature(const KernelInfo& k) {
  std::string s = k.op + "(";
  for (size_t i = 0; i + 1 < k.dtypes.size(); ++i)
    s += std::string(i ? ", " : "") + std::string(dtype_name(k.dtypes[i]));
  if (k.variadic) s += "...";
  s += ") -> " + std::string(k.dtypes.empty() ? "?" : dtype_name(k.dtypes.back()));
  if (k.bundle_slots) s += " bundle[" + std::to_string(k.bundle_slots) + "]";
  s += " [";
  for (size_t i = 0; i < k.layouts.size(); ++i) s += std::string(i ? ", " : "") + layout_name(k.layouts[i]);
  return s + "]";
}

PluginInfo parse_manifest(const std::filesystem::path& path) {
  const std::string where = "manifest " + path.string();
  // Far above any manifest (the CPU plugin's, every kernel listed, is ~100 KB).
  constexpr uint64_t kMaxManifest = uint64_t{4} << 20;
  const Json j =
      detail::parse_json_bounded(detail::read_regular_file(path, kMaxManifest, "4 MiB", where + ": "), where + ": ");
  if (auto err = detail::manifest_schema_compiled().check(j)) throw Error(where + ": " + *err);
  const auto& p = j["plugin"];
  PluginInfo info;
  info.manifest_path = path;
  info.name = p["name"];
  info.version = p["version"];
  info.abi_version = p["abi_version"];
  info.device_kind = p["device_kind"];
  info.device_kinds = {info.device_kind};
  if (p.contains("device_kinds"))
    for (const auto& k : p["device_kinds"])
      if (std::find(info.device_kinds.begin(), info.device_kinds.end(), k.get<std::string>()) == info.device_kinds.end())
        info.device_kinds.push_back(k.get<std::string>());
  info.description = p.value("description", "");
  // The library lies in the manifest's folder or below it: a manifest that
  // could name any path (absolute, or through '..') would load any library
  // on the machine. A symlink is followed, and the file it leads to recorded.
  const std::string lib_text = p["library_path"].get<std::string>();
  const std::filesystem::path lib = lib_text;
  if (lib.has_root_path())
    throw Error(where + ": library_path \"" + lib_text + "\" is absolute; it must be relative to the manifest's folder");
  for (const auto& part : lib)
    if (part == "..")
      throw Error(where + ": library_path \"" + lib_text + "\" has a '..' component; it must stay inside the manifest's folder");
  std::error_code ec;
  info.library_path = std::filesystem::weakly_canonical(path.parent_path() / lib, ec);
  if (ec) info.library_path = path.parent_path() / lib;
  // The schema has checked every field's type: read them in place (a CPU
  // manifest has 500+ rows, read at every Runtime::create).
  const auto& kernels = p["kernels"];
  info.kernels.reserve(kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) {
    const auto& k = kernels[i];
    KernelInfo ki;
    ki.op = k["op"].get_ref<const std::string&>();
    const auto& dtypes = k["dtypes"];
    const auto& layouts = k["layouts"];
    ki.dtypes.reserve(dtypes.size());
    ki.layouts.reserve(layouts.size());
    for (const auto& d : dtypes) ki.dtypes.push_back(*dtype_from_name(d.get_ref<const std::string&>()));
    for (const auto& l : layouts)
      ki.layouts.push_back(l.get_ref<const std::string&>() == "strided" ? BP_LAYOUT_STRIDED : BP_LAYOUT_CONTIGUOUS);
    if (const auto b = k.find("bundle_slots"); b != k.end()) ki.bundle_slots = b->get<uint32_t>();
    if (const auto v = k.find("variadic"); v != k.end()) ki.variadic = v->get<bool>();
    if (ki.layouts.size() + 1 != ki.dtypes.size())
      throw Error(where + ": kernel #" + std::to_string(i) + " (" + ki.op + ") has " + std::to_string(ki.dtypes.size()) +
                  " dtypes for " + std::to_string(ki.layouts.size()) + " inputs (expected inputs + 1)");
    info.kernels.push_back(std::move(ki));
  }
  if (p.contains("vendor_ops"))
    for (const auto& v : p["vendor_ops"]) info.vendor_ops.push_back(detail::parse_vendor_op(v, where));
  info.dynamic_kernels = p.value("dynamic_kernels", false);
  info.instances = p.value("instances", false);
  info.isolation = p.value("isolation", std::string("none"));
  if (info.dynamic_kernels && !info.kernels.empty())
    throw Error(where + ": a manifest with \"dynamic_kernels\": true lists no kernels (the library fills its table)");
  return info;
}

Json manifest_to_json(const PluginInfo& info) {
  Json kernels = Json::array();
  for (const auto& k : info.kernels) {
    Json e;
    e["op"] = k.op;
    e["dtypes"] = Json::array();
    for (auto d : k.dtypes) e["dtypes"].push_back(std::string(dtype_name(d)));
    e["layouts"] = Json::array();
    for (auto l : k.layouts) e["layouts"].push_back(layout_name(l));
    if (k.bundle_slots) e["bundle_slots"] = k.bundle_slots;
    if (k.variadic) e["variadic"] = true;
    kernels.push_back(std::move(e));
  }
  Json p;
  p["name"] = info.name;
  p["version"] = info.version;
  p["library_path"] = info.library_path.filename().string();
  p["abi_version"] = info.abi_version;
  p["device_kind"] = info.device_kind;
  if (!info.description.empty()) p["description"] = info.description;
  if (info.dynamic_kernels) p["dynamic_kernels"] = true;
  if (info.instances) p["instances"] = true;
  if (info.isolation != "none") p["isolation"] = info.isolation;
  p["kernels"] = std::move(kernels);
  return Json{{"file_format_version", "1.0.0"}, {"plugin", std::move(p)}};
}

std::vector<KernelInfo> kernels_of(const bp_plugin_api* api) {
  std::vector<KernelInfo> out;
  if (!api->kernels) return out;
  for (size_t i = 0; i < api->n_kernels; ++i) {
    const bp_kernel_desc& d = api->kernels[i];
    KernelInfo k;
    k.op = sv(d.op);
    if (d.dtypes) k.dtypes.assign(d.dtypes, d.dtypes + d.n_dtypes);
    if (d.input_layouts)
      for (uint32_t j = 0; j < d.n_inputs; ++j)
        k.layouts.push_back(d.input_layouts[j] == BP_LAYOUT_STRIDED ? BP_LAYOUT_STRIDED : BP_LAYOUT_CONTIGUOUS);
    k.bundle_slots = d.bundle_slots;
    k.variadic = (d.flags & BP_KERNEL_FLAG_VARIADIC) != 0;
    out.push_back(std::move(k));
  }
  return out;
}

namespace {

// The version the host speaks, as text.
std::string host_abi() { return std::to_string(BP_ABI_VERSION_MAJOR) + "." + std::to_string(BP_ABI_VERSION_MINOR); }

// What a library answered the handshake with: its table, of major 1 or 2.
struct Answer {
  const void* table = nullptr;
  uint32_t major = 0, minor = 0;
  size_t struct_size = 0;
};

// Opens a library and runs the version handshake. Throws Error with a message
// that names the library and both versions when they do not fit.
Answer open_library(boost::dll::shared_library& lib, const std::filesystem::path& path, const std::string& who,
                    const std::string& instance = {}) {
  if (!std::filesystem::exists(path)) throw Error(who + ": library " + path.string() + " does not exist");
  try {
    // rtld_now: a missing symbol fails here, not in the middle of a kernel.
    lib.load(boost::dll::fs::path(path.string()),
             boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    throw Error(who + ": cannot load " + path.string() + ": " + e.what());
  }
  if (!lib.has(BP_PLUGIN_ENTRY_SYMBOL))
    throw Error(who + ": " + path.string() + " does not export the entry symbol '" BP_PLUGIN_ENTRY_SYMBOL "'");
  auto& entry = lib.get<EntryFn>(BP_PLUGIN_ENTRY_SYMBOL);
  char reason[512] = {0};
  bp_plugin_query q{};
  q.struct_size = sizeof q;
  q.instance = bp_string{instance.data(), instance.size()};
  q.min_major = 1;  // 1.x tables are adapted (abi_v1.hpp)
  q.max_major = BP_ABI_VERSION_MAJOR;
  q.max_minor = BP_ABI_VERSION_MINOR;
  q.error_buffer = reason;
  q.error_buffer_size = sizeof reason;
  const bp_plugin_api* api = nullptr;
  const bp_status_code rc = entry(&q, &api);
  reason[sizeof reason - 1] = 0;
  if (rc != BP_OK || api == nullptr)
    throw Error(who + ": the plugin refused this host's ABI (majors 1.." + std::to_string(BP_ABI_VERSION_MAJOR) +
                ", up to " + host_abi() + ")" + (reason[0] ? std::string(": ") + reason : std::string()));
  // Every major's table begins with struct_size, abi_major, abi_minor.
  Answer out{api, api->abi_major, api->abi_minor, api->struct_size};
  const std::string theirs = std::to_string(out.major) + "." + std::to_string(out.minor);
  if (out.struct_size < offsetof(bp_plugin_api, name))
    throw Error(who + ": API table too small (struct_size " + std::to_string(out.struct_size) + ")");
  if (out.major != 1 && out.major != BP_ABI_VERSION_MAJOR)
    throw Error(who + ": the plugin speaks ABI " + theirs + "; this host speaks " + host_abi() + " and 1.x");
  if (out.major == BP_ABI_VERSION_MAJOR && out.struct_size < offsetof(bp_plugin_api, infer_custom_op) + sizeof(void*))
    throw Error(who + ": API table of ABI " + theirs + " too small (struct_size " + std::to_string(out.struct_size) +
                ", ABI 2.0 needs " + std::to_string(offsetof(bp_plugin_api, infer_custom_op) + sizeof(void*)) + ")");
  return out;
}

// The 2.0 form of an answer: a 2.x table copied as far as both sides know
// it, a 1.x table through the shim. Then the checks every table meets.
const bp_plugin_api* adopt(const Answer& a, bp_plugin_api& copy, std::unique_ptr<v1::Shim>& shim, const std::string& who) {
  const bp_plugin_api* api = nullptr;
  if (a.major == 1) {
    shim = std::make_unique<v1::Shim>(static_cast<const v1::PluginApi*>(a.table), who);
    api = shim->api();
  } else {
    copy = bp_plugin_api{};
    std::memcpy(&copy, a.table, std::min(a.struct_size, sizeof copy));
    copy.struct_size = sizeof copy;
    api = &copy;
  }
  for (auto fn : {reinterpret_cast<const void*>(api->error_code), reinterpret_cast<const void*>(api->error_message),
                  reinterpret_cast<const void*>(api->error_destroy), reinterpret_cast<const void*>(api->initialize),
                  reinterpret_cast<const void*>(api->device_count), reinterpret_cast<const void*>(api->device_get),
                  reinterpret_cast<const void*>(api->device_info), reinterpret_cast<const void*>(api->buffer_allocate),
                  reinterpret_cast<const void*>(api->buffer_free), reinterpret_cast<const void*>(api->buffer_read),
                  reinterpret_cast<const void*>(api->buffer_write)})
    if (fn == nullptr) throw Error(who + ": API table lacks a required function");
  if ((api->begin == nullptr) != (api->synchronize == nullptr))
    throw Error(who + ": API table sets one of begin and synchronize without the other");
  for (size_t i = 0; i < api->n_kernels; ++i)
    if (api->kernels[i].fn == nullptr || api->kernels[i].n_dtypes != api->kernels[i].n_inputs + 1)
      throw Error(who + ": kernel #" + std::to_string(i) + " (" + sv(api->kernels[i].op) + ") is malformed");
  return api;
}

}  // namespace

PluginInfo inspect_plugin_library(const std::filesystem::path& library) {
  boost::dll::shared_library lib;
  const std::string who = "library " + library.string();
  const Answer answer = open_library(lib, library, who);
  bp_plugin_api copy{};
  std::unique_ptr<v1::Shim> shim;
  const auto* api = adopt(answer, copy, shim, who);
  PluginInfo info;
  info.name = sv(api->name);
  info.version = sv(api->version);
  info.abi_version = std::to_string(api->abi_major) + "." + std::to_string(api->abi_minor);
  info.library_path = library;
  info.kernels = kernels_of(api);
  return info;
}

Plugin::~Plugin() { unload(); }

std::string Plugin::take_error(bp_error* e) const {
  if (!e) return {};
  std::string msg = capped(api_->error_message(ctx_, e), kMaxMessage);
  const auto code = api_->error_code(ctx_, e);
  api_->error_destroy(ctx_, e);
  if (msg.empty()) msg = "error code " + std::to_string(code);
  return msg;
}

void Plugin::check(bp_error* e, const std::string& what) const {
  if (!e) return;
  const auto code = api_->error_code(ctx_, e);
  throw Error(what + ": " + take_error(e), code);
}

void Plugin::reject(const std::string& why) {
  devices_.clear();
  if (initialized_ && api_ && api_->shutdown) api_->shutdown(ctx_);
  initialized_ = false;
  api_ = nullptr;
  ctx_ = nullptr;
  shim_.reset();
  index_.clear();
  if (lib_.is_loaded()) lib_.unload();
  info_.state = PluginState::Rejected;
  info_.rejection = why;
}

void Plugin::load(const bp_host_api* host) {
  if (info_.state != PluginState::NotLoaded) return;
  const std::string who = "plugin '" + info_.name + "'";
  try {
    const Answer answer = open_library(lib_, info_.library_path, who, info_.isolated ? info_.instance : std::string());
    raw_ = static_cast<const bp_plugin_api*>(answer.table);
    api_ = adopt(answer, table_, shim_, who);
    // The library must be what its manifest says, exactly.
    if (sv(api_->name) != info_.name)
      throw Error(who + ": library registers name '" + sv(api_->name) + "', manifest says '" + info_.name + "'");
    if (sv(api_->version) != info_.version)
      throw Error(who + ": library registers version '" + sv(api_->version) + "', manifest says '" + info_.version + "'");
    // An isolated plugin is reached through the remote plugin's library: its
    // child checks the plugin's own ABI.
    const std::string abi = std::to_string(api_->abi_major) + "." + std::to_string(api_->abi_minor);
    if (abi != info_.abi_version && !info_.isolated)
      throw Error(who + ": library speaks ABI " + abi + ", manifest says " + info_.abi_version);
    auto compare = [&](const std::vector<KernelInfo>& table, const std::vector<KernelInfo>& want) {
      for (size_t i = 0; i < std::max(table.size(), want.size()); ++i) {
        if (i < table.size() && i < want.size() && table[i] == want[i]) continue;
        if (i >= table.size())
          throw Error(who + ": manifest lists kernel #" + std::to_string(i) + " " + kernel_signature(want[i]) +
                      " that the library does not register (library has " + std::to_string(table.size()) +
                      ", manifest " + std::to_string(want.size()) + ")");
        if (i >= want.size())
          throw Error(who + ": library registers kernel #" + std::to_string(i) + " " + kernel_signature(table[i]) +
                      " that the manifest does not list (library has " + std::to_string(table.size()) +
                      ", manifest " + std::to_string(want.size()) + ")");
        throw Error(who + ": kernel #" + std::to_string(i) + " differs: manifest says " + kernel_signature(want[i]) +
                    ", library registers " + kernel_signature(table[i]));
      }
    };
    // A dynamic table (ABI 1.2) and an isolated plugin's (its child's) are
    // known after initialize(); every other table is checked before it.
    const bool late_table = info_.dynamic_kernels || info_.isolated;
    auto table = kernels_of(api_);
    if (!late_table) compare(table, info_.kernels);

    host_ = host;
    ctx_ = nullptr;
    // `self` is the table the plugin returned (the shim's own for 1.x).
    check(api_->initialize(shim_ ? api_ : raw_, host, &ctx_), who + ": initialize failed");
    initialized_ = true;
    if (late_table) {
      // A dynamic table is filled in by initialize: read it again.
      if (!shim_) {
        table_.kernels = raw_->kernels;
        table_.n_kernels = raw_->n_kernels;
      }
      if (api_->n_kernels > (size_t{1} << 16)) throw Error(who + ": registers more than 65536 kernels");
      for (size_t i = 0; i < api_->n_kernels; ++i)
        if (api_->kernels[i].fn == nullptr || api_->kernels[i].n_dtypes != api_->kernels[i].n_inputs + 1 ||
            api_->kernels[i].n_dtypes == 0 || api_->kernels[i].op.len > 128)
          throw Error(who + ": kernel #" + std::to_string(i) + " (" + capped(api_->kernels[i].op, 128) + ") is malformed");
      table = kernels_of(api_);
      for (const auto& k : table)
        for (auto d : k.dtypes)
          if (d <= BP_DTYPE_INVALID || d >= BP_DTYPE_COUNT_)
            throw Error(who + ": kernel " + k.op + " names a dtype that does not exist");
      if (info_.isolated) compare(table, info_.kernels);
      else info_.kernels = table;
    }
    for (size_t i = 0; i < table.size(); ++i) index_[{table[i].op, table[i].dtypes}] = static_cast<int>(i);
    const uint32_t n = api_->device_count(ctx_);
    if (n > kMaxDevices)
      throw Error(who + ": reports " + std::to_string(n) + " devices; a plugin may have at most " +
                  std::to_string(kMaxDevices));
    for (uint32_t i = 0; i < n; ++i) {
      auto dev = std::unique_ptr<Device>(new Device());
      dev->plugin_ = this;
      check(api_->device_get(ctx_, i, &dev->handle_), who + ": device " + std::to_string(i));
      dev->info_.struct_size = sizeof(bp_device_info);
      check(api_->device_info(ctx_, dev->handle_, &dev->info_), who + ": device " + std::to_string(i));
      // 256: a served device's name carries its server's address, and a
      // unix socket's path alone may take 107 bytes.
      dev->name_ = capped(dev->info_.name, 256);
      dev->kind_ = capped(dev->info_.kind, 32);
      // One truth for a device's kind: what the manifest says the plugin's
      // devices may be, so a listing before loading never contradicts one after.
      const auto& kinds = info_.device_kinds;
      if (std::find(kinds.begin(), kinds.end(), dev->kind_) == kinds.end()) {
        std::string allowed;
        for (const auto& k : kinds) allowed += (allowed.empty() ? "" : ", ") + k;
        throw Error(who + ": device '" + dev->name_ + "' reports kind '" + dev->kind_ +
                    "', which its manifest does not list (device_kind/device_kinds: " + allowed + ")");
      }
      dev->description_ = capped(dev->info_.description, 256);
      if (dev->name_.empty()) throw Error(who + ": device " + std::to_string(i) + " has no name");
      if (dev->info_.buffer_alignment == 0) dev->info_.buffer_alignment = 16;
      dev->supported_.assign(table.size(), true);
      if (api_->device_supports_kernel)
        for (size_t k = 0; k < table.size(); ++k) {
          bool ok = true;
          check(api_->device_supports_kernel(ctx_, dev->handle_, static_cast<uint32_t>(k), &ok), who + ": device_supports_kernel");
          dev->supported_[k] = ok;
        }
      for (size_t k = 0; k < info_.kernels.size() && k < dev->supported_.size(); ++k)
        if (dev->supported_[k]) dev->kernels_.push_back(info_.kernels[k]);
      devices_.push_back(std::move(dev));
    }
    info_.state = PluginState::Loaded;
  } catch (const std::exception& e) {
    reject(e.what());
  }
}

void Plugin::unload() {
  if (info_.state != PluginState::Loaded) return;
  devices_.clear();
  if (initialized_ && api_->shutdown) api_->shutdown(ctx_);
  initialized_ = false;
  api_ = nullptr;
  ctx_ = nullptr;
  shim_.reset();
  index_.clear();
  lib_.unload();
  info_.state = PluginState::NotLoaded;
}

int Plugin::find_kernel(const std::string& op, const std::vector<bp_dtype>& key) const {
  auto it = index_.find({op, key});
  return it == index_.end() ? -1 : it->second;
}

// ---- Device ------------------------------------------------------------------

Device::~Device() = default;

const std::string& Device::plugin_name() const { return plugin_->info().name; }

bool Device::imports_host_memory() const {
  const bp_plugin_api* api = plugin_->loaded() ? plugin_->api() : nullptr;
  return api && info_.memory_kind != BP_MEMORY_DEVICE && api->buffer_import_host;
}


}  // namespace backplane
