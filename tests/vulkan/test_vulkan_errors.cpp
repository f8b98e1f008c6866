// Data errors found on the device at synchronize() (an index out of range,
// integer division by zero, a cast of NaN to an integer) name the node on
// vulkan0 as they do on the CPU: the Vulkan plugin's error_call_index
// says which kernel call failed and the host names its node.
#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>

#include "vulkan_test_support.hpp"

#include <cmath>
#include <limits>

using namespace backplane;
using namespace backplane::vktest;

namespace {

std::vector<Device*> devices_to_check(Runtime& rt) {
  std::vector<Device*> out;
  for (auto* d : rt.all_devices())
    if (d->plugin_name() == "vulkan" || d->plugin_name() == "cpu") out.push_back(d);
  return out;
}

// Runs `g` on `dev` and returns the error message ("" when it ran).
std::string run_error(Runtime& rt, const Graph& g, Device& dev, const std::map<std::string, HostTensor>& in) {
  try {
    Plan p = rt.compile(g, dev);
    p.run(in);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

HostTensor f32(Shape s, std::vector<double> v) { return HostTensor::from_doubles(BP_DTYPE_F32, std::move(s), v); }

}  // namespace

TEST_CASE("vulkan: a data error found at synchronize names its node as on the cpu", "[vulkan][errors]") {
  auto rt = default_runtime();
  const auto devs = devices_to_check(*rt);
  bool have_vulkan = false;
  for (auto* d : devs) have_vulkan = have_vulkan || d->plugin_name() == "vulkan";
  if (!have_vulkan) {
    WARN("SKIPPED: no vulkan device");
    return;
  }

  // Work before and after the failing node, so the failing call is neither
  // the first nor the last one recorded.
  Graph g;
  g.input("x", BP_DTYPE_F32, {4});
  g.input("n", BP_DTYPE_I32, {4});
  g.input("d", BP_DTYPE_I32, {4});
  g.input("t", BP_DTYPE_F32, {5, 3});
  g.input("i", BP_DTYPE_I64, {2});
  g.node("a", "add", {"x", "x"});
  g.node("b", "mul", {"a", "x"});
  g.node("quot", "div", {"n", "d"});
  g.node("pick", "index_select", {"t", "i"}, {{"dim", 0}});
  g.node("whole", "cast", {"b"}, {{"dtype", "i32"}});
  g.node("c", "add", {"b", "a"});
  g.output("c");
  g.output("quot");
  g.output("pick");
  g.output("whole");

  const HostTensor ok_den = HostTensor::from_doubles(BP_DTYPE_I32, {4}, {1, 2, 3, 4});
  const HostTensor zero_den = HostTensor::from_doubles(BP_DTYPE_I32, {4}, {1, 0, 3, 4});
  const HostTensor num = HostTensor::from_doubles(BP_DTYPE_I32, {4}, {8, 9, 10, 11});
  const HostTensor ok_idx = HostTensor::from_doubles(BP_DTYPE_I64, {2}, {0, -1});
  const HostTensor bad_idx = HostTensor::from_doubles(BP_DTYPE_I64, {2}, {0, 5});
  const HostTensor table = f32({5, 3}, std::vector<double>(15, 1.0));
  const HostTensor ok_x = f32({4}, {1, 2, 3, 4});
  const HostTensor nan_x = f32({4}, {1, std::numeric_limits<double>::quiet_NaN(), 3, 4});

  for (Device* dev : devs) {
    INFO("device " << dev->name());
    SECTION("integer division by zero: " + dev->name()) {
      const std::string msg = run_error(*rt, g, *dev, {{"x", ok_x}, {"n", num}, {"d", zero_den}, {"t", table}, {"i", ok_idx}});
      INFO(msg);
      CHECK(msg.find("node 'quot'") != std::string::npos);
      CHECK(msg.find("division by zero") != std::string::npos);
    }
    SECTION("index out of range: " + dev->name()) {
      const std::string msg = run_error(*rt, g, *dev, {{"x", ok_x}, {"n", num}, {"d", ok_den}, {"t", table}, {"i", bad_idx}});
      INFO(msg);
      CHECK(msg.find("node 'pick'") != std::string::npos);
    }
    SECTION("cast of NaN to an integer: " + dev->name()) {
      const std::string msg = run_error(*rt, g, *dev, {{"x", nan_x}, {"n", num}, {"d", ok_den}, {"t", table}, {"i", ok_idx}});
      INFO(msg);
      CHECK(msg.find("node 'whole'") != std::string::npos);
    }
    SECTION("and the plan runs on after an error: " + dev->name()) {
      Plan p = rt->compile(g, *dev);
      CHECK_THROWS(p.run({{"x", ok_x}, {"n", num}, {"d", zero_den}, {"t", table}, {"i", ok_idx}}));
      const auto out = p.run({{"x", ok_x}, {"n", num}, {"d", ok_den}, {"t", table}, {"i", ok_idx}});
      CHECK(out.at("quot").get_int(1) == 4);
      CHECK(out.at("c").get(3) == 40.0);  // (4 + 4) * 4 + 8
    }
  }
}
