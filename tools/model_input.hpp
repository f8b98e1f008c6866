// What `run`, `import` and `bench --model` share: a graph from a graph file
// or an ONNX model, with its input data from --input NAME=FILE.npy (random
// data, said so, for inputs not given), and --dim NAME=N for dynamic dims.
#pragma once

#include "commands.hpp"

#include <backplane/backplane.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace backplane::cli {

struct LoadedModel {
  GraphFile file;                   // the graph and its inputs' data
  bool onnx = false;
  std::vector<std::string> notes;   // what the import did, what was generated
  std::map<std::string, std::string> onnx_names;  // graph name -> ONNX name (inputs, outputs)
  uint64_t weight_bytes = 0;
  int64_t opset = 0;
  double import_ms = 0;
};

// Takes every --input and --dim from args. `random_inputs`: inputs without
// data get reproducible random values (uniform [-1, 1) for floats, zeros for
// integers) instead of an error. keep_dynamic: an ONNX model's named dims
// stay dynamic where the graph allows (`import --dynamic`); its dynamic
// inputs get no data.
LoadedModel load_model(const std::filesystem::path& path, Args& args, bool random_inputs, bool keep_dynamic = false);

// Every value of a repeated option (--input a=x.npy --input b=y.npy).
std::vector<std::string> take_all(Args& args, const std::string& name);

bool is_onnx_path(const std::filesystem::path& path);

// "buffers: cpu 12.3 MiB (as written: 20.1 MiB)": a plan's device buffers
// per device, with the unoptimized figure when the stats have it.
std::string buffers_line(const Plan::CompileStats& s);

}  // namespace backplane::cli
