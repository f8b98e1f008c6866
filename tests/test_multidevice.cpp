// One graph across several devices: the test plugin "partial" (partial0,
// host memory, f32 add/mul/relu/exp/contiguous and vendor ops with
// decompositions) beside the CPU and Vulkan plugins.
#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <random>

using namespace backplane;

namespace {

std::unique_ptr<Runtime> runtime_with(const std::string& folder) {
  RuntimeOptions opts;
  opts.use_environment = false;
  opts.use_default_path = true;  // cpu, vulkan
  opts.plugin_paths = {std::string(BACKPLANE_FIXTURE_DIR) + "/" + folder};
  return Runtime::create(opts);
}

HostTensor random_f32(Shape shape, uint64_t seed, double lo = -2, double hi = 2) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

// Every output of `a` equals `b`'s within docs/ops.md's f32 reduction bound.
void check_same(const std::map<std::string, HostTensor>& a, const std::map<std::string, HostTensor>& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO("output " << name);
    const HostTensor& u = b.at(name);
    REQUIRE(t.dtype == u.dtype);
    REQUIRE(t.shape == u.shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double x = t.get(i), y = u.get(i);
      if (std::isnan(x) || std::isnan(y)) {
        CHECK(std::isnan(x) == std::isnan(y));
        continue;
      }
      const double err = std::abs(x - y);
      CHECK((err <= 1e-6 || err <= 1e-4 * std::abs(y)));
    }
  }
}

Device* vulkan(Runtime& rt) {
  for (auto* d : rt.all_devices())
    if (d->plugin_name() == "vulkan") return d;
  return nullptr;
}

size_t count_transfers(const Plan& p) { return p.transfers().size(); }

// x -> add -> mul -> softmax (partial0 lacks it) -> relu -> exp
Graph chain_graph() {
  Graph g;
  g.input("x", BP_DTYPE_F32, {8, 32});
  g.input("b", BP_DTYPE_F32, {32});
  g.node("a", "add", {"x", "b"});
  g.node("m", "mul", {"a", "a"});
  g.node("s", "softmax", {"m"}, {{"dim", -1}});
  g.node("r", "relu", {"s"});
  g.node("e", "exp", {"r"});
  g.output("e");
  g.output("a");
  return g;
}

// f64 references, independent of every plugin: a comparison with another
// plan can pass vacuously when both run the same kernels.
HostTensor f32_of(const std::vector<double>& v, Shape shape) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v[static_cast<size_t>(i)]);
  return t;
}
std::vector<double> values(const HostTensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.get(i);
  return v;
}
std::vector<double> softmax_rows(std::vector<double> v, size_t cols) {
  for (size_t r = 0; r < v.size() / cols; ++r) {
    double* row = v.data() + r * cols;
    const double m = *std::max_element(row, row + cols);
    double sum = 0;
    for (size_t c = 0; c < cols; ++c) sum += row[c] = std::exp(row[c] - m);
    for (size_t c = 0; c < cols; ++c) row[c] /= sum;
  }
  return v;
}
// chain_graph's outputs: a = x + b, e = exp(relu(softmax(a * a))).
std::map<std::string, HostTensor> chain_reference(const HostTensor& x, const HostTensor& b) {
  std::vector<double> a = values(x), bv = values(b), m(a.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] += bv[i % 32], m[i] = a[i] * a[i];
  std::vector<double> e = softmax_rows(m, 32);
  for (double& v : e) v = std::exp(std::max(v, 0.0));
  return {{"a", f32_of(a, x.shape)}, {"e", f32_of(e, x.shape)}};
}

std::string device_of(const Plan& p, const std::string& node) {
  for (const auto& pl : p.placement())
    if (pl.node == node) return pl.device;
  return "";
}

}  // namespace

TEST_CASE("a plugin that covers a few ops takes part; the CPU runs the rest", "[multidevice]") {
  auto rt = runtime_with("partial");
  const auto list = rt->select_devices("partial0,cpu");
  REQUIRE(list.size() == 2);
  const std::map<std::string, HostTensor> in = {{"x", random_f32({8, 32}, 1)}, {"b", random_f32({32}, 2)}};
  Plan mixed = rt->compile(chain_graph(), list);
  const auto want = chain_reference(in.at("x"), in.at("b"));
  check_same(mixed.run(in), want);
  CHECK(device_of(mixed, "a") == "partial0");
  CHECK(device_of(mixed, "m") == "partial0");
  CHECK(device_of(mixed, "s") == "cpu");
  CHECK(device_of(mixed, "e") == "partial0");
  // Two crossings (m to the cpu, s back), both zero-copy: the CPU and
  // partial0 address the same host memory.
  const auto t = mixed.transfers();
  REQUIRE(t.size() == 2);
  CHECK(t[0].value == "m");
  CHECK(t[0].from == "partial0");
  CHECK(t[0].to == "cpu");
  CHECK(t[0].zero_copy);
  CHECK(t[0].bytes == 0);
  CHECK(t[1].value == "s");
  CHECK(t[1].zero_copy);
  const std::string ex = mixed.explain();
  CHECK_THAT(ex, Catch::Contains("s (softmax)"));
  CHECK_THAT(ex, Catch::Contains("has no kernel softmax(f32) -> f32"));
  // Run again: same answers (buffers reused, nothing re-resolved).
  check_same(mixed.run(in), want);
}

TEST_CASE("a single device is a list of one and behaves as before", "[multidevice]") {
  auto rt = runtime_with("partial");
  Plan p = rt->compile(chain_graph(), rt->select_devices("cpu"));
  CHECK(p.devices() == std::vector<std::string>{"cpu"});
  CHECK(count_transfers(p) == 0);
  try {
    rt->compile(chain_graph(), rt->device("partial0"));
    FAIL("partial0 alone has no softmax");
  } catch (const Error& e) {
    CHECK_THAT(e.what(),
               Catch::Contains("node 's' (softmax): device 'partial0' has no kernel softmax(f32) -> f32"));
    CHECK(e.code() == BP_ERR_UNIMPLEMENTED);
  }
}

TEST_CASE("a cheap node between two nodes of one device stays there", "[multidevice]") {
  auto rt = runtime_with("partial");
  Graph g;
  g.input("x", BP_DTYPE_F32, {4, 16});
  g.node("s1", "softmax", {"x"}, {{"dim", -1}});
  g.node("r", "relu", {"s1"});  // partial0 could run it, first in the list
  g.node("s2", "softmax", {"r"}, {{"dim", -1}});
  g.output("s2");
  Plan p = rt->compile(g, rt->select_devices("partial0,cpu"));
  CHECK(device_of(p, "r") == "cpu");
  CHECK(count_transfers(p) == 0);
  for (const auto& pl : p.placement())
    if (pl.node == "r") CHECK_THAT(pl.reason, Catch::Contains("fewer bytes"));
  const std::map<std::string, HostTensor> in = {{"x", random_f32({4, 16}, 3)}};
  std::vector<double> r = softmax_rows(values(in.at("x")), 16);
  for (double& v : r) v = std::max(v, 0.0);
  check_same(p.run(in), {{"s2", f32_of(softmax_rows(r, 16), {4, 16})}});
}

TEST_CASE("pins are honoured, and a pin that cannot run its node is an error", "[multidevice]") {
  auto rt = runtime_with("partial");
  {
    Graph g = chain_graph();
    Graph pinned;
    pinned.input("x", BP_DTYPE_F32, {8, 32});
    pinned.input("b", BP_DTYPE_F32, {32});
    for (const auto& n : g.nodes()) pinned.node(n.name, n.op, n.inputs, n.params, n.name == "e" ? "cpu" : "");
    pinned.output("e");
    Plan p = rt->compile(pinned, rt->select_devices("partial0,cpu"));
    CHECK(device_of(p, "e") == "cpu");
    CHECK(device_of(p, "a") == "partial0");
  }
  Graph bad;
  bad.input("x", BP_DTYPE_F32, {4});
  bad.node("s", "softmax", {"x"}, {{"dim", 0}}, "partial0");
  bad.output("s");
  try {
    rt->compile(bad, rt->select_devices("cpu"));
    FAIL("the pin cannot run softmax");
  } catch (const Error& e) {
    CHECK_THAT(
        e.what(),
        Catch::Contains(
            "node 's' (softmax) is pinned to device 'partial0', which has no kernel softmax(f32) -> f32"));
    CHECK_THAT(e.what(), Catch::Contains("it offers:"));
  }
  Graph unknown;
  unknown.input("x", BP_DTYPE_F32, {4});
  unknown.node("r", "relu", {"x"}, {}, "nosuchdevice");
  unknown.output("r");
  CHECK_THROWS_WITH(rt->compile(unknown, rt->select_devices("cpu")),
                    Catch::Contains("node 'r' (relu) is pinned to device 'nosuchdevice'") &&
                        Catch::Contains("no device matches"));
  Graph view_pin;
  view_pin.input("x", BP_DTYPE_F32, {2, 3});
  view_pin.node("t", "transpose", {"x"}, {{"dim0", 0}, {"dim1", 1}}, "cpu");
  view_pin.output("t");
  CHECK_THROWS_WITH(rt->compile(view_pin, rt->select_devices("cpu")),
                    Catch::Contains("a view has no device of its own"));
}

TEST_CASE("graph files pin nodes with \"device\"", "[multidevice]") {
  const Json j = Json::parse(R"({"inputs": {"x": {"value": [1, -2, 3], "dtype": "f32"}},
    "nodes": [{"name": "r", "op": "relu", "inputs": ["x"], "device": "cpu"}], "outputs": ["r"]})");
  const GraphFile gf = parse_graph_json(j, ".");
  REQUIRE(gf.graph.nodes().size() == 1);
  CHECK(gf.graph.nodes()[0].device == "cpu");
  const Json bad =
      Json::parse(R"({"nodes": [{"name": "r", "op": "relu", "inputs": [], "device": 3}], "outputs": []})");
  CHECK_THROWS_WITH(parse_graph_json(bad, "."), Catch::Contains("node 'r': 'device' must be a device name"));
}

TEST_CASE("auto lists every usable device, CPU-kind last, the CPU plugin first among them", "[multidevice]") {
  auto rt = runtime_with("partial");
  const auto list = rt->select_devices("auto");
  std::vector<std::string> names;
  for (auto* d : list) names.push_back(d->name());
  REQUIRE(names.size() >= 2);
  CHECK(names.front() == "partial0");  // an accelerator before CPU-kind devices
  const auto cpu = std::find(names.begin(), names.end(), "cpu");
  REQUIRE(cpu != names.end());
  if (Device* vk = vulkan(*rt); vk && vk->kind() == "cpu")
    CHECK(std::find(names.begin(), names.end(), vk->name()) > cpu);  // lavapipe after the CPU plugin
  // The kind before loading lists what the manifest allows; after loading,
  // the device's kind is one of them.
  for (const auto& p : rt->plugins())
    if (p.name == "vulkan") {
      CHECK(std::find(p.device_kinds.begin(), p.device_kinds.end(), "cpu") != p.device_kinds.end());
      if (Device* vk = vulkan(*rt))
        CHECK(std::find(p.device_kinds.begin(), p.device_kinds.end(), vk->kind()) != p.device_kinds.end());
    }
  // A graph never fails for want of a kernel the CPU plugin has.
  const std::map<std::string, HostTensor> in = {{"x", random_f32({8, 32}, 4)}, {"b", random_f32({32}, 5)}};
  check_same(rt->compile(chain_graph(), list).run(in), chain_reference(in.at("x"), in.at("b")));
  CHECK_THROWS_WITH(rt->select_devices("cpu,,vulkan0"), Catch::Contains("an empty entry"));
  CHECK_THROWS_WITH(rt->select_devices("cpu,nosuch9"), Catch::Contains("no device matches 'nosuch9'"));
}

TEST_CASE("a value read on another device crosses once; copies are counted in bytes", "[multidevice]") {
  auto rt = runtime_with("partial");
  Device* vk = vulkan(*rt);
  if (!vk) {
    WARN("SKIPPED: no Vulkan device");
    return;
  }
  Graph g;
  g.input("x", BP_DTYPE_F32, {64, 16});
  g.node("y", "add", {"x", "x"});
  g.node("a", "relu", {"y"}, {}, vk->name());
  g.node("b", "exp", {"y"}, {}, vk->name());
  g.node("c", "mul", {"a", "b"}, {}, vk->name());
  g.node("d", "softmax", {"c"}, {{"dim", -1}});
  g.output("d");
  Plan p = rt->compile(g, rt->select_devices("cpu"));
  const auto t = p.transfers();
  REQUIRE(t.size() == 2);
  // y: cpu -> vulkan once for both readers: zero-copy where the driver
  // imports host memory (VK_EXT_external_memory_host: lavapipe does), else
  // a real copy of 64*16 floats.
  CHECK(t[0].value == "y");
  CHECK(t[0].from == "cpu");
  CHECK(t[0].to == vk->name());
  const bool imported = t[0].zero_copy;
  CHECK(t[0].bytes == (imported ? 0u : 64u * 16 * 4));
  // c: back to the CPU, which reads the mapped memory in place (lavapipe's
  // memory is host-visible); a device-only GPU costs a copy instead.
  CHECK(t[1].value == "c");
  CHECK(t[1].to == "cpu");
  const bool mapped = t[1].zero_copy;
  CHECK(t[1].bytes == (mapped ? 0u : 64u * 16 * 4));
  bool described = false;
  for (const auto& line : p.describe())
    described = described || line.find("transfer 'y' from cpu to " + vk->name() + ": " +
                                       (imported ? "zero-copy" : "4096 bytes")) != std::string::npos;
  CHECK(described);
  const std::map<std::string, HostTensor> in = {{"x", random_f32({64, 16}, 6)}};
  // d = softmax(relu(2x) * exp(2x)), in f64.
  std::vector<double> c = values(in.at("x"));
  for (double& v : c) v = std::max(2 * v, 0.0) * std::exp(2 * v);
  const std::map<std::string, HostTensor> want = {{"d", f32_of(softmax_rows(c, 16), {64, 16})}};
  check_same(p.run(in), want);
  check_same(p.run(in), want);
}

TEST_CASE("bundles are read across devices through view and view_owned", "[multidevice]") {
  auto rt = runtime_with("partial");
  Graph g;
  g.input("x", BP_DTYPE_F32, {6, 10});
  g.node("e", "exp", {"x"});                            // partial0
  g.node("t", "topk", {"e"}, {{"k", 3}, {"dim", -1}});  // cpu (partial0 lacks it)
  g.node("v", "view", {"t"}, {{"slot", 0}});
  g.node("r", "relu", {"v"});  // partial0 reads slot 0
  g.node("r2", "add", {"r", "r"});
  g.node("i", "view_owned", {"t"}, {{"slot", 1}});  // i64: only the cpu copies it
  g.node("vm", "var_mean", {"r2"}, {{"dims", {-1}}});
  g.node("var", "view", {"vm"}, {{"slot", 0}});
  g.node("mean", "view_owned", {"vm"}, {{"slot", 1}});
  g.node("m2", "mul", {"mean", "mean"});
  g.output("i");
  g.output("var");
  g.output("m2");
  std::vector<std::string> lists = {"partial0,cpu"};
  if (Device* vk = vulkan(*rt)) lists.push_back("partial0," + vk->name() + ",cpu");
  const std::map<std::string, HostTensor> in = {{"x", random_f32({6, 10}, 7)}};
  const auto want = rt->compile(g, rt->device("cpu")).run(in);
  for (const auto& l : lists) {
    INFO("devices " << l);
    Plan p = rt->compile(g, rt->select_devices(l));
    CHECK(device_of(p, "r") == "partial0");
    CHECK(count_transfers(p) >= 2);
    check_same(p.run(in), want);
  }
}

TEST_CASE("a vendor op runs its kernel where a device has it, its decomposition elsewhere", "[multidevice]") {
  auto rt = runtime_with("partial");
  Graph g;
  g.input("x", BP_DTYPE_F32, {3, 8});
  g.node("y", "partial.scale_shift", {"x"}, {{"scale", 2.0}, {"shift", 1.0}});
  g.node("mm", "partial.minmax", {"y"});
  g.node("lo", "view", {"mm"}, {{"slot", 0}});
  g.node("hi", "view_owned", {"mm"}, {{"slot", 1}});
  g.node("h", "partial.first_half", {"y"}, {{"times", 2}});  // decomposition only, anywhere
  g.output("y");
  g.output("lo");
  g.output("hi");
  g.output("h");
  const HostTensor x = random_f32({3, 8}, 8);
  const std::map<std::string, HostTensor> in = {{"x", x}};
  Plan on_cpu = rt->compile(g, rt->device("cpu"));
  Plan mixed = rt->compile(g, rt->select_devices("partial0,cpu"));
  CHECK(device_of(mixed, "y") == "partial0");
  CHECK(device_of(mixed, "mm") == "partial0");
  CHECK(device_of(on_cpu, "y/y") == "cpu");  // the decomposition's node, named under the vendor node
  CHECK_THAT(on_cpu.explain(), Catch::Contains("runs its decomposition"));
  const auto a = on_cpu.run(in);
  check_same(a, mixed.run(in));
  // By hand: y = 2x + 1, lo/hi = row min/max, h = 3 * y[:, :4].
  for (int64_t r = 0; r < 3; ++r) {
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t c = 0; c < 8; ++c) {
      const double y = 2 * x.get(r * 8 + c) + 1;
      CHECK(a.at("y").get(r * 8 + c) == Approx(y).epsilon(1e-6));
      lo = std::min(lo, y);
      hi = std::max(hi, y);
      if (c < 4) CHECK(a.at("h").get(r * 4 + c) == Approx(3 * y).epsilon(1e-6));
    }
    CHECK(a.at("lo").get(r) == Approx(lo).epsilon(1e-6));
    CHECK(a.at("hi").get(r) == Approx(hi).epsilon(1e-6));
  }
  CHECK(a.at("h").shape == Shape{3, 4});
  // Strict params: an unknown one is an error naming the node.
  Graph bad;
  bad.input("x", BP_DTYPE_F32, {2});
  bad.node("y", "partial.scale_shift", {"x"}, {{"scael", 2.0}});
  bad.output("y");
  CHECK_THROWS_WITH(rt->compile(bad, rt->device("cpu")),
                    Catch::Contains("node 'y' (partial.scale_shift): unknown param 'scael'"));
  // A vendor op nobody declares and no device runs.
  Graph none;
  none.input("x", BP_DTYPE_F32, {2});
  none.node("y", "nobody.op", {"x"});
  none.output("y");
  CHECK_THROWS_WITH(
      rt->compile(none, rt->select_devices("partial0,cpu")),
      Catch::Contains("no device of the list (partial0, cpu) has a kernel for the vendor op 'nobody.op'"));
}
