#include "kernels.hpp"

namespace backplane::cpu {
void register_linalg(sdk::KernelTable&) {}
}  // namespace backplane::cpu
