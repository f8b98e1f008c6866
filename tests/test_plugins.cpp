// Broken plugins built by the test build. Each must be rejected (or its
// failure contained) with its own message naming the plugin, while the CPU
// plugin keeps working in the same runtime.
#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

using namespace backplane;

namespace {

std::unique_ptr<Runtime> fixture_runtime() {
  RuntimeOptions opts;
  opts.use_environment = false;
  opts.use_default_path = true;  // the CPU plugin
  opts.plugin_paths = {BACKPLANE_FIXTURE_DIR};
  return Runtime::create(opts);
}

const PluginInfo& plugin(const Runtime& rt, const std::string& name) {
  for (const auto& p : rt.plugins())
    if (p.name == name) return p;
  FAIL("plugin " << name << " not found");
  throw std::logic_error("unreachable");
}

HostTensor f32(Shape shape, std::vector<double> v) { return HostTensor::from_doubles(BP_DTYPE_F32, std::move(shape), v); }

Graph add_graph() {
  Graph g;
  g.input("a", BP_DTYPE_F32, {3});
  g.input("b", BP_DTYPE_F32, {3});
  g.node("c", "add", {"a", "b"});
  g.output("c");
  return g;
}

void expect_cpu_works(Runtime& rt) {
  Device& cpu = rt.device("cpu");
  auto out = rt.run_graph(add_graph(), cpu, {{"a", f32({3}, {1, 2, 3})}, {"b", f32({3}, {10, 20, 30})}});
  CHECK(out["c"].get(2) == 33.0);
}

}  // namespace

TEST_CASE("each broken plugin is rejected with its own message", "[plugins]") {
  auto rt = fixture_runtime();
  rt->load_all();
  struct Expect {
    const char* name;
    const char* message;
  };
  const Expect cases[] = {
      {"fx_missing", "does not exist"},
      {"fx_noentry", "does not export the entry symbol 'backplane_plugin_entry'"},
      {"fx_abi99", "fixture speaks only ABI 99.0"},
      {"fx_mismatch", "library registers kernel #1 mul(f32, f32) -> f32"},
      {"fx_initfail", "fixture device is not present"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    const auto& p = plugin(*rt, c.name);
    CHECK(p.state == PluginState::Rejected);
    CHECK_THAT(p.rejection, Catch::Contains(std::string("plugin '") + c.name + "'") && Catch::Contains(c.message));
  }
  // Malformed manifests never become plugins; they are reported with the file.
  std::string errors;
  for (const auto& [path, why] : rt->manifest_errors()) errors += why + "\n";
  CHECK_THAT(errors, Catch::Contains("fx_malformed.json") && Catch::Contains("malformed JSON"));
  CHECK_THAT(errors, Catch::Contains("fx_schema.json") && Catch::Contains("toaster"));
  // The good ones load, and the CPU plugin is untouched.
  CHECK(plugin(*rt, "fx_good").state == PluginState::Loaded);
  CHECK(plugin(*rt, "cpu").state == PluginState::Loaded);
  expect_cpu_works(*rt);
  // Rejected devices are listed with why.
  bool listed = false;
  for (const auto& d : rt->devices())
    if (d.plugin == "fx_abi99") listed = d.state == PluginState::Rejected && !d.rejection.empty();
  CHECK(listed);
}

TEST_CASE("a kernel that fails or throws becomes an error naming the node", "[plugins]") {
  auto rt = fixture_runtime();
  for (const char* name : {"fx_kerror", "fx_kthrow"}) {
    INFO(name);
    Device& dev = rt->device(name);
    Plan plan = rt->compile(add_graph(), dev);
    try {
      plan.run({{"a", f32({3}, {1, 2, 3})}, {"b", f32({3}, {1, 2, 3})}});
      FAIL("the kernel's failure was not reported");
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Catch::Contains("node 'c' (add"));
      if (std::string(name) == "fx_kerror") {
        CHECK_THAT(msg, Catch::Contains("deliberate failure"));
        CHECK(e.code() == BP_ERR_OUT_OF_RANGE);
      } else {
        CHECK_THAT(msg, Catch::Contains("deliberate C++ exception"));
        CHECK(e.code() == BP_ERR_INTERNAL);
      }
    }
  }
  expect_cpu_works(*rt);
}

TEST_CASE("a working third plugin runs beside the CPU plugin", "[plugins]") {
  auto rt = fixture_runtime();
  Device& dev = rt->device("fx_good");
  CHECK(dev.plugin_name() == "fx_good");
  auto out = rt->run_graph(add_graph(), dev, {{"a", f32({3}, {1, 2, 3})}, {"b", f32({3}, {4, 5, 6})}});
  CHECK(out["c"].get(0) == 5.0);
  // An op it lacks: the error lists what the device does offer.
  Graph g;
  g.input("a", BP_DTYPE_F32, {3});
  g.node("r", "relu", {"a"});
  g.output("r");
  CHECK_THROWS_WITH(rt->compile(g, dev), Catch::Contains("has no kernel relu(f32) -> f32") &&
                                             Catch::Contains("fx_good"));
  expect_cpu_works(*rt);
}

TEST_CASE("device selection by name, kind and auto", "[plugins]") {
  auto rt = fixture_runtime();
  CHECK(rt->device("cpu").name() == "cpu");
  CHECK(rt->device("fx_good").name() == "fx_good");
  CHECK_THROWS_WITH(rt->device("quantum"), Catch::Contains("no device matches 'quantum'"));
  CHECK_THROWS_WITH(rt->device("fx_abi99"), Catch::Contains("rejected"));
}
