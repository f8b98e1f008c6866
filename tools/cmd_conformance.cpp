#include "commands.hpp"

#include <backplane/backplane.hpp>

namespace backplane::cli {

int cmd_conformance(const Args&) { throw Error("the conformance suite is not part of this build yet"); }

}  // namespace backplane::cli
