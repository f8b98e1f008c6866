// The plugin's packed GEMM, shared by matmul (linalg.cpp) and conv2d
// (conv.cpp): header-only templates, instantiated in each.
//
// The GEMM follows the BLIS layout: B is packed into KC x NR micro-panels,
// A into MR x KC micro-panels, and an MR x NR register tile accumulates
// kc rank-1 updates. Packing reads any strides (so matmul takes strided and
// transposed operands directly) and converts f16/bf16 to f32. The
// micro-kernel is written once with GCC vector extensions and instantiated
// inside functions compiled for avx512f, avx2+fma and baseline x86-64; the
// ISA chosen at initialize picks one.
#pragma once

#include "kernels.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace backplane::cpu {
namespace {

template <class P, int W> struct Vec {
  typedef P type __attribute__((vector_size(W * sizeof(P))));
};

// One MR x NR tile: c (row stride ldc) = or += a_panel * b_panel.
template <class P, int W, int MR, int NV>
[[gnu::always_inline]] inline void micro_tile(int64_t kc, const P* __restrict a, const P* __restrict b, P* c, int64_t ldc,
                                              bool overwrite, int64_t mr, int64_t nr) {
  using V = typename Vec<P, W>::type;
  constexpr int NR = W * NV;
  V acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] = V{};
  // The C tile is read (or written) only after kc steps: fetch it now so
  // the misses overlap the arithmetic instead of stalling at the end.
  for (int64_t i = 0; i < mr; ++i) {
    __builtin_prefetch(c + i * ldc, 1, 3);
    __builtin_prefetch(c + i * ldc + NR - 1, 1, 3);
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    V bv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) std::memcpy(&bv[j], b + k * NR + j * W, sizeof(V));
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      const V av = a[k * MR + i] - V{};  // broadcast (x - 0 == x, folds away)
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[i][j] += av * bv[j];
    }
  }
  if (mr == MR && nr == NR) {
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) {
        P* cp = c + i * ldc + j * W;
        if (!overwrite) {
          V cur;
          std::memcpy(&cur, cp, sizeof(V));
          acc[i][j] += cur;
        }
        std::memcpy(cp, &acc[i][j], sizeof(V));
      }
    return;
  }
  alignas(64) P tmp[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) std::memcpy(&tmp[i][j * W], &acc[i][j], sizeof(V));
  for (int64_t i = 0; i < mr; ++i)
    for (int64_t j = 0; j < nr; ++j) c[i * ldc + j] = overwrite ? tmp[i][j] : c[i * ldc + j] + tmp[i][j];
}

template <class P, int W, int MR, int NV>
[[gnu::always_inline]] inline void macro_tile(int64_t mc, int64_t nc, int64_t kc, const P* ap, const P* bp, P* c, int64_t ldc,
                                              bool overwrite) {
  constexpr int64_t NR = W * NV;
  for (int64_t jr = 0; jr < nc; jr += NR)
    for (int64_t ir = 0; ir < mc; ir += MR)
      micro_tile<P, W, MR, NV>(kc, ap + ir * kc, bp + jr * kc, c + ir * ldc + jr, ldc, overwrite, std::min<int64_t>(MR, mc - ir),
                               std::min<int64_t>(NR, nc - jr));
}

template <class P> using MacroFn = void (*)(int64_t, int64_t, int64_t, const P*, const P*, P*, int64_t, bool);

// [[maybe_unused]]: a file that multiplies only f32 (quant.cpp) leaves the
// f64 ones unused.
#define BP_CPU_MACRO(NAME, TARGET, P, W, MR, NV)                                                          \
  [[maybe_unused]] TARGET void NAME(int64_t mc, int64_t nc, int64_t kc, const P* ap, const P* bp, P* c, int64_t ldc, bool ow) { \
    macro_tile<P, W, MR, NV>(mc, nc, kc, ap, bp, c, ldc, ow);                                            \
  }
#if defined(__x86_64__)
#define BP_CPU_AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma")))
#define BP_CPU_AVX2 __attribute__((target("avx2,fma")))
BP_CPU_MACRO(macro_f32_avx512, BP_CPU_AVX512, float, 16, 12, 2)
BP_CPU_MACRO(macro_f64_avx512, BP_CPU_AVX512, double, 8, 12, 2)
BP_CPU_MACRO(macro_f32_avx2, BP_CPU_AVX2, float, 8, 6, 2)
BP_CPU_MACRO(macro_f64_avx2, BP_CPU_AVX2, double, 4, 6, 2)
#endif
BP_CPU_MACRO(macro_f32_base, , float, 4, 4, 2)
BP_CPU_MACRO(macro_f64_base, , double, 2, 4, 2)
#undef BP_CPU_MACRO

template <class P> struct GemmKernel {
  int64_t mr, nr;
  MacroFn<P> macro;
};

template <class P> GemmKernel<P> pick_kernel() {
  constexpr bool f = std::is_same_v<P, float>;
#if defined(__x86_64__)
  switch (isa()) {
    case Isa::avx512:
      if constexpr (f) return {12, 32, macro_f32_avx512};
      else return {12, 16, macro_f64_avx512};
    case Isa::avx2:
      if constexpr (f) return {6, 16, macro_f32_avx2};
      else return {6, 8, macro_f64_avx2};
    default:
      break;
  }
#endif
  if constexpr (f) return {4, 8, macro_f32_base};
  else return {4, 4, macro_f64_base};
}

template <class P> struct AlignedBuffer {
  struct Free {
    void operator()(P* p) const { std::free(p); }
  };
  std::unique_ptr<P, Free> p;
  explicit AlignedBuffer(int64_t n) {
    void* raw = nullptr;
    const size_t bytes = (static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(P) + 63) / 64 * 64;
    if (posix_memalign(&raw, 64, bytes) != 0 || raw == nullptr) throw std::bad_alloc();
    p.reset(static_cast<P*>(raw));
  }
  P* get() const { return p.get(); }
};

template <class S, class P> inline P to_p(S v) { return static_cast<P>(ld(v)); }

// f16 <-> f32 runs with F16C (every AVX2 processor has it) instead of the
// portable bit manipulation, which cost as much as the GEMM's arithmetic.
#if defined(__x86_64__)
[[maybe_unused]] __attribute__((target("avx2,f16c"))) void f16_run_f16c(const f16* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = ld(s[i]);
}
[[maybe_unused]] __attribute__((target("avx2,f16c"))) void f16_store_f16c(const float* s, f16* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) d[i] = st<f16>(s[i]);
}
#endif

bool use_f16c() {
#if defined(__x86_64__)
  return isa() >= Isa::avx2;  // the ISA choice implies F16C (AVX2 processors all have it)
#else
  return false;
#endif
}

// d[0..n) = src[0..n) converted to P.
template <class S, class P> inline void convert_run(const S* src, P* d, int64_t n) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<S, f16> && std::is_same_v<P, float>) {
    if (use_f16c()) {
      f16_run_f16c(src, d, n);
      return;
    }
  }
#endif
  for (int64_t j = 0; j < n; ++j) d[j] = to_p<S, P>(src[j]);
}

// MR-row panels of A[m x kc] (zero rows past m).
template <class S, class P>
void pack_a_panel(const S* a, int64_t rsa, int64_t csa, int64_t rows, int64_t kc, int64_t mr, P* dst) {
  if (csa == 1) {
    for (int64_t r = 0; r < mr; ++r) {
      if (r < rows) {
        const S* src = a + r * rsa;
        if constexpr (std::is_same_v<S, f16>) {
          P run[256];
          for (int64_t k0 = 0; k0 < kc; k0 += 256) {
            const int64_t m = std::min<int64_t>(256, kc - k0);
            convert_run<S, P>(src + k0, run, m);
            for (int64_t k = 0; k < m; ++k) dst[(k0 + k) * mr + r] = run[k];
          }
          continue;
        }
        for (int64_t k = 0; k < kc; ++k) dst[k * mr + r] = to_p<S, P>(src[k]);
      } else {
        for (int64_t k = 0; k < kc; ++k) dst[k * mr + r] = P(0);
      }
    }
    return;
  }
  for (int64_t k = 0; k < kc; ++k)
    for (int64_t r = 0; r < mr; ++r) dst[k * mr + r] = r < rows ? to_p<S, P>(a[r * rsa + k * csa]) : P(0);
}

// NR-column panels p0..p1 of B[kc x n] (zero columns past n). Rows of a
// row-major B are read whole, in order, across the panels: reading one
// panel at a time would touch one cache line per row, a page apart.
template <class S, class P>
void pack_b_panels(const S* b, int64_t rsb, int64_t csb, int64_t n, int64_t kc, int64_t nr, int64_t p0, int64_t p1, P* bp) {
  if (csb == 1) {
    for (int64_t k = 0; k < kc; ++k) {
      const S* src = b + k * rsb;
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t cols = std::min(nr, n - p * nr);
        P* dst = bp + p * nr * kc + k * nr;
        const S* s = src + p * nr;
        if (cols == nr) {
          convert_run<S, P>(s, dst, nr);
        } else {
          for (int64_t j = 0; j < nr; ++j) dst[j] = j < cols ? to_p<S, P>(s[j]) : P(0);
        }
      }
    }
    return;
  }
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t cols = std::min(nr, n - p * nr);
    P* dst = bp + p * nr * kc;
    for (int64_t j = 0; j < nr; ++j) {
      if (j >= cols) {
        for (int64_t k = 0; k < kc; ++k) dst[k * nr + j] = P(0);
        continue;
      }
      const S* src = b + (p * nr + j) * csb;
      for (int64_t k = 0; k < kc; ++k) dst[k * nr + j] = to_p<S, P>(src[k * rsb]);
    }
  }
}

// Operand sources: each packs its panels for the GEMM below.
template <class S, class P> struct StridedA {
  const S* a;
  int64_t rsa, csa;
  // MR-row panels of rows [i0, i0 + m) x cols [pc, pc + kc), panel p at ap + p * mr * kc.
  void pack(int64_t i0, int64_t m, int64_t pc, int64_t kc, int64_t mr, int64_t p0, int64_t p1, P* ap) const {
    for (int64_t p = p0; p < p1; ++p)
      pack_a_panel<S, P>(a + (i0 + p * mr) * rsa + pc * csa, rsa, csa, std::min(mr, m - p * mr), kc, mr, ap + p * mr * kc);
  }
};
template <class S, class P> struct StridedB {
  const S* b;
  int64_t rsb, csb;
  void pack(int64_t pc, int64_t kc, int64_t jc, int64_t nc, int64_t nr, int64_t p0, int64_t p1, P* bp) const {
    pack_b_panels<S, P>(b + pc * rsb + jc * csb, rsb, csb, nc, kc, nr, p0, p1, bp);
  }
};

// C[M x N] (dense rows, ldc) = A[M x K] * B[K x N], any element strides.
template <class S, class P>
void gemm(const Call& c, int64_t M, int64_t N, int64_t K, const S* a, int64_t rsa, int64_t csa, const S* b, int64_t rsb,
          int64_t csb, P* C, int64_t ldc);

template <class P, class ASrc, class BSrc>
void gemm_packed(const Call& c, int64_t M, int64_t N, int64_t K, const ASrc& A, const BSrc& B, P* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, P(0));
    return;
  }
  const GemmKernel<P> kern = pick_kernel<P>();
  const int64_t MR = kern.mr, NR = kern.nr;
  constexpr int64_t KC = 256;
  const int64_t MC = MR * (std::is_same_v<P, float> ? 24 : 12);
  const int64_t NC = NR * (4096 / NR);
  const int64_t MCHUNK = MC * 16;
  auto round_up = [](int64_t v, int64_t m) { return (v + m - 1) / m * m; };
  const int64_t nc_max = round_up(std::min(N, NC), NR), mch_max = round_up(std::min(M, MCHUNK), MR);
  const AlignedBuffer<P> bbuf(nc_max * KC), abuf(mch_max * KC);
  P* bp = bbuf.get();
  P* ap = abuf.get();
  const int64_t threads = num_threads(c);
  // Small products stay on one thread.
  const bool serial = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) < 1.5e5 || threads == 1;
  const int64_t big = std::numeric_limits<int64_t>::max() / 4;

  for (int64_t jc = 0; jc < N; jc += NC) {
    const int64_t nc = std::min(NC, N - jc);
    const int64_t nb = (nc + NR - 1) / NR;
    for (int64_t pc = 0; pc < K; pc += KC) {
      const int64_t kc = std::min(KC, K - pc);
      pfor(c, nb, serial ? big : std::max<int64_t>(1, 8192 / (kc * NR)),
           [&](int64_t b0, int64_t b1) { B.pack(pc, kc, jc, nc, NR, b0, b1, bp); });
      for (int64_t ic0 = 0; ic0 < M; ic0 += MCHUNK) {
        const int64_t mch = std::min(MCHUNK, M - ic0);
        const int64_t na = (mch + MR - 1) / MR;
        pfor(c, na, serial ? big : std::max<int64_t>(1, 8192 / (kc * MR)),
             [&](int64_t p0, int64_t p1) { A.pack(ic0, mch, pc, kc, MR, p0, p1, ap); });
        const int64_t mb = (mch + MC - 1) / MC;
        const int64_t nsplit = std::clamp<int64_t>((2 * threads + mb - 1) / mb, 1, nb);
        const int64_t ncs = (nb + nsplit - 1) / nsplit * NR;
        pfor(c, mb * nsplit, serial ? big : 1, [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t i0 = (t / nsplit) * MC, j0 = (t % nsplit) * ncs;
            if (j0 >= nc) continue;
            kern.macro(std::min(MC, mch - i0), std::min(ncs, nc - j0), kc, ap + i0 * kc, bp + j0 * kc,
                       C + (ic0 + i0) * ldc + jc + j0, ldc, pc == 0);
          }
        });
      }
    }
  }
}

template <class S, class P>
void gemm(const Call& c, int64_t M, int64_t N, int64_t K, const S* a, int64_t rsa, int64_t csa, const S* b, int64_t rsb,
          int64_t csb, P* C, int64_t ldc) {
  gemm_packed<P>(c, M, N, K, StridedA<S, P>{a, rsa, csa}, StridedB<S, P>{b, rsb, csb}, C, ldc);
}

template <class T> using gemm_p_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

}  // namespace
}  // namespace backplane::cpu
