#include "commands.hpp"

#include <backplane/backplane.hpp>

#include <fstream>
#include <iostream>

namespace backplane::cli {

// Writes (or checks) a manifest from what a built library registers, so the
// shipped manifest and the library never drift.
int cmd_manifest(const Args& in) {
  Args args = in;
  std::string kind = take_option(args, "--kind");
  std::string description = take_option(args, "--description");
  const std::string out = take_option(args, "--out");
  const std::string check = take_option(args, "--check");
  if (args.empty()) throw Error("manifest needs a plugin library path");
  const std::filesystem::path lib = args.front();
  args.erase(args.begin());
  reject_leftovers(args);

  PluginInfo info = inspect_plugin_library(lib);
  if (!check.empty()) {
    const PluginInfo shipped = parse_manifest(check);
    if (kind.empty()) kind = shipped.device_kind;
    if (description.empty()) description = shipped.description;
  }
  info.device_kind = kind.empty() ? "cpu" : kind;
  info.description = description;
  Json j = manifest_to_json(info);
  if (!check.empty()) {
    std::ifstream f(check);
    const Json shipped = Json::parse(f);
    // What a library cannot say of itself comes from the shipped manifest.
    for (const char* key : {"device_kinds", "vendor_ops"})
      if (shipped["plugin"].contains(key)) j["plugin"][key] = shipped["plugin"][key];
    if (shipped != j) {
      const PluginInfo s = parse_manifest(check);
      std::string why = "differs";
      if (s.name != info.name) why = "name '" + s.name + "' vs library '" + info.name + "'";
      else if (s.version != info.version) why = "version '" + s.version + "' vs library '" + info.version + "'";
      else if (s.kernels.size() != info.kernels.size())
        why = std::to_string(s.kernels.size()) + " kernels vs library " + std::to_string(info.kernels.size());
      else
        for (size_t i = 0; i < s.kernels.size(); ++i)
          if (!(s.kernels[i] == info.kernels[i])) {
            why = "kernel #" + std::to_string(i) + ": " + kernel_signature(s.kernels[i]) + " vs library " + kernel_signature(info.kernels[i]);
            break;
          }
      std::cerr << "backplane: manifest " << check << " does not match " << lib << ": " << why
                << "\n  regenerate it: backplane manifest " << lib << " --check " << check << " --out " << check << "\n";
      if (out.empty()) return 1;
    } else if (out.empty()) {
      std::cout << "manifest " << check << " matches " << lib << " (" << info.kernels.size() << " kernels)\n";
      return 0;
    }
  }
  if (out.empty()) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::ofstream f(out);
    f << j.dump(2) << "\n";
    if (!f) throw Error("cannot write " + out);
    std::cout << "wrote " << out << " (" << info.kernels.size() << " kernels)\n";
  }
  return 0;
}

}  // namespace backplane::cli
