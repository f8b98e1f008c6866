// `backplane bench`: per-op timings through reused plans (what an
// application pays per run once its plan is built).
//
// On a Vulkan device, the cases that have a raw-Vulkan counterpart (add_16M,
// chain100_add_4K) are also run by backplane_vulkan_raw (bench/vulkan_raw.cpp,
// installed beside this program) just before the plugin's own timing, and the
// plugin's overhead is reported as the ratio plugin / raw.
#include "bench_generate.hpp"
#include "bench_multidevice.hpp"
#include "commands.hpp"
#include "median_time.hpp"
#include "model_input.hpp"

#include <backplane/backplane.hpp>

#include <boost/dll/runtime_symbol_info.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <thread>
#include <vector>
#include <ctime>
#include <sys/wait.h>
#include <unistd.h>

namespace backplane::cli {

namespace {

struct Case {
  std::string name;
  Graph graph;
  std::map<std::string, HostTensor> inputs;
  double bytes = 0;  // memory traffic of one run, for GB/s
  double flops = 0;  // for GFLOP/s
  // What one timed run is: execute() on inputs set once, run(inputs), or
  // submit(inputs) and its outputs (what an application pays per call).
  enum class Call { execute, run, submit } call = Call::execute;
  bool optimize = true;  // CompileOptions::optimize
};

HostTensor filled(Shape shape, uint32_t seed, bp_dtype dtype = BP_DTYPE_F32) {
  HostTensor t(dtype, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  if (dtype == BP_DTYPE_F32) {
    float* p = t.as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
  }
  return t;
}

const char* dtype_suffix(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_BF16: return "_bf16";
    case BP_DTYPE_F16: return "_f16";
    default: return "";
  }
}

}  // namespace

// The `stream` roof: c[i] = a[i] + b[i] over 16M floats (add_16M's bytes)
// in a plain C++ loop split over `threads` std::threads, as STREAM's "add".
// Every memory-bound case reports its fraction of this figure, measured in
// the same run on the same machine.
double stream_add_seconds(unsigned threads, double min_time) {
  const size_t n = size_t{16} << 20;
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 0.0f);
  auto part = [&](unsigned t) {
    const size_t lo = n * t / threads, hi = n * (t + 1) / threads;
    const float* __restrict pa = a.data();
    const float* __restrict pb = b.data();
    float* __restrict pc = c.data();
    // 16 floats at a time (GCC's -O2 does not vectorise a loop of unknown
    // trip count; a scalar loop would measure the core, not the memory).
    typedef float V __attribute__((vector_size(64)));
    size_t i = lo;
    for (; i + 16 <= hi; i += 16) {
      V x, y;
      std::memcpy(&x, pa + i, sizeof x);
      std::memcpy(&y, pb + i, sizeof y);
      x += y;
      std::memcpy(pc + i, &x, sizeof x);
    }
    for (; i < hi; ++i) pc[i] = pa[i] + pb[i];
  };
  return bench::median_seconds(
      [&] {
        std::vector<std::thread> pool;
        for (unsigned t = 1; t < threads; ++t) pool.emplace_back(part, t);
        part(0);
        for (auto& th : pool) th.join();
      },
      min_time);
}

namespace {

Case unary_case(const std::string& name, const std::string& op, Shape shape, Json params, double out_elems) {
  Case c{name, {}, {}, 0, 0};
  c.graph.input("x", BP_DTYPE_F32, shape);
  c.graph.node("y", op, {"x"}, params);
  c.graph.output("y");
  double n = 1;
  for (auto d : shape) n *= static_cast<double>(d);
  c.inputs["x"] = filled(shape, 1);
  c.bytes = 4 * (n + out_elems);
  return c;
}

Case binary_case(const std::string& name, Shape a, Shape b, bool transpose_a) {
  Case c{name, {}, {}, 0, 0};
  c.graph.input("a", BP_DTYPE_F32, a);
  c.graph.input("b", BP_DTYPE_F32, b);
  std::string lhs = "a";
  if (transpose_a) {
    c.graph.node("at", "transpose", {"a"}, {{"dim0", 0}, {"dim1", 1}});
    lhs = "at";
  }
  c.graph.node("y", "add", {lhs, "b"});
  c.graph.output("y");
  c.inputs["a"] = filled(a, 1);
  c.inputs["b"] = filled(b, 2);
  auto numel = [](const Shape& s) {
    double n = 1;
    for (auto d : s) n *= static_cast<double>(d);
    return n;
  };
  c.bytes = 4 * (numel(a) + numel(b) + std::max(numel(a), numel(b)));
  return c;
}

// Eight elementwise ops over two 16M f32 inputs (a + b, then scale, relu,
// shift, minimum with b, negate, abs, maximum with a): memory-bound, so
// fused it should take about one add's time (three 64 MiB passes), unfused
// eight. `optimize` off keeps the eight kernels.
Case chain_case(const std::string& name, bool optimize) {
  Case c{name, {}, {}, 0, 0};
  const Shape s{16 << 20};
  c.graph.input("a", BP_DTYPE_F32, s);
  c.graph.input("b", BP_DTYPE_F32, s);
  c.graph.node("t0", "add", {"a", "b"});
  c.graph.node("t1", "affine", {"t0"}, {{"mul", 0.5}, {"add", 0.0}});
  c.graph.node("t2", "relu", {"t1"});
  c.graph.node("t3", "affine", {"t2"}, {{"mul", 1.0}, {"add", -0.25}});
  c.graph.node("t4", "minimum", {"t3", "b"});
  c.graph.node("t5", "neg", {"t4"});
  c.graph.node("t6", "abs", {"t5"});
  c.graph.node("y", "maximum", {"t6", "a"});
  c.graph.output("y");
  c.inputs["a"] = filled(s, 1);
  c.inputs["b"] = filled(s, 2);
  c.bytes = 3.0 * 4 * (16 << 20);
  c.optimize = optimize;
  return c;
}

// The cases whose name contains `filter` (only those get their inputs made:
// filling every case's tensors takes seconds).
std::vector<Case> all_cases(const std::string& filter) {
  std::vector<Case> cases;
  auto want = [&](const std::string& name) { return name.find(filter) != std::string::npos; };
  const int64_t M = 4096;
  if (want("add_16M")) cases.push_back(binary_case("add_16M", {16 << 20}, {16 << 20}, false));
  if (want("chain8_16M")) cases.push_back(chain_case("chain8_16M", true));
  if (want("chain8_16M_unfused")) cases.push_back(chain_case("chain8_16M_unfused", false));
  if (want("add_bcast_col")) cases.push_back(binary_case("add_bcast_col", {M, M}, {M, 1}, false));
  if (want("add_bcast_row")) cases.push_back(binary_case("add_bcast_row", {M, M}, {1, M}, false));
  if (want("add_transposed")) cases.push_back(binary_case("add_transposed", {M, M}, {M, M}, true));
  if (want("sum_dim-1")) cases.push_back(unary_case("sum_dim-1", "sum", {M, M}, {{"dims", {-1}}}, M));
  if (want("sum_dim0")) cases.push_back(unary_case("sum_dim0", "sum", {M, M}, {{"dims", {0}}}, M));
  if (want("mean_dim-1")) cases.push_back(unary_case("mean_dim-1", "mean", {M, M}, {{"dims", {-1}}}, M));
  if (want("layer_norm_dim-1")) {
    Case c = unary_case("layer_norm_dim-1", "layer_norm", {M, M}, {{"dims", {-1}}}, double(M) * M + 2.0 * M);
    c.graph = Graph();
    c.graph.input("x", BP_DTYPE_F32, {M, M});
    c.graph.input("w", BP_DTYPE_F32, {M});
    c.graph.input("b", BP_DTYPE_F32, {M});
    c.graph.node("y", "layer_norm", {"x", "w", "b"}, {{"dims", {-1}}});
    c.graph.output("y");
    c.inputs["w"] = filled({M}, 2);
    c.inputs["b"] = filled({M}, 3);
    cases.push_back(std::move(c));
  }
  if (want("softmax_dim-1"))
    cases.push_back(unary_case("softmax_dim-1", "softmax", {M, M}, {{"dim", -1}}, double(M) * M));
  // topk's two slots read through views; bytes read are the roof basis.
  auto topk8_case = [&](const char* name, const Shape& shape) {
    Case c = unary_case(name, "topk", shape, {{"k", 8}, {"dim", -1}}, 0);
    c.graph = Graph();
    c.graph.input("x", BP_DTYPE_F32, shape);
    c.graph.node("t", "topk", {"x"}, {{"k", 8}, {"dim", -1}});
    c.graph.node("v", "view", {"t"}, {{"slot", 0}});
    c.graph.node("i", "view", {"t"}, {{"slot", 1}});
    c.graph.output("v");
    c.graph.output("i");
    return c;
  };
  if (want("topk8_dim-1")) cases.push_back(topk8_case("topk8_dim-1", {M, M}));
  // Few long rows (a workgroup per row on a Vulkan device).
  if (want("topk8_long")) cases.push_back(topk8_case("topk8_long", {8, int64_t{1} << 21}));
  if (want("var_mean_dim-1")) {
    Case c = unary_case("var_mean_dim-1", "var_mean", {M, M}, {}, 2.0 * M);
    c.graph = Graph();
    c.graph.input("x", BP_DTYPE_F32, {M, M});
    c.graph.node("t", "var_mean", {"x"}, {{"dims", {-1}}});
    c.graph.node("v", "view", {"t"}, {{"slot", 0}});
    c.graph.node("m", "view", {"t"}, {{"slot", 1}});
    c.graph.output("v");
    c.graph.output("m");
    cases.push_back(std::move(c));
  }
  // matmul and conv2d in f32, then the same shapes in bf16 and f16.
  for (bp_dtype dt : {BP_DTYPE_F32, BP_DTYPE_BF16, BP_DTYPE_F16}) {
    const std::string sfx = dtype_suffix(dt);
    for (int64_t n : {1024, 2048}) {
      const std::string name = "matmul_" + std::to_string(n) + sfx;
      if (!want(name)) continue;
      Case c{name, {}, {}, 0, 2.0 * n * n * n};
      c.graph.input("a", dt, {n, n});
      c.graph.input("b", dt, {n, n});
      c.graph.node("y", "matmul", {"a", "b"});
      c.graph.output("y");
      c.inputs["a"] = filled({n, n}, 1, dt);
      c.inputs["b"] = filled({n, n}, 2, dt);
      cases.push_back(std::move(c));
    }
    const std::string conv = "conv2d_n8c64_56_k64_3x3" + sfx;
    if (want(conv)) {
      Case c{conv, {}, {}, 0, 2.0 * 8 * 64 * 56 * 56 * 64 * 9};
      c.graph.input("x", dt, {8, 64, 56, 56});
      c.graph.input("w", dt, {64, 64, 3, 3});
      c.graph.node("y", "conv2d", {"x", "w"}, {{"padding", 1}});
      c.graph.output("y");
      c.inputs["x"] = filled({8, 64, 56, 56}, 1, dt);
      c.inputs["w"] = filled({64, 64, 3, 3}, 2, dt);
      cases.push_back(std::move(c));
    }
  }
  if (want("add_1elem_per_call")) cases.push_back(binary_case("add_1elem_per_call", {1}, {1}, false));
  // run(inputs) against submit(inputs).outputs() on the same one-element
  // plan: the price of asynchrony per call.
  for (const auto& [name, call] : {std::pair{"add_1elem_run", Case::Call::run}, std::pair{"add_1elem_submit_wait", Case::Call::submit}})
    if (want(name)) {
      cases.push_back(binary_case(name, {1}, {1}, false));
      cases.back().call = call;
    }
  if (want("chain100_add_4K")) {
    // 100 small dependent ops in one plan: the cost per dispatch/kernel call.
    Case c{"chain100_add_4K", {}, {}, 0, 0};
    c.graph.input("x", BP_DTYPE_F32, {4096});
    std::string prev = "x";
    for (int i = 0; i < 100; ++i) {
      const std::string name = "y" + std::to_string(i);
      c.graph.node(name, "add", {prev, "x"});
      prev = name;
    }
    c.graph.output(prev);
    c.inputs["x"] = filled({4096}, 1);
    c.bytes = 100.0 * 3 * 4 * 4096;
    cases.push_back(std::move(c));
  }
  return cases;
}

// The raw-Vulkan baseline program, run as a subprocess per matching case.
class RawVulkan {
 public:
  // Raw-program cases that a plugin case is compared with.
  static std::vector<std::string> raw_cases(const std::string& plugin_case) {
    if (plugin_case == "add_16M") return {"add_16M"};
    if (plugin_case == "chain100_add_4K") return {"chain100_add_4K", "empty_submit"};
    return {};
  }

  RawVulkan(const Device& dev, double min_time, bool json) : min_time_(min_time), json_(json) {
    if (dev.plugin_name() != "vulkan") return;
    const std::string& name = dev.name();
    const size_t digits = name.find_first_of("0123456789");
    if (digits == std::string::npos) return;
    index_ = std::stoi(name.substr(digits));
    expect_device_ = dev.description();
    program_ = std::filesystem::path(boost::dll::program_location()).parent_path() / "backplane_vulkan_raw";
    if (!std::filesystem::exists(program_)) {
      say("raw Vulkan baseline: " + program_.string() + " not found, no plugin/raw comparison");
      program_.clear();
    }
  }
  bool available() const { return !program_.empty(); }

  // Runs the raw program on `cases`; its JSON case records by name. Throws a
  // one-line reason when it fails.
  std::map<std::string, Json> run(const std::vector<std::string>& cases) const {
    auto quote = [](const std::string& v) {
      std::string q = "'";
      for (char ch : v) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
      return q + "'";
    };
    char tmpl[] = "/tmp/backplane_raw_XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd < 0) throw Error("cannot create a temporary file");
    close(fd);
    const std::string err_path = tmpl;
    std::string cmd = quote(program_.string()) + " --json --device " + std::to_string(index_);
    char buf[64];
    std::snprintf(buf, sizeof buf, " --min-time %g", min_time_);
    cmd += buf;
    for (const auto& c : cases) cmd += " --case " + c;
    cmd += " 2>" + quote(err_path);
    std::string out;
    int status = -1;
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char chunk[4096];
      size_t n;
      while ((n = std::fread(chunk, 1, sizeof chunk, p)) > 0) out.append(chunk, n);
      status = pclose(p);
    }
    std::string last_err;
    {
      std::ifstream err(err_path);
      for (std::string line; std::getline(err, line);)
        if (!line.empty()) last_err = line;
    }
    std::filesystem::remove(err_path);
    if (status == -1) throw Error("could not start " + program_.string());
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      throw Error(program_.filename().string() + " failed" + (last_err.empty() ? "" : ": " + last_err));
    Json j;
    try {
      j = Json::parse(out);
    } catch (const std::exception& e) {
      throw Error(program_.filename().string() + " printed no JSON (" + e.what() + ")");
    }
    if (j.value("device", "") != expect_device_)
      throw Error(program_.filename().string() + " measured '" + j.value("device", "") + "', not '" +
                  expect_device_ + "'");
    std::map<std::string, Json> by_case;
    for (const auto& c : j.at("cases")) by_case[c.at("case").get<std::string>()] = c;
    for (const auto& c : cases)
      if (!by_case.count(c)) throw Error(program_.filename().string() + " reported no " + c);
    return by_case;
  }

  // One line: on stdout in the table, on stderr with --json.
  void say(const std::string& line) const {
    std::fprintf(json_ ? stderr : stdout, "%s\n", line.c_str());
    std::fflush(json_ ? stderr : stdout);
  }

 private:
  double min_time_;
  bool json_;
  int index_ = -1;
  std::string expect_device_;
  std::filesystem::path program_;
};

std::string human_time(double t) {
  char buf[64];
  if (t < 1e-3) std::snprintf(buf, sizeof buf, "%.3f us", t * 1e6);
  else std::snprintf(buf, sizeof buf, "%.3f ms", t * 1e3);
  return buf;
}

// A whole model (ONNX or graph file): compile once, then the reused plan's
// first run and its median warm run; --profile adds a warm run's steps.
int bench_model(const std::string& path, Args& args, const std::string& device_name, int threads, double min_time,
                bool json) {
  const bool profile = take_switch(args, "--profile");
  const bool optimize = take_optimize(args);
  LoadedModel m = load_model(path, args, true);
  reject_leftovers(args);
  RuntimeOptions opts;
  opts.num_threads = threads;
  auto rt = Runtime::create(opts);
  const std::vector<Device*> list = rt->select_devices(device_name);
  CompileOptions copts;
  copts.profile = profile;
  copts.optimize = optimize;
  copts.memory_baseline = true;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  Plan plan = rt->compile(m.file.graph, list, copts);
  const auto t1 = clock::now();
  plan.run(m.file.inputs);
  const auto t2 = clock::now();
  const double run_s = bench::median_seconds([&] { plan.run(m.file.inputs); }, std::max(min_time, 2.0));
  const Plan::CompileStats stats = plan.compile_stats();
  // Without the unoptimized baseline's lowering (memory figures only).
  const double compile_ms = std::chrono::duration<double, std::milli>(t1 - t0).count() - stats.baseline_seconds * 1e3;
  const double first_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  std::string used;
  for (const auto& d : plan.devices()) used += (used.empty() ? "" : ",") + d;
  if (json) {
    Json j{{"model", path}, {"device", used}, {"threads", rt->num_threads()}, {"import_ms", m.import_ms},
           {"compile_ms", compile_ms}, {"first_run_ms", first_ms}, {"median_run_ms", run_s * 1e3},
           {"buffer_bytes", stats.buffer_bytes}, {"unoptimized_buffer_bytes", stats.unoptimized_buffer_bytes}};
    if (profile) j["profile"] = plan.profile_json();
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  for (const auto& note : m.notes) std::printf("note: %s\n", note.c_str());
  std::printf("%s on %s, %u threads: import %.1f ms, compile %.1f ms, first run %.2f ms, median run %.3f ms\n",
              path.c_str(), used.c_str(), rt->num_threads(), m.import_ms, compile_ms, first_ms, run_s * 1e3);
  std::printf("%s\n", buffers_line(stats).c_str());
  if (profile) std::printf("profile (the last warm run):\n%s", plan.profile_table().c_str());
  return 0;
}

}  // namespace

int cmd_bench(const Args& in) {
  Args args = in;
  const std::string device_name = take_option(args, "--device", "cpu");
  const std::string filter = take_option(args, "--filter");
  const int threads = std::stoi(take_option(args, "--threads", "0"));
  const double min_time = std::stod(take_option(args, "--min-time", "0.3"));
  const bool json = take_switch(args, "--json");
  const std::string model_path = take_option(args, "--model");
  if (!model_path.empty()) return bench_model(model_path, args, device_name, threads, min_time, json);
  if (take_switch(args, "--generate")) return bench_generate(args, device_name, threads, json);
  reject_leftovers(args);

  RuntimeOptions opts;
  opts.num_threads = threads;
  // Start-up: what every host pays in Runtime::create and a device listing
  // from the manifests (CPU time of this process, median of 50).
  double startup_cpu = -1;
  if (filter.empty() || std::string("startup").find(filter) != std::string::npos) {
    std::vector<double> t;
    for (int i = 0; i < 50; ++i) {
      timespec a{}, b{};
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
      auto probe = Runtime::create(opts);
      const auto listing = probe->devices();
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
      if (listing.empty()) break;
      t.push_back((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9);
    }
    std::sort(t.begin(), t.end());
    if (!t.empty()) startup_cpu = t[t.size() / 2];
  }
  auto rt = Runtime::create(opts);
  // A list: the cases run on its first device with the rest as fallback
  // (each case compiles for the whole list), then the multi-device cases.
  const std::vector<Device*> list = rt->select_devices(device_name);
  Device& dev = *list.front();
  Json results = Json::array();
  if (!json) std::printf("device %s (%s), %u threads\n%-26s %12s %12s\n", dev.name().c_str(), dev.description().c_str(), rt->num_threads(), "case", "time", "rate");
  if (startup_cpu >= 0) {
    if (json) results.push_back({{"case", "startup"}, {"cpu_seconds", startup_cpu}});
    else std::printf("%-26s %12s %12s\n", "startup", human_time(startup_cpu).c_str(), "CPU, create + list");
  }
  const RawVulkan raw(dev, min_time, json);
  std::vector<Case> cases = all_cases(filter);
  // The stream roof, when asked for or when a memory-bound case runs on a
  // CPU-kind device (its fraction of the roof is reported).
  double stream_gbps = 0;
  const bool memory_bound_case =
      std::any_of(cases.begin(), cases.end(), [](const Case& c) { return c.bytes >= 32.0 * (1 << 20) && c.flops == 0; });
  if (filter.empty() || std::string("stream").find(filter) != std::string::npos ||
      (memory_bound_case && dev.kind() == "cpu")) {
    const double bytes = 3.0 * 4 * (16 << 20);
    const double t = stream_add_seconds(rt->num_threads(), min_time);
    stream_gbps = bytes / t / 1e9;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f GB/s", stream_gbps);
    if (json)
      results.push_back({{"case", "stream"}, {"threads", rt->num_threads()}, {"seconds", t}, {"gbps", stream_gbps}, {"description", dev.description()}});
    else
      std::printf("%-26s %12s %12s   plain C++ c=a+b, 16M f32, %u threads: the roof below\n", "stream", human_time(t).c_str(), buf,
                  rt->num_threads());
  }
  // A Vulkan device's own roofs, measured by the raw program in this run: a
  // vec4 copy (bandwidth) and an FMA loop (compute). Each case then reports
  // its fraction of the roof that bounds it.
  double roof_gbps = 0, roof_gflops = 0;
  if (raw.available() && !cases.empty()) {
    try {
      auto roofs = raw.run({"roof_copy", "roof_fma"});
      roof_gbps = roofs["roof_copy"].value("gbps", 0.0);
      roof_gflops = roofs["roof_fma"].value("gflops", 0.0);
      if (json) {
        results.push_back({{"case", "roof_copy"}, {"device", dev.name()}, {"gbps", roof_gbps}});
        results.push_back({{"case", "roof_fma"}, {"device", dev.name()}, {"gflops", roof_gflops}});
      } else {
        std::printf("%-26s %12s %9.1f GB/s   raw vec4 copy: the bandwidth roof\n", "roof_copy", "", roof_gbps);
        std::printf("%-26s %12s %6.1f GFLOP/s   raw FMA loop: the compute roof\n", "roof_fma", "", roof_gflops);
      }
    } catch (const std::exception& e) {
      raw.say(std::string("raw Vulkan roofs unavailable: ") + e.what());
    }
  }
  for (auto& c : cases) {
    // The raw baseline first, right before the plugin's timing of the same work.
    std::map<std::string, Json> raw_results;
    std::string raw_error;
    if (raw.available() && !RawVulkan::raw_cases(c.name).empty()) {
      try {
        raw_results = raw.run(RawVulkan::raw_cases(c.name));
      } catch (const std::exception& e) {
        raw_error = e.what();
        raw.say("raw Vulkan baseline for " + c.name + " unavailable: " + raw_error);
      }
    }
    try {
      CompileOptions co;
      co.optimize = c.optimize;
      Plan plan = rt->compile(c.graph, list, co);
      for (auto& [name, t] : c.inputs) plan.set_input(name, t);
      const double t = bench::median_seconds(
          [&] {
            if (c.call == Case::Call::run) plan.run(c.inputs);
            else if (c.call == Case::Call::submit) plan.submit(c.inputs).outputs();
            else plan.execute();
          },
          min_time);
      std::string rate;
      char buf[64];
      if (c.flops > 0) std::snprintf(buf, sizeof buf, "%.1f GFLOP/s", c.flops / t / 1e9), rate = buf;
      else if (c.bytes > 0) std::snprintf(buf, sizeof buf, "%.1f GB/s", c.bytes / t / 1e9), rate = buf;
      Json record = {{"case", c.name},
                     {"device", dev.name()},
                     {"description", dev.description()},
                     {"threads", rt->num_threads()},
                     {"seconds", t},
                     {"gbps", c.bytes > 0 ? c.bytes / t / 1e9 : 0.0},
                     {"gflops", c.flops > 0 ? c.flops / t / 1e9 : 0.0}};
      // Streaming cases (tens of MiB and no arithmetic to speak of); not the
      // cache-resident chains and single elements.
      const bool memory_bound = c.bytes >= 32.0 * (1 << 20) && c.flops == 0;
      if (memory_bound && stream_gbps > 0) record["stream_fraction"] = c.bytes / t / 1e9 / stream_gbps;
      double roof = 0;
      if (c.flops > 0 && roof_gflops > 0) roof = c.flops / t / 1e9 / roof_gflops;
      else if (c.bytes > 0 && roof_gbps > 0) roof = c.bytes / t / 1e9 / roof_gbps;
      if (roof > 0) record["roof_fraction"] = roof;
      if (!json) {
        if (roof > 0)
          std::printf("%-26s %12s %12s   %3.0f%% of the %s roof\n", c.name.c_str(), human_time(t).c_str(), rate.c_str(),
                      100.0 * roof, c.flops > 0 ? "compute" : "bandwidth");
        else if (memory_bound && stream_gbps > 0)
          std::printf("%-26s %12s %12s   %3.0f%% of stream\n", c.name.c_str(), human_time(t).c_str(), rate.c_str(),
                      100.0 * c.bytes / t / 1e9 / stream_gbps);
        else
          std::printf("%-26s %12s %12s\n", c.name.c_str(), human_time(t).c_str(), rate.c_str());
      }
      if (!raw_error.empty()) record["raw_error"] = raw_error;
      if (c.name == "add_16M" && raw_results.count("add_16M")) {
        const Json& r = raw_results["add_16M"];
        const double rs = r.at("seconds").get<double>();
        record["raw_seconds"] = rs;
        record["raw_gbps"] = r.at("gbps").get<double>();
        record["overhead_ratio"] = t / rs;
        if (!json) {
          std::snprintf(buf, sizeof buf, "%.1f GB/s", r.at("gbps").get<double>());
          std::printf("%-26s %12s %12s   plugin/raw %.2f\n", "  raw vulkan", human_time(rs).c_str(), buf,
                      t / rs);
        }
      }
      if (c.name == "chain100_add_4K" && raw_results.count("chain100_add_4K")) {
        const Json& r = raw_results["chain100_add_4K"];
        const double dispatches = r.at("dispatches").get<double>();
        const double rs = r.at("seconds").get<double>();
        const double empty = raw_results["empty_submit"].at("seconds").get<double>();
        record["per_dispatch_seconds"] = t / dispatches;
        record["raw_seconds"] = rs;
        record["raw_per_dispatch_seconds"] = rs / dispatches;
        record["raw_empty_submit_seconds"] = empty;
        record["overhead_ratio"] = t / rs;
        if (!json) {
          std::printf("%-26s %12s\n", "  per dispatch", human_time(t / dispatches).c_str());
          std::printf("%-26s %12s %12s   plugin/raw %.2f\n", "  raw vulkan per dispatch",
                      human_time(rs / dispatches).c_str(), "", t / rs);
          std::printf("%-26s %12s\n", "  raw vulkan empty submit", human_time(empty).c_str());
        }
      }
      if (json) results.push_back(std::move(record));
    } catch (const std::exception& e) {
      if (json) results.push_back({{"case", c.name}, {"device", dev.name()}, {"error", e.what()}});
      else std::printf("%-26s failed: %s\n", c.name.c_str(), e.what());
    }
    std::fflush(stdout);
  }
  bench_io(*rt, *list[0], filter, min_time, json, results);
  if (list.size() >= 2) {
    if (!json) std::printf("\nacross %s and %s\n", list[0]->name().c_str(), list[1]->name().c_str());
    bench_multidevice(*rt, list, filter, min_time, json, results);
  }
  if (json) std::cout << results.dump(2) << "\n";
  return 0;
}

}  // namespace backplane::cli
