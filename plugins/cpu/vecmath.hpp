// Small vector math for the CPU kernels, written with GCC vector extensions
// so that it vectorises on every ISA (the scalar libm calls do not).
#pragma once

#include <cstdint>
#include <cstring>

namespace backplane::cpu {

// 128-bit vectors: native on baseline x86-64 (wider generic vectors are
// split badly, with scalar conversions and compares).
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

// exp(x) lane-wise within ~2 ulp (Cephes expf: reduce by ln2, degree-6
// polynomial, scale by 2^n through the exponent bits in two halves so
// neither leaves the normal range). NaN propagates, overflow gives inf;
// results below e^-86 (4.4e-38, near the smallest normal float) are exactly
// 0, so no step ever touches a subnormal (which costs ~100 cycles).
// V is a float vector type and VI the int32 vector of the same lane count;
// instantiated at 4 lanes for baseline code and at 8 inside avx2 functions.
template <class V, class VI> [[gnu::always_inline]] inline V exp_lanes(V x) {
  const V lo = V{} - 86.0f, hi = V{} + 88.72283f;
  V xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const V magic = V{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const V n = (xc * 1.44269504088896341f + magic) - magic;
  V r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const VI ni = __builtin_convertvector(n, VI);
  const VI n1 = ni >> 1, n2 = ni - n1;
  const VI e1 = (n1 + 127) << 23, e2 = (n2 + 127) << 23;
  V s1, s2;
  std::memcpy(&s1, &e1, sizeof s1);
  std::memcpy(&s2, &e2, sizeof s2);
  V y = p * s1 * s2;
  y = x < lo ? V{} : y;
  y = x > hi ? V{} + __builtin_inff() : y;
  return y;
}

// out[0..4) = exp(in[0..4) - shift). Pointers, not vector arguments, so the
// ABI does not depend on the ISA.
inline void exp4_block(const float* in, float shift, float* out) {
  v4f x;
  std::memcpy(&x, in, sizeof x);
  const v4f y = exp_lanes<v4f, v4i>(x - shift);
  std::memcpy(out, &y, sizeof y);
}

// out[i] = exp(in[i] - shift) for n floats.
inline void exp_shifted(const float* in, float shift, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) exp4_block(in + i, shift, out + i);
  if (i < n) {
    float a[4] = {0, 0, 0, 0}, b[4];
    std::memcpy(a, in + i, static_cast<size_t>(n - i) * sizeof(float));
    exp4_block(a, shift, b);
    std::memcpy(out + i, b, static_cast<size_t>(n - i) * sizeof(float));
  }
}

}  // namespace backplane::cpu
