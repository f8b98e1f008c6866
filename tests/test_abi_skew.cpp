// Version skew between the host (ABI 2.x) and plugins built against other
// headers (tests/CMakeLists.txt builds each in fixtures/skew):
//  - abi13: a C plugin built against the ABI 1.3 header, adapted by the host's
//    1.x shim; its runs are keyed on the calling thread, and its kernels fail
//    when called outside begin()..synchronize() on their thread.
//  - fx_newer: built against this header with the minor one higher and an
//    entry appended to the table; loads with that entry unread.
//  - fx_needs_newer: the same, but it needs the newer minor and says so.
//  - fx_abi3: answers with a table of major 3.
#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

#include <thread>

using namespace backplane;

namespace {

std::unique_ptr<Runtime> skew_runtime() {
  RuntimeOptions opts;
  opts.use_environment = false;
  opts.use_default_path = true;  // the CPU plugin beside them
  opts.plugin_paths = {BACKPLANE_SKEW_DIR};
  auto rt = Runtime::create(opts);
  rt->load_all();
  return rt;
}

const PluginInfo& plugin(const Runtime& rt, const std::string& name) {
  for (const auto& p : rt.plugins())
    if (p.name == name) return p;
  FAIL("plugin " << name << " not found");
  throw std::logic_error("unreachable");
}

HostTensor f32(Shape shape, std::vector<double> v) { return HostTensor::from_doubles(BP_DTYPE_F32, std::move(shape), v); }

// relu(a * b + a) over a transposed view of b (strided inputs).
Graph mixed_graph() {
  Graph g;
  g.input("a", BP_DTYPE_F32, {2, 3});
  g.input("bt", BP_DTYPE_F32, {3, 2});
  g.node("b", "transpose", {"bt"}, {{"dim0", 0}, {"dim1", 1}});
  g.node("ab", "mul", {"a", "b"});
  g.node("s", "add", {"ab", "a"});
  g.node("y", "relu", {"s"});
  g.output("y");
  return g;
}

}  // namespace

TEST_CASE("a plugin built against ABI 1.3 loads through the shim and runs", "[plugins][abi]") {
  auto rt = skew_runtime();
  const PluginInfo& p = plugin(*rt, "abi13");
  INFO(p.rejection);
  REQUIRE(p.state == PluginState::Loaded);
  CHECK(p.abi_version == "1.3");
  Device& dev = rt->device("abi13dev");
  const HostTensor a = f32({2, 3}, {1, -2, 3, -4, 5, -6});
  const HostTensor bt = f32({3, 2}, {10, 40, 20, 50, 30, 60});  // b = [[10, 20, 30], [40, 50, 60]]
  Plan plan = rt->compile(mixed_graph(), dev);
  // Every node ran on the 1.3 device (the kernels fail outside a run on
  // their thread, so the shim's begin/synchronize drove them).
  for (const auto& pl : plan.placement())
    if (pl.op == "mul" || pl.op == "add" || pl.op == "relu") CHECK(pl.device == "abi13dev");
  auto out = plan.run({{"a", a}, {"bt", bt}});
  // relu(a*b + a), by hand.
  const double want[6] = {11, 0, 93, 0, 255, 0};
  for (int i = 0; i < 6; ++i) CHECK(out["y"].get(i) == want[i]);
}

TEST_CASE("a 1.3 plugin's runs on several threads stay on their threads", "[plugins][abi][concurrency]") {
  auto rt = skew_runtime();
  REQUIRE(plugin(*rt, "abi13").state == PluginState::Loaded);
  Device& dev = rt->device("abi13dev");
  std::vector<std::string> errors(4);
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t)
    pool.emplace_back([&, t] {
      try {
        Plan plan = rt->compile(mixed_graph(), dev);
        for (int i = 0; i < 20; ++i) {
          const double k = t * 100 + i;
          auto out = plan.run({{"a", f32({2, 3}, {k, 1, 1, 1, 1, 1})}, {"bt", f32({3, 2}, {1, 0, 0, 0, 0, 0})}});
          if (out["y"].get(0) != 2 * k) errors[static_cast<size_t>(t)] = "wrong value on thread " + std::to_string(t);
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(t)] = e.what();
      }
    });
  for (auto& th : pool) th.join();
  for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("a 1.3 plugin's call times reach a profile through the shim", "[plugins][abi][profile]") {
  auto rt = skew_runtime();
  REQUIRE(plugin(*rt, "abi13").state == PluginState::Loaded);
  CompileOptions co;
  co.profile = true;
  Plan plan = rt->compile(mixed_graph(), rt->device("abi13dev"), co);
  plan.run({{"a", f32({2, 3}, {1, 2, 3, 4, 5, 6})}, {"bt", f32({3, 2}, {1, 2, 3, 4, 5, 6})}});
  int timed = 0;
  for (const auto& s : plan.profile())
    if (!s.transfer && s.device == "abi13dev" && s.device_seconds >= 0) {
      CHECK(s.device_seconds == Approx(1e-6));  // the fixture's 1000 ns per call
      ++timed;
    }
  CHECK(timed >= 3);  // mul, add, relu (and the transpose's copy, if placed there)
}

TEST_CASE("a plugin built against a newer minor loads with its newer entries unread", "[plugins][abi]") {
  auto rt = skew_runtime();
  const PluginInfo& p = plugin(*rt, "fx_newer");
  INFO(p.rejection);
  REQUIRE(p.state == PluginState::Loaded);
  CHECK(p.abi_version == std::to_string(BP_ABI_VERSION_MAJOR) + "." + std::to_string(BP_ABI_VERSION_MINOR + 1));
  Graph g;
  g.input("a", BP_DTYPE_F32, {3});
  g.input("b", BP_DTYPE_F32, {3});
  g.node("c", "add", {"a", "b"});
  g.output("c");
  auto out = rt->run_graph(g, rt->device("fx_newer"), {{"a", f32({3}, {1, 2, 3})}, {"b", f32({3}, {10, 20, 30})}});
  CHECK(out["c"].get(2) == 33.0);
}

TEST_CASE("a plugin that needs a newer minor, or speaks another major, is refused naming both versions",
          "[plugins][abi]") {
  auto rt = skew_runtime();
  const PluginInfo& needs = plugin(*rt, "fx_needs_newer");
  CHECK(needs.state == PluginState::Rejected);
  const std::string host = std::to_string(BP_ABI_VERSION_MAJOR) + "." + std::to_string(BP_ABI_VERSION_MINOR);
  const std::string newer = std::to_string(BP_ABI_VERSION_MAJOR) + "." + std::to_string(BP_ABI_VERSION_MINOR + 1);
  CHECK_THAT(needs.rejection, Catch::Contains("needs ABI " + newer + " for future_entry") && Catch::Contains(host));
  const PluginInfo& other = plugin(*rt, "fx_abi3");
  CHECK(other.state == PluginState::Rejected);
  CHECK_THAT(other.rejection, Catch::Contains("speaks ABI 3.0") && Catch::Contains("this host speaks " + host));
  // The others keep working beside them.
  CHECK(plugin(*rt, "abi13").state == PluginState::Loaded);
  CHECK(plugin(*rt, "cpu").state == PluginState::Loaded);
}
