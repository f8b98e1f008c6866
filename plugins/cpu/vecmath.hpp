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

// out[0..4) = exp(in[0..4) - shift) within ~2 ulp (Cephes expf: reduce by
// ln2, degree-6 polynomial, scale by 2^n through the exponent bits in two
// halves so neither leaves the normal range). NaN propagates, overflow gives
// inf; results below e^-86 (4.4e-38, near the smallest normal float) are
// exactly 0, so no step ever touches a subnormal (which costs ~100 cycles).
// Pointers, not vector arguments, so the ABI does not depend on the ISA.
inline void exp4_block(const float* in, float shift, float* out) {
  v4f x;
  std::memcpy(&x, in, sizeof x);
  x = x - shift;
  const v4f lo = v4f{} - 86.0f, hi = v4f{} + 88.72283f;
  v4f xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const v4f magic = v4f{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const v4f n = (xc * 1.44269504088896341f + magic) - magic;
  v4f r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  v4f p = v4f{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const v4i ni = __builtin_convertvector(n, v4i);
  const v4i n1 = ni >> 1, n2 = ni - n1;
  const v4i e1 = (n1 + 127) << 23, e2 = (n2 + 127) << 23;
  v4f s1, s2;
  std::memcpy(&s1, &e1, sizeof s1);
  std::memcpy(&s2, &e2, sizeof s2);
  v4f y = p * s1 * s2;
  y = x < lo ? v4f{} : y;
  y = x > hi ? v4f{} + __builtin_inff() : y;
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
