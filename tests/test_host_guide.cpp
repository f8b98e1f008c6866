// Behaviours docs/host-guide.md promises that no other test pinned down:
// BACKPLANE_NUM_THREADS, duplicate devices in a list, pins on a reshape, and
// transfers that move only the span a view touches.
#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <optional>

using namespace backplane;

namespace {

// An environment variable for the scope, the old value restored after.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (const char* o = std::getenv(name.c_str())) old = o;
    if (value)
      setenv(name.c_str(), value, 1);
    else
      unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    if (old)
      setenv(name.c_str(), old->c_str(), 1);
    else
      unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

std::unique_ptr<Runtime> runtime_from_env() {
  RuntimeOptions o;
  o.use_environment = true;
  return Runtime::create(o);
}

Device* find(Runtime& rt, const std::string& plugin) {
  for (Device* d : rt.all_devices())
    if (d->plugin_name() == plugin) return d;
  return nullptr;
}

HostTensor iota(Shape shape) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(i));
  return t;
}

}  // namespace

// Catches the variable being ignored (the pool sized by the cores) or read
// when the application turned the environment off.
TEST_CASE("BACKPLANE_NUM_THREADS sizes the shared pool; RuntimeOptions::num_threads sets it in code",
          "[host_guide]") {
  ScopedEnv path("BACKPLANE_PLUGIN_PATH", nullptr);
  {
    ScopedEnv env("BACKPLANE_NUM_THREADS", "3");
    CHECK(runtime_from_env()->num_threads() == 3);
    RuntimeOptions o;
    o.use_environment = false;
    o.num_threads = 2;
    CHECK(Runtime::create(o)->num_threads() == 2);
  }
  ScopedEnv env("BACKPLANE_NUM_THREADS", "1");
  CHECK(runtime_from_env()->num_threads() == 1);
}

// Catches a list that keeps a repeated device (it would be placed twice) or
// loses the order of preference.
TEST_CASE("select_devices drops duplicates and keeps the order of preference", "[host_guide]") {
  RuntimeOptions o;
  o.use_environment = false;
  auto rt = Runtime::create(o);
  auto one = rt->select_devices("cpu,cpu,cpu");
  REQUIRE(one.size() == 1);
  CHECK(one[0]->name() == "cpu");
  Device* vk = find(*rt, "vulkan");
  if (!vk) {
    WARN("SKIPPED: no Vulkan device: only the one-device list was checked");
    return;
  }
  auto two = rt->select_devices(vk->name() + ",cpu," + vk->name() + ",cpu");
  REQUIRE(two.size() == 2);
  CHECK(two[0] == vk);
  CHECK(two[1]->name() == "cpu");
}

// Catches a reshape copy that ignores its pin (runs on the list's first
// device), and a pin on a reshape that is a view turned into an error.
TEST_CASE("a pin on a reshape applies to its copy and is ignored when it is a view", "[host_guide]") {
  RuntimeOptions o;
  o.use_environment = false;
  auto rt = Runtime::create(o);
  Device* vk = find(*rt, "vulkan");
  if (!vk) {
    WARN("SKIPPED: no Vulkan device (the pin needs a second device)");
    return;
  }
  Graph g;
  g.input("x", BP_DTYPE_F32, {3, 4});
  g.node("t", "transpose", {"x"}, {{"dim0", 0}, {"dim1", 1}});
  g.node("flat", "reshape", {"t"}, {{"shape", {12}}}, "cpu");     // a transposed view: needs a copy
  g.node("same", "reshape", {"x"}, {{"shape", {4, 3}}}, "cpu");   // dense: a view
  g.node("y", "neg", {"flat"});
  g.node("z", "neg", {"same"});
  g.output("y");
  g.output("z");
  Plan plan = rt->compile(g, rt->select_devices(vk->name() + ",cpu"));
  bool saw_flat = false;
  for (const auto& p : plan.placement()) {
    if (p.node == "flat") {
      saw_flat = true;
      CHECK(p.device == "cpu");
      CHECK(p.reason.find("pinned") != std::string::npos);
    }
  }
  CHECK(saw_flat);
  const auto out = plan.run({{"x", iota({3, 4})}});
  const HostTensor& y = out.at("y");
  const HostTensor& z = out.at("z");
  for (int64_t i = 0; i < 12; ++i) {
    CHECK(y.get(i) == -static_cast<double>((i % 3) * 4 + i / 3));  // x.T flattened
    CHECK(z.get(i) == -static_cast<double>(i));
  }
}

// Catches a transfer that moves the whole buffer under a view (48 bytes of
// x for a [3, 2] slice) instead of the span the view touches (elements 0 to
// 9: 40 bytes), or one that loses the view's strides on the way.
TEST_CASE("a transfer moves the span of bytes a view touches, keeping its strides", "[host_guide]") {
  ScopedEnv no_import("BACKPLANE_VULKAN_HOST_IMPORT", "0");  // copies, so bytes move
  RuntimeOptions o;
  o.use_environment = false;
  auto rt = Runtime::create(o);
  Device* vk = find(*rt, "vulkan");
  if (!vk) {
    WARN("SKIPPED: no Vulkan device (the transfer needs a second device)");
    return;
  }
  Graph g;
  g.input("x", BP_DTYPE_F32, {3, 4});
  g.node("x2", "neg", {"x"}, {}, "cpu");
  g.node("s", "slice", {"x2"}, {{"dim", 1}, {"start", 0}, {"end", 2}});
  g.node("y", "neg", {"s"}, {}, vk->name());
  g.output("y");
  Plan plan = rt->compile(g, rt->select_devices("cpu," + vk->name()));
  const auto transfers = plan.transfers();
  REQUIRE(transfers.size() == 1);
  CHECK(transfers[0].from == "cpu");
  CHECK(transfers[0].to == vk->name());
  CHECK_FALSE(transfers[0].zero_copy);
  CHECK(transfers[0].bytes == 40);
  const HostTensor y = plan.run({{"x", iota({3, 4})}}).at("y");
  REQUIRE(y.shape == Shape({3, 2}));
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 2; ++c) CHECK(y.get(r * 2 + c) == static_cast<double>(r * 4 + c));
}
