// An imported graph as a graph file: DIR/graph.json, its constants as .npy
// files under DIR/weights, its inputs declared by dtype and shape (a
// dynamic dim by its name).
#include <backplane/onnx.hpp>

#include <fstream>

namespace backplane::onnx {

std::filesystem::path write_graph_dir(const Graph& graph, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir / "weights");
  Json inputs = Json::object();
  int k = 0;
  for (const auto& in : graph.inputs()) {
    if (!in.constant) {
      // A dynamic dim by its name: "shape": [1, "seq", 64].
      Json shape = Json::array();
      for (size_t i = 0; i < in.shape.size(); ++i) {
        if (i < in.dim_names.size() && !in.dim_names[i].empty()) shape.push_back(in.dim_names[i]);
        else shape.push_back(in.shape[i]);
      }
      inputs[in.name] = {{"dtype", std::string(dtype_name(in.dtype))}, {"shape", shape}};
      continue;
    }
    // File names from a counter: value names may hold any character.
    const std::string file = "weights/" + std::to_string(k++) + ".npy";
    write_npy(dir / file, *in.constant);
    Json spec{{"file", file}, {"constant", true}};
    if (in.dtype == BP_DTYPE_BF16) spec["dtype"] = "bf16";
    inputs[in.name] = spec;
  }
  Json nodes = Json::array();
  for (const auto& n : graph.nodes()) {
    Json ins = Json::array();
    for (const auto& i : n.inputs) ins.push_back(i.empty() ? Json() : Json(i));
    Json j{{"name", n.name}, {"op", n.op}, {"inputs", ins}};
    if (!n.params.empty()) j["params"] = n.params;
    if (!n.device.empty()) j["device"] = n.device;
    nodes.push_back(std::move(j));
  }
  const Json g{{"inputs", inputs}, {"nodes", nodes}, {"outputs", graph.outputs()}};
  const auto path = dir / "graph.json";
  std::ofstream f(path);
  f << g.dump(1) << "\n";
  if (!f) throw Error("cannot write " + path.string());
  return path;
}

}  // namespace backplane::onnx
