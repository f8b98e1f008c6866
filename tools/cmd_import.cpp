// backplane import MODEL.onnx --out DIR: the model as a graph file with its
// weights as .npy files beside it.
#include "cli_module.hpp"
#include "commands.hpp"
#include "model_input.hpp"

#include <cstdio>
#include <map>

namespace backplane::cli {

int cmd_import(const Args& in) {
  Args args = in;
  const std::string out_dir = take_option(args, "--out");
  const bool dynamic = take_switch(args, "--dynamic");
  if (args.empty() || args.front().rfind("--", 0) == 0 || out_dir.empty())
    throw Error("import needs a model and a folder: backplane import MODEL.onnx --out DIR [--input NAME=FILE.npy]... [--dim NAME=N]... [--dynamic]");
  const std::filesystem::path path = args.front();
  args.erase(args.begin());
  if (!is_onnx_path(path)) throw Error(path.string() + ": import takes an ONNX model (.onnx)");
  LoadedModel m = load_model(path, args, true, dynamic);
  reject_leftovers(args);
  const auto file = onnx_module().write_graph_dir(m.file.graph, out_dir);
  std::map<std::string, int> ops;
  for (const auto& n : m.file.graph.nodes()) ++ops[n.op];
  std::printf("imported %s (opset %lld) in %.1f ms: %zu nodes, %.1f MB of constants\n", path.string().c_str(),
              static_cast<long long>(m.opset), m.import_ms, m.file.graph.nodes().size(), static_cast<double>(m.weight_bytes) / 1e6);
  std::string list;
  for (const auto& [op, count] : ops) list += (list.empty() ? "" : ", ") + op + " " + std::to_string(count);
  std::printf("  ops: %s\n", list.c_str());
  for (const auto& note : m.notes)
    if (note.rfind("input '", 0) != 0) std::printf("  %s\n", note.c_str());
  for (const auto& in : m.file.graph.inputs()) {
    if (in.constant) continue;
    std::string shape = shape_str(in.shape);
    if (!in.dim_names.empty()) {  // a dynamic dim by its name: [1, seq, 64]
      shape = "[";
      for (size_t i = 0; i < in.shape.size(); ++i)
        shape += (i ? ", " : "") + (in.dim_names[i].empty() ? std::to_string(in.shape[i]) : in.dim_names[i]);
      shape += "]";
    }
    std::printf("  input  %-12s %-4s %s\n", in.name.c_str(), std::string(dtype_name(in.dtype)).c_str(), shape.c_str());
  }
  for (const auto& o : m.file.graph.outputs()) std::printf("  output %s\n", o.c_str());
  std::printf("wrote %s (run it: backplane run %s --input NAME=FILE.npy)\n", file.string().c_str(), file.string().c_str());
  return 0;
}

}  // namespace backplane::cli
