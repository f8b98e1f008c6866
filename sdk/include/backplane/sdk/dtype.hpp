// Header-only dtype helpers shared by plugins and the core: sizes, names,
// and the f16/bf16 storage types with round-to-nearest-even conversion.
#pragma once

#include <backplane/abi.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace backplane {

// 16-bit float storage types. Arithmetic happens in float.
struct f16 {
  uint16_t bits = 0;
};
struct bf16 {
  uint16_t bits = 0;
};

inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      out = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(out);
}

inline uint16_t float_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absu < 0x38800000u) {
    // Result is subnormal or zero: scale so the f16 subnormal unit is 1.0,
    // and let float addition do the round-to-nearest-even.
    const float a = std::bit_cast<float>(absu);
    const float scaled = a * 16777216.0f;  // 2^24
    const float r = scaled + 8388608.0f - 8388608.0f;  // round to integer (RNE)
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t m = absu + 0xfffu + ((absu >> 13) & 1u);  // round mantissa to 10 bits, RNE
  m -= (127u - 15u) << 23;
  return static_cast<uint16_t>(sign | (m >> 13));
}

inline float to_float(f16 v) { return f16_to_float(v.bits); }
inline float to_float(bf16 v) { return bf16_to_float(v.bits); }

constexpr size_t dtype_size(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F64:
    case BP_DTYPE_I64:
      return 8;
    case BP_DTYPE_F32:
    case BP_DTYPE_I32:
      return 4;
    case BP_DTYPE_F16:
    case BP_DTYPE_BF16:
    case BP_DTYPE_I16:
      return 2;
    case BP_DTYPE_I8:
    case BP_DTYPE_U8:
    case BP_DTYPE_BOOL:
      return 1;
    default:
      return 0;
  }
}

constexpr std::string_view dtype_name(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F32: return "f32";
    case BP_DTYPE_F16: return "f16";
    case BP_DTYPE_BF16: return "bf16";
    case BP_DTYPE_F64: return "f64";
    case BP_DTYPE_I8: return "i8";
    case BP_DTYPE_I16: return "i16";
    case BP_DTYPE_I32: return "i32";
    case BP_DTYPE_I64: return "i64";
    case BP_DTYPE_U8: return "u8";
    case BP_DTYPE_BOOL: return "bool";
    default: return "invalid";
  }
}

inline std::optional<bp_dtype> dtype_from_name(std::string_view s) {
  for (int i = 1; i < BP_DTYPE_COUNT_; ++i) {
    const auto d = static_cast<bp_dtype>(i);
    if (dtype_name(d) == s) return d;
  }
  return std::nullopt;
}

constexpr bool is_float(bp_dtype d) {
  return d == BP_DTYPE_F32 || d == BP_DTYPE_F16 || d == BP_DTYPE_BF16 || d == BP_DTYPE_F64;
}
constexpr bool is_int(bp_dtype d) {
  return d == BP_DTYPE_I8 || d == BP_DTYPE_I16 || d == BP_DTYPE_I32 || d == BP_DTYPE_I64 ||
         d == BP_DTYPE_U8;
}

// C++ type for a dtype, and back.
template <bp_dtype D> struct dtype_traits;
template <> struct dtype_traits<BP_DTYPE_F32> { using type = float; };
template <> struct dtype_traits<BP_DTYPE_F16> { using type = f16; };
template <> struct dtype_traits<BP_DTYPE_BF16> { using type = bf16; };
template <> struct dtype_traits<BP_DTYPE_F64> { using type = double; };
template <> struct dtype_traits<BP_DTYPE_I8> { using type = int8_t; };
template <> struct dtype_traits<BP_DTYPE_I16> { using type = int16_t; };
template <> struct dtype_traits<BP_DTYPE_I32> { using type = int32_t; };
template <> struct dtype_traits<BP_DTYPE_I64> { using type = int64_t; };
template <> struct dtype_traits<BP_DTYPE_U8> { using type = uint8_t; };
template <> struct dtype_traits<BP_DTYPE_BOOL> { using type = bool; };
template <bp_dtype D> using dtype_t = typename dtype_traits<D>::type;

// Calls f(std::integral_constant<bp_dtype, D>{}) for the runtime dtype d.
// Returns false for an invalid dtype.
template <typename F> bool visit_dtype(bp_dtype d, F&& f) {
  switch (d) {
#define BP_VISIT_CASE_(D)                          \
  case D:                                          \
    f(std::integral_constant<bp_dtype, D>{});      \
    return true;
    BP_VISIT_CASE_(BP_DTYPE_F32)
    BP_VISIT_CASE_(BP_DTYPE_F16)
    BP_VISIT_CASE_(BP_DTYPE_BF16)
    BP_VISIT_CASE_(BP_DTYPE_F64)
    BP_VISIT_CASE_(BP_DTYPE_I8)
    BP_VISIT_CASE_(BP_DTYPE_I16)
    BP_VISIT_CASE_(BP_DTYPE_I32)
    BP_VISIT_CASE_(BP_DTYPE_I64)
    BP_VISIT_CASE_(BP_DTYPE_U8)
    BP_VISIT_CASE_(BP_DTYPE_BOOL)
#undef BP_VISIT_CASE_
    default:
      return false;
  }
}

}  // namespace backplane
