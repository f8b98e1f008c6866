// Misuse of the host API and hostile plugins: each is an Error with a clear
// message, never a crash, a wrong answer or unbounded work.
#include <backplane/backplane.hpp>

#include <backplane/sdk/plugin.hpp>
#include <catch2/catch.hpp>

#include <atomic>
#include <unistd.h>
#include <fstream>
#include <filesystem>
#include <thread>

using namespace backplane;
namespace sdk = backplane::sdk;

namespace {

std::unique_ptr<Runtime> cpu_runtime(uint64_t max_memory = 0) {
  RuntimeOptions opts;
  opts.use_environment = false;
  opts.max_memory_bytes = max_memory;
  return Runtime::create(opts);
}

std::unique_ptr<Runtime> fixture_runtime() {
  RuntimeOptions opts;
  opts.use_environment = false;
  opts.plugin_paths = {BACKPLANE_FIXTURE_DIR};
  return Runtime::create(opts);
}

HostTensor f32(Shape shape, std::vector<double> v) { return HostTensor::from_doubles(BP_DTYPE_F32, std::move(shape), v); }

// x -> t = x + x -> y = t * x ; outputs y only.
Graph twice_graph() {
  Graph g;
  g.input("x", BP_DTYPE_F32, {4});
  g.node("t", "add", {"x", "x"});
  g.node("y", "mul", {"t", "x"});
  g.output("y");
  return g;
}

}  // namespace

TEST_CASE("set_input refuses a tensor whose bytes do not match its shape", "[safety]") {
  auto rt = cpu_runtime();
  Plan p = rt->compile(twice_graph(), rt->device("cpu"));
  HostTensor more = f32({4}, {1, 2, 3, 4});
  more.bytes.resize(64);  // too many: a heap overflow before
  CHECK_THROWS_WITH(p.set_input("x", more), Catch::Contains("input 'x': the tensor holds 64 bytes; f32[4] needs 16"));
  HostTensor fewer = f32({4}, {1, 2, 3, 4});
  fewer.bytes.resize(8);  // too few: stale data from an earlier run before
  CHECK_THROWS_WITH(p.set_input("x", fewer), Catch::Contains("holds 8 bytes"));
}

TEST_CASE("execute with an input never set names the input", "[safety]") {
  auto rt = cpu_runtime();
  Plan p = rt->compile(twice_graph(), rt->device("cpu"));
  CHECK_THROWS_WITH(p.execute(), Catch::Contains("input 'x' was never set"));
  p.set_input("x", f32({4}, {1, 2, 3, 4}));
  p.execute();
  CHECK(p.output("y").get(3) == 32.0);
}

TEST_CASE("only outputs, or values kept at compile time, can be read", "[safety]") {
  auto rt = cpu_runtime();
  Plan p = rt->compile(twice_graph(), rt->device("cpu"));
  p.run({{"x", f32({4}, {1, 2, 3, 4})}});
  CHECK_THROWS_WITH(p.output("t"), Catch::Contains("'t' is not a graph output") && Catch::Contains("CompileOptions::keep"));
  CHECK_THROWS_WITH(p.output("nope"), Catch::Contains("plan has no value named 'nope'"));
  CompileOptions keep;
  keep.keep = {"t"};
  Plan k = rt->compile(twice_graph(), rt->device("cpu"), keep);
  k.run({{"x", f32({4}, {1, 2, 3, 4})}});
  CHECK(k.output("t").get(2) == 6.0);
  keep.keep = {"missing"};
  CHECK_THROWS_WITH(rt->compile(twice_graph(), rt->device("cpu"), keep), Catch::Contains("keep names 'missing'"));
}

TEST_CASE("typed access checks the dtype", "[safety]") {
  HostTensor t(BP_DTYPE_F32, {2});
  CHECK_NOTHROW(t.as<float>());
  CHECK_NOTHROW(t.as<uint32_t>());  // raw bits of the same size
  CHECK_THROWS_WITH(t.as<double>(), Catch::Contains("tensor of f32: typed access as a 8-byte float"));
  CHECK_THROWS_WITH(t.as<int32_t>(), Catch::Contains("signed integer"));
  HostTensor b(BP_DTYPE_BF16, {2});
  CHECK_NOTHROW(b.as<uint16_t>());
  CHECK_THROWS(b.as<int16_t>());
  HostTensor i(BP_DTYPE_I64, {1});
  CHECK_NOTHROW(i.as<int64_t>());
  CHECK_THROWS(i.as<double>());
}

TEST_CASE("huge shapes are errors, not bad_alloc", "[safety]") {
  CHECK_THROWS_WITH(HostTensor(BP_DTYPE_F32, {int64_t{1} << 40, int64_t{1} << 30}), Catch::Contains("overflows"));
  try {
    HostTensor(BP_DTYPE_F32, {int64_t{1} << 50});
    FAIL("4 PiB were allocated");
  } catch (const Error& e) {
    CHECK(e.code() == BP_ERR_OUT_OF_MEMORY);
    CHECK_THAT(e.what(), Catch::Contains("cannot allocate"));
  }
}

TEST_CASE("a value's byte size that overflows is an error naming it, never a wrapped buffer size", "[safety]") {
  // f32 [2^62] is 2^64 bytes: summed unchecked it wrapped to 0 and the plan
  // gave the kernel a 64-byte buffer to write 2^62 elements into.
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  const int64_t big = int64_t{1} << 62;
  auto refused = [&](const Graph& g, const std::string& name) {
    try {
      rt->compile(g, cpu);
      FAIL("compiled with a " + name + " of 2^64 bytes");
    } catch (const Error& e) {
      CHECK(e.code() == BP_ERR_OUT_OF_RANGE);
      CHECK_THAT(e.what(), Catch::Contains(name) && Catch::Contains("more bytes than a buffer can hold"));
    }
  };
  {
    Graph g;
    g.input("x", BP_DTYPE_F32, {big});
    g.node("y", "relu", {"x"});
    g.output("y");
    refused(g, "input 'x'");
  }
  {
    Graph g;  // the view is free; the kernel's output is not
    g.input("x", BP_DTYPE_F32, {1});
    g.node("b", "broadcast_to", {"x"}, {{"shape", {big}}});
    g.node("y", "relu", {"b"});
    g.output("y");
    refused(g, "node 'y'");
  }
  {
    Graph g;  // 2^31 x 2^31 elements of 8 bytes
    g.input("x", BP_DTYPE_F64, {1, 1});
    g.node("b", "broadcast_to", {"x"}, {{"shape", {int64_t{1} << 31, int64_t{1} << 31}}});
    g.node("y", "neg", {"b"});
    g.output("y");
    refused(g, "node 'y'");
  }
  // The runtime and its CPU are intact afterwards.
  Graph ok;
  ok.input("x", BP_DTYPE_F32, {2});
  ok.node("y", "neg", {"x"});
  ok.output("y");
  HostTensor x(BP_DTYPE_F32, {2});
  x.set(1, -2.0);
  CHECK(rt->compile(ok, cpu).run({{"x", x}}).at("y").get(1) == 2);
}

TEST_CASE("a plan over the memory budget fails at compile time, naming the bytes", "[safety]") {
  auto rt = cpu_runtime(1 << 20);
  Graph g;
  g.input("x", BP_DTYPE_F32, {512, 1024});  // 2 MiB
  g.node("y", "relu", {"x"});
  g.output("y");
  try {
    rt->compile(g, rt->device("cpu"));
    FAIL("4 MiB of buffers fit a 1 MiB budget");
  } catch (const Error& e) {
    CHECK(e.code() == BP_ERR_OUT_OF_MEMORY);
    CHECK_THAT(e.what(), Catch::Contains("over the budget of 1048576 bytes") && Catch::Contains("max_memory_bytes"));
  }
}

TEST_CASE("concurrent run() calls on one plan each get their own results", "[safety][concurrency]") {
  auto rt = cpu_runtime();
  Plan p = rt->compile(twice_graph(), rt->device("cpu"));
  std::atomic<int> wrong{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        const double v = t * 1000 + i;
        auto out = p.run({{"x", f32({4}, {v, v, v, v})}});
        if (out["y"].get(0) != static_cast<double>(static_cast<float>(2 * v * v))) ++wrong;
        ++done;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(done == 1200);
  CHECK(wrong == 0);
}

TEST_CASE("a plan outlives its runtime", "[safety]") {
  Plan p;
  {
    auto rt = cpu_runtime();
    p = rt->compile(twice_graph(), rt->device("cpu"));
  }
  auto out = p.run({{"x", f32({4}, {1, 2, 3, 4})}});
  CHECK(out["y"].get(1) == 8.0);
}

TEST_CASE("a plugin's device count and error messages are bounded", "[safety]") {
  auto rt = fixture_runtime();
  rt->load_all();
  for (const auto& p : rt->plugins())
    if (p.name == "fx_manydevices") {
      CHECK(p.state == PluginState::Rejected);
      CHECK_THAT(p.rejection, Catch::Contains("reports 4294967295 devices"));
    }
  Graph g;
  g.input("a", BP_DTYPE_F32, {3});
  g.node("c", "add", {"a", "a"});
  g.output("c");
  Plan p = rt->compile(g, rt->device("fx_hugeerror"));
  try {
    p.run({{"a", f32({3}, {1, 2, 3})}});
    FAIL("the kernel's error was lost");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.size() < 70 * 1024);
    CHECK_THAT(m, Catch::Contains("node 'c' (add)") && Catch::Contains("more bytes cut"));
  }
  // The CPU plugin in the same runtime keeps working.
  CHECK(rt->run_graph(g, rt->device("cpu"), {{"a", f32({3}, {1, 2, 3})}})["c"].get(2) == 6.0);
}

TEST_CASE("sdk::layout_fits refuses layouts outside their storage, overflow included", "[safety]") {
  auto layout = [](std::vector<int64_t> shape, std::vector<int64_t> strides, int64_t offset) {
    bp_layout l{};
    l.rank = static_cast<uint32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) {
      l.shape[i] = shape[i];
      l.strides[i] = strides[i];
    }
    l.offset = offset;
    return l;
  };
  CHECK(sdk::layout_fits(layout({2, 3}, {3, 1}, 0), 4, 0, 24));
  CHECK_FALSE(sdk::layout_fits(layout({2, 3}, {3, 1}, 0), 4, 0, 23));
  CHECK_FALSE(sdk::layout_fits(layout({2, 3}, {3, 1}, 1), 4, 0, 24));
  CHECK(sdk::layout_fits(layout({3}, {-1}, 2), 4, 0, 12));   // negative stride from the end
  CHECK_FALSE(sdk::layout_fits(layout({3}, {-1}, 1), 4, 0, 12));
  CHECK(sdk::layout_fits(layout({4, 0}, {1000, 1}, 99999), 4, 0, 0));  // empty: touches nothing
  CHECK(sdk::layout_fits(layout({5}, {0}, 0), 8, 64, 72));              // broadcast, at a byte offset
  CHECK_FALSE(sdk::layout_fits(layout({5}, {0}, 0), 8, 65, 72));
  CHECK_FALSE(sdk::layout_fits(layout({8, int64_t{1} << 61}, {int64_t{1} << 61, 1}, 0), 4, 0, 1 << 20));  // wraps
  CHECK_FALSE(sdk::layout_fits(layout({2}, {INT64_MAX}, 0), 1, 0, UINT64_MAX));
  CHECK_FALSE(sdk::layout_fits(layout({-1}, {1}, 0), 4, 0, 100));
}

TEST_CASE("matmul with an empty batch dim against a batch of one", "[safety]") {
  auto rt = cpu_runtime();
  for (const auto& [as, bs] : std::vector<std::pair<Shape, Shape>>{{{0, 7, 3}, {1, 3, 1}}, {{1, 7, 3}, {0, 3, 1}}}) {
    Graph g;
    g.input("a", BP_DTYPE_F32, as);
    g.input("b", BP_DTYPE_F32, bs);
    g.node("c", "matmul", {"a", "b"});
    g.output("c");
    auto out = rt->compile(g, rt->device("cpu")).run({{"a", HostTensor(BP_DTYPE_F32, as)}, {"b", HostTensor(BP_DTYPE_F32, bs)}});
    CHECK(out["c"].shape == Shape{0, 7, 1});
  }
}

TEST_CASE("auto skips broken plugins on the path", "[safety]") {
  auto rt = fixture_runtime();  // fx_missing, fx_noentry, fx_abi99, fx_initfail, ... beside cpu
  const auto list = rt->select_devices("auto");
  bool has_cpu = false;
  for (auto* d : list) has_cpu = has_cpu || d->name() == "cpu";
  CHECK(has_cpu);
  for (auto* d : list) CHECK(d->plugin_name() != "fx_initfail");
  CHECK(&rt->device("auto") == list.front());
  Graph g;
  g.input("a", BP_DTYPE_F32, {3});
  g.node("s", "softmax", {"a"}, {{"dim", 0}});  // no fixture has softmax: the CPU runs it
  g.output("s");
  const auto out = rt->compile(g, list).run({{"a", f32({3}, {0, 0, 0})}});
  CHECK(out.at("s").get(1) == Approx(1.0 / 3));
}

TEST_CASE("naming a rejected plugin's device is an error, never another plugin's device of that kind", "[safety]") {
  // A CPU plugin whose library is missing (rejected at load) beside a
  // plugin whose device is of kind "cpu" (fx_good, like lavapipe's vulkan0):
  // "cpu" once ran on the other plugin's device with exit 0.
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("bp_rejected_cpu_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(fs::path(BACKPLANE_FIXTURE_DIR) / "fx_good.json", dir / "fx_good.json", fs::copy_options::overwrite_existing);
  fs::copy_file(fs::path(BACKPLANE_FIXTURE_DIR) / "libfx_good.so", dir / "libfx_good.so", fs::copy_options::overwrite_existing);
  {
    std::ifstream in(fs::path(BACKPLANE_PLUGIN_DIR) / "cpu.json");
    Json m = Json::parse(in);
    m["plugin"]["library_path"] = "libbackplane_cpu_not_built.so";
    std::ofstream(dir / "cpu.json") << m.dump();
  }
  RuntimeOptions opts;
  opts.use_environment = false;
  opts.use_default_path = false;  // only the folder above
  opts.plugin_paths = {dir};
  auto rt = Runtime::create(opts);
  for (const char* name : {"cpu", "cpu0"}) {
    try {
      Device& d = rt->device(name);
      FAIL(std::string(name) + " selected " + d.name() + " of plugin " + d.plugin_name());
    } catch (const Error& e) {
      CHECK(e.code() == BP_ERR_UNAVAILABLE);
      CHECK_THAT(e.what(), Catch::Contains("plugin 'cpu' was rejected") && Catch::Contains("libbackplane_cpu_not_built.so"));
    }
  }
  CHECK_THROWS_WITH(rt->select_devices("fx_good0,cpu"), Catch::Contains("plugin 'cpu' was rejected"));
  // The other plugin still serves, by its own name and under auto, which
  // leaves the rejected plugin out.
  CHECK(rt->device("fx_good").plugin_name() == "fx_good");
  CHECK(rt->device("auto").plugin_name() == "fx_good");
  rt.reset();
  fs::remove_all(dir);
}

TEST_CASE("device(\"auto\") is the first device of select_devices(\"auto\")", "[safety]") {
  auto rt = cpu_runtime();
  CHECK(&rt->device("auto") == rt->select_devices("auto").front());
}

TEST_CASE("asking for a device whose manifest is broken says why", "[safety]") {
  auto rt = fixture_runtime();  // holds fx_malformed.json and fx_schema.json
  try {
    rt->device("fx_malformed");
    FAIL("a device from a malformed manifest was found");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("no device matches 'fx_malformed'") && Catch::Contains("fx_malformed.json is unusable"));
  }
}
