// contiguous and cast; registers every elementwise family in table order.
#include "elementwise.hpp"

#include <atomic>
#include <bit>
#include <cmath>
#include <limits>

namespace backplane::cpu {
namespace {
using namespace eltwise;

// contiguous only moves bytes: one instantiation per element size.
template <size_t S> using bits_t = std::conditional_t<
    S == 1, uint8_t, std::conditional_t<S == 2, uint16_t, std::conditional_t<S == 4, uint32_t, uint64_t>>>;

template <bp_dtype D> struct ContiguousK {
  static void impl(const Call& c) {
    c.expect(1, BP_PARAMS_NONE);
    using T = bits_t<sizeof(st_t<D>)>;
    map1<T, T>(c, [](T v) { return v; }, kGrain);
  }
};

// Cast ----------------------------------------------------------------------

// Rounds to float with round-to-odd, so that a following round-to-nearest-
// even to a 16-bit float equals a single rounding of the double.
inline float to_float_odd(double d) {
  float f = static_cast<float>(d);
  if (std::isfinite(d) && static_cast<double>(f) != d) {
    uint32_t b = std::bit_cast<uint32_t>(f);
    if ((b & 1u) == 0) b = std::fabs(static_cast<double>(f)) > std::fabs(d) ? b - 1 : b + 1;
    f = std::bit_cast<float>(b);
  }
  return f;
}

template <bp_dtype DI, bp_dtype DO> struct Converter {
  using TI = st_t<DI>;
  using TO = st_t<DO>;
  static constexpr bool fi = is_float(DI);
  static constexpr bool fo = is_float(DO);
  static constexpr bool half_out = DO == BP_DTYPE_F16 || DO == BP_DTYPE_BF16;
  mutable std::atomic<bool> bad{false};

  TO operator()(TI v) const {
    if constexpr (DO == BP_DTYPE_BOOL) {
      return static_cast<TO>(ld(v) != comp_t<TI>(0));
    } else if constexpr (fi && fo) {
      if constexpr (DI == BP_DTYPE_F64 && half_out) return st<TO>(to_float_odd(v));
      else return st<TO>(static_cast<comp_t<TO>>(ld(v)));
    } else if constexpr (fi) {  // float -> int: truncate; NaN, inf, out of range are errors
      const double t = std::trunc(static_cast<double>(ld(v)));
      constexpr double lo = static_cast<double>(std::numeric_limits<TO>::min());
      // max + 1 is exact in double for every int type (2^63 for i64).
      constexpr double hi = static_cast<double>(std::numeric_limits<TO>::max() / 2 + 1) * 2.0;
      if (!(t >= lo && t < hi)) {
        bad.store(true, std::memory_order_relaxed);
        return TO(0);
      }
      return static_cast<TO>(t);
    } else if constexpr (fo) {  // int/bool -> float
      if constexpr (half_out) return st<TO>(to_float_odd(static_cast<double>(v)));
      else return static_cast<TO>(v);
    } else {  // int/bool -> int wraps (modular conversion)
      return static_cast<TO>(v);
    }
  }
};

template <bp_dtype DI> struct CastFrom {
  template <bp_dtype DO> struct K {
    static void impl(const Call& c) {
      c.expect(1, BP_PARAMS_CAST);
      BP_SDK_CHECK(c.params->u.cast.dtype == DO, BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": params dtype " + std::string(dtype_name(c.params->u.cast.dtype)) +
                     " does not match the kernel's output " + std::string(dtype_name(DO)));
      const Converter<DI, DO> conv;
      map1<st_t<DI>, st_t<DO>>(c, [&](st_t<DI> v) { return conv(v); }, kGrain);
      if (conv.bad.load())
        sdk::fail(BP_ERR_OUT_OF_RANGE, std::string(c.op) + ": " + std::string(dtype_name(DI)) + " value is NaN, infinite or out of range for " +
                                           std::string(dtype_name(DO)));
    }
  };
};

template <bp_dtype... DIs> void add_casts(sdk::KernelTable& t) {
  (add_rows<CastFrom<DIs>::template K, BP_CPU_ALL_DTYPES>(
       t, "cast", [](bp_dtype d) { return std::vector<bp_dtype>{DIs, d}; }, {kStrided}),
   ...);
}

}  // namespace

void register_elementwise(sdk::KernelTable& t) {
  const auto k11 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d}; };
  const std::vector<uint8_t> s1{kStrided};
  add_rows<ContiguousK, BP_CPU_ALL_DTYPES>(t, "contiguous", k11, s1);
  add_casts<BP_CPU_ALL_DTYPES>(t);
  register_unary(t);
  register_binary(t);
  register_compare(t);
}

}  // namespace backplane::cpu
