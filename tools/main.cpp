// The `backplane` command: how a newcomer meets the project, and how tools
// outside C++ drive it.
#include "cli_module.hpp"
#include "commands.hpp"

#include <backplane/backplane.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>

namespace {

const char* kUsage = R"(usage: backplane <command> [options]

commands:
  devices [--json]                      every manifest found, each device, its load status
  run GRAPH.json|MODEL.onnx [--input NAME=FILE.npy]... [--dim NAME=N]... [--device LIST]
      [--out DIR] [--explain] [--profile] [--json] [--max-memory BYTES] [--optimize all|none]
                                        run a graph file or an ONNX model; outputs go to
                                        DIR/<name>.npy; inputs not given get random data;
                                        LIST: devices in order of preference (acme0,cpu) or auto;
                                        --explain shows where each node runs and every transfer,
                                        and what the optimizer replaced (--optimize none: nothing)
  import MODEL.onnx --out DIR [--input NAME=FILE.npy]... [--dim NAME=N]... [--dynamic]
                                        an ONNX model as DIR/graph.json, weights in DIR/weights
                                        (--dynamic: named dims stay dynamic where the graph allows)
  demo [--device NAME|all] [--no-prepare]
                                        the main job: a Mamba-style block on built-in data,
                                        on every device, cross-checked, timed (--no-prepare:
                                        devices set up at the first run, not at compile)
  conformance --plugin NAME|MANIFEST [--json REPORT] [--filter OP] [--quick]
              [--compare DEVICE] [--fallback DEVICE] [--strict]
              [--expected-failures FILE|none]
                                        the plugin conformance suite; vendor ops are
                                        checked against their manifest's decomposition;
                                        --strict fails on unverified vendor ops; rows
                                        listed in the manifest's .xfail (or FILE) may
                                        fail, and fail the run when they pass
  bench [--device LIST] [--filter CASE] [--threads N] [--min-time S] [--json]
        [--model MODEL.onnx|GRAPH.json [--input NAME=FILE.npy]... [--profile] [--optimize all|none]]
        [--generate [--dtype f32|bf16|q8|q4] [--size bench|small] [--prompt N] [--tokens N]]
                                        per-op timings on LIST's first device, the rest
                                        as fallback; with two or more devices, also
                                        transfers between the first two, a graph split
                                        across them, and placement time; --model: one
                                        whole model, a reused plan (median warm run);
                                        --generate: a GPT-style decoder's prompt and
                                        generated tokens/s against the stream roof
  manifest LIBRARY [--kind K] [--description D] [--out FILE] [--check MANIFEST]
                                        write a plugin's manifest from the built library
  ops [--markdown|--json] [--check DOC] [--update DOC]
                                        the standard ops: inputs, params, dtypes, outputs;
                                        --check fails when DOC's generated op tables differ
  serve (--listen HOST:PORT | --unix PATH) --token-file FILE [--tls-cert C --tls-key K]
        [--insecure-loopback] [--plugin NAME]... [--deadline MS] [--max-memory BYTES]
        [--max-total-memory BYTES] [--max-connections N] [--idle-timeout MS]
                                        offer this machine's devices over gRPC to the
                                        remote plugin (docs/remote.md); TCP needs TLS

environment:
  BACKPLANE_PLUGIN_PATH   extra folders of plugin manifests (colon-separated)
  BACKPLANE_DEVICE        devices 'auto' puts first (comma-separated); where one
                          device is picked, the first of them
  BACKPLANE_NUM_THREADS   host thread pool size
  BACKPLANE_REMOTE        servers whose devices the remote plugin offers (HOST:PORT or
                          unix:PATH, comma-separated), as DEVICE@SERVER; with
                          BACKPLANE_REMOTE_TOKEN_FILE and, for TLS, BACKPLANE_REMOTE_CA_FILE
  BACKPLANE_ISOLATE       plugins to run in a private child process (comma-separated);
                          BACKPLANE_ISOLATE_DEADLINE_MS ends a kernel that runs longer
)";

// The usage block of one command: its lines in kUsage, from "  <cmd> " up to
// the next command (or the end of the command list). Empty when unknown.
std::string command_usage(const std::string& cmd) {
  const std::string text = kUsage;
  const size_t at = text.find("\n  " + cmd + " ");
  const size_t at_end = text.find("\n  " + cmd + "\n");
  size_t start = std::min(at, at_end);
  if (start == std::string::npos) return "";
  ++start;
  size_t end = start;
  for (;;) {
    const size_t nl = text.find('\n', end);
    if (nl == std::string::npos) return text.substr(start);
    end = nl + 1;
    // A line at the commands' indent with a word right after it starts the
    // next command; a blank line or a heading ends the list.
    if (end >= text.size() || text[end] == '\n' || text[end] != ' ' ||
        (text.compare(end, 2, "  ") == 0 && end + 2 < text.size() && text[end + 2] != ' '))
      return text.substr(start, end - start);
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace backplane::cli;
  Args args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string cmd = args.front();
  args.erase(args.begin());
  // `backplane CMD --help` (or -h) anywhere in the command's arguments: its
  // usage, never the option taken for a file or a value.
  if (std::find_if(args.begin(), args.end(), [](const std::string& a) { return a == "--help" || a == "-h"; }) !=
      args.end()) {
    const std::string usage = command_usage(cmd);
    if (usage.empty()) {
      std::fprintf(stderr, "backplane: unknown command '%s'\n%s", cmd.c_str(), kUsage);
      return 2;
    }
    std::printf("usage: backplane %s", usage.substr(2).c_str());
    return 0;
  }
  try {
    if (cmd == "devices") return cmd_devices(args);
    if (cmd == "run") return cmd_run(args);
    if (cmd == "demo") return cmd_demo(args);
    if (cmd == "manifest") return cmd_manifest(args);
    if (cmd == "bench") return cmd_bench(args);
    if (cmd == "conformance") return cmd_conformance(args);
    if (cmd == "ops") return cmd_ops(args);
#ifdef BACKPLANE_HAVE_ONNX
    if (cmd == "import") return cmd_import(args);
#endif
#ifdef BACKPLANE_HAVE_REMOTE
    if (cmd == "serve") return serve_module().serve(args);  // gRPC and the rest: loaded for serve only
#endif
    std::fprintf(stderr, "backplane: unknown command '%s'\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "backplane: error: %s\n", e.what());
    return 1;
  }
}
