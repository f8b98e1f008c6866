#include "commands.hpp"
#include "model_input.hpp"

#include <backplane/backplane.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>

namespace backplane::cli {

namespace {
std::string preview(const HostTensor& t) {
  std::string s = "[";
  const int64_t n = std::min<int64_t>(t.numel(), 6);
  for (int64_t i = 0; i < n; ++i) {
    char buf[32];
    if (is_float(t.dtype)) std::snprintf(buf, sizeof buf, "%.6g", t.get(i));
    else std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(t.get_int(i)));
    s += (i ? ", " : "") + std::string(buf);
  }
  if (t.numel() > n) s += ", ...";
  return s + "]";
}
// "1048576", "64K", "512M", "2G" (powers of 1024).
uint64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &used);
  } catch (const std::exception&) {
    throw Error(what + ": '" + text + "' is not a byte count (like 512M or 2G)");
  }
  const std::string unit = text.substr(used);
  int shift = 0;
  if (unit == "K" || unit == "k") shift = 10;
  else if (unit == "M" || unit == "m") shift = 20;
  else if (unit == "G" || unit == "g") shift = 30;
  else if (!unit.empty()) throw Error(what + ": unknown unit '" + unit + "' (K, M or G)");
  if (shift && n > (~0ull >> shift)) throw Error(what + ": '" + text + "' is too large");
  return static_cast<uint64_t>(n) << shift;
}

}  // namespace

int cmd_run(const Args& in) {
  Args args = in;
  const std::string device_name = take_option(args, "--device", "auto");
  const std::string out_dir = take_option(args, "--out");
  const bool json = take_switch(args, "--json");
  const bool explain = take_switch(args, "--explain");
  // Each step's time (kernels, transfers, synchronize) of a second, warm run.
  const bool profile = take_switch(args, "--profile");
  const bool optimize = take_optimize(args);
  const std::string max_memory = take_option(args, "--max-memory");
  if (args.empty() || args.front().rfind("--", 0) == 0)
    throw Error("run needs a graph file or an ONNX model: backplane run GRAPH.json|MODEL.onnx [--input NAME=FILE.npy]... "
                "[--dim NAME=N]... [--device NAME[,NAME...]] [--out DIR] [--explain] [--profile] [--json]");
  const std::filesystem::path graph_path = args.front();
  args.erase(args.begin());
  LoadedModel model = load_model(graph_path, args, true);
  reject_leftovers(args);
  GraphFile& gf = model.file;
  if (!json)
    for (const auto& note : model.notes) std::printf("note: %s\n", note.c_str());
  RuntimeOptions ropts;
  if (!max_memory.empty()) ropts.max_memory_bytes = parse_bytes(max_memory, "--max-memory");
  auto rt = Runtime::create(ropts);
  const std::vector<Device*> devices = rt->select_devices(device_name);
  const auto t0 = std::chrono::steady_clock::now();
  CompileOptions copts;
  copts.profile = profile;
  copts.optimize = optimize;
  copts.memory_baseline = explain;
  Plan plan = rt->compile(gf.graph, devices, copts);
  const auto t1 = std::chrono::steady_clock::now();
  std::string used;
  for (const auto& d : plan.devices()) used += (used.empty() ? "" : ",") + d;
  if (explain && !json) std::printf("%s%s\n", plan.explain().c_str(), buffers_line(plan.compile_stats()).c_str());
  auto outputs = plan.run(gf.inputs);
  const auto t2 = std::chrono::steady_clock::now();
  if (!out_dir.empty()) {
    std::filesystem::create_directories(out_dir);
    for (const auto& [name, t] : outputs) write_npy(std::filesystem::path(out_dir) / (name + ".npy"), t);
  }
  if (profile) plan.run(gf.inputs);  // the profiled run: warm (pipelines, caches)
  const double compile_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const double run_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  if (json) {
    Json j{{"device", used}, {"compile_ms", compile_ms}, {"run_ms", run_ms}, {"outputs", Json::object()}};
    if (explain) {
      j["placement"] = Json::array();
      for (const auto& pl : plan.placement())
        j["placement"].push_back({{"node", pl.node}, {"op", pl.op}, {"device", pl.device}, {"reason", pl.reason}});
      j["transfers"] = Json::array();
      for (const auto& t : plan.transfers())
        j["transfers"].push_back({{"value", t.value}, {"from", t.from}, {"to", t.to}, {"bytes", t.bytes}, {"zero_copy", t.zero_copy}});
    }
    for (const auto& [name, t] : outputs)
      j["outputs"][name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape},
                            {"file", out_dir.empty() ? "" : (std::filesystem::path(out_dir) / (name + ".npy")).string()}};
    if (profile) j["profile"] = plan.profile_json();
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  if (plan.devices().size() == 1)
    std::printf("ran %s on %s (%s): compile %.2f ms, run %.2f ms\n", graph_path.string().c_str(), used.c_str(),
                rt->device(used).description().c_str(), compile_ms, run_ms);
  else
    std::printf("ran %s on %s: compile %.2f ms, run %.2f ms\n", graph_path.string().c_str(), used.c_str(), compile_ms, run_ms);
  for (const auto& [name, t] : outputs)
    std::printf("  %-12s %-4s %-16s %s\n", name.c_str(), std::string(dtype_name(t.dtype)).c_str(), shape_str(t.shape).c_str(),
                preview(t).c_str());
  if (!out_dir.empty()) std::printf("outputs written to %s/<name>.npy\n", out_dir.c_str());
  if (profile) std::printf("profile (a second run, warm; a kernel on an asynchronous device is timed as it is\n"
                           "enqueued, its device time shows in that device's synchronize row):\n%s",
                           plan.profile_table().c_str());
  return 0;
}

}  // namespace backplane::cli
