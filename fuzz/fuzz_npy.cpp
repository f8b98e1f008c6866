// libFuzzer entry point: bytes -> a .npy file -> read_npy (and write_npy/read_npy of what it read).
// The body is backplane::fuzz::npy_one (harness.cpp), which fuzz_replay also runs.
#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return backplane::fuzz::npy_one(data, size);
}
