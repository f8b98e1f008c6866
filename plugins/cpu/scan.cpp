#include "kernels.hpp"

namespace backplane::cpu {
void register_scan(sdk::KernelTable&) {}
}  // namespace backplane::cpu
