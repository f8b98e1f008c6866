// Regression test: a host that keeps its Runtime in a static. The Runtime is
// constructed before any plugin is loaded, so at process exit its destructor
// (which shuts the plugins down and unloads them) runs after the plugins' own
// static destructors. The Vulkan plugin once kept its instance and devices in
// a function-local static and crashed here at exit; the remote plugin its
// list of instances. Runs one op on vulkan0 and
// must exit 0; exits 77 (skipped) when there is no Vulkan device.
#include <backplane/backplane.hpp>
#include <cstdio>
#include <exception>
#include <memory>

namespace {

backplane::Runtime& runtime() {
  static std::unique_ptr<backplane::Runtime> rt = backplane::Runtime::create();
  return *rt;
}

}  // namespace

int main() {
  backplane::Device* dev = nullptr;
  try {
    dev = &runtime().device("vulkan0");
  } catch (const std::exception& e) {
    std::printf("skipped: no vulkan0 (%s)\n", e.what());
    return 77;  // the static Runtime still shuts the loaded plugin down at exit
  }
  // Every plugin loaded, so every one is shut down from the static at exit
  // (the remote plugin's instance list was once destroyed before that).
  runtime().load_all();
  try {
    backplane::Graph g;
    g.input("a", BP_DTYPE_F32, {4});
    g.input("b", BP_DTYPE_F32, {4});
    g.node("y", "add", {"a", "b"});
    g.output("y");
    backplane::HostTensor a(BP_DTYPE_F32, {4}), b(BP_DTYPE_F32, {4});
    for (int64_t i = 0; i < 4; ++i) {
      a.set(i, static_cast<double>(i));
      b.set(i, 10.0);
    }
    auto out = runtime().run_graph(g, *dev, {{"a", a}, {"b", b}});
    const backplane::HostTensor& y = out.at("y");
    for (int64_t i = 0; i < 4; ++i)
      if (y.get(i) != static_cast<double>(i) + 10.0) {
        std::printf("wrong result: y[%lld] = %g\n", static_cast<long long>(i), y.get(i));
        return 1;
      }
  } catch (const std::exception& e) {
    std::printf("failed: %s\n", e.what());
    return 1;
  }
  std::printf("add on %s ok; exiting with the Runtime in a static\n", dev->name().c_str());
  return 0;
}
