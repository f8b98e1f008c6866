// libFuzzer entry point: bytes -> a manifest x.json -> parse_manifest (and manifest_to_json of what it read).
// The body is backplane::fuzz::manifest_one (harness.cpp), which fuzz_replay also runs.
#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return backplane::fuzz::manifest_one(data, size);
}
