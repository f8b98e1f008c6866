#include "commands.hpp"

#include <backplane/backplane.hpp>

#include <cstdio>
#include <iostream>

namespace backplane::cli {

namespace {
const char* state_name(PluginState s) {
  switch (s) {
    case PluginState::Loaded: return "loaded";
    case PluginState::Rejected: return "rejected";
    default: return "not loaded";
  }
}
}  // namespace

// Lists from manifests alone unless --load is given: no library is touched.
int cmd_devices(const Args& in) {
  Args args = in;
  const bool json = take_switch(args, "--json");
  const bool load = take_switch(args, "--load");
  reject_leftovers(args);
  auto rt = Runtime::create();
  if (load) rt->load_all();
  const auto listing = rt->devices();
  if (json) {
    Json j;
    j["manifests"] = Json::array();
    for (const auto& p : rt->plugins())
      j["manifests"].push_back({{"plugin", p.name}, {"version", p.version}, {"path", p.manifest_path.string()},
                                {"library", p.library_path.string()}, {"state", state_name(p.state)},
                                {"rejection", p.rejection}, {"kernels", p.kernels.size()}});
    j["devices"] = Json::array();
    for (const auto& d : listing)
      j["devices"].push_back({{"name", d.name}, {"kind", d.kind}, {"description", d.description}, {"plugin", d.plugin},
                              {"manifest", d.manifest.string()}, {"state", state_name(d.state)},
                              {"rejection", d.rejection}, {"kernels", d.kernel_count}});
    j["manifest_errors"] = Json::array();
    for (const auto& [path, why] : rt->manifest_errors())
      j["manifest_errors"].push_back({{"path", path.string()}, {"error", why}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  if (listing.empty() && rt->manifest_errors().empty())
    std::cout << "no plugin manifests found (set BACKPLANE_PLUGIN_PATH to a folder of manifests)\n";
  for (const auto& d : listing) {
    std::printf("%-10s %-8s %-11s %4zu kernels  plugin %s (%s)\n", d.name.c_str(), d.kind.c_str(),
                state_name(d.state), d.kernel_count, d.plugin.c_str(), d.manifest.string().c_str());
    if (!d.description.empty()) std::printf("           %s\n", d.description.c_str());
    if (!d.rejection.empty()) std::printf("           rejected: %s\n", d.rejection.c_str());
  }
  for (const auto& [path, why] : rt->manifest_errors()) std::printf("unusable manifest %s\n  %s\n", path.string().c_str(), why.c_str());
  if (!load) std::printf("(listed from manifests; `backplane devices --load` loads every plugin)\n");
  return 0;
}

}  // namespace backplane::cli
