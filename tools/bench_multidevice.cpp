// `backplane bench --device A,B,...`: what placing one graph on several
// devices costs, measured in one run beside a baseline:
//   transfer_64M_A_to_B  bandwidth of one 64 MiB transfer step (plan profile),
//                        beside a plain memcpy of the same bytes
//   split3_A_B_A         a 30-node chain split into three segments (A, B, A)
//                        against the sum of its three parts run alone
//   place_10000          placement of a 10,000-node graph on the list
#include "bench_multidevice.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

#include "median_time.hpp"

namespace backplane::cli {

namespace {

HostTensor ramp(Shape shape) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  float* p = t.as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(i % 1000) * 1e-3f;
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The median seconds of the transfer step of `plan`, over runs lasting
// about min_time in all (at least 5).
double transfer_seconds(Plan& plan, double min_time) {
  std::vector<double> times;
  const auto start = std::chrono::steady_clock::now();
  while (times.size() < 5 ||
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < min_time) {
    plan.execute();
    for (const auto& st : plan.profile())
      if (st.transfer) times.push_back(st.seconds);
    if (times.size() > 200) break;
  }
  return median(times);
}

struct Printer {
  bool json;
  Json* results;
  void row(const std::string& name, const std::string& value, const std::string& note, Json record) {
    if (json)
      results->push_back(std::move(record));
    else
      std::printf("%-26s %12s %s\n", name.c_str(), value.c_str(), note.c_str());
    std::fflush(stdout);
  }
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void bench_transfer(Runtime& rt, Device& a, Device& b, double min_time, Printer& out) {
  const Shape shape = {16 << 20};  // 64 MiB of f32
  const double bytes = 4.0 * (16 << 20);
  Graph g;
  g.input("x", BP_DTYPE_F32, shape);
  g.node("y", "relu", {"x"}, {}, a.name());
  g.node("z", "relu", {"y"}, {}, b.name());
  g.output("z");
  const std::string name = "transfer_64M_" + a.name() + "_to_" + b.name();
  CompileOptions co;
  co.profile = true;
  Plan plan = rt.compile(g, std::vector<Device*>{&a, &b}, co);
  plan.set_input("x", ramp(shape));
  const auto t = plan.transfers();
  // memcpy of the same bytes in the same run: the roof for a host copy.
  std::unique_ptr<char[]> src(new char[static_cast<size_t>(bytes)]),
      dst(new char[static_cast<size_t>(bytes)]);
  std::memset(src.get(), 1, static_cast<size_t>(bytes));
  std::memset(dst.get(), 0, static_cast<size_t>(bytes));
  const double mc =
      bench::median_seconds([&] { std::memcpy(dst.get(), src.get(), static_cast<size_t>(bytes)); }, min_time);
  if (!t.empty() && t[0].zero_copy) {
    plan.execute();
    out.row(name, "zero-copy",
            "(" + b.name() + " reads " + a.name() + "'s memory in place; memcpy " +
                fmt("%.1f GB/s", bytes / mc / 1e9) + ")",
            {{"case", name}, {"zero_copy", true}, {"memcpy_gbps", bytes / mc / 1e9}});
    return;
  }
  const double s = transfer_seconds(plan, min_time);
  out.row(name, fmt("%.1f GB/s", bytes / s / 1e9),
          "memcpy " + fmt("%.1f GB/s", bytes / mc / 1e9) + ", transfer/memcpy time " + fmt("%.2f", s / mc),
          {{"case", name},
           {"seconds", s},
           {"gbps", bytes / s / 1e9},
           {"memcpy_seconds", mc},
           {"memcpy_gbps", bytes / mc / 1e9}});
}

// Ten elementwise nodes starting from `in`, all pinned to `dev`.
std::string segment(Graph& g, const std::string& in, const std::string& prefix, const std::string& dev) {
  std::string cur = in;
  for (int i = 0; i < 10; ++i) {
    const std::string n = prefix + std::to_string(i);
    if (i % 2 == 0)
      g.node(n, "add", {cur, "c"}, {}, dev);
    else
      g.node(n, "mul", {cur, "k"}, {}, dev);
    cur = n;
  }
  return cur;
}

void bench_split(Runtime& rt, Device& a, Device& b, double min_time, Printer& out) {
  const Shape shape = {1 << 20};
  auto inputs = [&](Graph& g) {
    g.input("x", BP_DTYPE_F32, shape);
    g.input("c", BP_DTYPE_F32, shape);
    g.input("k", BP_DTYPE_F32, shape);
  };
  Graph whole;
  inputs(whole);
  std::string cur = segment(whole, "x", "p", a.name());
  cur = segment(whole, cur, "q", b.name());
  cur = segment(whole, cur, "r", a.name());
  whole.output(cur);
  const std::vector<Device*> list = {&a, &b};
  Plan wp = rt.compile(whole, list);
  for (const char* n : {"x", "c", "k"}) wp.set_input(n, ramp(shape));
  const double tw = bench::median_seconds([&] { wp.execute(); }, min_time);
  double parts = 0;
  for (Device* d : {&a, &b, &a}) {
    Graph g;
    inputs(g);
    g.output(segment(g, "x", "p", d->name()));
    Plan pp = rt.compile(g, *d);
    for (const char* n : {"x", "c", "k"}) pp.set_input(n, ramp(shape));
    parts += bench::median_seconds([&] { pp.execute(); }, min_time);
  }
  const std::string name = "split3_" + a.name() + "_" + b.name() + "_" + a.name();
  out.row(name, fmt("%.3f ms", tw * 1e3),
          "sum of the parts alone " + fmt("%.3f ms", parts * 1e3) + ", ratio " + fmt("%.2f", tw / parts),
          {{"case", name},
           {"seconds", tw},
           {"parts_seconds", parts},
           {"ratio", tw / parts},
           {"transfers", wp.transfers().size()}});
}

void bench_placement(Runtime& rt, const std::vector<Device*>& list, Printer& out) {
  // 10,000 nodes: elementwise ops every device may have, and every 7th a
  // softmax only some have, so placement has choices to make.
  Graph g;
  g.input("x", BP_DTYPE_F32, {16});
  std::string cur = "x";
  for (int i = 0; i < 10000; ++i) {
    const std::string n = "n" + std::to_string(i);
    if (i % 7 == 6)
      g.node(n, "softmax", {cur}, {{"dim", 0}});
    else if (i % 2)
      g.node(n, "relu", {cur});
    else
      g.node(n, "add", {cur, "x"});
    cur = n;
  }
  g.output(cur);
  std::vector<double> place, build;
  size_t transfers = 0;
  for (int i = 0; i < 5; ++i) {
    Plan p = rt.compile(g, list);
    place.push_back(p.compile_stats().placement_seconds);
    build.push_back(p.compile_stats().build_seconds);
    transfers = p.transfers().size();
  }
  out.row("place_10000", fmt("%.2f ms", median(place) * 1e3),
          "lowering + placement; building the plan " + fmt("%.2f ms", median(build) * 1e3) + ", " +
              std::to_string(transfers) + " transfers",
          {{"case", "place_10000"},
           {"placement_seconds", median(place)},
           {"build_seconds", median(build)},
           {"transfers", transfers}});
}

}  // namespace

void bench_multidevice(Runtime& rt, const std::vector<Device*>& list, const std::string& filter,
                       double min_time, bool json, Json& results) {
  Printer out{json, &results};
  auto wanted = [&](const std::string& name) {
    return filter.empty() || name.find(filter) != std::string::npos;
  };
  auto guarded = [&](const std::string& name, const std::function<void()>& f) {
    if (!wanted(name)) return;
    try {
      f();
    } catch (const std::exception& e) {
      out.row(name, "failed", e.what(), {{"case", name}, {"error", e.what()}});
    }
  };
  Device& a = *list[0];
  Device& b = *list[1];
  guarded("transfer_64M_" + a.name() + "_to_" + b.name(), [&] { bench_transfer(rt, a, b, min_time, out); });
  guarded("transfer_64M_" + b.name() + "_to_" + a.name(), [&] { bench_transfer(rt, b, a, min_time, out); });
  guarded("split3_" + a.name() + "_" + b.name() + "_" + a.name(),
          [&] { bench_split(rt, a, b, min_time, out); });
  guarded("place_10000", [&] { bench_placement(rt, list, out); });
}

// Host <-> device bandwidth of one 256 MiB tensor (Runtime::upload and
// Tensor::download_into): for a remote device the wire (or, isolated, the
// shared memory) is the path being measured.
void bench_io(Runtime& rt, Device& dev, const std::string& filter, double min_time, bool json, Json& results) {
  const bool up = filter.empty() || std::string("upload_256M").find(filter) != std::string::npos;
  const bool down = filter.empty() || std::string("download_256M").find(filter) != std::string::npos;
  if (!up && !down) return;
  Printer out{json, &results};
  const uint64_t bytes = uint64_t{256} << 20;
  HostTensor host(BP_DTYPE_F32, {static_cast<int64_t>(bytes / 4)});
  std::memset(host.data(), 1, static_cast<size_t>(bytes));
  try {
    Tensor t = rt.upload(host, dev);
    if (up) {
      const double s = bench::median_seconds([&] { t = rt.upload(host, dev); }, min_time);
      out.row("upload_256M", fmt("%.2f GB/s", bytes / s / 1e9), "host -> " + dev.name() + ", " + fmt("%.1f ms", s * 1e3),
              {{"case", "upload_256M"}, {"device", dev.name()}, {"seconds", s}, {"gb_per_s", bytes / s / 1e9}});
    }
    if (down) {
      const double s = bench::median_seconds([&] { t.download_into(host.data(), bytes); }, min_time);
      out.row("download_256M", fmt("%.2f GB/s", bytes / s / 1e9), dev.name() + " -> host, " + fmt("%.1f ms", s * 1e3),
              {{"case", "download_256M"}, {"device", dev.name()}, {"seconds", s}, {"gb_per_s", bytes / s / 1e9}});
    }
  } catch (const std::exception& e) {
    out.row("upload_256M", "failed", e.what(), {{"case", "upload_256M"}, {"device", dev.name()}, {"error", e.what()}});
  }
}

}  // namespace backplane::cli
