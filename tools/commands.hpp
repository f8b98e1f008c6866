// Subcommands of the `backplane` program. Each returns the exit status and
// reports errors as one line on stderr (main catches what they throw).
#pragma once

#include <string>
#include <vector>

namespace backplane::cli {

using Args = std::vector<std::string>;

int cmd_devices(const Args& args);
int cmd_run(const Args& args);
int cmd_demo(const Args& args);
int cmd_manifest(const Args& args);
int cmd_bench(const Args& args);
int cmd_conformance(const Args& args);
int cmd_ops(const Args& args);
int cmd_serve(const Args& args);
int cmd_import(const Args& args);

// Small argument helpers: --flag VALUE and --switch.
bool take_switch(Args& args, const std::string& name);
std::string take_option(Args& args, const std::string& name, const std::string& fallback = "");
void reject_leftovers(const Args& args);
// --optimize none|all (default all): CompileOptions::optimize.
bool take_optimize(Args& args);

}  // namespace backplane::cli
