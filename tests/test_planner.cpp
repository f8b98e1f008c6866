// The planner and executor on the real CPU plugin: views, contiguize,
// bundles, buffer reuse, plan reuse, poisoning.
#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

using namespace backplane;

namespace {
std::unique_ptr<Runtime> cpu_runtime() {
  RuntimeOptions opts;
  opts.use_environment = false;
  return Runtime::create(opts);
}
HostTensor iota(bp_dtype dt, Shape shape) {
  HostTensor t(dt, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(i));
  return t;
}
}  // namespace

TEST_CASE("views feed kernels without copies; reshape of a transpose copies", "[planner]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  Graph g;
  g.input("x", BP_DTYPE_F32, {3, 4});
  g.node("t", "transpose", {"x"}, {{"dim0", 0}, {"dim1", 1}});  // [4, 3]
  g.node("s", "slice", {"t"}, {{"dim", 0}, {"start", 3}, {"end", 0}, {"step", -2}});  // rows 3, 1
  g.node("y", "neg", {"s"});
  g.node("flat", "reshape", {"t"}, {{"shape", {-1}}});
  g.output("y");
  g.output("flat");
  g.output("s");
  Plan plan = rt->compile(g, cpu);
  auto out = plan.run({{"x", iota(BP_DTYPE_F32, {3, 4})}});
  // t[r][c] = x[c][r] = 4c + r; s = rows 3 and 1 of t.
  const std::vector<double> y = {-3, -7, -11, -1, -5, -9};
  for (size_t i = 0; i < y.size(); ++i) CHECK(out["y"].get(static_cast<int64_t>(i)) == y[i]);
  CHECK(out["s"].get(1) == 7);  // a strided graph output is gathered on read
  CHECK(out["flat"].shape == Shape{12});
  CHECK(out["flat"].get(1) == 4);
  bool copied = false;
  for (const auto& d : plan.describe()) copied = copied || d.find("node 'flat' (reshape)") != std::string::npos;
  CHECK(copied);
}

TEST_CASE("bundles are read through view and view_owned", "[planner]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  Graph g;
  g.input("x", BP_DTYPE_F32, {2, 5});
  g.node("t", "topk", {"x"}, {{"k", 2}});
  g.node("v", "view", {"t"}, {{"slot", 0}});
  g.node("i", "view_owned", {"t"}, {{"slot", 1}});
  g.output("v");
  g.output("i");
  auto x = HostTensor::from_doubles(BP_DTYPE_F32, {2, 5}, {3, 9, 1, 9, 4, -1, -2, -3, -4, -5});
  auto out = rt->run_graph(g, cpu, {{"x", x}});
  CHECK(out["v"].get(0) == 9);
  CHECK(out["v"].get(1) == 9);
  CHECK(out["i"].dtype == BP_DTYPE_I64);
  CHECK(out["i"].get_int(0) == 1);  // ties: lower index first
  CHECK(out["i"].get_int(1) == 3);
  CHECK(out["i"].get_int(2) == 0);
  CHECK(out["i"].get_int(3) == 1);
}

TEST_CASE("buffers are reused by liveness and plans run again unchanged", "[planner]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  Graph g;
  g.input("x", BP_DTYPE_F32, {1024});
  std::string prev = "x";
  for (int i = 0; i < 10; ++i) {
    g.node("n" + std::to_string(i), "neg", {prev});
    prev = "n" + std::to_string(i);
  }
  g.output(prev);
  CompileOptions opts;
  opts.poison_outputs = true;
  opts.optimize = false;  // ten steps (optimized, the chain is one fused step)
  Plan plan = rt->compile(g, cpu, opts);
  // Input + output pinned, the 9 intermediates fit in two alternating buffers.
  CHECK(plan.buffer_count() == 4);
  auto x = iota(BP_DTYPE_F32, {1024});
  for (int run = 0; run < 3; ++run) {
    auto out = plan.run({{"x", x}});
    CHECK(out[prev].get(5) == 5);  // ten negations
  }
  x.set(5, 42);
  plan.set_input("x", x);
  plan.execute();
  CHECK(plan.output(prev).get(5) == 42);
  CHECK_THROWS_WITH(plan.set_input("x", iota(BP_DTYPE_F32, {3})), Catch::Contains("expected f32[1024]"));
}

TEST_CASE("data-dependent errors name the node and leave the runtime usable", "[planner]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  Graph g;
  g.input("x", BP_DTYPE_F32, {4});
  g.input("i", BP_DTYPE_I64, {2});
  g.node("y", "index_select", {"x", "i"}, {{"dim", 0}});
  g.output("y");
  Plan plan = rt->compile(g, cpu);
  auto idx = HostTensor::from_doubles(BP_DTYPE_I64, {2}, {1, 9});
  CHECK_THROWS_WITH(plan.run({{"x", iota(BP_DTYPE_F32, {4})}, {"i", idx}}), Catch::Contains("node 'y' (index_select"));
  idx.set_int(1, -1);
  auto out = plan.run({{"x", iota(BP_DTYPE_F32, {4})}, {"i", idx}});
  CHECK(out["y"].get(1) == 3);
}
