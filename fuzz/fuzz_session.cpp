// libFuzzer entry point: bytes -> a program of requests -> one in-process
// server session (backplane::fuzz::session_one, fuzz/session_harness.cpp),
// which fuzz_replay also runs.
#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return backplane::fuzz::session_one(data, size);
}
