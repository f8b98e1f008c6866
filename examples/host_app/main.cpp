// host_app [--device NAME|auto] [GRAPH.json]
//
// Picks a device at run time (the argument, else BACKPLANE_DEVICE, else the
// best available: a GPU, then anything else), runs a graph file on it (or a
// small built-in graph), and says which device ran it.
#include <backplane/backplane.hpp>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  std::string selector = "auto";
  std::string graph_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) selector = argv[++i];
    else graph_path = a;
  }
  try {
    auto rt = backplane::Runtime::create();
    std::printf("devices on this machine:\n");
    for (backplane::Device* d : rt->all_devices())
      std::printf("  %-10s %-12s %s (plugin %s)\n", d->name().c_str(), d->kind().c_str(), d->description().c_str(),
                  d->plugin_name().c_str());
    backplane::Device& dev = rt->device(selector);

    backplane::GraphFile gf;
    if (!graph_path.empty()) {
      gf = backplane::load_graph_file(graph_path);
    } else {
      gf.graph.input("x", BP_DTYPE_F32, {2, 3});
      gf.graph.node("y", "relu", {"x"});
      gf.graph.output("y");
      gf.inputs["x"] = backplane::HostTensor::from_doubles(BP_DTYPE_F32, {2, 3}, {-1, 2, -3, 4, -5, 6});
    }
    backplane::Plan plan = rt->compile(gf.graph, dev);
    auto outputs = plan.run(gf.inputs);
    std::printf("ran on device '%s' (%s, plugin %s)\n", dev.name().c_str(), dev.description().c_str(),
                dev.plugin_name().c_str());
    for (const auto& [name, t] : outputs) {
      std::printf("  %s %s:", name.c_str(), backplane::shape_str(t.shape).c_str());
      for (int64_t i = 0; i < t.numel() && i < 8; ++i) std::printf(" %g", t.get(i));
      std::printf("\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "host_app: %s\n", e.what());
    return 1;
  }
}
