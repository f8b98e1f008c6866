// Unary elementwise kernels: math functions, activations, clamp and affine.
#include "eltwise_ops.hpp"
#include "rowops.hpp"

#include <cmath>

namespace backplane::cpu {
void register_unary(sdk::KernelTable& t) {
  using namespace eltwise;
  using namespace eltwise::ops;
  const auto k11 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d}; };
  const std::vector<uint8_t> s1{kStrided};
  add_rows<UnaryK<Neg>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "neg", k11, s1);
  add_rows<UnaryK<Abs>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "abs", k11, s1);
  add_rows<UnaryK<Sign>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "sign", k11, s1);
  add_rows<UnaryK<Sqr>::K, BP_CPU_FLOAT_DTYPES>(t, "sqr", k11, s1);
  add_rows<UnaryK<Sqrt>::K, BP_CPU_FLOAT_DTYPES>(t, "sqrt", k11, s1);
  add_rows<UnaryK<Rsqrt>::K, BP_CPU_FLOAT_DTYPES>(t, "rsqrt", k11, s1);
  add_rows<UnaryK<Recip>::K, BP_CPU_FLOAT_DTYPES>(t, "recip", k11, s1);
  add_rows<UnaryK<Exp>::K, BP_CPU_FLOAT_DTYPES>(t, "exp", k11, s1);
  add_rows<UnaryK<Log>::K, BP_CPU_FLOAT_DTYPES>(t, "log", k11, s1);
  add_rows<UnaryK<Sin>::K, BP_CPU_FLOAT_DTYPES>(t, "sin", k11, s1);
  add_rows<UnaryK<Cos>::K, BP_CPU_FLOAT_DTYPES>(t, "cos", k11, s1);
  add_rows<UnaryK<Tanh>::K, BP_CPU_FLOAT_DTYPES>(t, "tanh", k11, s1);
  add_rows<UnaryK<Erf>::K, BP_CPU_FLOAT_DTYPES>(t, "erf", k11, s1);
  add_rows<UnaryK<Floor>::K, BP_CPU_FLOAT_DTYPES>(t, "floor", k11, s1);
  add_rows<UnaryK<Ceil>::K, BP_CPU_FLOAT_DTYPES>(t, "ceil", k11, s1);
  add_rows<UnaryK<Round>::K, BP_CPU_FLOAT_DTYPES>(t, "round", k11, s1);
  add_rows<UnaryK<Relu>::K, BP_CPU_FLOAT_DTYPES>(t, "relu", k11, s1);
  add_rows<UnaryK<Sigmoid>::K, BP_CPU_FLOAT_DTYPES>(t, "sigmoid", k11, s1);
  add_rows<UnaryK<Silu>::K, BP_CPU_FLOAT_DTYPES>(t, "silu", k11, s1);
  add_rows<UnaryK<Softplus>::K, BP_CPU_FLOAT_DTYPES>(t, "softplus", k11, s1);
  add_rows<UnaryK<Gelu>::K, BP_CPU_FLOAT_DTYPES>(t, "gelu", k11, s1);
  add_rows<UnaryK<Clamp>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "clamp", k11, s1);
  add_rows<UnaryK<Affine>::K, BP_CPU_FLOAT_DTYPES>(t, "affine", k11, s1);
}

}  // namespace backplane::cpu
