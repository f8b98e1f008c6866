// libFuzzer entry point: bytes -> a graph -> compiled for the partial test plugin (64 MiB budget) and run.
// The body is backplane::fuzz::plan_one (harness.cpp), which fuzz_replay also runs.
#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return backplane::fuzz::plan_one(data, size);
}
