// AVX2+FMA bodies of rowops.hpp (softmax's max, exp and scale passes also
// in AVX-512, taken when initialize picked avx512). Only the functions below
// carry the target attribute; the file is compiled for baseline x86-64 like
// the rest, and nothing here runs unless initialize picked avx2 or wider.
#include "rowops.hpp"

#include "kernels.hpp"
#include "vecmath.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace backplane::cpu::rows {

bool enabled() {
#if defined(__x86_64__)
  return isa() >= Isa::avx2;
#else
  return false;
#endif
}

#if defined(__x86_64__)
#define BP_AVX2 __attribute__((target("avx2,fma")))
#define BP_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma")))

namespace {

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef double v4d __attribute__((vector_size(32)));
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef double v8d __attribute__((vector_size(64)));

template <class V, class P> BP_AVX2 [[gnu::always_inline]] inline V load(const P* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V, class P> BP_AVX2 [[gnu::always_inline]] inline void store(P* p, V v) { std::memcpy(p, &v, sizeof v); }

BP_AVX2 [[gnu::always_inline]] inline v4d widen4(const float* p) { return __builtin_convertvector(load<v4f>(p), v4d); }
BP_AVX2 [[gnu::always_inline]] inline double hsum(v4d a) { return (a[0] + a[1]) + (a[2] + a[3]); }

// Rows are read once, front to back, often one after another: fetching
// 8 KiB ahead keeps more lines in flight than the hardware prefetcher does
// with the double conversions in between (measured ~20% on a 64 MiB sum).
// Past the end of the data a prefetch is harmless.
constexpr int64_t kAhead = 2048;

}  // namespace

BP_AVX2 double sum(const float* x, int64_t n) {
  v4d a0{}, a1{}, a2{}, a3{};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __builtin_prefetch(x + i + kAhead);
    a0 += widen4(x + i);
    a1 += widen4(x + i + 4);
    a2 += widen4(x + i + 8);
    a3 += widen4(x + i + 12);
  }
  for (; i + 4 <= n; i += 4) a0 += widen4(x + i);
  double s = hsum((a0 + a1) + (a2 + a3));
  for (; i < n; ++i) s += static_cast<double>(x[i]);
  return s;
}

BP_AVX2 void moments(const float* x, int64_t n, double k, double* s1, double* s2) {
  const v4d kv = v4d{} + k;
  v4d a0{}, a1{}, q0{}, q1{};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if ((i & 15) == 0) __builtin_prefetch(x + i + kAhead);
    const v4d d0 = widen4(x + i) - kv, d1 = widen4(x + i + 4) - kv;
    a0 += d0;
    a1 += d1;
    q0 += d0 * d0;
    q1 += d1 * d1;
  }
  double t1 = hsum(a0 + a1), t2 = hsum(q0 + q1);
  for (; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - k;
    t1 += d;
    t2 += d * d;
  }
  *s1 += t1;
  *s2 += t2;
}

BP_AVX2 void add_rows_to(double* acc, const float* x, int64_t stride, int64_t rows, int64_t n) {
  int64_t r = 0;
  // Four rows per pass over acc: one read-modify-write of acc per 4 rows,
  // the same additions in the same order as one row at a time.
  for (; r + 4 <= rows; r += 4) {
    const float* x0 = x + r * stride;
    const float* x1 = x0 + stride;
    const float* x2 = x1 + stride;
    const float* x3 = x2 + stride;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      v4d a = load<v4d>(acc + j);
      a += widen4(x0 + j);
      a += widen4(x1 + j);
      a += widen4(x2 + j);
      a += widen4(x3 + j);
      store(acc + j, a);
    }
    for (; j < n; ++j)
      acc[j] = (((acc[j] + static_cast<double>(x0[j])) + static_cast<double>(x1[j])) + static_cast<double>(x2[j])) +
               static_cast<double>(x3[j]);
  }
  for (; r < rows; ++r) {
    const float* xr = x + r * stride;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) store(acc + j, load<v4d>(acc + j) + widen4(xr + j));
    for (; j < n; ++j) acc[j] += static_cast<double>(xr[j]);
  }
}

namespace {
BP_AVX2 float max_avx2(const float* x, int64_t n, bool* nan) {
  const float ninf = -std::numeric_limits<float>::infinity();
  v8f m0 = v8f{} + ninf, m1 = m0;
  v8i bad{};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __builtin_prefetch(x + i + kAhead);
    const v8f v0 = load<v8f>(x + i), v1 = load<v8f>(x + i + 8);
    bad |= (v0 != v0) | (v1 != v1);
    m0 = v0 > m0 ? v0 : m0;
    m1 = v1 > m1 ? v1 : m1;
  }
  m0 = m1 > m0 ? m1 : m0;
  float m = ninf;
  bool any_nan = false;
  for (int k = 0; k < 8; ++k) {
    m = m0[k] > m ? m0[k] : m;
    any_nan |= bad[k] != 0;
  }
  for (; i < n; ++i) {
    any_nan |= x[i] != x[i];
    m = x[i] > m ? x[i] : m;
  }
  *nan = any_nan;
  return m;
}

BP_AVX2 double exp_sum_avx2(const float* x, float m, float* y, int64_t n) {
  v4d a0{}, a1{};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const v8f e = exp_lanes<v8f, v8i>(load<v8f>(x + i) - m);
    store(y + i, e);
    float h[8];
    store(h, e);
    a0 += widen4(h);
    a1 += widen4(h + 4);
  }
  double s = hsum(a0 + a1);
  if (i < n) {
    float in[8] = {0, 0, 0, 0, 0, 0, 0, 0}, out[8];
    std::memcpy(in, x + i, static_cast<size_t>(n - i) * sizeof(float));
    store(out, exp_lanes<v8f, v8i>(load<v8f>(in) - m));
    for (int64_t k = 0; k < n - i; ++k) {
      y[i + k] = out[k];
      s += static_cast<double>(out[k]);
    }
  }
  return s;
}

// AVX-512: the same exp polynomial 16 lanes at a time (softmax's exp pass
// was its costliest: ~2x the row's memory time at 8 lanes).

BP_AVX512 double exp_sum_avx512(const float* x, float m, float* y, int64_t n) {
  v8d a0{}, a1{};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const v16f e = exp_lanes<v16f, v16i>(load<v16f>(x + i) - m);
    store(y + i, e);
    a0 += __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3, 4, 5, 6, 7), v8d);
    a1 += __builtin_convertvector(__builtin_shufflevector(e, e, 8, 9, 10, 11, 12, 13, 14, 15), v8d);
  }
  const v8d a = a0 + a1;
  double s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  if (i < n) s += exp_sum_avx2(x + i, m, y + i, n - i);
  return s;
}

BP_AVX512 float max_avx512(const float* x, int64_t n, bool* nan) {
  const float ninf = -std::numeric_limits<float>::infinity();
  v16f m0 = v16f{} + ninf, m1 = m0;
  v16i bad{};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __builtin_prefetch(x + i + kAhead);
    __builtin_prefetch(x + i + kAhead + 16);
    const v16f v0 = load<v16f>(x + i), v1 = load<v16f>(x + i + 16);
    bad |= (v0 != v0) | (v1 != v1);
    m0 = v0 > m0 ? v0 : m0;
    m1 = v1 > m1 ? v1 : m1;
  }
  m0 = m1 > m0 ? m1 : m0;
  float m = ninf;
  bool any_nan = false;
  for (int k = 0; k < 16; ++k) {
    m = m0[k] > m ? m0[k] : m;
    any_nan |= bad[k] != 0;
  }
  if (i < n) {
    bool tail_nan = false;
    const float t = max_avx2(x + i, n - i, &tail_nan);
    m = t > m ? t : m;
    any_nan |= tail_nan;
  }
  *nan = any_nan;
  return m;
}

BP_AVX512 void scale_avx512(float* y, float s, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store(y + i, load<v16f>(y + i) * s);
  for (; i < n; ++i) y[i] *= s;
}
}  // namespace

float max(const float* x, int64_t n, bool* nan) {
  return isa() == Isa::avx512 ? max_avx512(x, n, nan) : max_avx2(x, n, nan);
}

double exp_sum(const float* x, float m, float* y, int64_t n) {
  return isa() == Isa::avx512 ? exp_sum_avx512(x, m, y, n) : exp_sum_avx2(x, m, y, n);
}

BP_AVX2 void scale(float* y, float s, int64_t n) {
  if (isa() == Isa::avx512) {
    scale_avx512(y, s, n);
    return;
  }
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store(y + i, load<v8f>(y + i) * s);
  for (; i < n; ++i) y[i] *= s;
}

BP_AVX2 int64_t find_contender(const float* x, int64_t i, int64_t n, float thr, bool largest) {
  const v8f t = v8f{} + thr;
  for (; i + 16 <= n; i += 16) {
    const v8f v0 = load<v8f>(x + i), v1 = load<v8f>(x + i + 8);
    // Lanes that lose are all-ones; a NaN lane compares false and stops.
    const v8i lose = largest ? ((v0 <= t) & (v1 <= t)) : ((v0 >= t) & (v1 >= t));
    bool all = true;
    for (int k = 0; k < 8; ++k) all &= lose[k] != 0;
    if (!all) break;
  }
  for (; i < n; ++i)
    if (largest ? !(x[i] <= thr) : !(x[i] >= thr)) return i;
  return n;
}

BP_AVX2 void scale_to(float* y, const float* e, float s, int64_t n, bool stream) {
  int64_t i = 0;
  if (stream) {
    for (; i < n && (reinterpret_cast<uintptr_t>(y + i) & 31) != 0; ++i) y[i] = e[i] * s;
    for (; i + 8 <= n; i += 8) __builtin_ia32_movntps256(y + i, load<v8f>(e + i) * s);
  }
  for (; i + 8 <= n; i += 8) store(y + i, load<v8f>(e + i) * s);
  for (; i < n; ++i) y[i] = e[i] * s;
}

BP_AVX2 void norm_affine(const float* x, int64_t n, float mean_hi, float mean_lo, float rstd, const float* w, const float* b,
                         float* y) {
  const v8f mh = v8f{} + mean_hi, ml = v8f{} + mean_lo, rv = v8f{} + rstd;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    store(y + i, ((load<v8f>(x + i) - mh) - ml) * (rv * load<v8f>(w + i)) + load<v8f>(b + i));
  for (; i < n; ++i) y[i] = ((x[i] - mean_hi) - mean_lo) * (rstd * w[i]) + b[i];
}

namespace {

// 1 / d for d in [1, 6] without a division (16 lanes of division cost as
// much as the whole polynomial): the exponent-flip estimate (within 12%)
// and three Newton steps (each squares the error: ~2e-8, far inside the
// fit's 2e-6).
template <class V, class VI> [[gnu::always_inline]] inline V recip_1_6(V d) {
  VI bits;
  std::memcpy(&bits, &d, sizeof d);
  bits = 0x7EF311C7 - bits;
  V r;
  std::memcpy(&r, &bits, sizeof r);
  r = r * (2.0f - d * r);
  r = r * (2.0f - d * r);
  return r * (2.0f - d * r);
}

template <class V, class VI> BP_AVX2 [[gnu::always_inline]] inline V gelu_erf_lanes(V x) {
  const V z = x * 0.70710678118654752f;
  V a = z < 0.0f ? -z : z;
  a = a > 10.0f ? V{} + 10.0f : a;  // erfc(10) exp(100) is the fit's end; exp(-100) is 0 anyway
  const V t = recip_1_6<V, VI>(1.0f + 0.5f * a);
  V p = V{} + 2.916046695e-02f;
  p = p * t - 2.176054354e-01f;
  p = p * t + 6.589779610e-01f;
  p = p * t - 9.913491888e-01f;
  p = p * t + 7.052551089e-01f;
  p = p * t - 2.638104385e-01f;
  p = p * t + 2.897853513e-01f;
  p = p * t + 2.222766601e-01f;
  p = p * t + 2.854722189e-01f;
  p = p * t + 2.818281129e-01f;
  p = p * t + 9.178994844e-06f;
  const V e = exp_lanes<V, VI>(-(a * a)) * p;  // erfc(a)
  return 0.5f * x * (x < 0.0f ? e : 2.0f - e);
}

// Two vectors per pass: the polynomial is one chain of dependent FMAs, and
// two chains keep both FMA ports busy.
BP_AVX512 void gelu_erf_avx512(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const v16f a = gelu_erf_lanes<v16f, v16i>(load<v16f>(x + i));
    const v16f b = gelu_erf_lanes<v16f, v16i>(load<v16f>(x + i + 16));
    store(y + i, a);
    store(y + i + 16, b);
  }
  for (; i + 16 <= n; i += 16) store(y + i, gelu_erf_lanes<v16f, v16i>(load<v16f>(x + i)));
  if (i < n) {
    float in[16] = {}, out[16];
    std::memcpy(in, x + i, static_cast<size_t>(n - i) * sizeof(float));
    store(out, gelu_erf_lanes<v16f, v16i>(load<v16f>(in)));
    std::memcpy(y + i, out, static_cast<size_t>(n - i) * sizeof(float));
  }
}

}  // namespace

BP_AVX2 void gelu_erf(const float* x, float* y, int64_t n) {
  if (isa() == Isa::avx512) {
    gelu_erf_avx512(x, y, n);
    return;
  }
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store(y + i, gelu_erf_lanes<v8f, v8i>(load<v8f>(x + i)));
  if (i < n) {
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8];
    std::memcpy(a, x + i, static_cast<size_t>(n - i) * sizeof(float));
    store(b, gelu_erf_lanes<v8f, v8i>(load<v8f>(a)));
    std::memcpy(y + i, b, static_cast<size_t>(n - i) * sizeof(float));
  }
}

void fence() { __builtin_ia32_sfence(); }

#undef BP_AVX2
#undef BP_AVX512

#else  // not x86-64: enabled() is false and nothing below is called.

double sum(const float*, int64_t) { return 0; }
void moments(const float*, int64_t, double, double*, double*) {}
void add_rows_to(double*, const float*, int64_t, int64_t, int64_t) {}
float max(const float*, int64_t, bool*) { return 0; }
double exp_sum(const float*, float, float*, int64_t) { return 0; }
void scale(float*, float, int64_t) {}
void scale_to(float*, const float*, float, int64_t, bool) {}
void norm_affine(const float*, int64_t, float, float, float, const float*, const float*, float*) {}
void gelu_erf(const float*, float*, int64_t) {}
void fence() {}
int64_t find_contender(const float*, int64_t, int64_t n, float, bool) { return n; }

#endif

}  // namespace backplane::cpu::rows
