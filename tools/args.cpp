// Small argument helpers (commands.hpp): the program's and the serve module's.
#include "commands.hpp"

#include <backplane/backplane.hpp>

namespace backplane::cli {

bool take_switch(Args& args, const std::string& name) {
  for (auto it = args.begin(); it != args.end(); ++it)
    if (*it == name) {
      args.erase(it);
      return true;
    }
  return false;
}

std::string take_option(Args& args, const std::string& name, const std::string& fallback) {
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (*it == name) {
      if (it + 1 == args.end()) throw Error("option " + name + " needs a value");
      std::string v = *(it + 1);
      args.erase(it, it + 2);
      return v;
    }
    if (it->rfind(name + "=", 0) == 0) {
      std::string v = it->substr(name.size() + 1);
      args.erase(it);
      return v;
    }
  }
  return fallback;
}

void reject_leftovers(const Args& args) {
  if (!args.empty()) throw Error("unexpected argument '" + args.front() + "' (see backplane --help)");
}

bool take_optimize(Args& args) {
  const std::string v = take_option(args, "--optimize", "all");
  if (v != "all" && v != "none") throw Error("--optimize takes 'all' or 'none', not '" + v + "'");
  return v == "all";
}

}  // namespace backplane::cli
