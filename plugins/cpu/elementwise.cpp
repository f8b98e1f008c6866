// Elementwise kernels: unary math, binary arithmetic, comparisons, where,
// clamp, affine, gelu, cast and contiguous.
//
// The host hands every input with the output's shape (broadcast dims have
// stride 0) and the output dense, so every kernel is "walk N layouts in step".
// sdk::StridedWalker coalesces dims and gives inner runs; each map* helper
// has a unit-stride loop the compiler vectorises plus a general strided one.
#include "kernels.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <limits>

namespace backplane::cpu {
namespace {

// ---------------------------------------------------------------------------
// Walk helpers

// Cache-blocked walk for inputs that run along a different dim than the
// output ("x.T + y", a transposing contiguous). Walking such an input in
// output order touches one cache line per element (and one DRAM page per
// few elements). Instead the output is cut into blocks of kBT x kBL
// (t: the input's unit-stride dim, l: the output's last dim); each block of
// a transposed input is first copied, 32x32 at a time and reading along its
// own unit-stride dim in 1 KiB runs, into an L2-sized buffer laid out like
// the output, and then every output row of the block is one unit-stride,
// vectorisable loop over the buffer and the other inputs.
struct Tiling {
  int t = -1, l = -1;  // the input's unit-stride dim and the output's last dim
  int64_t nt = 0, nl = 0, bt = 0, bl = 0;  // sizes and block counts along t and l
};
constexpr int64_t kBT = 256, kBL = 128, kSub = 32;

inline bool transposed_input(const bp_layout& li, int t, int l) {
  return (li.strides[t] == 1 || li.strides[t] == -1) && (li.strides[l] > 1 || li.strides[l] < -1);
}

template <size_t N> Tiling plan_tiling(const std::array<const bp_layout*, N>& lays) {
  Tiling tl;
  const bp_layout& lo = *lays[N - 1];
  const int r = static_cast<int>(lo.rank);
  if (sdk::numel(lo) < 16384) return tl;
  int l = -1;
  for (int i = r - 1; i >= 0 && l < 0; --i)
    if (lo.shape[i] > 1) l = i;
  if (l < 0 || lo.shape[l] < 8) return tl;
  for (size_t k = 0; k + 1 < N && tl.t < 0; ++k)
    for (int i = 0; i < r && tl.t < 0; ++i)
      if (i != l && lo.shape[i] >= 8 && transposed_input(*lays[k], i, l)) tl.t = i;
  if (tl.t < 0) return tl;
  tl.l = l;
  tl.nt = lo.shape[tl.t];
  tl.nl = lo.shape[l];
  tl.bt = (tl.nt + kBT - 1) / kBT;
  tl.bl = (tl.nl + kBL - 1) / kBL;
  return tl;
}

// Runs body(base offsets, i0, i1, j0, j1) for every (outer position, block),
// split over threads; make_scratch() is called once per thread chunk and its
// result passed to body.
template <size_t N, class MakeScratch, class Body>
void for_blocks(const Call& c, const std::array<const bp_layout*, N>& lays, const Tiling& tl, MakeScratch&& make_scratch,
                Body&& body) {
  const bp_layout& lo = *lays[N - 1];
  int64_t osh[BP_MAX_RANK] = {};
  for (uint32_t i = 0; i < lo.rank; ++i) osh[i] = lo.shape[i];
  osh[tl.t] = osh[tl.l] = 1;
  const sdk::StridedWalker<N> w(lo.rank, osh, lays);
  const int64_t per = tl.bt * tl.bl;
  pfor(c, w.numel() * per, 1, [&](int64_t b, int64_t e) {
    auto scratch = make_scratch();
    for (int64_t task = b; task < e; ++task) {
      const int64_t o = task / per, blk = task % per;
      const int64_t i0 = (blk / tl.bl) * kBT, j0 = (blk % tl.bl) * kBL;
      std::array<int64_t, N> base{};
      w.run(o, o + 1, [&](const int64_t* off, int64_t, const int64_t*) {
        for (size_t k = 0; k < N; ++k) base[k] = off[k];
      });
      body(scratch, base.data(), i0, std::min(tl.nt, i0 + kBT), j0, std::min(tl.nl, j0 + kBL));
    }
  });
}

// Copies the block [i0, i1) x [j0, j1) of a transposed input into
// buf[(i - i0) * kBL + (j - j0)]: 32x32 sub-tiles, each read along the
// input's unit-stride dim i, the next sub-tile's lines prefetched.
template <class T>
void gather_block(const T* p, int64_t st, int64_t sl, int64_t i0, int64_t i1, int64_t j0, int64_t j1, T* buf) {
  for (int64_t jj = j0; jj < j1; jj += kSub) {
    const int64_t je = std::min(j1, jj + kSub);
    for (int64_t ii = i0; ii < i1; ii += kSub) {
      const int64_t ie = std::min(i1, ii + kSub);
      if (ie < i1)
        for (int64_t j = jj; j < je; ++j) __builtin_prefetch(p + ie * st + j * sl);
      T* bb = buf + (ii - i0) * kBL;
      for (int64_t j = jj; j < je; ++j) {
        const T* src = p + j * sl;
        for (int64_t i = ii; i < ie; ++i) bb[(i - ii) * kBL + (j - j0)] = src[i * st];
      }
    }
  }
}

template <class TI, class TO, class F> void map1(const Call& c, F f, int64_t grain) {
  const bp_layout& li = c.in_layout(0);
  const bp_layout& lo = c.out_layout();
  const TI* x = c.in_data<TI>(0);
  TO* y = c.out_data<TO>();
  if (const Tiling tl = plan_tiling<2>({&li, &lo}); tl.t >= 0) {
    const int64_t xt = li.strides[tl.t], xl = li.strides[tl.l], yt = lo.strides[tl.t];
    for_blocks<2>(c, {&li, &lo}, tl, [] { return std::vector<TI>(kBT * kBL); },
                  [&](std::vector<TI>& buf, const int64_t* base, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
                    gather_block(x + base[0], xt, xl, i0, i1, j0, j1, buf.data());
                    for (int64_t i = i0; i < i1; ++i) {
                      TO* __restrict yr = y + base[1] + i * yt + j0;
                      const TI* __restrict br = buf.data() + (i - i0) * kBL;
                      for (int64_t j = 0; j < j1 - j0; ++j) yr[j] = f(br[j]);
                    }
                  });
    return;
  }
  const sdk::StridedWalker<2> w(lo.rank, lo.shape, {&li, &lo});
  pfor(c, w.numel(), grain, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const int64_t* off, int64_t n, const int64_t* s) {
      const TI* xp = x + off[0];
      TO* yp = y + off[1];
      if (s[0] == 1 && s[1] == 1) {
        for (int64_t i = 0; i < n; ++i) yp[i] = f(xp[i]);
      } else if (s[0] == 0 && s[1] == 1) {
        const TO v = f(*xp);
        for (int64_t i = 0; i < n; ++i) yp[i] = v;
      } else {
        for (int64_t i = 0; i < n; ++i) yp[i * s[1]] = f(xp[i * s[0]]);
      }
    });
  });
}

// One output run of a binary op with the input strides sa, sb (the output
// is unit-stride): the common stride patterns get loops of their own.
template <class TA, class TB, class TO, class F>
inline void binary_run(const TA* __restrict ap, int64_t sa, const TB* __restrict bp, int64_t sb, TO* __restrict yp,
                       int64_t n, F& f) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) yp[i] = f(ap[i], bp[i]);
  } else if (sa == 1 && sb == 0) {
    const TB bv = *bp;
    for (int64_t i = 0; i < n; ++i) yp[i] = f(ap[i], bv);
  } else if (sa == 0 && sb == 1) {
    const TA av = *ap;
    for (int64_t i = 0; i < n; ++i) yp[i] = f(av, bp[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) yp[i] = f(ap[i * sa], bp[i * sb]);
  }
}

template <class TA, class TB, class TO, class F> void map2(const Call& c, F f, int64_t grain) {
  const bp_layout& la = c.in_layout(0);
  const bp_layout& lb = c.in_layout(1);
  const bp_layout& lo = c.out_layout();
  const TA* a = c.in_data<TA>(0);
  const TB* b = c.in_data<TB>(1);
  TO* y = c.out_data<TO>();
  if (const Tiling tl = plan_tiling<3>({&la, &lb, &lo}); tl.t >= 0) {
    const int64_t at = la.strides[tl.t], al = la.strides[tl.l], bt = lb.strides[tl.t], bl = lb.strides[tl.l];
    const int64_t yt = lo.strides[tl.t];
    const bool ga = transposed_input(la, tl.t, tl.l), gb = transposed_input(lb, tl.t, tl.l);
    struct Scratch {
      std::vector<TA> a;
      std::vector<TB> b;
    };
    for_blocks<3>(
        c, {&la, &lb, &lo}, tl,
        [&] { return Scratch{std::vector<TA>(ga ? kBT * kBL : 0), std::vector<TB>(gb ? kBT * kBL : 0)}; },
        [&](Scratch& sc, const int64_t* base, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
          if (ga) gather_block(a + base[0], at, al, i0, i1, j0, j1, sc.a.data());
          if (gb) gather_block(b + base[1], bt, bl, i0, i1, j0, j1, sc.b.data());
          const int64_t as = ga ? 1 : al, bs = gb ? 1 : bl;
          for (int64_t i = i0; i < i1; ++i) {
            const TA* ar = ga ? sc.a.data() + (i - i0) * kBL : a + base[0] + i * at + j0 * al;
            const TB* br = gb ? sc.b.data() + (i - i0) * kBL : b + base[1] + i * bt + j0 * bl;
            binary_run(ar, as, br, bs, y + base[2] + i * yt + j0, j1 - j0, f);
          }
        });
    return;
  }
  const sdk::StridedWalker<3> w(lo.rank, lo.shape, {&la, &lb, &lo});
  pfor(c, w.numel(), grain, [&](int64_t lo_, int64_t hi_) {
    w.run(lo_, hi_, [&](const int64_t* off, int64_t n, const int64_t* s) {
      if (s[2] == 1) {
        binary_run(a + off[0], s[0], b + off[1], s[1], y + off[2], n, f);
        return;
      }
      const TA* ap = a + off[0];
      const TB* bp = b + off[1];
      TO* yp = y + off[2];
      for (int64_t i = 0; i < n; ++i) yp[i * s[2]] = f(ap[i * s[0]], bp[i * s[1]]);
    });
  });
}

template <class T> void map_where(const Call& c) {
  const bp_layout& lc = c.in_layout(0);
  const bp_layout& la = c.in_layout(1);
  const bp_layout& lb = c.in_layout(2);
  const bp_layout& lo = c.out_layout();
  const uint8_t* cond = c.in_data<uint8_t>(0);
  const T* a = c.in_data<T>(1);
  const T* b = c.in_data<T>(2);
  T* y = c.out_data<T>();
  const sdk::StridedWalker<4> w(lo.rank, lo.shape, {&lc, &la, &lb, &lo});
  pfor(c, w.numel(), kGrain, [&](int64_t lo_, int64_t hi_) {
    w.run(lo_, hi_, [&](const int64_t* off, int64_t n, const int64_t* s) {
      const uint8_t* cp = cond + off[0];
      const T* ap = a + off[1];
      const T* bp = b + off[2];
      T* yp = y + off[3];
      if (s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1) {
        for (int64_t i = 0; i < n; ++i) yp[i] = cp[i] ? ap[i] : bp[i];
      } else {
        for (int64_t i = 0; i < n; ++i) yp[i * s[3]] = cp[i * s[0]] ? ap[i * s[1]] : bp[i * s[2]];
      }
    });
  });
}

// ---------------------------------------------------------------------------
// Op functors. C is the compute type: float (f32/f16/bf16), double (f64) or
// the integer type itself.

struct NoParams {
  static constexpr bp_params_kind kind = BP_PARAMS_NONE;
  static constexpr int cost = 1;
  explicit NoParams(const bp_op_params*) {}
  void finish(const Call&) const {}
};
// Transcendental ops: fewer elements per thread before splitting.
struct Costly : NoParams {
  using NoParams::NoParams;
  static constexpr int cost = 8;
};

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
    // 0.5x(1 + erf(x/sqrt2)) == 0.5x * erfc(-x/sqrt2), accurate for x << 0.
    return C(0.5) * x * std::erfc(-x * C(0.7071067811865476));
  }
};

struct Clamp : NoParams {
  static constexpr bp_params_kind kind = BP_PARAMS_CLAMP;
  bp_clamp_params p;
  explicit Clamp(const bp_op_params* q) : NoParams(q), p(q->u.clamp) {}
  template <class C> C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) {
      int64_t v = x;
      if (p.has_min && v < p.min_i) v = p.min_i;
      if (p.has_max && v > p.max_i) v = p.max_i;
      return static_cast<C>(v);
    } else {
      if (x != x) return x;
      if (p.has_min && x < C(p.min_f)) x = C(p.min_f);
      if (p.has_max && x > C(p.max_f)) x = C(p.max_f);
      return x;
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

// Binary ------------------------------------------------------------------

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

struct Eq : NoParams { using NoParams::NoParams; template <class C> bool operator()(C a, C b) const { return a == b; } };
struct Ne : NoParams { using NoParams::NoParams; template <class C> bool operator()(C a, C b) const { return a != b; } };
struct Lt : NoParams { using NoParams::NoParams; template <class C> bool operator()(C a, C b) const { return a < b; } };
struct Le : NoParams { using NoParams::NoParams; template <class C> bool operator()(C a, C b) const { return a <= b; } };
struct Gt : NoParams { using NoParams::NoParams; template <class C> bool operator()(C a, C b) const { return a > b; } };
struct Ge : NoParams { using NoParams::NoParams; template <class C> bool operator()(C a, C b) const { return a >= b; } };

// ---------------------------------------------------------------------------
// Kernel classes

template <class Op> struct UnaryK {
  template <bp_dtype D> struct K {
    static void impl(const Call& c) {
      c.expect(1, Op::kind);
      using T = st_t<D>;
      const Op op(c.params);
      map1<T, T>(c, [&](T v) { return st<T>(op(ld(v))); }, kGrain / Op::cost);
      op.finish(c);
    }
  };
};

template <class Op> struct BinaryK {
  template <bp_dtype D> struct K {
    static void impl(const Call& c) {
      c.expect(2, Op::kind);
      using T = st_t<D>;
      const Op op(c.params);
      map2<T, T, T>(c, [&](T a, T b) { return st<T>(op(ld(a), ld(b))); }, kGrain / Op::cost);
      op.finish(c);
    }
  };
};

template <class Op> struct CompareK {
  template <bp_dtype D> struct K {
    static void impl(const Call& c) {
      c.expect(2, BP_PARAMS_NONE);
      using T = st_t<D>;
      const Op op(c.params);
      map2<T, T, uint8_t>(c, [&](T a, T b) { return static_cast<uint8_t>(op(ld(a), ld(b))); }, kGrain);
    }
  };
};

template <bp_dtype D> struct WhereK {
  static void impl(const Call& c) {
    c.expect(3, BP_PARAMS_NONE);
    map_where<st_t<D>>(c);
  }
};

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
      sdk::check(c.params->u.cast.dtype == DO, BP_ERR_INVALID_ARGUMENT,
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
  const auto k21 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, d}; };
  const auto kcmp = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, BP_DTYPE_BOOL}; };
  const auto kwhere = [](bp_dtype d) { return std::vector<bp_dtype>{BP_DTYPE_BOOL, d, d, d}; };
  const std::vector<uint8_t> s1{kStrided}, s2{kStrided, kStrided}, s3{kStrided, kStrided, kStrided};

  add_rows<ContiguousK, BP_CPU_ALL_DTYPES>(t, "contiguous", k11, s1);
  add_casts<BP_CPU_ALL_DTYPES>(t);

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

  add_rows<BinaryK<Add>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "add", k21, s2);
  add_rows<BinaryK<Sub>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "sub", k21, s2);
  add_rows<BinaryK<Mul>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "mul", k21, s2);
  add_rows<BinaryK<Div>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "div", k21, s2);
  add_rows<BinaryK<Maximum>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "maximum", k21, s2);
  add_rows<BinaryK<Minimum>::K, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "minimum", k21, s2);
  add_rows<BinaryK<Pow>::K, BP_CPU_FLOAT_DTYPES>(t, "pow", k21, s2);

  add_rows<CompareK<Eq>::K, BP_CPU_ALL_DTYPES>(t, "eq", kcmp, s2);
  add_rows<CompareK<Ne>::K, BP_CPU_ALL_DTYPES>(t, "ne", kcmp, s2);
  add_rows<CompareK<Lt>::K, BP_CPU_ALL_DTYPES>(t, "lt", kcmp, s2);
  add_rows<CompareK<Le>::K, BP_CPU_ALL_DTYPES>(t, "le", kcmp, s2);
  add_rows<CompareK<Gt>::K, BP_CPU_ALL_DTYPES>(t, "gt", kcmp, s2);
  add_rows<CompareK<Ge>::K, BP_CPU_ALL_DTYPES>(t, "ge", kcmp, s2);
  add_rows<WhereK, BP_CPU_ALL_DTYPES>(t, "where", kwhere, s3);
}

}  // namespace backplane::cpu
