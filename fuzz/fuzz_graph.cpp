// libFuzzer entry point: bytes -> a graph file's JSON -> parse_graph_json -> infer_graph.
// The body is backplane::fuzz::graph_one (harness.cpp), which fuzz_replay also runs.
#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return backplane::fuzz::graph_one(data, size);
}
