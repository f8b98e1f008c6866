// libbackplane_cli_onnx.so: the ONNX importer (Backplane::onnx, libonnx,
// protobuf) for `import`, and for `run` and `bench --model` given an .onnx
// model, opened by the program only then (cli_module.hpp).
#include "cli_module.hpp"

#include <backplane/onnx.hpp>

#include <chrono>

namespace backplane::cli {

namespace {

void import_model(const std::filesystem::path& path, const std::map<std::string, int64_t>& dims,
                  const std::map<std::string, Shape>& input_shapes, bool keep_dynamic, LoadedModel& m) {
  onnx::ImportOptions opt;
  opt.dims = dims;
  opt.input_shapes = input_shapes;
  opt.keep_dynamic = keep_dynamic;
  const auto t0 = std::chrono::steady_clock::now();
  auto im = onnx::import_file(path, opt);
  m.import_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  m.onnx = true;
  m.notes = im.notes;
  m.onnx_names = im.onnx_names;
  m.weight_bytes = im.weight_bytes;
  m.opset = im.opset;
  m.file.graph = std::move(im.graph);
}

std::filesystem::path write_graph_dir(const Graph& graph, const std::filesystem::path& dir) {
  return onnx::write_graph_dir(graph, dir);
}

}  // namespace

}  // namespace backplane::cli

extern "C" __attribute__((visibility("default"))) const backplane::cli::OnnxModule* backplane_cli_onnx_module() {
  using namespace backplane::cli;
  static const OnnxModule table{kCliModuleAbi, sizeof(OnnxModule), &import_model, &write_graph_dir};
  return &table;
}
