// `backplane conformance --plugin NAME|MANIFEST`: certifies a plugin. Checks
// its ABI handshake directly, its manifest against what it registers (the
// host's load check), then runs the conformance library on each of its
// devices against f64 references and the CPU plugin.
#include "commands.hpp"

#include <backplane/backplane.hpp>

#include "conformance/conformance.hpp"

#include <boost/dll/shared_library.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>

namespace backplane::cli {

namespace {

using EntryFn = bp_status_code(const bp_plugin_query*, const bp_plugin_api**);

struct AbiCheck {
  std::string name;
  bool ok;
  std::string detail;
};

// Calls the entry symbol the way different hosts would: a smaller (older) and a
// larger (newer) query struct, a newer minor, a major range it cannot speak, and
// checks the answers and the table's required functions.
std::vector<AbiCheck> probe_abi(const std::filesystem::path& library) {
  std::vector<AbiCheck> out;
  boost::dll::shared_library lib;
  try {
    lib.load(boost::dll::fs::path(library.string()), boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    out.push_back({"load", false, e.what()});
    return out;
  }
  if (!lib.has(BP_PLUGIN_ENTRY_SYMBOL)) {
    out.push_back({"entry symbol", false, "no " BP_PLUGIN_ENTRY_SYMBOL});
    return out;
  }
  auto& entry = lib.get<EntryFn>(BP_PLUGIN_ENTRY_SYMBOL);
  // A query followed by extra fields a newer host might send.
  struct BigQuery {
    bp_plugin_query q;
    uint64_t future[8];
  } big{};
  char reason[256];
  auto query = [&](size_t size, uint32_t lo, uint32_t hi, uint32_t minor) {
    big = BigQuery{};
    reason[0] = 0;
    big.q.struct_size = size;
    big.q.min_major = lo;
    big.q.max_major = hi;
    big.q.max_minor = minor;
    big.q.error_buffer = reason;
    big.q.error_buffer_size = sizeof reason;
    const bp_plugin_api* api = nullptr;
    const bp_status_code rc = entry(&big.q, &api);
    return std::make_pair(rc, api);
  };
  // This host speaks majors 1 (adapted) and 2.
  auto [rc, api] = query(sizeof(bp_plugin_query), 1, BP_ABI_VERSION_MAJOR, BP_ABI_VERSION_MINOR);
  out.push_back({"handshake at the host's versions", rc == BP_OK && api != nullptr, "status " + std::to_string(rc)});
  if (rc != BP_OK || !api) return out;
  const uint32_t major = api->abi_major;
  const std::string theirs = std::to_string(major) + "." + std::to_string(api->abi_minor);
  out.push_back({"answers a major this host speaks (1 or " + std::to_string(BP_ABI_VERSION_MAJOR) + ")",
                 major == 1 || major == BP_ABI_VERSION_MAJOR, "abi " + theirs});
  if (major == BP_ABI_VERSION_MAJOR) {
    const size_t need = offsetof(bp_plugin_api, infer_custom_op) + sizeof(void*);
    out.push_back({"API table struct_size covers ABI 2.0", api->struct_size >= need,
                   "struct_size " + std::to_string(api->struct_size)});
    if (api->struct_size < need) return out;
    const bool required = api->error_code && api->error_message && api->error_destroy && api->initialize &&
                          api->device_count && api->device_get && api->device_info && api->buffer_allocate &&
                          api->buffer_free && api->buffer_read && api->buffer_write;
    out.push_back({"required functions present", required, required ? "" : "a required function pointer is NULL"});
    out.push_back({"begin and synchronize set together", (api->begin == nullptr) == (api->synchronize == nullptr), ""});
    std::string optional;
    for (auto [name, present] : {std::pair{"begin", api->begin != nullptr}, {"synchronize", api->synchronize != nullptr},
                                 {"device_supports_kernel", api->device_supports_kernel != nullptr},
                                 {"infer_custom_op", api->infer_custom_op != nullptr}, {"shutdown", api->shutdown != nullptr},
                                 {"buffer_import_host", api->buffer_import_host != nullptr},
                                 {"error_call_index", api->error_call_index != nullptr}})
      optional += std::string(optional.empty() ? "" : ", ") + name + (present ? "" : " (absent)");
    out.push_back({"optional functions (absent ones are fine)", true, optional});
  } else {
    out.push_back({"ABI 1.x table (the host adapts it; its load checks the entries)", true, "abi " + theirs});
  }
  auto r1 = query(offsetof(bp_plugin_query, error_buffer), 1, major, 0);  // an older host: no error buffer fields
  out.push_back({"smaller query struct (older host)", r1.first == BP_OK && r1.second, "status " + std::to_string(r1.first)});
  auto r2 = query(sizeof(BigQuery), 1, BP_ABI_VERSION_MAJOR, BP_ABI_VERSION_MINOR);  // a newer host
  out.push_back({"larger query struct (newer host)", r2.first == BP_OK && r2.second, "status " + std::to_string(r2.first)});
  auto r3 = query(sizeof(bp_plugin_query), major, major, 99);  // a newer minor the plugin does not know
  out.push_back({"unknown newer minor version", r3.first == BP_OK && r3.second, "status " + std::to_string(r3.first)});
  auto r4 = query(sizeof(bp_plugin_query), 7, 8, 0);  // majors it cannot speak
  out.push_back({"refuses majors it does not speak, with a reason", r4.first == BP_ERR_INCOMPATIBLE && !r4.second && reason[0],
                 "status " + std::to_string(r4.first) + (reason[0] ? std::string(": ") + reason : std::string(" (no reason)"))});
  return out;
}

}  // namespace

int cmd_conformance(const Args& in) {
  Args args = in;
  const std::string plugin_arg = take_option(args, "--plugin");
  const std::string json_path = take_option(args, "--json");
  const std::string filter = take_option(args, "--filter");
  const std::string compare = take_option(args, "--compare", "cpu");
  const bool quick = take_switch(args, "--quick");
  const bool quiet = take_switch(args, "--quiet");
  const bool strict = take_switch(args, "--strict");
  const std::string fallback = take_option(args, "--fallback");
  const std::string xfail_arg = take_option(args, "--expected-failures");
  reject_leftovers(args);
  if (plugin_arg.empty()) throw Error("conformance needs --plugin NAME|MANIFEST");

  RuntimeOptions ropts;
  std::string plugin_name = plugin_arg;
  if (plugin_arg.size() > 5 && plugin_arg.substr(plugin_arg.size() - 5) == ".json") {
    const PluginInfo info = parse_manifest(plugin_arg);
    plugin_name = info.name;
    ropts.plugin_paths.push_back(std::filesystem::absolute(plugin_arg).parent_path());
  }
  auto rt = Runtime::create(ropts);
  const PluginInfo* info = nullptr;
  for (const auto& p : rt->plugins())
    if (p.name == plugin_name) info = &p;
  if (!info) throw Error("no plugin named '" + plugin_name + "' on the search path (give its manifest path, or set BACKPLANE_PLUGIN_PATH)");
  const auto library = info->library_path;

  int failures = 0;
  Json report{{"plugin", plugin_name}, {"abi_checks", Json::array()}, {"devices", Json::array()}};
  std::printf("conformance of plugin '%s' (%s)\n", plugin_name.c_str(), library.string().c_str());
  for (const auto& c : probe_abi(library)) {
    std::printf("  abi  %-48s %s  %s\n", c.name.c_str(), c.ok ? "ok  " : "FAIL", c.detail.c_str());
    report["abi_checks"].push_back({{"check", c.name}, {"ok", c.ok}, {"detail", c.detail}});
    failures += !c.ok;
  }

  // Loading checks the manifest against the registered table.
  rt->load_all();
  for (const auto& p : rt->plugins())
    if (p.name == plugin_name) info = &p;
  const bool loaded = info->state == PluginState::Loaded;
  std::printf("  load manifest agrees with the library                 %s  %s\n", loaded ? "ok  " : "FAIL",
              loaded ? "" : info->rejection.c_str());
  report["manifest_check"] = {{"ok", loaded}, {"detail", info->rejection}};
  if (!loaded) {
    ++failures;
  } else {
    std::vector<Device*> devices;
    Device* reference = nullptr;
    Device* fallback_device = nullptr;
    for (Device* d : rt->all_devices()) {
      if (d->plugin_name() == plugin_name) devices.push_back(d);
      if (d->name() == compare && d->plugin_name() != plugin_name) reference = d;
    }
    if (!fallback.empty()) fallback_device = &rt->device(fallback);
    // The plugin's bring-up list: --expected-failures FILE, else the
    // "<stem>.xfail" beside its manifest when there is one ("none" = ignore it).
    std::vector<conformance::ExpectedFailure> expected;
    std::filesystem::path xfail_file = xfail_arg;
    if (const auto beside = conformance::expected_failures_path(info->manifest_path);
        xfail_arg.empty() && std::filesystem::exists(beside))
      xfail_file = beside;
    if (!xfail_file.empty() && xfail_arg != "none") {
      expected = conformance::load_expected_failures(xfail_file);
      std::printf("  expected failures: %zu entries from %s\n", expected.size(), xfail_file.string().c_str());
      report["expected_failures_file"] = xfail_file.string();
    }
    if (devices.empty()) {
      std::printf("  SKIPPED: plugin '%s' has no device available on this machine\n", plugin_name.c_str());
      report["skipped"] = "no device available";
    }
    for (Device* dev : devices) {
      conformance::Options opts;
      opts.filter = filter;
      opts.large = !quick;
      opts.compare_device = reference;
      opts.fallback_device = fallback_device;
      opts.expected_failures = expected;
      std::string last_op;
      if (!quiet)
        opts.progress = [&](const conformance::Progress& p) {
          if (p.op == last_op) return;
          last_op = p.op;
          std::fprintf(stderr, "\r  [%zu/%zu] %-16s %-8s", p.kernel_index + 1, p.kernel_count, p.op.c_str(), p.phase.c_str());
          std::fflush(stderr);
        };
      std::printf("\ndevice %s (%s)%s\n", dev->name().c_str(), dev->description().c_str(),
                  reference ? (", compared with " + reference->name() + " and f64 references").c_str() : ", against f64 references");
      const conformance::Report r = conformance::run_conformance(*rt, *dev, opts);
      if (!quiet) std::fprintf(stderr, "\r%60s\r", "");
      std::cout << r.table(false);
      const auto fails = r.failures();
      std::printf("device %s: %lld of %lld cases passed in %.1f s%s\n", dev->name().c_str(),
                  static_cast<long long>(r.total_passed()), static_cast<long long>(r.total_cases()), r.seconds,
                  r.all_passed() ? "" : " -- FAILED");
      for (const auto* row : fails)
        std::printf("  FAILED %s [%s] %s: %s\n", row->op.c_str(), row->dtype_key.c_str(), row->layout.c_str(),
                    row->xpass() ? ("listed as an expected failure at " + row->unexpected_pass +
                                    " but every row it names passed: remove the entry").c_str()
                                 : row->first_failure.c_str());
      for (const auto& row : r.rows)
        if (row.xfail())
          std::printf("  XFAIL %s [%s] %s (%s): %s\n", row.op.c_str(), row.dtype_key.c_str(), row.layout.c_str(),
                      row.expected_failure.c_str(), row.first_failure.c_str());
      for (const auto& row : r.rows)
        if (row.not_covered)
          std::printf("  %s %s [%s]: %s\n", strict ? "FAILED (--strict)" : "UNVERIFIED", row.op.c_str(),
                      row.dtype_key.c_str(), row.first_failure.c_str());
      failures += !r.all_passed() || (strict && r.any_unverified());
      report["devices"].push_back(r.to_json());
    }
  }
  report["passed"] = failures == 0;
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << report.dump(2) << "\n";
    if (!f) throw Error("cannot write " + json_path);
    std::printf("report written to %s\n", json_path.c_str());
  }
  std::printf("%s\n", failures ? "conformance: FAILED" : "conformance: passed");
  return failures ? 1 : 0;
}

}  // namespace backplane::cli
