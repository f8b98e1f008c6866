// The ONNX importer's harness (builds with libonnx-dev only): bytes -> a
// ModelProto -> onnx::import_bytes. Refusals (backplane::Error) are fine; a
// model it accepts must be a graph the core accepts as it is (every node was
// inferred on the way), with each input and output it reports in the graph.
#include "harness.hpp"

#include <backplane/onnx.hpp>

namespace backplane::fuzz {

int onnx_one(const uint8_t* data, size_t size) {
  if (size > kMaxInput) {
    set_note("skipped: too large");
    return 0;
  }
  onnx::ImportOptions opt;
  // Small folds: the harness looks for wrong answers and crashes, not for
  // how long a large constant takes to compute.
  opt.fold_limit = 1 << 14;
  opt.default_dim = 2;
  onnx::ImportedModel m;
  try {
    m = onnx::import_bytes(std::string_view(reinterpret_cast<const char*>(data), size), opt, "fuzz.onnx");
  } catch (const Error& e) {
    set_note(std::string("refused: ") + e.what());
    return 0;
  }
  std::map<std::string, std::pair<bp_dtype, Shape>> types;
  try {
    types = infer_graph(m.graph);
  } catch (const Error& e) {
    throw HarnessFailure(std::string("an imported graph the core refuses: ") + e.what());
  }
  for (const auto& name : m.inputs)
    if (!types.count(name)) throw HarnessFailure("input '" + name + "' is not in the imported graph");
  for (const auto& name : m.outputs)
    if (!types.count(name)) throw HarnessFailure("output '" + name + "' is not in the imported graph");
  set_note("imported: " + std::to_string(m.graph.nodes().size()) + " nodes");
  return 0;
}

}  // namespace backplane::fuzz
