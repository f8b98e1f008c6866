// Binary arithmetic kernels: add sub mul div maximum minimum pow.
#include "eltwise_ops.hpp"

#include <atomic>
#include <cmath>

namespace backplane::cpu {
void register_binary(sdk::KernelTable& t) {
  using namespace eltwise;
  using namespace eltwise::ops;
  const auto k21 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, d}; };
  const std::vector<uint8_t> s2{kStrided, kStrided};
  add_rows<BinaryK<Add>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "add", k21, s2);
  add_rows<BinaryK<Sub>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "sub", k21, s2);
  add_rows<BinaryK<Mul>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "mul", k21, s2);
  add_rows<BinaryK<Div>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "div", k21, s2);
  add_rows<BinaryK<Maximum>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "maximum", k21, s2);
  add_rows<BinaryK<Minimum>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "minimum", k21, s2);
  add_rows<BinaryK<Pow>::K, BP_CPU_FLOAT_DTYPES>(t, "pow", k21, s2);
}

}  // namespace backplane::cpu
