// The fuzz harnesses' bodies, as plain functions: the libFuzzer entry points
// (fuzz_*.cpp, clang builds with -DBACKPLANE_FUZZ=ON) call them, and so does
// fuzz_replay (any build, gcc included), which runs the checked-in corpora
// under ctest.
//
// Each function takes one input. A backplane::Error is an accepted outcome
// (hostile input refused); anything else is a finding and is raised as an
// exception other than backplane::Error (HarnessFailure for a broken
// invariant), or shows as a crash or a sanitizer report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace backplane::fuzz {

// Inputs above this are ignored: the harnesses look for logic errors, not
// for what a megabyte of input costs, and small inputs keep runs fast.
inline constexpr size_t kMaxInput = 64 * 1024;

// A harness's own check failed: the code under test returned a wrong answer.
struct HarnessFailure : std::logic_error {
  using std::logic_error::logic_error;
};

// bytes -> JSON (nesting bounded as graph files are) -> parse_graph_json ->
// infer_graph; the inferred types are checked for sanity. Graphs that name
// .npy files are skipped (no file system access from the fuzzer).
int graph_one(const uint8_t* data, size_t size);

// bytes -> a temporary file -> read_npy (plain, then as bf16); what it
// returns must be self-consistent and survive write_npy/read_npy unchanged.
int npy_one(const uint8_t* data, size_t size);

// bytes -> <temp dir>/x.json -> parse_manifest; what it returns must survive
// manifest_to_json/parse_manifest with the same kernels.
int manifest_one(const uint8_t* data, size_t size);

// A graph as graph_one reads it, compiled for the test plugin "partial"
// (device partial0; CPU too when the fuzz build has it) under a 64 MiB
// budget and run: twice, and once more from a plan that poisons its output
// buffers; the three results must agree bit for bit and match the plan's
// inferred types.
int plan_one(const uint8_t* data, size_t size);

// Creates the scratch folder the harnesses write their temporary files to
// (else made on first use). A process that forks children to run harnesses
// calls it first, so that they share it and it is removed when it exits.
void prepare();

// What the last harness call on this thread did, in a line ("refused: ...",
// "accepted: ...", "ran on partial0: 2 outputs"), for fuzz_replay --verbose.
const std::string& last_note();
void set_note(const std::string& what);  // for harnesses in other files

// The remote server's decoder and call check (fuzz/remote_harness.cpp; in
// builds with gRPC only): bytes -> a protobuf Request -> each call of a batch
// through remote::check_call against a fixed kernel table; a call it accepts
// must be safe to run (storages inside buffers, layouts inside storages,
// outputs dense), params must survive decode -> encode -> decode.
int remote_one(const uint8_t* data, size_t size);

// The ONNX importer (fuzz/onnx_harness.cpp; in builds with libonnx-dev
// only): bytes -> onnx::import_bytes; a model it accepts must give a graph
// the core accepts, holding the inputs and outputs it reports.
int onnx_one(const uint8_t* data, size_t size);

// The whole request stream of a server session (fuzz/session_harness.cpp;
// in builds with gRPC only): bytes -> a short program of requests (hello,
// allocate, free, writes, reads, a batch of one call, raw Request bytes) ->
// one in-process session of `backplane serve` over the CPU plugin. Every
// answer must be a Response, a read that succeeds must return the bytes
// asked for, and once the session closes the memory budget must be back
// at 0.
int session_one(const uint8_t* data, size_t size);

// The folder(s) holding the partial plugin's manifest (and the CPU plugin's,
// optionally), ':'-separated; plan_one reads it on first use. The default is
// the compile-time BACKPLANE_FUZZ_PLUGIN_DIRS.
void set_plugin_dirs(const std::string& dirs);
std::string plugin_dirs();

}  // namespace backplane::fuzz
