// matmul (float dtypes, as docs/ops.md says) on the plugin's packed GEMM
// (gemm.hpp), or oneDNN where it is faster (onednn.cpp).
#include "gemm.hpp"
#include "kernels.hpp"
#include "onednn.hpp"
#include "packed.hpp"
#include "rowops.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace backplane::cpu {
namespace {

// y[N] = a[K] x b[K, N] in f32 for one row of a (a classifier's last layer
// at batch 1, a decoder's step): a stream over b that neither the packed
// GEMM nor oneDNN's matmul runs at memory speed (they pack or split for
// panels of rows; ResNet-18's 512x1000 layer took ~250 us for 2 MB).
// b's columns contiguous (rsb == 1, the exporters' x @ W.T): dot products
// of a with four columns at a time; b's rows contiguous (csb == 1): y grows
// by a[k] * row k over a block of columns. Sums in f32 in a fixed order per
// element (docs/ops.md's reduction bound).
// b in f32, or in bf16 (widened 16 at a time in registers: a bf16 weight
// is read at half the bytes and never converted whole); a and y in f32.
template <class B> struct GemvT {
  const float* a;
  int64_t sa;  // a's element stride
  const B* b;
  int64_t rsb, csb, K;
  float* y;
  // bf16 dots: a dense, and also split per block of 32 into its even and
  // odd elements (16 + 16), so that 32 bf16 of b read as 16 pairs give two
  // f32 vectors by a shift and a mask instead of two widening moves.
  const float* a_pairs = nullptr;
};
using Gemv = GemvT<float>;
typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
[[gnu::always_inline]] inline v16f load16(const float* p) {
  v16f v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline v16f load16(const bf16* p) {
  v16h h;
  __builtin_memcpy(&h, p, sizeof h);
  const v16u w = __builtin_convertvector(h, v16u) << 16;
  v16f v;
  __builtin_memcpy(&v, &w, sizeof v);
  return v;
}
[[gnu::always_inline]] inline float widen(float x) { return x; }
[[gnu::always_inline]] inline float widen(bf16 x) { return backplane::bf16_to_float(x.bits); }
[[gnu::always_inline]] inline float hsum(v16f v) {
  float s = 0;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}
// Columns [n0, n1) when b's columns are contiguous and a is dense.
[[gnu::always_inline]] inline void bf16_pairs(const bf16* p, v16f& even, v16f& odd) {
  v16u w;
  __builtin_memcpy(&w, p, sizeof w);
  const v16u lo = w << 16, hi = w & 0xFFFF0000u;
  __builtin_memcpy(&even, &lo, sizeof even);
  __builtin_memcpy(&odd, &hi, sizeof odd);
}
[[gnu::always_inline]] inline void gemv_dots_bf16(const GemvT<bf16>& g, int64_t n0, int64_t n1) {
  const int64_t K = g.K, K32 = K / 32 * 32;
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t m = std::min<int64_t>(4, n1 - n);
    const bf16* c[4];
    for (int64_t i = 0; i < 4; ++i) c[i] = g.b + (n + std::min(i, m - 1)) * g.csb;
    v16f s[4] = {};
    for (int64_t k = 0; k < K32; k += 32) {
      const v16f ae = load16(g.a_pairs + k), ao = load16(g.a_pairs + k + 16);
      for (int i = 0; i < 4; ++i) {
        v16f e, o;
        bf16_pairs(c[i] + k, e, o);
        s[i] += ae * e;
        s[i] += ao * o;
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      float t = hsum(s[i]);
      for (int64_t k = K32; k < K; ++k) t += g.a[k] * widen(c[i][k]);
      g.y[n + i] = t;
    }
  }
}
template <class B> [[gnu::always_inline]] inline void gemv_dots(const GemvT<B>& g, int64_t n0, int64_t n1) {
  if constexpr (std::is_same_v<B, bf16>) {
    if (g.a_pairs) return gemv_dots_bf16(g, n0, n1);
  }
  const int64_t K = g.K, K16 = K / 16 * 16;
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const B* c0 = g.b + n * g.csb;
    const B* c1 = c0 + g.csb;
    const B* c2 = c1 + g.csb;
    const B* c3 = c2 + g.csb;
    v16f s0 = {}, s1 = {}, s2 = {}, s3 = {};
    for (int64_t k = 0; k < K16; k += 16) {
      const v16f av = load16(g.a + k);
      s0 += av * load16(c0 + k);
      s1 += av * load16(c1 + k);
      s2 += av * load16(c2 + k);
      s3 += av * load16(c3 + k);
    }
    float t0 = hsum(s0), t1 = hsum(s1), t2 = hsum(s2), t3 = hsum(s3);
    for (int64_t k = K16; k < K; ++k) {
      t0 += g.a[k] * widen(c0[k]);
      t1 += g.a[k] * widen(c1[k]);
      t2 += g.a[k] * widen(c2[k]);
      t3 += g.a[k] * widen(c3[k]);
    }
    g.y[n] = t0;
    g.y[n + 1] = t1;
    g.y[n + 2] = t2;
    g.y[n + 3] = t3;
  }
  for (; n < n1; ++n) {
    const B* c0 = g.b + n * g.csb;
    v16f s0 = {};
    for (int64_t k = 0; k < K16; k += 16) s0 += load16(g.a + k) * load16(c0 + k);
    float t0 = hsum(s0);
    for (int64_t k = K16; k < K; ++k) t0 += g.a[k] * widen(c0[k]);
    g.y[n] = t0;
  }
}
[[gnu::always_inline]] inline void store16(float* p, v16f v) { __builtin_memcpy(p, &v, sizeof v); }
// Columns [n0, n1) when b's rows are contiguous (any a stride). A panel of
// y (at most 2 KiB, in L1) takes four rows of b per pass, each read as one
// contiguous run: a narrow panel would touch a new page for every row of b
// (rows of a 1000-wide b are 4000 bytes apart) and stall on the TLB.
template <class B> [[gnu::always_inline]] inline void gemv_rows(const GemvT<B>& g, int64_t n0, int64_t n1) {
  constexpr int64_t kPanel = 512;
  for (int64_t p0 = n0; p0 < n1; p0 += kPanel) {
    const int64_t w = std::min(kPanel, n1 - p0), w16 = w / 16 * 16;
    float* __restrict y = g.y + p0;
    for (int64_t j = 0; j < w; ++j) y[j] = 0.0f;
    int64_t k = 0;
    for (; k + 4 <= g.K; k += 4) {
      const float a0 = g.a[k * g.sa], a1 = g.a[(k + 1) * g.sa], a2 = g.a[(k + 2) * g.sa], a3 = g.a[(k + 3) * g.sa];
      const B* __restrict r0 = g.b + k * g.rsb + p0;
      const B* __restrict r1 = r0 + g.rsb;
      const B* __restrict r2 = r1 + g.rsb;
      const B* __restrict r3 = r2 + g.rsb;
      // The same order per element as one row at a time: y + a0 r0, then + a1 r1, ...
      for (int64_t j = 0; j < w16; j += 16) {
        v16f v = load16(y + j);
        v += a0 * load16(r0 + j);
        v += a1 * load16(r1 + j);
        v += a2 * load16(r2 + j);
        v += a3 * load16(r3 + j);
        store16(y + j, v);
      }
      for (int64_t j = w16; j < w; ++j) {
        float v = y[j];
        v += a0 * widen(r0[j]);
        v += a1 * widen(r1[j]);
        v += a2 * widen(r2[j]);
        v += a3 * widen(r3[j]);
        y[j] = v;
      }
    }
    for (; k < g.K; ++k) {
      const float av = g.a[k * g.sa];
      const B* __restrict r = g.b + k * g.rsb + p0;
      for (int64_t j = 0; j < w; ++j) y[j] += av * widen(r[j]);
    }
  }
}
template <bool Dots, class B> void gemv_base(const GemvT<B>& g, int64_t n0, int64_t n1) {
  if constexpr (Dots) gemv_dots(g, n0, n1);
  else gemv_rows(g, n0, n1);
}
#if defined(__x86_64__)
template <bool Dots, class B> BP_CPU_AVX512 void gemv_avx512(const GemvT<B>& g, int64_t n0, int64_t n1) {
  if constexpr (Dots) gemv_dots(g, n0, n1);
  else gemv_rows(g, n0, n1);
}
template <bool Dots, class B> BP_CPU_AVX2 void gemv_avx2(const GemvT<B>& g, int64_t n0, int64_t n1) {
  if constexpr (Dots) gemv_dots(g, n0, n1);
  else gemv_rows(g, n0, n1);
}
#endif

// A constant b with contiguous rows (a MatMul exported with its weight
// already [K, N], ShuffleNet's classifier) read as the dot form from a
// transposed copy made at the first run and kept with the weight
// (packed.hpp): the row form reads b at ~60% of the dot form's speed. Only
// up to 16 MiB of weight, so a large model's memory does not double.
const float* transposed_constant(const Call& c, const Gemv& g, int64_t N) {
  if (!(g.csb == 1 && g.sa == 1 && packed::constant(c, 1))) return nullptr;
  if (g.K * N > (int64_t{4} << 20) || g.K * N < (int64_t{1} << 16)) return nullptr;
  const int64_t off = g.b - c.in_data<float>(1);
  const std::string key = "gemv_t:" + std::to_string(off) + ":" + std::to_string(g.K) + ":" + std::to_string(N) + ":" +
                          std::to_string(g.rsb);
  auto kept = packed::get<std::vector<float>>(c, 1, key, [&] {
    auto t = std::make_shared<std::vector<float>>(static_cast<size_t>(g.K * N));
    for (int64_t k = 0; k < g.K; ++k)
      for (int64_t n = 0; n < N; ++n) (*t)[static_cast<size_t>(n * g.K + k)] = g.b[k * g.rsb + n];
    return t;
  });
  return kept->data();
}

template <class B> using GemvFnT = void (*)(const GemvT<B>&, int64_t, int64_t);
using GemvFn = GemvFnT<float>;
template <class B = float> GemvFnT<B> gemv_fn(bool dots) {
#if defined(__x86_64__)
  if (isa() >= Isa::avx512) return dots ? &gemv_avx512<true, B> : &gemv_avx512<false, B>;
  if (isa() >= Isa::avx2) return dots ? &gemv_avx2<true, B> : &gemv_avx2<false, B>;
#endif
  return dots ? &gemv_base<true, B> : &gemv_base<false, B>;
}

// One row of a per batch, each batch its own b: attention over a cache at
// one query (scores: [H, 1, d] x [H, d, S]; context: [H, 1, S] x [H, S, d],
// b a strided view of the cache). Each batch is one task's GEMV: oneDNN
// took ~340 us for 16 heads of 64 x 256 with a transposed view of b.
bool gemv_batches_f32(const Call& c, const std::vector<std::array<int64_t, 3>>& offs, const float* a, int64_t sa,
                      const float* b, int64_t rsb, int64_t csb, int64_t K, float* y, int64_t N) {
  const bool dots = rsb == 1 && sa == 1;
  if (!dots && csb != 1) return false;
  const GemvFn fn = gemv_fn(dots);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, K * N));
  pfor(c, static_cast<int64_t>(offs.size()), grain, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) {
      const auto& o = offs[static_cast<size_t>(i)];
      fn(Gemv{a + o[0], sa, b + o[1], rsb, csb, K, y + o[2]}, 0, N);
    }
  });
  return true;
}

// True when taken: one row of f32 a, b's columns or rows contiguous.
template <class B> bool gemv_one(const Call& c, GemvT<B> g, int64_t N) {
  if constexpr (std::is_same_v<B, float>) {
    if (const float* t = transposed_constant(c, g, N)) {
      g.b = t;
      g.rsb = 1;
      g.csb = g.K;
    }
  }
  const bool dots = g.rsb == 1 && g.sa == 1;
  if (!dots && g.csb != 1) return false;
  const GemvFnT<B> fn = gemv_fn<B>(dots);
  // Blocks of 64 columns (whole cache lines of y), at least ~64K
  // multiply-adds per task. The row form reads every row of b in each task,
  // so it takes one wide task per thread rather than several narrow ones.
  const int64_t blocks = (N + 63) / 64;
  int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, g.K * 64));
  if (!dots) grain = std::max<int64_t>(grain, (blocks + num_threads(c) - 1) / num_threads(c));
  pfor(c, blocks, grain, [&](int64_t b0, int64_t b1) {
    fn(g, b0 * 64, std::min(N, b1 * 64));
  });
  return true;
}

template <bp_dtype D> struct MatmulK {
  static void impl(const Call& c) {
    c.expect(2, BP_PARAMS_NONE);
    using T = st_t<D>;
    const bp_layout& la = c.in_layout(0);
    const bp_layout& lb = c.in_layout(1);
    const bp_layout& lo = c.out_layout();
    const uint32_t r = la.rank;
    BP_SDK_CHECK(r >= 2 && lb.rank == r && lo.rank == r, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": operands of rank " + std::to_string(la.rank) + " and " + std::to_string(lb.rank) +
                   ", output rank " + std::to_string(lo.rank) + " (the host promotes to equal rank >= 2)");
    const int64_t M0 = la.shape[r - 2], K = la.shape[r - 1], N = lb.shape[r - 1];
    bool ok = lb.shape[r - 2] == K && lo.shape[r - 2] == M0 && lo.shape[r - 1] == N;
    for (uint32_t i = 0; ok && i + 2 < r; ++i) ok = la.shape[i] == lo.shape[i] && lb.shape[i] == lo.shape[i];
    BP_SDK_CHECK(ok, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": shapes " + dims_str(la) + " x " + dims_str(lb) + " -> " + dims_str(lo) + " do not fit");
    int64_t bshape[BP_MAX_RANK] = {};
    for (uint32_t i = 0; i < r; ++i) bshape[i] = i + 2 < r ? lo.shape[i] : 1;
    const sdk::StridedWalker<3> w(r, bshape, {&la, &lb, &lo});
    if (w.numel() == 0 || M0 == 0 || N == 0) return;
    std::vector<std::array<int64_t, 3>> offs;
    offs.reserve(static_cast<size_t>(w.numel()));
    w.run_all([&](const int64_t* off, int64_t n, const int64_t* s) {
      for (int64_t i = 0; i < n; ++i) offs.push_back({off[0] + i * s[0], off[1] + i * s[1], off[2] + i * s[2]});
    });
    T* y = c.out_data<T>();
    if (K == 0) {  // empty sums; the operands may be NULL
      for (const auto& o : offs) std::fill(y + o[2], y + o[2] + M0 * N, st<T>(comp_t<T>(0)));
      return;
    }
    const T* a = c.in_data<T>(0);
    const T* b = c.in_data<T>(1);
    int64_t rsa = la.strides[r - 2];
    const int64_t csa = la.strides[r - 1], rsb = lb.strides[r - 2], csb = lb.strides[r - 1];
    int64_t M = M0, batches = static_cast<int64_t>(offs.size());
    // One b for every batch (2-D, or its batch dims broadcast) and a's batch
    // dims and rows one run of rows by their strides (x @ W.T of a [B, S, K]
    // activation, [S, 1, K] attention rows): one product [batches * M, K] x
    // [K, N] over the dense, batch-major output, instead of a product per
    // batch that packs all of b again for a few rows.
    if (batches > 1) {
      bool one_b = true;
      for (uint32_t i = 0; i + 2 < r; ++i) one_b = one_b && (lb.shape[i] == 1 || lb.strides[i] == 0);
      int64_t rows = 1, row_stride = rsa;
      for (uint32_t i = r - 1; one_b && i-- > 0;) {  // dims r-2 .. 0, inner to outer
        if (la.shape[i] == 1) continue;
        if (rows == 1) row_stride = la.strides[i];
        else if (la.strides[i] != row_stride * rows) one_b = false;
        rows *= la.shape[i];
      }
      if (one_b) {
        M = rows;
        rsa = row_stride;
        offs.resize(1);
        batches = 1;
      }
    }
    if constexpr (D == BP_DTYPE_F32) {
      if (M == 1 && batches == 1 &&
          gemv_one(c, Gemv{a + offs[0][0], csa, b + offs[0][1], rsb, csb, K, y + offs[0][2]}, N))
        return;
      if (M == 1 && batches > 1 && gemv_batches_f32(c, offs, a, csa, b, rsb, csb, K, y, N)) return;
    }
    // bf16 at one row (a bf16 weight applied to one token): b read as bf16
    // and widened in registers, a widened once, the f32 sums rounded once.
    // oneDNN's AMX/brgemm matmul re-blocks a plain bf16 b per call: 1x1024
    // by 1024x1024 took ~0.4 ms (5 GB/s), half the f32 GEMV's speed.
    if constexpr (D == BP_DTYPE_BF16) {
      if (M == 1 && batches == 1 && (rsb == 1 || csb == 1)) {
        std::vector<float> af(static_cast<size_t>(K)), pairs(static_cast<size_t>(K)), yf(static_cast<size_t>(N));
        for (int64_t k = 0; k < K; ++k) af[static_cast<size_t>(k)] = ld(a[offs[0][0] + k * csa]);
        for (int64_t k = 0; k + 32 <= K; k += 32)
          for (int64_t i = 0; i < 16; ++i) {
            pairs[static_cast<size_t>(k + i)] = af[static_cast<size_t>(k + 2 * i)];
            pairs[static_cast<size_t>(k + 16 + i)] = af[static_cast<size_t>(k + 2 * i + 1)];
          }
        if (gemv_one(c, GemvT<bf16>{af.data(), 1, b + offs[0][1], rsb, csb, K, yf.data(), pairs.data()}, N)) {
          for (int64_t n = 0; n < N; ++n) y[offs[0][2] + n] = st<T>(yf[static_cast<size_t>(n)]);
          return;
        }
      }
    }
    // bf16 (and f32 where it wins) through oneDNN when it takes the layout.
    if (onednn::matmul(c, D, offs, M, N, K, rsa, csa, rsb, csb)) return;
    const double flops = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
    // Many small products: one per thread; else each product uses every thread.
    const int64_t grain = flops < 2e6 ? std::max<int64_t>(1, static_cast<int64_t>(2e6 / std::max(flops, 1.0))) : batches;
    pfor(c, batches, grain, [&](int64_t b0, int64_t b1) {
      std::vector<float> tmp;
      for (int64_t i = b0; i < b1; ++i) {
        const auto& o = offs[static_cast<size_t>(i)];
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          gemm<T, T>(c, M, N, K, a + o[0], rsa, csa, b + o[1], rsb, csb, y + o[2], N);
        } else {
          tmp.resize(static_cast<size_t>(M * N));
          gemm<T, float>(c, M, N, K, a + o[0], rsa, csa, b + o[1], rsb, csb, tmp.data(), N);
#if defined(__x86_64__)
          if constexpr (std::is_same_v<T, f16>) {
            if (use_f16c()) {
              f16_store_f16c(tmp.data(), y + o[2], M * N);
              continue;
            }
          }
#endif
          for (int64_t k = 0; k < M * N; ++k) y[o[2] + k] = st<T>(tmp[static_cast<size_t>(k)]);
        }
      }
    });
  }
};

// cpu.matmul_add(a, b, c) = matmul(a, b) + c, c broadcast to the product's
// shape (a Linear layer's bias: the pattern pass substitutes it for the
// matmul -> add pair an exporter writes), and cpu.matmul_add_gelu, gelu
// (erf form) of that (a transformer's MLP up-projection). The product runs
// as matmul does, its operands given matmul's NumPy semantics here (the
// host promotes only for the standard op); c is then added over the
// product while it is still in cache, and gelu applied, in the same f32
// operations as the separate add and gelu kernels: the same bits, one or
// two nodes and passes over the product fewer.

template <bool Gelu> struct MatmulAddT {
  template <bp_dtype D> struct K {
  static void impl(const Call& c) {
    c.expect(3, BP_PARAMS_NONE);
    const bp_layout &la0 = c.in_layout(0), &lb0 = c.in_layout(1), &lc = c.in_layout(2), &lo0 = c.out_layout();
    BP_SDK_CHECK(la0.rank >= 1 && lb0.rank >= 1, BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": a 0-d operand");
    // a 1-D a is [1, K]; a 1-D b is [K, 1]; the added dims are not in y.
    bp_layout la = la0, lb = lb0;
    if (la0.rank == 1) {
      la.rank = 2;
      la.shape[0] = 1, la.strides[0] = 0;
      la.shape[1] = la0.shape[0], la.strides[1] = la0.strides[0];
    }
    if (lb0.rank == 1) {
      lb.rank = 2;
      lb.shape[0] = lb0.shape[0], lb.strides[0] = lb0.strides[0];
      lb.shape[1] = 1, lb.strides[1] = 0;
    }
    const uint32_t r = std::max(la.rank, lb.rank);
    BP_SDK_CHECK(r <= BP_MAX_RANK, BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": rank over 8");
    const bool keep_n = lb0.rank > 1, keep_m = la0.rank > 1;
    // The product's own shape (matmul's inference): batch dims broadcast,
    // then M and N unless dropped.
    bp_layout lp{};
    for (uint32_t i = 0; i + 2 < r; ++i) {
      const uint32_t pa = r - la.rank, pb = r - lb.rank;
      const int64_t da = i < pa ? 1 : la.shape[i - pa], db = i < pb ? 1 : lb.shape[i - pb];
      lp.shape[lp.rank++] = da == 1 ? db : da;
    }
    if (keep_m) lp.shape[lp.rank++] = la.shape[la.rank - 2];
    if (keep_n) lp.shape[lp.rank++] = lb.shape[lb.rank - 1];
    bool fits = lp.rank == lo0.rank;
    for (uint32_t i = 0; fits && i < lp.rank; ++i) fits = lp.shape[i] == lo0.shape[i];
    // c broadcasts the product up (a [K] x [K] product plus a vector): the
    // product goes to scratch, then y = product + c, both broadcast.
    std::vector<st_t<D>> scratch;
    bp_storage scratch_out = c.out[0];
    if (!fits) {
      int64_t n = 1;
      for (uint32_t i = 0; i < lp.rank; ++i) n *= lp.shape[i];
      for (uint32_t i = lp.rank; i-- > 0;) lp.strides[i] = i + 1 == lp.rank ? 1 : lp.strides[i + 1] * lp.shape[i + 1];
      scratch.assign(static_cast<size_t>(std::max<int64_t>(n, 1)), st_t<D>{});
      scratch_out.data = scratch.data();
      scratch_out.byte_size = scratch.size() * sizeof(st_t<D>);
    }
    const bp_layout& lprod = fits ? lo0 : lp;
    // The output as matmul sees it: rank r, with the dropped dims back as 1.
    bp_layout lo{};
    lo.rank = r;
    lo.offset = lprod.offset;
    {
      uint32_t src = lprod.rank;
      for (uint32_t i = r; i-- > 0;) {
        const bool dropped = (i == r - 1 && !keep_n) || (i == r - 2 && !keep_m);
        if (dropped) {
          lo.shape[i] = 1;
          lo.strides[i] = 0;
        } else {
          BP_SDK_CHECK(src > 0, BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": output rank does not fit the operands");
          --src;
          lo.shape[i] = lprod.shape[src];
          lo.strides[i] = lprod.strides[src];
        }
      }
      BP_SDK_CHECK(src == 0, BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": output rank does not fit the operands");
    }
    // Batch dims: each operand's right-aligned, broadcast (stride 0) to y's.
    auto promote = [&](const bp_layout& l) {
      bp_layout p{};
      p.rank = r;
      p.offset = l.offset;
      const uint32_t pad = r - l.rank;
      for (uint32_t i = 0; i < r; ++i) {
        if (i + 2 >= r) {
          p.shape[i] = l.shape[i - pad];
          p.strides[i] = l.strides[i - pad];
        } else if (i < pad || l.shape[i - pad] == 1) {
          p.shape[i] = lo.shape[i];
          p.strides[i] = 0;
        } else {
          p.shape[i] = l.shape[i - pad];
          p.strides[i] = l.strides[i - pad];
        }
      }
      return p;
    };
    const bp_layout lays[3] = {promote(la), promote(lb), lo};
    Call mm = c;
    mm.n_in = 2;
    mm.lay = lays;
    mm.out = fits ? c.out : &scratch_out;
    mm.op = "matmul";
    MatmulK<D>::impl(mm);
    if (!fits) {
      // y = product + c, each right-aligned and broadcast to y (the
      // separate add's f32 sum), then gelu as below.
      BP_SDK_CHECK(lp.rank <= lo0.rank && lc.rank <= lo0.rank, BP_ERR_INVALID_ARGUMENT,
                   std::string(c.op) + ": operands of a higher rank than the output");
      auto spread = [&](const bp_layout& l) {
        bp_layout b{};
        b.rank = lo0.rank;
        b.offset = l.offset;
        const uint32_t pad = lo0.rank - l.rank;
        for (uint32_t i = 0; i < lo0.rank; ++i) {
          const int64_t n = i < pad ? 1 : l.shape[i - pad];
          BP_SDK_CHECK(n == 1 || n == lo0.shape[i], BP_ERR_INVALID_ARGUMENT,
                       std::string(c.op) + ": " + dims_str(l) + " does not broadcast to " + dims_str(lo0));
          b.shape[i] = lo0.shape[i];
          b.strides[i] = n == 1 ? 0 : l.strides[i - pad];
        }
        return b;
      };
      const bp_layout pb = spread(lp), cb = spread(lc);
      using T = st_t<D>;
      const T* cv = c.in_data<T>(2);
      T* y = c.out_data<T>();
      const sdk::StridedWalker<3> w(lo0.rank, lo0.shape, {&pb, &cb, &lo0});
      w.run_all([&](const int64_t* off, int64_t n, const int64_t* step) {
        for (int64_t i = 0; i < n; ++i) {
          y[off[2] + i * step[2]] =
              st<T>(ld(scratch[static_cast<size_t>(off[0] + i * step[0])]) + ld(cv[off[1] + i * step[1]]));
        }
      });
      if constexpr (Gelu) gelu_pass(c, y, lo0);
      return;
    }
    // y += c over the output as the kernel was given it, c right-aligned
    // and broadcast.
    BP_SDK_CHECK(lc.rank <= lo0.rank, BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": c has a higher rank than the product");
    bp_layout cb{};
    cb.rank = lo0.rank;
    cb.offset = lc.offset;
    for (uint32_t i = 0; i < lo0.rank; ++i) {
      const uint32_t pad = lo0.rank - lc.rank;
      const int64_t n = i < pad ? 1 : lc.shape[i - pad];
      BP_SDK_CHECK(n == 1 || n == lo0.shape[i], BP_ERR_INVALID_ARGUMENT,
                   std::string(c.op) + ": c " + dims_str(lc) + " does not broadcast to " + dims_str(lo0));
      cb.shape[i] = lo0.shape[i];
      cb.strides[i] = n == 1 ? 0 : lc.strides[i - pad];
    }
    using T = st_t<D>;
    const T* cv = c.in_data<T>(2);
    T* y = c.out_data<T>();
    // Dense output with c a dense row of N broadcast over every row (the
    // bias case): rows in parallel, each row's add and gelu in one pass.
    // (A rank-0 output, a [K] x [K] product plus a scalar, has no rows.)
    const uint32_t ro = lo0.rank;
    const int64_t N = ro > 0 ? lo0.shape[ro - 1] : 0;
    bool rowwise = ro > 0 && sdk::is_contiguous(lo0) && N > 0 && (cb.strides[ro - 1] == 1 || lo0.shape[ro - 1] == 1);
    for (uint32_t i = 0; rowwise && i + 1 < ro; ++i) rowwise = cb.strides[i] == 0;
    if (rowwise) {
      const int64_t rows = sdk::numel(lo0) / N;
      T* y0 = y + lo0.offset;
      const T* c0 = cv + cb.offset;
      const bool block = Gelu && D == BP_DTYPE_F32 && rows::enabled();
      pfor(c, rows, std::max<int64_t>(1, 16384 / N), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          T* row = y0 + r * N;
          for (int64_t j = 0; j < N; ++j) row[j] = st<T>(ld(row[j]) + ld(c0[j]));
          if constexpr (Gelu) {
            if (block) {
              rows::gelu_erf(reinterpret_cast<float*>(row), reinterpret_cast<float*>(row), N);
            } else {
              for (int64_t j = 0; j < N; ++j) row[j] = st<T>(gelu_erf_one(ld(row[j])));
            }
          }
        }
      });
      return;
    }
    const sdk::StridedWalker<2> w(lo0.rank, lo0.shape, {&cb, &lo0});
    w.run_all([&](const int64_t* off, int64_t n, const int64_t* step) {
      for (int64_t i = 0; i < n; ++i) {
        T& out = y[off[1] + i * step[1]];
        out = st<T>(ld(out) + ld(cv[off[0] + i * step[0]]));
      }
    });
    if constexpr (Gelu) gelu_pass(c, y, lo0);
  }
  // y = gelu(y) in place, as gelu's own kernel does: the vector form over
  // dense f32.
  static void gelu_pass(const Call& c, st_t<D>* y, const bp_layout& lo0) {
    using T = st_t<D>;
    if (D == BP_DTYPE_F32 && rows::enabled() && sdk::is_contiguous(lo0)) {
      float* y0 = reinterpret_cast<float*>(y + lo0.offset);
      pfor(c, sdk::numel(lo0), 16384, [&](int64_t b, int64_t e) { rows::gelu_erf(y0 + b, y0 + b, e - b); });
      return;
    }
    const sdk::StridedWalker<1> wy(lo0.rank, lo0.shape, {&lo0});
    wy.run_all([&](const int64_t* off, int64_t n, const int64_t* step) {
      for (int64_t i = 0; i < n; ++i) y[off[0] + i * step[0]] = st<T>(gelu_erf_one(ld(y[off[0] + i * step[0]])));
    });
  }
};
};

}  // namespace

void register_linalg(sdk::KernelTable& t) {
  const auto k21 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, d}; };
  const auto k31 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, d, d}; };
  add_rows<MatmulK, BP_CPU_FLOAT_DTYPES>(t, "matmul", k21, {kStrided, kStrided});
  add_rows<MatmulAddT<false>::K, BP_DTYPE_F32>(t, "cpu.matmul_add", k31, {kStrided, kStrided, kStrided});
  add_rows<MatmulAddT<true>::K, BP_DTYPE_F32>(t, "cpu.matmul_add_gelu", k31, {kStrided, kStrided, kStrided});
  register_conv(t);  // conv2d and the fused convolutions right after, as the manifest lists them
}

}  // namespace backplane::cpu
