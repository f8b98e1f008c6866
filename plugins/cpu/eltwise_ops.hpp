// The elementwise ops' element functors, shared by their kernels (unary.cpp,
// binary.cpp, compare.cpp) and fused_elementwise's (fused.cpp), so a fused
// chain computes each element exactly as the chain's own kernels do.
#pragma once

#include "elementwise.hpp"
#include "rowops.hpp"

#include <atomic>
#include <cmath>

namespace backplane::cpu::eltwise::ops {

struct Neg : NoParams {
  using NoParams::NoParams;
  template <class C> C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) return wneg(x);
    else return -x;
  }
};
struct Abs : NoParams {
  using NoParams::NoParams;
  template <class C> C operator()(C x) const {
    if constexpr (std::is_unsigned_v<C>) return x;
    else if constexpr (std::is_integral_v<C>) return x < 0 ? wneg(x) : x;
    else return std::fabs(x);
  }
};
struct Sign : NoParams {
  using NoParams::NoParams;
  template <class C> C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) return static_cast<C>((x > 0) - (x < 0));
    else return x > 0 ? C(1) : x < 0 ? C(-1) : x;  // 0 and NaN pass through
  }
};

#define BP_CPU_UNARY(NAME, BASE, EXPR)                  \
  struct NAME : BASE {                                  \
    using BASE::BASE;                                   \
    template <class C> C operator()(C x) const { return EXPR; } \
  };
BP_CPU_UNARY(Sqr, NoParams, x * x)
BP_CPU_UNARY(Sqrt, NoParams, std::sqrt(x))
BP_CPU_UNARY(Rsqrt, NoParams, C(1) / std::sqrt(x))
BP_CPU_UNARY(Recip, NoParams, C(1) / x)
BP_CPU_UNARY(Exp, Costly, std::exp(x))
BP_CPU_UNARY(Log, Costly, std::log(x))
BP_CPU_UNARY(Sin, Costly, std::sin(x))
BP_CPU_UNARY(Cos, Costly, std::cos(x))
BP_CPU_UNARY(Tanh, Costly, std::tanh(x))
BP_CPU_UNARY(Erf, Costly, std::erf(x))
BP_CPU_UNARY(Floor, NoParams, std::floor(x))
BP_CPU_UNARY(Ceil, NoParams, std::ceil(x))
BP_CPU_UNARY(Round, NoParams, std::nearbyint(x))  // default rounding mode: half to even
BP_CPU_UNARY(Relu, NoParams, x < C(0) ? C(0) : x)  // NaN < 0 is false: NaN propagates
BP_CPU_UNARY(Sigmoid, Costly, C(1) / (C(1) + std::exp(-x)))
BP_CPU_UNARY(Silu, Costly, x / (C(1) + std::exp(-x)))
BP_CPU_UNARY(Softplus, Costly, (x > C(0) ? x : C(0)) + std::log1p(std::exp(-std::fabs(x))))
#undef BP_CPU_UNARY

struct Gelu : Costly {
  static constexpr bp_params_kind kind = BP_PARAMS_GELU;
  bool tanh_form;
  explicit Gelu(const bp_op_params* p) : Costly(p), tanh_form(p->u.gelu.tanh_approximation) {}
  template <class C> C operator()(C x) const {
    if (tanh_form) {
      // 0.5x(1 + tanh(u)) == x * sigmoid(2u): no cancellation for x << 0.
      const C u = C(0.7978845608028654) * (x + C(0.044715) * x * x * x);
      return x / (C(1) + std::exp(C(-2) * u));
    }
    return gelu_erf_one(x);
  }
  // The erf form over dense f32 on AVX2: rows::gelu_erf (a fitted erfc,
  // ~30x the libm erfcf per element above).
  bool block_f32_applies() const { return !tanh_form && rows::enabled(); }
  void block_f32(const float* x, float* y, int64_t n) const { rows::gelu_erf(x, y, n); }
};

struct Clamp : NoParams {
  static constexpr bp_params_kind kind = BP_PARAMS_CLAMP;
  bp_clamp_params p;
  // Absent bounds as infinities, so the float path is two selects without
  // branches (it vectorises; MobileNetV2's 35 clamps took a quarter of its
  // time with a NaN test and two flag tests per element).
  double lo, hi;
  explicit Clamp(const bp_op_params* q)
      : NoParams(q), p(q->u.clamp), lo(p.has_min ? p.min_f : -HUGE_VAL), hi(p.has_max ? p.max_f : HUGE_VAL) {}
  template <class C> C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) {
      int64_t v = x;
      if (p.has_min && v < p.min_i) v = p.min_i;
      if (p.has_max && v > p.max_i) v = p.max_i;
      return static_cast<C>(v);
    } else {
      // min first, then max (min > max gives max); NaN fails both tests and
      // passes through.
      const C l = static_cast<C>(lo), h = static_cast<C>(hi);
      x = x < l ? l : x;
      return x > h ? h : x;
    }
  }
};

struct Affine : NoParams {
  static constexpr bp_params_kind kind = BP_PARAMS_AFFINE;
  double mul, add;
  explicit Affine(const bp_op_params* q) : NoParams(q), mul(q->u.affine.mul), add(q->u.affine.add) {}
  // In double, rounded once: y = mul*x + add may cancel.
  template <class C> C operator()(C x) const { return static_cast<C>(mul * static_cast<double>(x) + add); }
};

// Binary arithmetic
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

// Comparisons (to bool)
struct Eq : NoParams { using NoParams::NoParams; template <class C> bool operator()(C a, C b) const { return a == b; } };
struct Ne : NoParams { using NoParams::NoParams; template <class C> bool operator()(C a, C b) const { return a != b; } };
struct Lt : NoParams { using NoParams::NoParams; template <class C> bool operator()(C a, C b) const { return a < b; } };
struct Le : NoParams { using NoParams::NoParams; template <class C> bool operator()(C a, C b) const { return a <= b; } };
struct Gt : NoParams { using NoParams::NoParams; template <class C> bool operator()(C a, C b) const { return a > b; } };
struct Ge : NoParams { using NoParams::NoParams; template <class C> bool operator()(C a, C b) const { return a >= b; } };

}  // namespace backplane::cpu::eltwise::ops
