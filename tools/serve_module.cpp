// libbackplane_cli_serve.so: `backplane serve` (cmd_serve.cpp) with the
// server and its gRPC, protobuf and abseil, opened by the program only for
// that command (cli_module.hpp).
#include "cli_module.hpp"
#include "commands.hpp"

extern "C" __attribute__((visibility("default"))) const backplane::cli::ServeModule* backplane_cli_serve_module() {
  using namespace backplane::cli;
  static const ServeModule table{kCliModuleAbi, sizeof(ServeModule), &cmd_serve};
  return &table;
}
