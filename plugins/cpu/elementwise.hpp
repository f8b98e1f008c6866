// Shared by the elementwise kernel files (elementwise.cpp: contiguous and
// cast; unary.cpp; binary.cpp: arithmetic; compare.cpp: comparisons and
// where): the strided walks, the op functor bases and the kernel classes.
// Split over files so the hundreds of instantiations build in parallel.
//
// The host hands every input with the output's shape (broadcast dims have
// stride 0) and the output dense, so every kernel is "walk N layouts in step".
// sdk::StridedWalker coalesces dims and gives inner runs; each map* helper
// has a unit-stride loop the compiler vectorises plus a general strided one.
#pragma once

#include "kernels.hpp"
#include "rowops.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

namespace backplane::cpu {

void register_unary(sdk::KernelTable& t);
void register_binary(sdk::KernelTable& t);
void register_compare(sdk::KernelTable& t);

namespace eltwise {

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
// buf[(i - i0) * kBL + (j - j0)], in stripes of 32 input rows (j): each
// row's run of up to kBT elements along the input's unit-stride dim i is
// first copied whole into `stage` (a unit-stride loop: the hardware
// prefetcher follows it, and each line is used once, at once), then the
// stripe is transposed from there in 32x32 sub-tiles. Reading the runs
// directly sub-tile by sub-tile left every load waiting on memory: the
// rows are a power of two apart, so the lines of a stripe share a few
// cache sets and were evicted before their neighbours were used.
// `stage` holds kSub * kBT elements.
template <class T>
void gather_block(const T* p, int64_t st, int64_t sl, int64_t i0, int64_t i1, int64_t j0, int64_t j1, T* buf, T* stage) {
  const int64_t ni = i1 - i0;
  for (int64_t jj = j0; jj < j1; jj += kSub) {
    const int64_t je = std::min(j1, jj + kSub);
    for (int64_t j = jj; j < je; ++j) {
      const T* src = p + j * sl + i0 * st;
      T* dst = stage + (j - jj) * kBT;
      if (st == 1) {
        std::memcpy(dst, src, static_cast<size_t>(ni) * sizeof(T));
      } else {
        for (int64_t i = 0; i < ni; ++i) dst[i] = src[i * st];
      }
    }
    for (int64_t ii = 0; ii < ni; ii += kSub) {
      const int64_t ie = std::min(ni, ii + kSub);
      int64_t j = jj;
#if defined(__SSE2__)
      if constexpr (sizeof(T) == 4) {  // 4x4 register transposes: a quarter of the stores
        for (; j + 4 <= je; j += 4) {
          const T* r = stage + (j - jj) * kBT;
          T* col = buf + (j - j0);
          int64_t i = ii;
          for (; i + 4 <= ie; i += 4) {
            __m128 a = _mm_loadu_ps(reinterpret_cast<const float*>(r + i));
            __m128 b = _mm_loadu_ps(reinterpret_cast<const float*>(r + kBT + i));
            __m128 c2 = _mm_loadu_ps(reinterpret_cast<const float*>(r + 2 * kBT + i));
            __m128 d = _mm_loadu_ps(reinterpret_cast<const float*>(r + 3 * kBT + i));
            _MM_TRANSPOSE4_PS(a, b, c2, d);
            _mm_storeu_ps(reinterpret_cast<float*>(col + i * kBL), a);
            _mm_storeu_ps(reinterpret_cast<float*>(col + (i + 1) * kBL), b);
            _mm_storeu_ps(reinterpret_cast<float*>(col + (i + 2) * kBL), c2);
            _mm_storeu_ps(reinterpret_cast<float*>(col + (i + 3) * kBL), d);
          }
          for (; i < ie; ++i)
            for (int64_t k = 0; k < 4; ++k) col[i * kBL + k] = r[k * kBT + i];
        }
      }
#endif
      for (; j < je; ++j) {
        const T* row = stage + (j - jj) * kBT;
        T* col = buf + (j - j0);
        for (int64_t i = ii; i < ie; ++i) col[i * kBL] = row[i];
      }
    }
  }
}

// Outputs of kStreamBytes or more are written with non-temporal stores:
// they do not fit in the cache anyway, and a normal store first reads every
// line it writes (a quarter of the traffic of a binary op). Each run is
// computed in kChunk pieces into an L1 buffer, then streamed out.
constexpr int64_t kStreamBytes = int64_t{8} << 20, kChunk = 512;

template <class TO> inline bool streams(const bp_layout& lo) {
  return sdk::numel(lo) * static_cast<int64_t>(sizeof(TO)) >= kStreamBytes;
}

// dst[0..n) = src[0..n), 16-byte non-temporal stores where dst is aligned.
template <class T> inline void stream_store(T* dst, const T* src, int64_t n) {
  char* d = reinterpret_cast<char*>(dst);
  const char* s = reinterpret_cast<const char*>(src);
  size_t bytes = static_cast<size_t>(n) * sizeof(T);
#if defined(__SSE2__)
  const size_t head = std::min(bytes, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  for (; bytes >= 16; bytes -= 16, d += 16, s += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
#endif
  std::memcpy(d, s, bytes);
}

// fill(dst, k, m) writes the run's elements k..k+m-1 to dst[0..m).
template <class TO, class Fill> inline void write_run(TO* y, int64_t n, bool stream, Fill&& fill) {
  if (!stream) {
    fill(y, int64_t{0}, n);
    return;
  }
  alignas(64) TO tmp[kChunk];
  for (int64_t k = 0; k < n; k += kChunk) {
    const int64_t m = std::min(kChunk, n - k);
    fill(tmp, k, m);
    stream_store(y + k, tmp, m);
  }
}

template <class TI, class TO, class F> void map1(const Call& c, F f, int64_t grain) {
  const bp_layout& li = c.in_layout(0);
  const bp_layout& lo = c.out_layout();
  const TI* x = c.in_data<TI>(0);
  TO* y = c.out_data<TO>();
  const bool stream = streams<TO>(lo);
  if (const Tiling tl = plan_tiling<2>({&li, &lo}); tl.t >= 0) {
    const int64_t xt = li.strides[tl.t], xl = li.strides[tl.l], yt = lo.strides[tl.t];
    for_blocks<2>(c, {&li, &lo}, tl, [] { return std::vector<TI>(kBT * kBL + kSub * kBT); },
                  [&](std::vector<TI>& buf, const int64_t* base, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
                    gather_block(x + base[0], xt, xl, i0, i1, j0, j1, buf.data(), buf.data() + kBT * kBL);
                    for (int64_t i = i0; i < i1; ++i) {
                      const TI* br = buf.data() + (i - i0) * kBL;
                      write_run(y + base[1] + i * yt + j0, j1 - j0, stream, [&](TO* __restrict d, int64_t k, int64_t m) {
                        const TI* __restrict bk = br + k;
                        for (int64_t j = 0; j < m; ++j) d[j] = f(bk[j]);
                      });
                    }
                    if (stream) rows::fence();
                  });
    return;
  }
  const sdk::StridedWalker<2> w(lo.rank, lo.shape, {&li, &lo});
  pfor(c, w.numel(), grain, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const int64_t* off, int64_t n, const int64_t* s) {
      const TI* xp = x + off[0];
      TO* yp = y + off[1];
      if (s[1] != 1) {
        for (int64_t i = 0; i < n; ++i) yp[i * s[1]] = f(xp[i * s[0]]);
        return;
      }
      write_run(yp, n, stream, [&](TO* __restrict d, int64_t k, int64_t m) {
        const TI* __restrict xk = xp + k * s[0];
        if (s[0] == 1) {
          for (int64_t i = 0; i < m; ++i) d[i] = f(xk[i]);
        } else if (s[0] == 0) {
          const TO v = f(*xk);
          for (int64_t i = 0; i < m; ++i) d[i] = v;
        } else {
          for (int64_t i = 0; i < m; ++i) d[i] = f(xk[i * s[0]]);
        }
      });
    });
    if (stream) rows::fence();
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
  const bool stream = streams<TO>(lo);
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
        [&] {
          return Scratch{std::vector<TA>(ga ? kBT * kBL + kSub * kBT : 0), std::vector<TB>(gb ? kBT * kBL + kSub * kBT : 0)};
        },
        [&](Scratch& sc, const int64_t* base, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
          if (ga) gather_block(a + base[0], at, al, i0, i1, j0, j1, sc.a.data(), sc.a.data() + kBT * kBL);
          if (gb) gather_block(b + base[1], bt, bl, i0, i1, j0, j1, sc.b.data(), sc.b.data() + kBT * kBL);
          const int64_t as = ga ? 1 : al, bs = gb ? 1 : bl;
          for (int64_t i = i0; i < i1; ++i) {
            const TA* ar = ga ? sc.a.data() + (i - i0) * kBL : a + base[0] + i * at + j0 * al;
            const TB* br = gb ? sc.b.data() + (i - i0) * kBL : b + base[1] + i * bt + j0 * bl;
            write_run(y + base[2] + i * yt + j0, j1 - j0, stream,
                      [&](TO* d, int64_t k, int64_t m) { binary_run(ar + k * as, as, br + k * bs, bs, d, m, f); });
          }
          if (stream) rows::fence();
        });
    return;
  }
  const sdk::StridedWalker<3> w(lo.rank, lo.shape, {&la, &lb, &lo});
  pfor(c, w.numel(), grain, [&](int64_t lo_, int64_t hi_) {
    w.run(lo_, hi_, [&](const int64_t* off, int64_t n, const int64_t* s) {
      if (s[2] == 1) {
        write_run(y + off[2], n, stream, [&](TO* d, int64_t k, int64_t m) {
          binary_run(a + off[0] + k * s[0], s[0], b + off[1] + k * s[1], s[1], d, m, f);
        });
        return;
      }
      const TA* ap = a + off[0];
      const TB* bp = b + off[1];
      TO* yp = y + off[2];
      for (int64_t i = 0; i < n; ++i) yp[i * s[2]] = f(ap[i * s[0]], bp[i * s[1]]);
    });
    if (stream) rows::fence();
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
  // An op may also offer a vector path for dense f32 runs:
  //   bool block_f32_applies() const;  // the ISA, its params
  //   void block_f32(const float* x, float* y, int64_t n) const;
  // UnaryK takes it where it applies, else the element functor.
};
// Transcendental ops: fewer elements per thread before splitting.
struct Costly : NoParams {
  using NoParams::NoParams;
  static constexpr int cost = 8;
};

// ---------------------------------------------------------------------------
// Kernel classes

template <class Op> struct UnaryK {
  template <bp_dtype D> struct K {
    static void impl(const Call& c) {
      c.expect(1, Op::kind);
      using T = st_t<D>;
      const Op op(c.params);
      if constexpr (D == BP_DTYPE_F32 && requires(const float* x, float* y) { op.block_f32(x, y, int64_t{}); op.block_f32_applies(); }) {
        const bp_layout& li = c.in_layout(0);
        const bp_layout& lo = c.out_layout();
        if (sdk::is_contiguous(li) && sdk::is_contiguous(lo) && op.block_f32_applies()) {
          const float* x = c.in_data<float>(0);
          float* y = c.out_data<float>();
          pfor(c, sdk::numel(lo), kGrain / Op::cost, [&](int64_t b, int64_t e) { op.block_f32(x + b, y + b, e - b); });
          op.finish(c);
          return;
        }
      }
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

}  // namespace eltwise
}  // namespace backplane::cpu
