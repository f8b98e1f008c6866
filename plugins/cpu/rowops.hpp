// Row primitives for contiguous f32 data, written for AVX2+FMA: the hot
// inner loops of sum, mean, var_mean, softmax and topk. The generic kernels
// call them when rows::enabled() (the ISA picked at initialize is avx2 or
// wider) and keep their own portable loops otherwise, so the baseline path
// stays exercised by BACKPLANE_CPU_ISA=baseline.
//
// Float data is accumulated in double, as in the portable loops.
#pragma once

#include <cstdint>

namespace backplane::cpu::rows {

bool enabled();

// The sum of x[0..n).
double sum(const float* x, int64_t n);
// s1 += sum(x - k), s2 += sum((x - k)^2) over x[0..n).
void moments(const float* x, int64_t n, double k, double* s1, double* s2);
// acc[j] += x[r * stride + j] for r = 0..rows-1 in order, j = 0..n-1.
void add_rows_to(double* acc, const float* x, int64_t stride, int64_t rows, int64_t n);
// The largest of x[0..n) (n >= 1); *nan tells whether any was NaN.
float max(const float* x, int64_t n, bool* nan);
// y[i] = exp(x[i] - m); returns the sum of the y (y may be x).
double exp_sum(const float* x, float m, float* y, int64_t n);
// y[i] *= s.
void scale(float* y, float s, int64_t n);
// y[i] = e[i] * s; with `stream`, as non-temporal stores (the caller fences).
void scale_to(float* y, const float* e, float s, int64_t n, bool stream);
// y[i] = (x[i] - mean) * (rstd * w[i]) + b[i], layer_norm's last pass (w
// and b dense over n). The mean comes as mean_hi + mean_lo (the float
// nearest it and the rest), subtracted one after the other: x - mean_hi is
// exact where x is near the mean, so rows far from zero keep their spread.
void norm_affine(const float* x, int64_t n, float mean_hi, float mean_lo, float rstd, const float* w, const float* b,
                 float* y);
// y[i] = gelu(x[i]) = 0.5 x erfc(-x / sqrt 2) (the erf form), within ~2e-6
// relative where |y| > 1e-6 (an absolute 1e-7 below). erfc(a) for a = |x /
// sqrt 2| is exp(-a^2) P(t), t = 1 / (1 + a / 2), P a degree-10 polynomial
// fitted to erfc(a) exp(a^2) over a in [0, 10] (relative 2.4e-8; rounding
// in f32 brings it to ~2e-7); erfc(-a) = 2 - erfc(a). NaN propagates.
void gelu_erf(const float* x, float* y, int64_t n);
// Orders this thread's non-temporal stores before what it does next; unlike
// the functions above, callable whatever ISA was picked (a no-op off x86-64).
void fence();
// The first index in [i, n) whose value does not lose to thr (for largest:
// not x <= thr, so NaN stops too; for smallest: not x >= thr), or n.
int64_t find_contender(const float* x, int64_t i, int64_t n, float thr, bool largest);

}  // namespace backplane::cpu::rows
