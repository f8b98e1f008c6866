// The main job: a small Mamba-style block (projections, softplus, the
// selective scan, a SiLU gate, top-k over the result) on built-in data, run on
// every device found, cross-checked against the first device, and timed.
#include <backplane/backplane.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "commands.hpp"

namespace backplane::cli {

namespace {

constexpr int64_t B = 2, L = 64, D = 32, N = 8;

HostTensor random_tensor(std::mt19937& rng, Shape shape, double scale) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  std::normal_distribution<double> dist(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
  return t;
}

Graph mamba_block(std::mt19937& rng) {
  Graph g;
  g.input("x", BP_DTYPE_F32, {B, L, D});
  g.constant("w_delta", random_tensor(rng, {D, D}, 0.2));
  g.constant("w_b", random_tensor(rng, {D, N}, 0.3));
  g.constant("w_c", random_tensor(rng, {D, N}, 0.3));
  g.constant("w_gate", random_tensor(rng, {D, D}, 0.2));
  HostTensor a(BP_DTYPE_F32, {D, N});  // Mamba's A = -exp(A_log), A_log = log(1..N)
  for (int64_t i = 0; i < D; ++i)
    for (int64_t j = 0; j < N; ++j) a.set(i * N + j, -static_cast<double>(j + 1));
  g.constant("a", a);
  g.node("dt", "matmul", {"x", "w_delta"});
  g.node("delta", "softplus", {"dt"});
  g.node("bm", "matmul", {"x", "w_b"});
  g.node("cm", "matmul", {"x", "w_c"});
  g.node("scan", "selective_scan", {"x", "delta", "a", "bm", "cm"});
  g.node("y", "view", {"scan"}, {{"slot", 0}});
  g.node("state", "view_owned", {"scan"}, {{"slot", 1}});
  g.node("g", "matmul", {"x", "w_gate"});
  g.node("gate", "silu", {"g"});
  g.node("out", "mul", {"y", "gate"});
  g.node("top", "topk", {"out"}, {{"k", 4}, {"dim", -1}});
  g.node("top_values", "view", {"top"}, {{"slot", 0}});
  g.node("top_indices", "view", {"top"}, {{"slot", 1}});
  for (auto* o : {"out", "state", "top_values", "top_indices"}) g.output(o);
  return g;
}

// Worst relative error (with an absolute floor) between two results.
double worst_error(const HostTensor& a, const HostTensor& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b.get(i);
    const double err = std::abs(x - y) / std::max(std::abs(y), 1e-3);
    worst = std::max(worst, err);
  }
  return worst;
}

// Prints how `out` compares with the reference run and whether they agree.
bool agrees(std::map<std::string, HostTensor>& out, std::map<std::string, HostTensor>& reference,
            const std::string& reference_device) {
  double worst = 0;
  for (const char* name : {"out", "state", "top_values"})
    worst = std::max(worst, worst_error(out[name], reference[name]));
  int64_t index_mismatch = 0;
  const auto& idx = out["top_indices"];
  for (int64_t i = 0; i < idx.numel(); ++i)
    index_mismatch += idx.get_int(i) != reference["top_indices"].get_int(i);
  const bool ok = worst <= 1e-3 && index_mismatch == 0;
  std::printf("          vs %s: worst relative error %.2e, %lld of %lld top-k indices differ -> %s\n",
              reference_device.c_str(), worst, static_cast<long long>(index_mismatch),
              static_cast<long long>(idx.numel()), ok ? "agree" : "DISAGREE");
  return ok;
}

}  // namespace

int cmd_demo(const Args& in) {
  Args args = in;
  const std::string only = take_option(args, "--device", "all");
  const int iters = std::stoi(take_option(args, "--iters", "20"));
  CompileOptions copts;
  copts.prepare = !take_switch(args, "--no-prepare");  // the first run then compiles the pipelines
  reject_leftovers(args);

  std::mt19937 rng(2024);
  const Graph graph = mamba_block(rng);
  const HostTensor x = random_tensor(rng, {B, L, D}, 1.0);

  auto rt = Runtime::create();
  std::vector<Device*> devices;
  if (only == "all")
    devices = rt->all_devices();
  else
    devices.push_back(&rt->device(only));
  for (const auto& p : rt->plugins())
    if (p.state == PluginState::Rejected)
      std::printf("plugin %s rejected: %s\n", p.name.c_str(), p.rejection.c_str());
  if (devices.empty()) throw Error("no devices found (is BACKPLANE_PLUGIN_PATH set?)");

  std::printf(
      "Backplane demo: a Mamba-style block (B=%lld L=%lld D=%lld N=%lld): matmul, softplus, selective_scan,\n"
      "silu gate, topk(k=4) -- on %zu device(s), %u host threads\n\n",
      static_cast<long long>(B), static_cast<long long>(L), static_cast<long long>(D),
      static_cast<long long>(N), devices.size(), rt->num_threads());
  std::map<std::string, HostTensor> reference;
  std::string reference_device;
  int failures = 0;
  for (Device* dev : devices) {
    std::printf("%-9s %-5s %s\n", dev->name().c_str(), dev->kind().c_str(), dev->description().c_str());
    try {
      const auto t0 = std::chrono::steady_clock::now();
      Plan plan = rt->compile(graph, *dev, copts);
      const auto t1 = std::chrono::steady_clock::now();
      auto out = plan.run({{"x", x}});
      const auto t2 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) plan.execute();
      const auto t3 = std::chrono::steady_clock::now();
      using ms = std::chrono::duration<double, std::milli>;
      std::printf(
          "          compile %.2f ms, first run %.2f ms, then %.3f ms per run (%d runs of a reused plan)\n",
          ms(t1 - t0).count(), ms(t2 - t1).count(), ms(t3 - t2).count() / iters, iters);
      const auto& vals = out["top_values"];
      const auto& idx = out["top_indices"];
      std::printf(
          "          top-4 of the last step of batch 0: values [%.4f %.4f %.4f %.4f] at channels [%lld %lld "
          "%lld %lld]\n",
          vals.get((L - 1) * 4 + 0), vals.get((L - 1) * 4 + 1), vals.get((L - 1) * 4 + 2),
          vals.get((L - 1) * 4 + 3), static_cast<long long>(idx.get_int((L - 1) * 4 + 0)),
          static_cast<long long>(idx.get_int((L - 1) * 4 + 1)),
          static_cast<long long>(idx.get_int((L - 1) * 4 + 2)),
          static_cast<long long>(idx.get_int((L - 1) * 4 + 3)));
      if (reference.empty()) {
        reference = out;
        reference_device = dev->name();
      } else {
        failures += !agrees(out, reference, reference_device);
      }
    } catch (const std::exception& e) {
      std::printf("          FAILED: %s\n", e.what());
      ++failures;
    }
  }
  // One graph across the devices: the scan pinned to the second device, the
  // rest placed on the list (every device, preference order).
  if (only == "all" && devices.size() >= 2 && !reference.empty()) {
    const std::vector<Device*> list = rt->select_devices("auto");
    Device* scan_dev = list.size() >= 2 ? list[1] : list[0];
    Graph split = graph;
    split.pin("scan", scan_dev->name());
    std::string names;
    for (auto* d : list) names += (names.empty() ? "" : ",") + d->name();
    std::printf("%-9s one graph on the list %s, selective_scan pinned to %s\n", "split", names.c_str(),
                scan_dev->name().c_str());
    try {
      Plan plan = rt->compile(split, list);
      auto out = plan.run({{"x", x}});
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) plan.execute();
      const double per_run =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
      uint64_t bytes = 0;
      size_t zero_copy = 0;
      const auto transfers = plan.transfers();
      for (const auto& t : transfers) bytes += t.bytes, zero_copy += t.zero_copy;
      std::string where;
      for (const auto& pl : plan.placement()) where += " " + pl.node + "@" + pl.device;
      std::printf("          placement:%s\n", where.c_str());
      std::printf("          %zu transfers (%zu zero-copy), %llu bytes moved per run; %.3f ms per run\n",
                  transfers.size(), zero_copy, static_cast<unsigned long long>(bytes), per_run);
      failures += !agrees(out, reference, reference_device);
    } catch (const std::exception& e) {
      std::printf("          FAILED: %s\n", e.what());
      ++failures;
    }
  }
  std::printf("\n%s\n", failures ? "demo finished with failures" : "demo finished: every device agrees");
  return failures ? 1 : 0;
}

}  // namespace backplane::cli
