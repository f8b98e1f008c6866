// libFuzzer entry point: bytes -> an ONNX ModelProto -> onnx::import_bytes.
// The body is backplane::fuzz::onnx_one (onnx_harness.cpp), which fuzz_replay also runs.
#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return backplane::fuzz::onnx_one(data, size);
}
