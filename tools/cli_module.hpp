// The `backplane` program's two private modules, in <libdir>/backplane/cli/
// (the build tree mirrors it): libbackplane_cli_serve.so (`backplane serve`:
// the server, gRPC, protobuf, abseil) and libbackplane_cli_onnx.so (the ONNX
// importer: libonnx, protobuf). The program opens one only for a command that
// needs it (serve; import, and run or bench given an .onnx model), so every
// other command starts without mapping those libraries.
//
// Each module exports one extern "C" function that returns its table. The
// tables hold C++ types and may throw backplane::Error: a module is built
// with the program, from the same tree, and is no interface for anyone else;
// `abi` and `size` catch a module left over from another build.
#pragma once

#include "model_input.hpp"

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

namespace backplane::cli {

// One more whenever a table below changes.
inline constexpr uint32_t kCliModuleAbi = 2;

struct ServeModule {
  uint32_t abi;
  uint32_t size;
  int (*serve)(const Args& args);  // `backplane serve ARGS`
};

struct OnnxModule {
  uint32_t abi;
  uint32_t size;
  // Imports an ONNX file into m: its graph, the import's notes, the graph's
  // names for the model's, opset, constants' bytes, the import's time.
  // keep_dynamic: named dims stay dynamic where the graph allows
  // (onnx::ImportOptions::keep_dynamic).
  void (*import_model)(const std::filesystem::path& path, const std::map<std::string, int64_t>& dims,
                       const std::map<std::string, Shape>& input_shapes, bool keep_dynamic, LoadedModel& m);
  // onnx::write_graph_dir: DIR/graph.json and DIR/weights; the graph file's path.
  std::filesystem::path (*write_graph_dir)(const Graph& graph, const std::filesystem::path& dir);
};

// The program's side: opens the module at the first call (it stays loaded)
// and returns its table; throws Error naming the module's path, and why,
// when it is missing, cannot be loaded or comes from another build.
const ServeModule& serve_module();
const OnnxModule& onnx_module();

}  // namespace backplane::cli

// The modules' side: their one exported symbol each.
extern "C" {
const backplane::cli::ServeModule* backplane_cli_serve_module();
const backplane::cli::OnnxModule* backplane_cli_onnx_module();
}
