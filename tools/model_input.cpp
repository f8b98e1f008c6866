#include "model_input.hpp"

#ifdef BACKPLANE_HAVE_ONNX
#include "cli_module.hpp"
#endif

#include <random>

namespace backplane::cli {

std::vector<std::string> take_all(Args& args, const std::string& name) {
  std::vector<std::string> r;
  for (;;) {
    const std::string v = take_option(args, name, "\x01");
    if (v == "\x01") return r;
    r.push_back(v);
  }
}

bool is_onnx_path(const std::filesystem::path& path) { return path.extension() == ".onnx"; }

namespace {

std::pair<std::string, std::string> split_eq(const std::string& s, const std::string& opt) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
    throw Error(opt + " takes NAME=VALUE, got '" + s + "'");
  return {s.substr(0, eq), s.substr(eq + 1)};
}

HostTensor random_tensor(bp_dtype dt, const Shape& shape, uint32_t seed) {
  HostTensor t(dt, shape);
  if (!is_float(dt)) return t;  // zeros: valid token ids, indices, masks
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

}  // namespace

LoadedModel load_model(const std::filesystem::path& path, Args& args, bool random_inputs, bool keep_dynamic) {
  LoadedModel m;
  std::map<std::string, HostTensor> given;
  for (const auto& s : take_all(args, "--input")) {
    auto [name, file] = split_eq(s, "--input");
    try {
      given[name] = read_npy(file);
    } catch (const Error& e) {
      throw Error("--input " + name + ": " + e.what());
    }
  }
  std::map<std::string, int64_t> dims;
  for (const auto& s : take_all(args, "--dim")) {
    auto [name, value] = split_eq(s, "--dim");
    try {
      size_t used = 0;
      const long long v = std::stoll(value, &used);
      if (used != value.size() || v < 0) throw std::invalid_argument(value);
      dims[name] = v;
    } catch (const std::exception&) {
      throw Error("--dim " + name + ": '" + value + "' is not a size");
    }
  }
  if (is_onnx_path(path)) {
#ifdef BACKPLANE_HAVE_ONNX
    std::map<std::string, Shape> shapes;
    for (const auto& [name, t] : given) shapes[name] = t.shape;
    onnx_module().import_model(path, dims, shapes, keep_dynamic, m);
    // --input keys are the model's names (or the graph's, where they differ).
    for (auto& [name, t] : given) {
      std::string key = name;
      for (const auto& [ours, theirs] : m.onnx_names)
        if (theirs == name) key = ours;
      m.file.inputs[key] = std::move(t);
    }
#else
    throw Error(path.string() + ": this build has no ONNX importer (install libonnx-dev and rebuild)");
#endif
  } else {
    if (!dims.empty()) throw Error("--dim applies to ONNX models only");
    m.file = load_graph_file(path);
    for (auto& [name, t] : given) m.file.inputs[name] = std::move(t);
  }
  uint32_t seed = 0;
  for (const auto& in : m.file.graph.inputs()) {
    if (in.constant || m.file.inputs.count(in.name) || !in.dim_names.empty()) continue;
    if (!random_inputs)
      throw Error("input '" + in.name + "' (" + std::string(dtype_name(in.dtype)) + " " + shape_str(in.shape) +
                  ") has no data: give it with --input " + in.name + "=FILE.npy");
    m.file.inputs[in.name] = random_tensor(in.dtype, in.shape, seed++);
    m.notes.push_back("input '" + in.name + "' not given: " + (is_float(in.dtype) ? "uniform [-1, 1)" : "zeros") + " " +
                      std::string(dtype_name(in.dtype)) + " " + shape_str(in.shape));
  }
  for (const auto& [name, t] : m.file.inputs) {
    bool found = false;
    for (const auto& in : m.file.graph.inputs()) found = found || (in.name == name && !in.constant);
    if (!found) throw Error("--input " + name + ": the graph has no such input");
  }
  return m;
}

std::string buffers_line(const Plan::CompileStats& s) {
  auto mib = [](uint64_t b) {
    char t[32];
    std::snprintf(t, sizeof t, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
    return std::string(t);
  };
  std::string line = "buffers:";
  for (const auto& [dev, bytes] : s.buffer_bytes) {
    line += " " + dev + " " + mib(bytes);
    auto it = s.unoptimized_buffer_bytes.find(dev);
    if (it != s.unoptimized_buffer_bytes.end()) line += " (as written: " + mib(it->second) + ")";
  }
  return line;
}

}  // namespace backplane::cli
