// diff_fuzz: a graph-level differential fuzzer. It generates random valid
// graphs (chains and DAGs of elementwise ops with broadcasting, reductions,
// softmax, matmul, concat, views, topk and var_mean with their slots,
// gather/index_select, casts between every dtype, compares and where; with
// --partial-dir the test plugin's vendor ops too) over random inline
// constants or fed inputs, runs each on the CPU plugin (the reference) and on
//   vulkan0 alone            (when there is a Vulkan device and it has every kernel),
//   "vulkan0,cpu"            (some nodes pinned to one device or the other),
//   "partial0,cpu"           (with --partial-dir: the test plugin, some nodes pinned),
// and compares the results with docs/ops.md's tolerances: f32 relative 1e-4
// or absolute 1e-6 per element, NaN matches NaN, infinities exactly,
// integers and bools exactly. Every plan is also run twice (the same bits).
//
//   diff_fuzz [--seed N] [--count M] [--start K] [--max-nodes K] [--partial-dir DIR]
//             [--save DIR] [--no-scalar-dims] [--verbose]
//
// `diff_fuzz --graph FILE...` runs graph files (inline inputs) the same way:
// on the CPU without pins, on vulkan0 alone, and on the device lists with the
// file's own pins. fuzz/diff_fuzz_cases/ holds what it found, minimised.
//
// --no-scalar-dims leaves out rank-0 inputs to the ops that take dim 0 or -1
// on them (softmax, log_softmax, cumsum, argmax, argmin, gather).
//
// Graph i of seed N is the same graph on any machine: `--seed N --start i
// --count 1` regenerates it. A mismatch prints the graph as a graph file
// (every input inline, the pins of the device list that failed), which
// `backplane run graph.json --device <list>` replays; --save writes it too.
//
// The generator keeps, per value, bounds of its elements, whether it is exact
// (small dyadic values through exactly rounded arithmetic: the same bits on
// any correct device, whatever the order of a sum) and otherwise an estimate
// of how far two correct devices may drift apart; it only builds values whose
// drift stays well within the tolerance, so a mismatch means a bug, not
// rounding. Ops whose answer can flip on a last-bit difference (floor,
// compare, argmax, topk indices, casts, sign) only take exact values; f16,
// bf16 and f64 values are all exact (small dyadic numbers), integers exact
// (they wrap).
#include "diff_fuzz.hpp"

namespace diff_fuzz {
namespace {

// ---- running and comparing -----------------------------------------------------------

struct Outcome {
  std::map<std::string, HostTensor> outputs;
  int fused_attention = 0;  // nodes the optimizer ran as scaled_dot_product_attention
  int fused_chains = 0;     // nodes it ran as fused_elementwise
  std::string error;  // compile or run error ("" when it ran)
  bool compile_failed = false;
  bool escaped = false;  // an exception other than backplane::Error
};

Graph build_graph(const Json& graph, const std::set<std::string>& fed, std::map<std::string, HostTensor>& feeds) {
  GraphFile gf = parse_graph_json(graph, ".");
  Graph g;
  for (const auto& in : gf.graph.inputs()) {
    if (fed.count(in.name)) {
      g.input(in.name, in.dtype, in.shape);
      feeds[in.name] = *in.constant;
    } else {
      g.constant(in.name, *in.constant);
    }
  }
  for (const auto& n : gf.graph.nodes()) g.node(n.name, n.op, n.inputs, n.params, n.device);
  for (const auto& o : gf.graph.outputs()) g.output(o);
  return g;
}

Outcome run_on(Runtime& rt, const Json& graph, const std::set<std::string>& fed, const std::vector<Device*>& devices,
               std::string* determinism, bool optimize = true) {
  Outcome o;
  std::map<std::string, HostTensor> feeds;
  std::optional<Plan> plan;
  try {
    Graph g = build_graph(graph, fed, feeds);
    CompileOptions co;
    co.optimize = optimize;
    plan.emplace(rt.compile(g, devices, co));
    for (const auto& p : plan->placement()) {
      o.fused_attention += p.op == "scaled_dot_product_attention";
      o.fused_chains += p.op == "fused_elementwise";
    }
  } catch (const Error& e) {
    o.error = e.what();
    o.compile_failed = true;
    return o;
  } catch (const std::exception& e) {  // every error must be a backplane::Error
    o.error = std::string("compile threw a non-backplane exception: ") + e.what();
    o.escaped = true;
    return o;
  }
  try {
    o.outputs = plan->run(feeds);
  } catch (const Error& e) {
    o.error = e.what();
    return o;
  } catch (const std::exception& e) {
    o.error = std::string("run threw a non-backplane exception: ") + e.what();
    o.escaped = true;
    return o;
  }
  // The same plan again: the same bits.
  try {
    auto again = plan->run(feeds);
    for (const auto& [name, t] : o.outputs)
      if (again.at(name).bytes != t.bytes) {
        *determinism = "output '" + name + "' differs between two runs of the same plan";
        break;
      }
  } catch (const Error& e) {
    *determinism = std::string("the second run failed: ") + e.what();
  }
  return o;
}

// A graph file as text: one input, node or output list per line.
std::string graph_text(const Json& g) {
  std::string s = "{\n  \"inputs\": {";
  bool first = true;
  for (const auto& [name, spec] : g["inputs"].items()) {
    s += std::string(first ? "" : ",") + "\n    " + Json(name).dump() + ": " + spec.dump();
    first = false;
  }
  s += "\n  },\n  \"nodes\": [";
  first = true;
  for (const auto& n : g["nodes"]) {
    s += std::string(first ? "" : ",") + "\n    " + n.dump();
    first = false;
  }
  return s + "\n  ],\n  \"outputs\": " + g["outputs"].dump() + "\n}";
}

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

// docs/ops.md's comparison for f32 (relative 1e-4 or absolute 1e-6), exact
// for the rest. Returns "" or the first difference.
std::string compare(const HostTensor& ref, const HostTensor& got) {
  if (ref.dtype != got.dtype || ref.shape != got.shape)
    return "type " + std::string(dtype_name(got.dtype)) + shape_text(got.shape) + ", the CPU gives " +
           std::string(dtype_name(ref.dtype)) + shape_text(ref.shape);
  const int64_t n = ref.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (ref.dtype == BP_DTYPE_F32 || ref.dtype == BP_DTYPE_F64 || ref.dtype == BP_DTYPE_F16 || ref.dtype == BP_DTYPE_BF16) {
      // f16, bf16 and f64 values are exact here (see within_tolerance).
      const double a = ref.get(i), b = got.get(i);
      const double tol = ref.dtype == BP_DTYPE_F32 ? std::max(1e-6, 1e-4 * std::fabs(a)) : 0.0;
      bool ok;
      if (std::isnan(a) || std::isnan(b)) ok = std::isnan(a) && std::isnan(b);
      else if (std::isinf(a) || std::isinf(b)) ok = a == b;
      else ok = std::fabs(a - b) <= tol;
      if (!ok) return "element " + std::to_string(i) + ": " + num(b) + ", the CPU gives " + num(a);
    } else if (ref.get_int(i) != got.get_int(i)) {
      return "element " + std::to_string(i) + ": " + std::to_string(got.get_int(i)) + ", the CPU gives " +
             std::to_string(ref.get_int(i));
    }
  }
  return "";
}

struct Options {
  uint64_t seed = 1;
  int count = 200;
  int start = 0;
  int max_nodes = 12;
  std::string partial_dir;
  std::string save_dir;
  bool verbose = false;
  bool scalar_dims = true;
  std::vector<std::string> graph_files;  // --graph: these instead of generated graphs
};

// The graph with pins on some nodes: "cpu" on any; `other` (the device
// besides the CPU) on those `other_runs` says it has a kernel for.
template <typename F>
Json with_pins(const Json& graph, std::mt19937_64& rng, const std::string& other, F other_runs) {
  Json g = graph;
  std::uniform_real_distribution<double> u(0, 1);
  // Views have no device of their own (the core refuses a pin on one).
  static const std::set<std::string> views = {"view", "reshape", "permute", "transpose", "broadcast_to",
                                              "slice", "squeeze", "unsqueeze"};
  for (auto& n : g["nodes"]) {
    const double r = u(rng);
    if (views.count(n["op"].get<std::string>())) continue;
    if (r < 0.25) n["device"] = "cpu";
    else if (r < 0.5 && other_runs(n)) n["device"] = other;
  }
  return g;
}

int usage() {
  std::cerr << "usage: diff_fuzz [--seed N] [--count M] [--start K] [--max-nodes K] [--partial-dir DIR] [--save DIR] "
               "[--no-scalar-dims] [--verbose]\n       diff_fuzz [--partial-dir DIR] --graph FILE [--graph FILE]...\n";
  return 2;
}

}  // namespace
}  // namespace diff_fuzz

using namespace diff_fuzz;

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) std::exit(usage());
      return argv[++i];
    };
    if (a == "--seed") opt.seed = std::stoull(next());
    else if (a == "--count") opt.count = std::stoi(next());
    else if (a == "--start") opt.start = std::stoi(next());
    else if (a == "--max-nodes") opt.max_nodes = std::max(1, std::stoi(next()));
    else if (a == "--partial-dir") opt.partial_dir = next();
    else if (a == "--save") opt.save_dir = next();
    else if (a == "--verbose" || a == "-v") opt.verbose = true;
    else if (a == "--no-scalar-dims") opt.scalar_dims = false;
    else if (a == "--graph") opt.graph_files.push_back(next());
    else return usage();
  }

  RuntimeOptions ro;
  ro.use_environment = false;
  // The attention step's graphs are small: fuse them on the CPU anyway, so
  // fused and composed meet.
  ro.attention_cpu_min_bytes = 0;
  if (!opt.partial_dir.empty()) ro.plugin_paths.emplace_back(opt.partial_dir);
  auto rt = Runtime::create(ro);
  std::vector<Device*> cpu, vulkan, vulkan_list, partial_list;
  try {
    cpu = rt->select_devices("cpu");
  } catch (const Error& e) {
    std::cerr << "diff_fuzz: no CPU plugin: " << e.what() << "\n";
    return 1;
  }
  try {
    vulkan = rt->select_devices("vulkan0");
    vulkan_list = rt->select_devices("vulkan0,cpu");
  } catch (const Error& e) {
    std::printf("diff_fuzz: no vulkan0 (%s): CPU against the device lists only\n", e.what());
    vulkan.clear();
  }
  if (!opt.partial_dir.empty()) partial_list = rt->select_devices("partial0,cpu");

  int failures = 0, generator_rejections = 0, vulkan_skipped = 0, compared = 0, fused_attention = 0, fused_chains = 0;
  size_t nodes = 0;
  std::map<std::string, int> op_counts;
  // `label`: "graph 12 (--seed 1 --start 12 --count 1)" or a file name;
  // `stem`: the file name --save writes.
  std::string label, stem;
  auto report = [&](const std::string& config, const std::string& what, const Json& graph,
                    const std::set<std::string>& fed) {
    ++failures;
    std::printf("\nMISMATCH %s on %s: %s\n", label.c_str(), config.c_str(), what.c_str());
    std::string fed_list;
    for (const auto& f : fed) fed_list += (fed_list.empty() ? "" : ", ") + f;
    if (!fed_list.empty()) std::printf("(inputs fed at run time, inline below: %s)\n", fed_list.c_str());
    std::printf("replay: backplane run graph.json --device %s\n%s\n", config.c_str(), graph_text(graph).c_str());
    if (!opt.save_dir.empty()) {
      std::filesystem::create_directories(opt.save_dir);
      const auto path = std::filesystem::path(opt.save_dir) / (stem + ".json");
      std::ofstream(path) << graph_text(graph) << "\n";
      std::printf("saved: %s\n", path.c_str());
    }
  };

  // One graph: on the CPU, then on the other devices. A graph file (`from_file`)
  // keeps its own pins for the device lists and gets none added.
  auto run_case = [&](const Case& c, uint64_t graph_seed, bool from_file) {
    std::mt19937_64 pin_rng(graph_seed ^ 0x9e3779b97f4a7c15ULL);
    Json unpinned = c.graph;
    for (auto& n : unpinned["nodes"]) n.erase("device");
    std::string det;
    const Outcome ref = run_on(*rt, unpinned, c.fed, cpu, &det);
    fused_attention += ref.fused_attention > 0;
    if (!ref.error.empty()) {
      report("cpu", (ref.escaped ? "" : "the CPU refused a valid graph: ") + ref.error, unpinned, c.fed);
      return;
    }
    if (!det.empty()) report("cpu", det, unpinned, c.fed);
    auto check = [&](const std::string& config, const Json& graph, const std::vector<Device*>& devices,
                     bool may_lack_kernels, bool optimize = true) -> bool {
      std::string d;
      const Outcome o = run_on(*rt, graph, c.fed, devices, &d, optimize);
      if (o.compile_failed && may_lack_kernels && !o.escaped) return false;
      ++compared;
      if (!o.error.empty()) {
        report(config, (o.compile_failed ? "compile failed: " : "run failed: ") + o.error, graph, c.fed);
        return true;
      }
      if (!d.empty()) report(config, d, graph, c.fed);
      std::string diffs;  // every output that differs, one line each
      for (const auto& [name, t] : ref.outputs) {
        auto it = o.outputs.find(name);
        const std::string diff = it == o.outputs.end() ? "missing" : compare(t, it->second);
        if (diff.empty()) continue;
        const auto op = c.node_ops.find(name);
        diffs += std::string(diffs.empty() ? "" : "\n  ") + "output '" + name + "'" +
                 (op == c.node_ops.end() ? "" : " (" + op->second + ")") + ": " + diff;
      }
      if (!diffs.empty()) report(config, diffs, graph, c.fed);
      return true;
    };
    // Fused chains against the same graph unfused, on the same device.
    if (ref.fused_chains > 0) {
      ++fused_chains;
      check("cpu --optimize none", unpinned, cpu, false, false);
    }
    if (from_file) {
      if (!vulkan.empty()) {
        if (!check("vulkan0", unpinned, vulkan, true)) ++vulkan_skipped;
        check("vulkan0,cpu", c.graph, vulkan_list, false);
      }
      if (!partial_list.empty()) check("partial0,cpu", c.graph, partial_list, false);
      return;
    }
    if (!vulkan.empty()) {
      const bool alone = check("vulkan0", c.graph, vulkan, true);
      if (!alone) ++vulkan_skipped;
      check("vulkan0,cpu", with_pins(c.graph, pin_rng, "vulkan0", [&](const Json&) { return alone; }), vulkan_list,
            false);
    }
    if (!partial_list.empty()) {
      // The test plugin's f32 ops (tests/fixtures/partial.json.in).
      auto partial_runs = [&](const Json& n) {
        static const std::set<std::string> ops = {"add", "mul", "relu", "exp", "contiguous", "partial.scale_shift",
                                                  "partial.minmax", "partial.norm_rows"};
        const std::string name = n["name"];
        const std::string op = n["op"];
        return ops.count(op) && (c.node_dtypes.at(name) == BP_DTYPE_F32 || op == "partial.minmax") &&
               std::all_of(n["inputs"].begin(), n["inputs"].end(), [&](const Json& i) {
                 const std::string in = i.get<std::string>();
                 auto it = c.node_dtypes.find(in);
                 return it != c.node_dtypes.end() ? it->second == BP_DTYPE_F32
                                                  : c.graph["inputs"][in]["dtype"] == "f32";
               });
      };
      check("partial0,cpu", with_pins(c.graph, pin_rng, "partial0", partial_runs), partial_list, false);
    }
  };

  if (!opt.graph_files.empty()) {
    for (const auto& file : opt.graph_files) {
      label = file;
      stem = std::filesystem::path(file).stem().string();
      Case c;
      try {
        std::ifstream in(file);
        c.graph = Json::parse(in);
        for (const auto& n : c.graph.at("nodes")) c.node_ops[n.at("name").get<std::string>()] = n.at("op").get<std::string>();
      } catch (const std::exception& e) {
        std::printf("diff_fuzz: %s: %s\n", file.c_str(), e.what());
        ++failures;
        continue;
      }
      run_case(c, 0, true);
    }
    std::printf("diff_fuzz: %zu graph files: %d comparisons, %d failures\n", opt.graph_files.size(), compared, failures);
    return failures ? 1 : 0;
  }

  for (int index = opt.start; index < opt.start + opt.count; ++index) {
    const uint64_t graph_seed = opt.seed * 1000003ULL + static_cast<uint64_t>(index);
    Generator gen(graph_seed, opt.max_nodes, opt.scalar_dims, !partial_list.empty());
    const Case c = gen.make();
    generator_rejections += c.rejected;
    nodes += c.node_names.size();
    for (const auto& [name, op] : c.node_ops) ++op_counts[op];
    if (opt.verbose) {
      std::printf("graph %d: %zu nodes, %d proposals refused\n", index, c.node_names.size(), c.rejected);
      for (const auto& r : c.rejections) std::printf("  refused: %s\n", r.c_str());
    }
    label = "graph " + std::to_string(index) + " (--seed " + std::to_string(opt.seed) + " --start " +
            std::to_string(index) + " --count 1)";
    stem = "seed" + std::to_string(opt.seed) + "-graph" + std::to_string(index);
    run_case(c, graph_seed, false);
  }
  if (opt.verbose) {
    std::printf("ops generated:");
    for (const auto& [op, n] : op_counts) std::printf(" %s %d", op.c_str(), n);
    std::printf("\n");
  }
  std::printf("diff_fuzz: seed %llu, graphs %d..%d (%zu nodes): %d comparisons, %d failures; vulkan0 alone lacked a "
              "kernel for %d graphs; the core refused %d generated nodes; %d graphs ran fused attention and %d fused "
              "elementwise chains on the cpu (the chains also compared unfused)\n",
              static_cast<unsigned long long>(opt.seed), opt.start, opt.start + opt.count - 1, nodes, compared, failures,
              vulkan_skipped, generator_rejections, fused_attention, fused_chains);
  return failures ? 1 : 0;
}
