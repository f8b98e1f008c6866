// The program's side of its modules (cli_module.hpp): found at a path fixed
// relative to the program's own file, the same in the build tree and the
// installed one (bin/backplane, <libdir>/backplane/cli/).
#include "cli_module.hpp"

#include <dlfcn.h>

#include <system_error>

#ifndef BACKPLANE_CLI_MODULE_DIR
#error "BACKPLANE_CLI_MODULE_DIR: the modules' folder relative to the program's (tools/CMakeLists.txt)"
#endif

namespace backplane::cli {

namespace {

std::filesystem::path module_path(const std::string& name) {
  std::error_code ec;
  // The program's file, links resolved: a link to it elsewhere (a folder on
  // PATH) still finds the modules beside the real one.
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot find the backplane program's own file (/proc/self/exe): " + ec.message());
  return (self.parent_path() / BACKPLANE_CLI_MODULE_DIR / ("libbackplane_cli_" + name + ".so")).lexically_normal();
}

// `what`: the command that needs the module, for the messages.
template <class Table>
const Table& open_module(const std::string& name, const char* symbol, const std::string& what) {
  const auto path = module_path(name);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error(what + " needs the module " + path.string() +
                ", which is missing (it is built and installed with the backplane program)");
  // Never closed: the program ends with it. Local: only its entry is looked up.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw Error(what + " needs the module " + path.string() + ", which cannot be loaded: " + (why ? why : "unknown error"));
  }
  using Entry = const Table* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, symbol));
  if (!entry) throw Error(path.string() + " is not the backplane program's module: it has no " + symbol);
  const Table* table = entry();
  if (!table || table->abi != kCliModuleAbi || table->size != sizeof(Table))
    throw Error(path.string() + " comes from another build of backplane (module interface " +
                (table ? std::to_string(table->abi) : std::string("none")) + ", this program's " +
                std::to_string(kCliModuleAbi) + "): install the program and its modules together");
  return *table;
}

}  // namespace

const ServeModule& serve_module() {
  static const ServeModule& m = open_module<ServeModule>("serve", "backplane_cli_serve_module", "backplane serve");
  return m;
}

const OnnxModule& onnx_module() {
  static const OnnxModule& m = open_module<OnnxModule>("onnx", "backplane_cli_onnx_module", "the ONNX importer");
  return m;
}

}  // namespace backplane::cli
