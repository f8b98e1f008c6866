// Products with block-quantized weights (docs/ops.md, "Quantized weights"):
// cpu.matmul_q8 and cpu.matmul_q4, y[m, n] = Σ_k a[m, k] · w(n, k), where
// row n of the weight is stored in blocks of 32 values, each block with one
// f16 scale s[n, b]:
//   q8: q i8 [N, K], w(n, k) = s[n, k / 32] · q[n, k]
//   q4: q u8 [N, K / 2]; byte j of block b holds the block's element j in
//       its low nibble and element j + 16 in its high one; w = s · (nibble - 8)
// The weights are never dequantized whole: each block is widened in
// registers, multiplied with a's 32 values and the block sum scaled once.
// Token generation reads every weight once per token, so the bytes read per
// weight (1.06 for q8, 0.56 for q4, against 4 for f32) set its speed.
#include "gemm.hpp"
#include "kernels.hpp"

#include <immintrin.h>

// GCC 12 reports its own AVX-512 intrinsics' undefined merge operand as
// maybe-uninitialized once they are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace backplane::cpu {
namespace {

constexpr int64_t kBlock = 32;

struct QuantArgs {
  const float* a;  // [M, K], row stride lda
  int64_t lda;
  const uint8_t* q;  // row n at q + n * ldq bytes
  int64_t ldq;
  const uint16_t* s;  // f16 scales, row n at s + n * lds
  int64_t lds;
  float* y;  // [M, N], row stride ldy
  int64_t ldy;
  int64_t M, N, K;
};

// One weight row's block b widened to 32 floats (before the scale).
template <bool Q4> inline void widen_block(const uint8_t* row, int64_t b, float* out) {
  if constexpr (Q4) {
    const uint8_t* p = row + b * (kBlock / 2);
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<float>(p[j] & 0xF) - 8.0f;
      out[j + 16] = static_cast<float>(p[j] >> 4) - 8.0f;
    }
  } else {
    const int8_t* p = reinterpret_cast<const int8_t*>(row) + b * kBlock;
    for (int j = 0; j < kBlock; ++j) out[j] = static_cast<float>(p[j]);
  }
}

template <bool Q4> void rows_scalar(const QuantArgs& g, int64_t n0, int64_t n1) {
  float w[kBlock];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = g.q + n * g.ldq;
    for (int64_t m = 0; m < g.M; ++m) {
      const float* a = g.a + m * g.lda;
      float acc = 0.0f;
      for (int64_t b = 0; b < g.K / kBlock; ++b) {
        widen_block<Q4>(row, b, w);
        float sum = 0.0f;
        for (int j = 0; j < kBlock; ++j) sum += a[b * kBlock + j] * w[j];
        acc += f16_to_float(g.s[n * g.lds + b]) * sum;
      }
      g.y[m * g.ldy + n] = acc;
    }
  }
}

#define BP_QUANT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))

// widen_block in two 16-lane vectors: elements 0-15 and 16-31.
template <bool Q4> BP_QUANT_AVX512 inline void widen_block_avx512(const uint8_t* row, int64_t b, __m512& lo, __m512& hi) {
  if constexpr (Q4) {
    // A nibble u indexes a table of u - 8: the permute reads only the low 4
    // bits of each lane, so neither a mask nor a conversion is needed.
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * 16)));
    lo = _mm512_permutexvar_ps(v, table);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
  } else {
    const __m128i* p = reinterpret_cast<const __m128i*>(row + b * kBlock);
    lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p)));
    hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p + 1)));
  }
}

// AVX-512: a block is two 16-lane vectors. Four weight rows per pass share
// each load of a's block; every row keeps one vector accumulator, to which
// the block's two products are added scaled by the block's scale.
template <bool Q4> BP_QUANT_AVX512 void rows_avx512(const QuantArgs& g, int64_t n0, int64_t n1) {
  constexpr int R = 4;
  const int64_t blocks = g.K / kBlock;
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    for (int64_t m = 0; m < g.M; ++m) {
      const float* a = g.a + m * g.lda;
      __m512 acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
      for (int64_t b = 0; b < blocks; ++b) {
        const __m512 a0 = _mm512_loadu_ps(a + b * kBlock);
        const __m512 a1 = _mm512_loadu_ps(a + b * kBlock + 16);
        for (int r = 0; r < R; ++r) {
          __m512 lo, hi;
          widen_block_avx512<Q4>(g.q + (n + r) * g.ldq, b, lo, hi);
          const __m512 sum = _mm512_fmadd_ps(a1, hi, _mm512_mul_ps(a0, lo));
          const float sc = _cvtsh_ss(g.s[(n + r) * g.lds + b]);
          acc[r] = _mm512_fmadd_ps(sum, _mm512_set1_ps(sc), acc[r]);
        }
      }
      for (int r = 0; r < R; ++r) g.y[m * g.ldy + n + r] = _mm512_reduce_add_ps(acc[r]);
    }
  }
  if (n < n1) rows_scalar<Q4>(g, n, n1);
}

// Several rows of a (a prompt's tokens): the plugin's packed GEMM with b
// dequantized as it is packed, a panel of KC x NR at a time, never whole.
// w(n, k) = s · q is the f32 product the decomposition makes; the GEMM then
// sums as matmul does. At one row the block form above reads fewer bytes.
template <bool Q4> struct QuantB {
  const QuantArgs* g;
  void pack(int64_t pc, int64_t kc, int64_t jc, int64_t nc, int64_t nr, int64_t p0, int64_t p1, float* bp) const {
    float w[kBlock];
    for (int64_t p = p0; p < p1; ++p) {
      float* dst = bp + p * nr * kc;
      for (int64_t j = 0; j < nr; ++j) {
        const int64_t n = jc + p * nr + j;
        if (p * nr + j >= nc) {
          for (int64_t k = 0; k < kc; ++k) dst[k * nr + j] = 0.0f;
          continue;
        }
        const uint8_t* row = g->q + n * g->ldq;
        for (int64_t k = 0; k < kc; k += kBlock) {  // pc and kc are multiples of 32 (KC is 256, K of 32)
          const int64_t b = (pc + k) / kBlock;
          widen_block<Q4>(row, b, w);
          const float sc = f16_to_float(g->s[n * g->lds + b]);
          for (int64_t t = 0; t < kBlock; ++t) dst[(k + t) * nr + j] = sc * w[t];
        }
      }
    }
  }
};

template <bool Q4> struct MatmulQK {
  template <bp_dtype> struct K {
    static void impl(const Call& c) {
      c.expect(3, BP_PARAMS_NONE);
      const bp_layout& la = c.in_layout(0);
      const bp_layout& lq = c.in_layout(1);
      const bp_layout& ls = c.in_layout(2);
      const bp_layout& ly = c.out_layout();
      const auto dense_rows = [](const bp_layout& l) { return l.rank == 2 && (l.shape[1] <= 1 || l.strides[1] == 1); };
      BP_SDK_CHECK(dense_rows(la) && dense_rows(lq) && dense_rows(ls) && dense_rows(ly), BP_ERR_INVALID_ARGUMENT,
                   std::string(c.op) + ": a, q, s and y must be 2-D and dense");
      const int64_t M = la.shape[0], K = la.shape[1], N = lq.shape[0];
      BP_SDK_CHECK(K % kBlock == 0 && lq.shape[1] == (Q4 ? K / 2 : K) && ls.shape[0] == N &&
                       ls.shape[1] == K / kBlock && ly.shape[0] == M && ly.shape[1] == N,
                   BP_ERR_INVALID_ARGUMENT,
                   std::string(c.op) + ": a " + dims_str(la) + ", q " + dims_str(lq) + ", s " + dims_str(ls) +
                       " and y " + dims_str(ly) + " do not fit blocks of 32 along K");
      QuantArgs g;
      g.a = c.in_data<float>(0) + la.offset;
      g.lda = la.strides[0];
      g.q = c.in_data<uint8_t>(1) + lq.offset;
      g.ldq = lq.strides[0];
      g.s = c.in_data<uint16_t>(2) + ls.offset;
      g.lds = ls.strides[0];
      g.y = c.out_data<float>() + ly.offset;
      g.ldy = ly.strides[0];
      g.M = M;
      g.N = N;
      g.K = K;
      if (M == 0 || N == 0) return;
      if (K == 0) {
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) g.y[m * g.ldy + n] = 0.0f;
        return;
      }
      if (M >= 4) {
        gemm_packed<float>(c, M, N, K, StridedA<float, float>{g.a, g.lda, 1}, QuantB<Q4>{&g}, g.y, g.ldy);
        return;
      }
      // Groups of 4 weight rows split over the threads, ~kGrain products a task.
      const bool wide = isa() == Isa::avx512;
      pfor(c, (N + 3) / 4, std::max<int64_t>(1, kGrain / (4 * M * K)), [&](int64_t b, int64_t e) {
        const int64_t n0 = b * 4, n1 = std::min(N, e * 4);
        if (wide)
          rows_avx512<Q4>(g, n0, n1);
        else
          rows_scalar<Q4>(g, n0, n1);
      });
    }
  };
};

template <bp_dtype D> using MatmulQ8K = MatmulQK<false>::K<D>;
template <bp_dtype D> using MatmulQ4K = MatmulQK<true>::K<D>;

}  // namespace

void register_quant(sdk::KernelTable& t) {
  add_rows<MatmulQ8K, BP_DTYPE_F32>(
      t, "cpu.matmul_q8", [](bp_dtype) { return std::vector<bp_dtype>{BP_DTYPE_F32, BP_DTYPE_I8, BP_DTYPE_F16, BP_DTYPE_F32}; },
      {kContiguous, kContiguous, kContiguous});
  add_rows<MatmulQ4K, BP_DTYPE_F32>(
      t, "cpu.matmul_q4", [](bp_dtype) { return std::vector<bp_dtype>{BP_DTYPE_F32, BP_DTYPE_U8, BP_DTYPE_F16, BP_DTYPE_F32}; },
      {kContiguous, kContiguous, kContiguous});
}

}  // namespace backplane::cpu
