#include "kernels.hpp"

namespace backplane::cpu {
void register_index(sdk::KernelTable&) {}
}  // namespace backplane::cpu
