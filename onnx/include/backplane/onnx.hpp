// ONNX models in: Backplane::onnx (libbackplane_onnx), built where Debian's
// libonnx-dev is installed.
//
//   backplane::onnx::ImportOptions opt;
//   opt.input_shapes["input"] = {1, 3, 224, 224};   // or opt.dims["batch"] = 1
//   auto m = backplane::onnx::import_file("resnet18.onnx", opt);
//   backplane::Plan plan = rt->compile(m.graph, rt->select_devices("vulkan0,cpu"));
//   auto out = plan.run({{m.inputs[0], x}});         // keyed by the model's names
//
// The model is parsed with ONNX's own protobuf classes and checked with its
// checker; every node is mapped onto the standard ops of docs/ops.md (some
// ONNX ops become several: Gemm, HardSwish, BatchNormalization, ...). A
// dynamic dim (`batch`, `sequence`) takes its size from `input_shapes` or
// `dims`; with `keep_dynamic` or `dynamic_dims` a named one stays dynamic in
// the graph (that size is then only the one imported at). Subgraphs whose inputs are all known
// at import (shape arithmetic: Shape, Gather, Concat, ConstantOfShape,
// Range, ...) are folded into constants. Initializers become graph constants
// (copied once out of the parsed model, whose copy is freed as it goes).
//
// Every failure is a backplane::Error naming the model and the node. A model
// with ops that cannot be mapped fails before anything is built, listing
// every such op with its node names and the opset.
#pragma once

#include <backplane/backplane.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::onnx {

struct ImportOptions {
  // Shapes of the model's inputs, by ONNX name: required for an input with a
  // dynamic dim unless `dims` names it; a given shape must agree with the
  // model's static dims.
  std::map<std::string, Shape> input_shapes;
  // Sizes of named dynamic dims ("batch": 1).
  std::map<std::string, int64_t> dims;
  // The size of any dynamic dim neither of the above gives (-1: none; such
  // a dim is then an error naming it).
  int64_t default_dim = -1;
  // Keep the named dynamic dims of the model's inputs dynamic in the graph
  // (Graph::input with dim names), so that one plan runs at every size
  // (docs/host-guide.md, Dynamic dims). The sizes above are then the trial
  // sizes the model is imported at. A dim the graph cannot keep, because a
  // node needs a param or a constant computed from its size that no
  // size-independent param can replace (a Range or Trilu of `seq` elements,
  // a Reshape with two entries that follow dims), is fixed at its trial size
  // with a note in ImportedModel::notes naming the node ("dim 'seq' fixed at
  // 16: node 'r' (Range) makes a constant that depends on it ..."). Unnamed
  // dynamic dims are always fixed. docs/onnx.md, Dynamic dims.
  bool keep_dynamic = false;
  // Dims that must stay dynamic (with or without keep_dynamic): one that
  // cannot is an Error naming the node, and so is a name no input has.
  std::set<std::string> dynamic_dims;
  // Fold a BatchNormalization that follows a Conv into the Conv's weights
  // and bias (exact up to f32 rounding of the folded weights).
  bool fold_batch_norm = true;
  // Map the compositions exporters write for LayerNorm (before opset 17) and
  // GELU (erf form) onto layer_norm and gelu (f32/f64) at import. Off by
  // default: the optimizer does the same at compile (CompileOptions::
  // optimize), so `--optimize none` runs the model as exported.
  bool map_compositions = false;
  // Nodes whose inputs are all known at import are evaluated then, up to
  // this many elements per value (larger ones stay nodes).
  int64_t fold_limit = int64_t{1} << 20;
};

struct ImportedModel {
  Graph graph;
  // The model's inputs and outputs in order: Backplane names (the same as the
  // ONNX names unless those had characters a file name cannot hold).
  std::vector<std::string> inputs, outputs;
  std::map<std::string, std::string> onnx_names;  // Backplane name -> ONNX name, for inputs and outputs
  int64_t opset = 0;
  std::string producer;      // producer_name and version, as the model says
  uint64_t weight_bytes = 0;  // constants in the graph
  // What the import did beyond a one-to-one mapping ("3 BatchNormalization
  // folded into Conv", "41 nodes evaluated at import").
  std::vector<std::string> notes;
  // The dims the graph keeps dynamic (keep_dynamic, dynamic_dims), in the
  // order the model's inputs name them, and their sizes at import: the
  // first sizes for a plan (CompileOptions::dims = m.dims).
  std::vector<std::string> dynamic_dims;
  std::map<std::string, int64_t> dims;
  // The named dynamic dims of the model's inputs fixed at import, and their sizes.
  std::map<std::string, int64_t> fixed_dims;
};

// Reads and imports an ONNX file (external data is read from beside it).
ImportedModel import_file(const std::filesystem::path& path, const ImportOptions& options = {});
// Imports a serialized ModelProto held in memory (no external data). `label`
// names the model in messages.
ImportedModel import_bytes(std::string_view bytes, const ImportOptions& options = {},
                           const std::string& label = "model");

// The ONNX ops the importer maps (domain "ai.onnx", opsets 11-18).
std::vector<std::string> supported_ops();

// Writes `graph` as DIR/graph.json with each constant of more than a few
// elements in DIR/weights/<name>.npy; inputs without data are declared by
// dtype and shape (given at run time: `backplane run DIR/graph.json --input
// name=file.npy`). Returns the graph file's path.
std::filesystem::path write_graph_dir(const Graph& graph, const std::filesystem::path& dir);

}  // namespace backplane::onnx
