// Binary arithmetic kernels: add sub mul div maximum minimum pow.
#include "elementwise.hpp"

#include <atomic>
#include <cmath>

namespace backplane::cpu {
namespace {
using namespace eltwise;

struct Add : NoParams {
  using NoParams::NoParams;
  template <class C> C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) return wadd(a, b);
    else return a + b;
  }
};
struct Sub : NoParams {
  using NoParams::NoParams;
  template <class C> C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) return wsub(a, b);
    else return a - b;
  }
};
struct Mul : NoParams {
  using NoParams::NoParams;
  template <class C> C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) return wmul(a, b);
    else return a * b;
  }
};
struct Div : NoParams {
  using NoParams::NoParams;
  mutable std::atomic<bool> by_zero{false};
  template <class C> C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      if (b == 0) {
        by_zero.store(true, std::memory_order_relaxed);
        return 0;
      }
      // INT_MIN / -1 overflows (and traps on x86): it wraps to INT_MIN.
      if constexpr (std::is_signed_v<C>)
        if (b == -1) return wneg(a);
      return static_cast<C>(a / b);
    } else {
      return a / b;
    }
  }
  void finish(const Call& c) const {
    if (by_zero.load()) sdk::fail(BP_ERR_OUT_OF_RANGE, std::string(c.op) + ": integer division by zero");
  }
};
struct Maximum : NoParams {
  using NoParams::NoParams;
  template <class C> C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) return a > b ? a : b;
    else return (a != a || a > b) ? a : b;  // b NaN: a > b false, picks b
  }
};
struct Minimum : NoParams {
  using NoParams::NoParams;
  template <class C> C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) return a < b ? a : b;
    else return (a != a || a < b) ? a : b;
  }
};
struct Pow : Costly {
  using Costly::Costly;
  template <class C> C operator()(C a, C b) const { return std::pow(a, b); }
};

}  // namespace

void register_binary(sdk::KernelTable& t) {
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
