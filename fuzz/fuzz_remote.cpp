// libFuzzer entry point: bytes -> a remote protocol Request -> the server's
// call check (backplane::fuzz::remote_one, fuzz/remote_harness.cpp), which
// fuzz_replay also runs.
#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return backplane::fuzz::remote_one(data, size);
}
