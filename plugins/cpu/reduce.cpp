#include "kernels.hpp"

namespace backplane::cpu {
void register_reduce(sdk::KernelTable&) {}
}  // namespace backplane::cpu
