// f32 transcendental functions with ~1-2 ulp accuracy. GLSL's built-ins are
// only loosely specified by Vulkan (e.g. sin/cos: 2^-11 absolute, log:
// 2^-21 absolute near 1), too coarse for Backplane's 1e-5 relative
// tolerance, so shaders use these. Polynomials are Cephes' single-precision
// ones (S. L. Moshier, public domain).
#ifndef BP_MATH_GLSL
#define BP_MATH_GLSL

#define F_INF uintBitsToFloat(0x7f800000u)
#define F_NAN uintBitsToFloat(0x7fc00000u)

float ldexp_safe(float x, int n) {
  int h = n / 2;
  return ldexp(ldexp(x, h), n - h);
}

float exp_f(float x) {
  if (isnan(x)) return x;
  if (x > 88.72283935546875) return F_INF;
  if (x < -103.972084045410) return 0.0;
  float fx = floor(x * 1.44269504088896341 + 0.5);
  float r = x - fx * 0.693359375;
  r = r + fx * 2.12194440e-4;
  float z = r * r;
  float p = (((((1.9875691500E-4 * r + 1.3981999507E-3) * r + 8.3334519073E-3) * r + 4.1665795894E-2) * r +
              1.6666665459E-1) * r + 5.0000001201E-1) * z + r + 1.0;
  return ldexp_safe(p, int(fx));
}

float log_f(float x) {
  if (isnan(x) || x < 0.0) return F_NAN;
  if (x == 0.0) return -F_INF;
  if (isinf(x)) return x;
  int bias = 0;
  if (x < 1.17549435e-38) {  // subnormal input
    x *= 16777216.0;
    bias = -24;
  }
  int e;
  float m = frexp(x, e);
  e += bias;
  if (m < 0.707106781186547524) {
    e -= 1;
    m = m + m - 1.0;
  } else {
    m = m - 1.0;
  }
  float z = m * m;
  float y = ((((((((7.0376836292E-2 * m - 1.1514610310E-1) * m + 1.1676998740E-1) * m - 1.2420140846E-1) * m +
                 1.4249322787E-1) * m - 1.6668057665E-1) * m + 2.0000714765E-1) * m - 2.4999993993E-1) * m +
             3.3333331174E-1) * m * z;
  float fe = float(e);
  y += -2.12194440e-4 * fe;
  y += -0.5 * z;
  float r = m + y;
  r += 0.693359375 * fe;
  return r;
}

float log1p_f(float x) {
  if (isinf(x) && x > 0.0) return x;
  float u = 1.0 + x;
  if (u == 1.0) return x;
  return log_f(u) * (x / (u - 1.0));
}

float expm1_f(float x) {
  if (abs(x) < 0.5) {
    // Taylor to x^8: relative error < 1e-8 for |x| < 0.5.
    float p = x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x * (1.0 / 120.0 + x * (1.0 / 720.0 +
              x * (1.0 / 5040.0 + x * (1.0 / 40320.0))))))));
    return p;
  }
  return exp_f(x) - 1.0;
}

float sincos_poly_sin(float r) {
  float z = r * r;
  return ((-1.9515295891E-4 * z + 8.3321608736E-3) * z - 1.6666654611E-1) * z * r + r;
}
float sincos_poly_cos(float r) {
  float z = r * r;
  return ((2.443315711809948E-005 * z - 1.388731625493765E-003) * z + 4.166664568298827E-002) * z * z - 0.5 * z + 1.0;
}
// Reduces |x| by multiples of pi/4; returns the octant (0..7) and the remainder.
int sincos_reduce(float x, out float r) {
  float j = floor(x * 1.27323954473516);
  if (mod(j, 2.0) == 1.0) j += 1.0;
  r = ((x - j * 0.78515625) - j * 2.4187564849853515625e-4) - j * 3.77489497744594108e-8;
  return int(mod(j, 8.0));
}

float sin_f(float x) {
  if (isnan(x) || isinf(x)) return F_NAN;
  float s = x < 0.0 ? -1.0 : 1.0;
  float r;
  int j = sincos_reduce(abs(x), r);
  if (j > 3) {
    s = -s;
    j -= 4;
  }
  float y = (j == 1 || j == 2) ? sincos_poly_cos(r) : sincos_poly_sin(r);
  return s * y;
}

float cos_f(float x) {
  if (isnan(x) || isinf(x)) return F_NAN;
  float r;
  int j = sincos_reduce(abs(x), r);
  float s = 1.0;
  if (j > 3) {
    j -= 4;
    s = -s;
  }
  if (j > 1) s = -s;
  float y = (j == 1 || j == 2) ? sincos_poly_sin(r) : sincos_poly_cos(r);
  return s * y;
}

float tanh_f(float x) {
  if (isnan(x)) return x;
  float z = abs(x);
  if (z > 9.0) return x > 0.0 ? 1.0 : -1.0;
  if (z >= 0.625) {
    float s = exp_f(2.0 * z);
    float r = 1.0 - 2.0 / (s + 1.0);
    return x < 0.0 ? -r : r;
  }
  float zz = x * x;
  return ((((-5.70498872745E-3 * zz + 2.06390887954E-2) * zz - 5.37397155531E-2) * zz + 1.33314422036E-1) * zz -
          3.33332819422E-1) * zz * x + x;
}

// exp(-x*x) with the rounding error of x*x compensated.
float expmx2_f(float x) {
  float h = x * x;
  precise float l = fma(x, x, -h);
  return exp_f(-h) * (1.0 - l);
}

// erf for |x| < 1.5: 2/sqrt(pi) exp(-x^2) sum 2^n x^(2n+1) / (1*3*...*(2n+1)),
// all terms positive (no cancellation).
float erf_series(float x) {
  float t = x, s = x;
  float x2 = 2.0 * x * x;
  for (int n = 1; n < 40; ++n) {
    t *= x2 / float(2 * n + 1);
    s += t;
    if (abs(t) < abs(s) * 1e-9) break;
  }
  return 1.1283791670955126 * expmx2_f(x) * s;
}

// erfc for x >= 1.5 by its continued fraction (40 levels: rel. error < 1e-10).
float erfc_cf(float x) {
  float f = x;
  for (int k = 40; k >= 1; --k) f = x + (0.5 * float(k)) / f;
  return expmx2_f(x) * 0.5641895835477563 / f;
}

float erf_f(float x) {
  if (isnan(x)) return x;
  float a = abs(x);
  if (a < 1.5) return erf_series(x);
  float r = a > 10.0 ? 1.0 : 1.0 - erfc_cf(a);
  return x < 0.0 ? -r : r;
}

float erfc_f(float x) {
  if (isnan(x)) return x;
  if (x >= 1.5) return x > 10.5 ? 0.0 : erfc_cf(x);
  if (x <= -1.5) return x < -10.5 ? 2.0 : 2.0 - erfc_cf(-x);
  return 1.0 - erf_series(x);
}

// C99 pow semantics.
float pow_f(float x, float y) {
  if (y == 0.0 || x == 1.0) return 1.0;
  if (isnan(x) || isnan(y)) return x + y;
  float ax = abs(x);
  bool yint = floor(y) == y;
  bool odd = yint && abs(y) < 16777216.0 && mod(y, 2.0) == 1.0;
  if (isinf(y)) {
    if (ax == 1.0) return 1.0;
    return ((ax > 1.0) == (y > 0.0)) ? F_INF : 0.0;
  }
  if (x == 0.0) {
    if (y < 0.0) return odd ? (sign(1.0 / x) * F_INF) : F_INF;
    return odd ? x : 0.0;
  }
  if (isinf(x)) {
    float r = y < 0.0 ? 0.0 : F_INF;
    return (x < 0.0 && odd) ? -r : r;
  }
  if (x < 0.0 && !yint) return F_NAN;
  // exp(y * log|x|) with the product split into hi + lo.
  float l = log_f(ax);
  float h = y * l;
  precise float lo = fma(y, l, -h);
  float r = exp_f(h) * (1.0 + lo);
  if (isinf(exp_f(h))) r = F_INF;
  return (x < 0.0 && odd) ? -r : r;
}

// ---------------------------------------------------------------------------
// f64 (only compiled into shaders that use doubles). Relative error ~1e-16.
#ifdef BP_MATH_DOUBLE
#define D_INF double(uintBitsToFloat(0x7f800000u))
#define D_NAN double(uintBitsToFloat(0x7fc00000u))

double ldexp_d(double x, int n) {
  int h = n / 2;
  return ldexp(ldexp(x, h), n - h);
}

double exp_d(double x) {
  if (isnan(x)) return x;
  if (x > 709.782712893384LF) return D_INF;
  if (x < -745.1332191019412LF) return 0.0LF;
  double k = floor(x * 1.4426950408889634LF + 0.5LF);
  double r = x - k * 6.93147180369123816490e-01LF;
  r = r - k * 1.90821492927058770002e-10LF;
  // Taylor series to degree 14 on |r| <= ln2/2.
  double p = 1.0LF / 87178291200.0LF;
  p = p * r + 1.0LF / 6227020800.0LF;
  p = p * r + 1.0LF / 479001600.0LF;
  p = p * r + 1.0LF / 39916800.0LF;
  p = p * r + 1.0LF / 3628800.0LF;
  p = p * r + 1.0LF / 362880.0LF;
  p = p * r + 1.0LF / 40320.0LF;
  p = p * r + 1.0LF / 5040.0LF;
  p = p * r + 1.0LF / 720.0LF;
  p = p * r + 1.0LF / 120.0LF;
  p = p * r + 1.0LF / 24.0LF;
  p = p * r + 1.0LF / 6.0LF;
  p = p * r + 0.5LF;
  p = p * r * r + r + 1.0LF;
  return ldexp_d(p, int(k));
}

double log_d(double x) {
  if (isnan(x) || x < 0.0LF) return D_NAN;
  if (x == 0.0LF) return -D_INF;
  if (isinf(x)) return x;
  int e;
  double m = frexp(x, e);
  if (m < 0.70710678118654752LF) {
    m *= 2.0LF;
    e -= 1;
  }
  // log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716
  double s = (m - 1.0LF) / (m + 1.0LF);
  double s2 = s * s;
  double p = 1.0LF / 25.0LF;
  p = p * s2 + 1.0LF / 23.0LF;
  p = p * s2 + 1.0LF / 21.0LF;
  p = p * s2 + 1.0LF / 19.0LF;
  p = p * s2 + 1.0LF / 17.0LF;
  p = p * s2 + 1.0LF / 15.0LF;
  p = p * s2 + 1.0LF / 13.0LF;
  p = p * s2 + 1.0LF / 11.0LF;
  p = p * s2 + 1.0LF / 9.0LF;
  p = p * s2 + 1.0LF / 7.0LF;
  p = p * s2 + 1.0LF / 5.0LF;
  p = p * s2 + 1.0LF / 3.0LF;
  double lm = 2.0LF * (s + s * s2 * p);
  double fe = double(e);
  return fe * 6.93147180369123816490e-01LF + (lm + fe * 1.90821492927058770002e-10LF);
}

double log1p_d(double x) {
  if (isinf(x) && x > 0.0LF) return x;
  double u = 1.0LF + x;
  if (u == 1.0LF) return x;
  return log_d(u) * (x / (u - 1.0LF));
}

double expm1_d(double x) {
  if (abs(x) < 0.5LF) {
    // Taylor to x^18: relative error < 1e-17 for |x| < 0.5.
    // x + x^2 (1/2! + x/3! + ... + x^16/18!)
    double p = 1.0LF / 6402373705728000.0LF;
    double f = 6402373705728000.0LF;  // 18!
    for (int k = 18; k >= 3; --k) {
      f /= double(k);  // (k-1)!
      p = p * x + 1.0LF / f;
    }
    return x + x * x * p;
  }
  return exp_d(x) - 1.0LF;
}

double tanh_d(double x) {
  if (isnan(x)) return x;
  double z = abs(x);
  if (z > 20.0LF) return x > 0.0LF ? 1.0LF : -1.0LF;
  double r;
  if (z >= 0.5LF) {
    r = 1.0LF - 2.0LF / (exp_d(2.0LF * z) + 1.0LF);
  } else {
    double e = expm1_d(2.0LF * z);
    r = e / (e + 2.0LF);
  }
  return x < 0.0LF ? -r : r;
}

// sin/cos: x = k pi/2 + r with a three-part pi/2 (fdlibm's constants),
// then Taylor series on |r| <= pi/4 to degree 21/22.
double sin_poly_d(double r) {
  double z = r * r;
  double p = -1.0LF / 51090942171709440000.0LF;  // -1/21!
  p = p * z + 1.0LF / 121645100408832000.0LF;    // 1/19!
  p = p * z - 1.0LF / 355687428096000.0LF;       // 1/17!
  p = p * z + 1.0LF / 1307674368000.0LF;
  p = p * z - 1.0LF / 6227020800.0LF;
  p = p * z + 1.0LF / 39916800.0LF;
  p = p * z - 1.0LF / 362880.0LF;
  p = p * z + 1.0LF / 5040.0LF;
  p = p * z - 1.0LF / 120.0LF;
  p = p * z + 1.0LF / 6.0LF;
  return r - r * z * p;
}
double cos_poly_d(double r) {
  double z = r * r;
  double p = 1.0LF / 1124000727777607680000.0LF;  // 1/22!
  p = p * z - 1.0LF / 2432902008176640000.0LF;     // 1/20!
  p = p * z + 1.0LF / 6402373705728000.0LF;
  p = p * z - 1.0LF / 20922789888000.0LF;
  p = p * z + 1.0LF / 87178291200.0LF;
  p = p * z - 1.0LF / 479001600.0LF;
  p = p * z + 1.0LF / 3628800.0LF;
  p = p * z - 1.0LF / 40320.0LF;
  p = p * z + 1.0LF / 720.0LF;
  p = p * z - 1.0LF / 24.0LF;
  p = p * z + 0.5LF;
  return 1.0LF - z * p;
}
int reduce_pio2_d(double x, out double r) {
  double k = floor(x * 0.636619772367581343LF + 0.5LF);
  r = ((x - k * 1.57079632673412561417e+00LF) - k * 6.07710050630396597660e-11LF) - k * 2.02226624879595063154e-21LF;
  return int(mod(k, 4.0LF));
}
double sin_d(double x) {
  if (isnan(x) || isinf(x)) return D_NAN;
  double r;
  int q = reduce_pio2_d(x, r);
  if (q == 0) return sin_poly_d(r);
  if (q == 1) return cos_poly_d(r);
  if (q == 2) return -sin_poly_d(r);
  return -cos_poly_d(r);
}
double cos_d(double x) {
  if (isnan(x) || isinf(x)) return D_NAN;
  double r;
  int q = reduce_pio2_d(x, r);
  if (q == 0) return cos_poly_d(r);
  if (q == 1) return -sin_poly_d(r);
  if (q == 2) return -cos_poly_d(r);
  return sin_poly_d(r);
}

double expmx2_d(double x) {
  double h = x * x;
  precise double l = fma(x, x, -h);
  return exp_d(-h) * (1.0LF - l);
}
double erf_series_d(double x) {
  double t = x, s = x;
  double x2 = 2.0LF * x * x;
  for (int n = 1; n < 120; ++n) {
    t *= x2 / double(2 * n + 1);
    s += t;
    if (abs(t) < abs(s) * 1e-18LF) break;
  }
  return 1.1283791670955125739LF * expmx2_d(x) * s;
}
double erfc_cf_d(double x) {
  double f = x;
  for (int k = 90; k >= 1; --k) f = x + (0.5LF * double(k)) / f;
  return expmx2_d(x) * 0.56418958354775628695LF / f;
}
double erf_d(double x) {
  if (isnan(x)) return x;
  double a = abs(x);
  if (a < 2.0LF) return erf_series_d(x);
  double r = a > 27.0LF ? 1.0LF : 1.0LF - erfc_cf_d(a);
  return x < 0.0LF ? -r : r;
}
double erfc_d(double x) {
  if (isnan(x)) return x;
  if (x >= 2.0LF) return x > 27.3LF ? 0.0LF : erfc_cf_d(x);
  if (x <= -2.0LF) return x < -27.0LF ? 2.0LF : 2.0LF - erfc_cf_d(-x);
  return 1.0LF - erf_series_d(x);
}

double pow_d(double x, double y) {
  if (y == 0.0LF || x == 1.0LF) return 1.0LF;
  if (isnan(x) || isnan(y)) return x + y;
  double ax = abs(x);
  bool yint = floor(y) == y;
  bool odd = yint && abs(y) < 9007199254740992.0LF && mod(y, 2.0LF) == 1.0LF;
  if (isinf(y)) {
    if (ax == 1.0LF) return 1.0LF;
    return ((ax > 1.0LF) == (y > 0.0LF)) ? D_INF : 0.0LF;
  }
  if (x == 0.0LF) {
    if (y < 0.0LF) return odd ? (sign(1.0LF / x) * D_INF) : D_INF;
    return odd ? x : 0.0LF;
  }
  if (isinf(x)) {
    double r = y < 0.0LF ? 0.0LF : D_INF;
    return (x < 0.0LF && odd) ? -r : r;
  }
  if (x < 0.0LF && !yint) return D_NAN;
  double l = log_d(ax);
  double h = y * l;
  precise double lo = fma(y, l, -h);
  double e = exp_d(h);
  double r = isinf(e) ? e : e * (1.0LF + lo);
  return (x < 0.0LF && odd) ? -r : r;
}
#endif

#endif
