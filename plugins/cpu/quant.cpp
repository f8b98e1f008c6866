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

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

// GCC 12 reports its own AVX-512 intrinsics' undefined merge operand as
// maybe-uninitialized (or uninitialized, _mm512_reduce_add_ps's) once they
// are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

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

// ---- The _a8 ops: a rounded to 8-bit blocks of 32 as well ----------------
//
// cpu.matmul_q8_a8 and cpu.matmul_q4_a8 are the ops above with each row of a
// first rounded to 8-bit blocks of 32 along K (ggml's Q8_0 form, ONNX
// Runtime's MatMulNBits at accuracy level 4):
//   s_a = max(f32(max|a_blk| · (1/127), in double), 1e-30), q_a = rint(a / s_a)
// (a block holding NaN or an infinity gets s_a = NaN, q_a = 0, so its row's
// products are NaN as the decomposition's NaN / inf / 0 give). Each block's
// product is then exact in integers, Σ q_a · q_w, scaled once by s_a · s_w:
// AVX-512 VNNI (vpdpbusd) or AVX2 (vpmaddubsw) byte products, chosen at run
// time. The rounding is the decomposition's own (the same divide, half to
// even), so the two differ by float summation order only.
constexpr double kInv127 = 1.0 / 127.0;
constexpr float kMinScale = 1e-30f;

inline float a8_scale(float amax) {
  if (!(amax <= std::numeric_limits<float>::max())) return std::numeric_limits<float>::quiet_NaN();
  const float s = static_cast<float>(kInv127 * static_cast<double>(amax));
  return s < kMinScale ? kMinScale : s;
}

// One block of a rounded: q[0..31], returns s_a; *sum = Σ q.
inline float quantize_block(const float* a, int8_t* q, int32_t* sum) {
  float amax = 0.0f;
  bool bad = false;
  for (int j = 0; j < kBlock; ++j) {
    const float v = std::fabs(a[j]);
    bad |= !(v <= std::numeric_limits<float>::max());
    amax = v > amax ? v : amax;
  }
  const float s = bad ? std::numeric_limits<float>::quiet_NaN() : a8_scale(amax);
  int32_t t = 0;
  for (int j = 0; j < kBlock; ++j) {
    q[j] = bad ? int8_t{0} : static_cast<int8_t>(std::nearbyint(a[j] / s));
    t += q[j];
  }
  *sum = t;
  return s;
}

#define BP_QUANT_A512 __attribute__((target("avx512f,avx512bw,avx512vl")))

// quantize_block with AVX-512 (the bulk of a prompt row costs K divides).
BP_QUANT_A512 inline float quantize_block_avx512(const float* a, int8_t* q, int32_t* sum) {
  const __m512 x0 = _mm512_loadu_ps(a), x1 = _mm512_loadu_ps(a + 16);
  const __m512 ax0 = _mm512_abs_ps(x0), ax1 = _mm512_abs_ps(x1);
  const __m512 big = _mm512_set1_ps(std::numeric_limits<float>::max());
  // NaN or an infinity: not (|x| <= max), unordered included.
  const __mmask16 bad = _mm512_cmp_ps_mask(ax0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(ax1, big, _CMP_NLE_UQ);
  if (bad) return quantize_block(a, q, sum);
  const float s = a8_scale(_mm512_reduce_max_ps(_mm512_max_ps(ax0, ax1)));
  const __m512 vs = _mm512_set1_ps(s);
  const __m512i q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(x0, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m512i q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(x1, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(q1));
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  return s;
}

#define BP_QUANT_AVX2 __attribute__((target("avx2,fma,f16c")))

BP_QUANT_AVX2 inline float quantize_block_avx2(const float* a, int8_t* q, int32_t* sum) {
  __m256 x[4], amax = _mm256_setzero_ps();
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 big = _mm256_set1_ps(std::numeric_limits<float>::max());
  int bad = 0;
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_loadu_ps(a + 8 * i);
    const __m256 ax = _mm256_and_ps(x[i], absmask);
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(ax, big, _CMP_NLE_UQ));
    amax = _mm256_max_ps(amax, ax);
  }
  if (bad) return quantize_block(a, q, sum);
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  const float s = a8_scale(_mm_cvtss_f32(m));
  const __m256 vs = _mm256_set1_ps(s);
  __m256i v[4];
  for (int i = 0; i < 4; ++i)
    v[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(x[i], vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  // packs interleave 128-bit lanes: put them back in order after.
  const __m256i w16a = _mm256_packs_epi32(v[0], v[1]), w16b = _mm256_packs_epi32(v[2], v[3]);
  const __m256i w8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w16a, w16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), w8);
  __m256i t = _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
  __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4E));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0xB1));
  *sum = _mm_cvtsi128_si32(u);
  return s;
}

// Which a8 kernel runs: the vector ones take a chunk of C blocks (C / 4 per
// group vector) at a time.
enum class A8Path { scalar, avx2, vnni };

A8Path a8_path() {
  if (isa() == Isa::avx512) {
    static const bool vnni = [] {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("f16c");
#else
      return false;
#endif
    }();
    if (vnni) return A8Path::vnni;
  }
  return isa() >= Isa::avx2 ? A8Path::avx2 : A8Path::scalar;
}

// The rows of a, rounded and laid out for `path`:
// - q: per row nbp · 32 bytes, nbp = blocks rounded up to a chunk (zeros
//   after K). q8: in a's order. q4: per group of L blocks, the blocks' first
//   16 values (which pair with the weight bytes' low nibbles) then their last
//   16 (the high nibbles), so one load matches L blocks of weight bytes.
// - s, c: per row nbp scales and corrections (c · Σ q_a added to each
//   block's integer sum undoes the kernel's offset of the weights: 8 for q4's
//   nibbles, 128 for q8 under VNNI, whose weights go in as unsigned bytes),
//   in the chunk's reduced order: position p = 4i + g holds block L·g + i.
// The scalar path keeps a's order and needs no correction.
struct A8Rows {
  int64_t nb = 0, nbp = 0;
  std::vector<int8_t> q;
  std::vector<float> s;
  std::vector<int32_t> c;
};

template <bool Q4> A8Rows quantize_rows(const QuantArgs& g, A8Path path) {
  A8Rows r;
  r.nb = g.K / kBlock;
  const int64_t C = path == A8Path::vnni ? 16 : path == A8Path::avx2 ? 8 : 1;
  const int64_t L = C / 4;
  r.nbp = (r.nb + C - 1) / C * C;
  r.q.assign(static_cast<size_t>(g.M * r.nbp * kBlock), 0);
  r.s.assign(static_cast<size_t>(g.M * r.nbp), 0.0f);
  r.c.assign(static_cast<size_t>(g.M * r.nbp), 0);
  const int32_t offset = Q4 ? 8 : (path == A8Path::vnni ? 128 : 0);
  // The rounding is the same on every path: the fastest this CPU has, also
  // for the scalar layout (a prompt's rows).
  const A8Path rounding = a8_path();
  alignas(64) int8_t blk[kBlock];
  for (int64_t m = 0; m < g.M; ++m) {
    int8_t* q = r.q.data() + m * r.nbp * kBlock;
    float* s = r.s.data() + m * r.nbp;
    int32_t* c = r.c.data() + m * r.nbp;
    for (int64_t b = 0; b < r.nb; ++b) {
      const float* a = g.a + m * g.lda + b * kBlock;
      int32_t sum = 0;
      const float sc = rounding == A8Path::vnni   ? quantize_block_avx512(a, blk, &sum)
                       : rounding == A8Path::avx2 ? quantize_block_avx2(a, blk, &sum)
                                                  : quantize_block(a, blk, &sum);
      int64_t pos = b;
      if (C > 1) {
        const int64_t i = (b % C) % L, grp = (b % C) / L;
        pos = b - b % C + 4 * i + grp;
      }
      s[pos] = sc;
      c[pos] = -offset * sum;
      if (Q4 && C > 1) {
        const int64_t grp0 = b / L * L, i = b - grp0;
        std::memcpy(q + grp0 * kBlock + 16 * i, blk, 16);
        std::memcpy(q + grp0 * kBlock + 16 * L + 16 * i, blk + 16, 16);
      } else {
        std::memcpy(q + b * kBlock, blk, kBlock);
      }
    }
  }
  return r;
}

// Scalar: y[m, n] = Σ_b s_w · s_a · Σ_j q_a · w(j), a's own order.
template <bool Q4> void a8_rows_scalar(const QuantArgs& g, const A8Rows& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = g.q + n * g.ldq;
    for (int64_t m = 0; m < g.M; ++m) {
      const int8_t* aq = a.q.data() + m * a.nbp * kBlock;
      const float* sa = a.s.data() + m * a.nbp;
      float acc = 0.0f;
      for (int64_t b = 0; b < a.nb; ++b) {
        int32_t t = 0;
        for (int j = 0; j < kBlock; ++j) {
          int32_t w;
          if constexpr (Q4) {
            const uint8_t byte = row[b * 16 + (j & 15)];
            w = (j < 16 ? byte & 0xF : byte >> 4) - 8;
          } else {
            w = static_cast<int8_t>(row[b * kBlock + j]);
          }
          t += w * aq[b * kBlock + j];
        }
        acc += f16_to_float(g.s[n * g.lds + b]) * sa[b] * static_cast<float>(t);
      }
      g.y[m * g.ldy + n] = acc;
    }
  }
}

// The weight bytes and scales of rows n .. n + R - 1 for the chunk of C
// blocks at b0: in place, or copied with zeros after the row's last block.
template <bool Q4, int R, int C> struct ChunkRows {
  static constexpr int kBytes = C * (Q4 ? 16 : 32);
  alignas(64) uint8_t tq[R][kBytes];
  alignas(64) uint16_t ts[R][C];
  const uint8_t* q[R];
  const uint16_t* s[R];
  void at(const QuantArgs& g, int64_t n, int64_t b0, int64_t nb) {
    const int64_t vb = std::min<int64_t>(C, nb - b0);
    for (int r = 0; r < R; ++r) {
      q[r] = g.q + (n + r) * g.ldq + b0 * (Q4 ? 16 : 32);
      s[r] = g.s + (n + r) * g.lds + b0;
      if (vb < C) {
        std::memset(tq[r], 0, sizeof tq[r]);
        std::memset(ts[r], 0, sizeof ts[r]);
        std::memcpy(tq[r], q[r], static_cast<size_t>(vb * (Q4 ? 16 : 32)));
        std::memcpy(ts[r], s[r], static_cast<size_t>(vb) * sizeof(uint16_t));
        q[r] = tq[r];
        s[r] = ts[r];
      }
    }
  }
};

#define BP_QUANT_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))

// AVX-512 VNNI, R weight rows against one row m of a, chunks of 16 blocks:
// four group vectors (a 128-bit lane per block) of vpdpbusd sums, reduced
// to one vector of 16 block sums, scaled and accumulated in f32.
constexpr int64_t kAhead = 8;  // rows ahead a prefetch reads

template <bool Q4, int R> BP_QUANT_VNNI void a8_vnni(const QuantArgs& g, const A8Rows& a, int64_t m, int64_t n) {
  constexpr int C = 16;
  const int8_t* aq = a.q.data() + m * a.nbp * kBlock;
  const float* sa = a.s.data() + m * a.nbp;
  const int32_t* ca = a.c.data() + m * a.nbp;
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  ChunkRows<Q4, R, C> w;
  for (int64_t b0 = 0; b0 < a.nb; b0 += C) {
    w.at(g, n, b0, a.nb);
    __m512i v[R][4];
    for (int grp = 0; grp < 4; ++grp) {
      const __m512i a0 = _mm512_loadu_si512(aq + b0 * kBlock + grp * 128);
      const __m512i a1 = _mm512_loadu_si512(aq + b0 * kBlock + grp * 128 + 64);
      for (int r = 0; r < R; ++r) {
        if constexpr (Q4) {
          // The next rows' bytes at the same place: the loads stream
          // ahead of the arithmetic (a token's weights come from DRAM).
          _mm_prefetch(reinterpret_cast<const char*>(w.q[r] + grp * 64 + kAhead * g.ldq), _MM_HINT_T0);
          const __m512i x = _mm512_loadu_si512(w.q[r] + grp * 64);
          const __m512i lo = _mm512_and_si512(x, nib);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), nib);
          v[r][grp] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, a0), hi, a1);
        } else {
          _mm_prefetch(reinterpret_cast<const char*>(w.q[r] + grp * 128 + kAhead * g.ldq), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(w.q[r] + grp * 128 + 64 + kAhead * g.ldq), _MM_HINT_T0);
          const __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(w.q[r] + grp * 128), flip);
          const __m512i x1 = _mm512_xor_si512(_mm512_loadu_si512(w.q[r] + grp * 128 + 64), flip);
          const __m512i t0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), x0, a0);
          const __m512i t1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), x1, a1);
          v[r][grp] = _mm512_add_epi32(_mm512_shuffle_i32x4(t0, t1, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(t0, t1, _MM_SHUFFLE(3, 1, 3, 1)));
        }
      }
    }
    const __m512i corr = _mm512_loadu_si512(ca + b0);
    const __m512 sav = _mm512_loadu_ps(sa + b0);
    for (int r = 0; r < R; ++r) {
      const __m512i x = _mm512_add_epi32(_mm512_unpacklo_epi32(v[r][0], v[r][1]), _mm512_unpackhi_epi32(v[r][0], v[r][1]));
      const __m512i y = _mm512_add_epi32(_mm512_unpacklo_epi32(v[r][2], v[r][3]), _mm512_unpackhi_epi32(v[r][2], v[r][3]));
      const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y)), corr);
      const __m512 sw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.s[r])));
      const __m512 scale = _mm512_mul_ps(_mm512_permutexvar_ps(order, sw), sav);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) g.y[m * g.ldy + n + r] = _mm512_reduce_add_ps(acc[r]);
}

// AVX2: the same with vpmaddubsw byte products (pairs summed in 16 bits:
// 2 · 15 · 127 for q4's nibbles, 2 · 128 · 127 for q8 with its signs moved
// onto a), chunks of 8 blocks, two per group vector.
template <bool Q4, int R> BP_QUANT_AVX2 void a8_avx2(const QuantArgs& g, const A8Rows& a, int64_t m, int64_t n) {
  constexpr int C = 8;
  const int8_t* aq = a.q.data() + m * a.nbp * kBlock;
  const float* sa = a.s.data() + m * a.nbp;
  const int32_t* ca = a.c.data() + m * a.nbp;
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  ChunkRows<Q4, R, C> w;
  for (int64_t b0 = 0; b0 < a.nb; b0 += C) {
    w.at(g, n, b0, a.nb);
    __m256i v[R][4];
    for (int grp = 0; grp < 4; ++grp) {
      const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + b0 * kBlock + grp * 64));
      const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + b0 * kBlock + grp * 64 + 32));
      for (int r = 0; r < R; ++r) {
        if constexpr (Q4) {
          if (grp % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(w.q[r] + grp * 32 + kAhead * g.ldq), _MM_HINT_T0);
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.q[r] + grp * 32));
          const __m256i lo = _mm256_and_si256(x, nib);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, a0), _mm256_maddubs_epi16(hi, a1));
          v[r][grp] = _mm256_madd_epi16(p, ones);
        } else {
          _mm_prefetch(reinterpret_cast<const char*>(w.q[r] + grp * 64 + kAhead * g.ldq), _MM_HINT_T0);
          const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.q[r] + grp * 64));
          const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.q[r] + grp * 64 + 32));
          const __m256i t0 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(x0), _mm256_sign_epi8(a0, x0)), ones);
          const __m256i t1 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(x1), _mm256_sign_epi8(a1, x1)), ones);
          v[r][grp] = _mm256_add_epi32(_mm256_permute2x128_si256(t0, t1, 0x20), _mm256_permute2x128_si256(t0, t1, 0x31));
        }
      }
    }
    const __m256i corr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ca + b0));
    const __m256 sav = _mm256_loadu_ps(sa + b0);
    for (int r = 0; r < R; ++r) {
      const __m256i sum = _mm256_add_epi32(
          _mm256_hadd_epi32(_mm256_hadd_epi32(v[r][0], v[r][1]), _mm256_hadd_epi32(v[r][2], v[r][3])), corr);
      const __m256 sw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.s[r])));
      const __m256 scale = _mm256_mul_ps(_mm256_permutevar8x32_ps(sw, order), sav);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
    g.y[m * g.ldy + n + r] = _mm_cvtss_f32(t);
  }
}

// Weight rows outer, a's rows inner: a group's weights are read from memory
// once and stay in L1 while every row of a (a prompt's tokens) uses them.
template <bool Q4> void a8_rows(const QuantArgs& g, const A8Rows& a, A8Path path, int64_t n0, int64_t n1) {
  if (path == A8Path::scalar) return a8_rows_scalar<Q4>(g, a, n0, n1);
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4)
    for (int64_t m = 0; m < g.M; ++m) path == A8Path::vnni ? a8_vnni<Q4, 4>(g, a, m, n) : a8_avx2<Q4, 4>(g, a, m, n);
  for (; n < n1; ++n)
    for (int64_t m = 0; m < g.M; ++m) path == A8Path::vnni ? a8_vnni<Q4, 1>(g, a, m, n) : a8_avx2<Q4, 1>(g, a, m, n);
}

// The four kernels: Q4 picks the weight format, A8 whether a is rounded too.
template <bool Q4, bool A8> struct MatmulQK {

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
      // With a rounded too (A8), the integer kernels take every row count
      // where the CPU has them; otherwise four rows or more (a prompt) go
      // through the packed f32 GEMM.
      const A8Path path = A8 ? a8_path() : A8Path::scalar;
      const bool integer = A8 && (M < 4 || path != A8Path::scalar);
      if (M >= 4 && !integer) {
        if constexpr (A8) {
          // A prompt's rows without integer products: a as its blocks give
          // it back, then the f32 GEMM.
          const A8Rows r = quantize_rows<Q4>(g, A8Path::scalar);
          std::vector<float> back(static_cast<size_t>(M * K));
          for (int64_t i = 0; i < M * K; ++i) back[static_cast<size_t>(i)] = r.q[static_cast<size_t>(i)] * r.s[static_cast<size_t>(i / kBlock)];
          gemm_packed<float>(c, M, N, K, StridedA<float, float>{back.data(), K, 1}, QuantB<Q4>{&g}, g.y, g.ldy);
        } else {
          gemm_packed<float>(c, M, N, K, StridedA<float, float>{g.a, g.lda, 1}, QuantB<Q4>{&g}, g.y, g.ldy);
        }
        return;
      }
      if (integer) {
        const A8Rows r = quantize_rows<Q4>(g, path);
        pfor(c, (N + 3) / 4, std::max<int64_t>(1, kGrain / (4 * M * K)), [&](int64_t b, int64_t e) {
          a8_rows<Q4>(g, r, path, b * 4, std::min(N, e * 4));
        });
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

template <bp_dtype D> using MatmulQ8K = MatmulQK<false, false>::K<D>;
template <bp_dtype D> using MatmulQ4K = MatmulQK<true, false>::K<D>;
template <bp_dtype D> using MatmulQ8A8K = MatmulQK<false, true>::K<D>;
template <bp_dtype D> using MatmulQ4A8K = MatmulQK<true, true>::K<D>;

}  // namespace

void register_quant(sdk::KernelTable& t) {
  add_rows<MatmulQ8K, BP_DTYPE_F32>(
      t, "cpu.matmul_q8", [](bp_dtype) { return std::vector<bp_dtype>{BP_DTYPE_F32, BP_DTYPE_I8, BP_DTYPE_F16, BP_DTYPE_F32}; },
      {kContiguous, kContiguous, kContiguous});
  add_rows<MatmulQ4K, BP_DTYPE_F32>(
      t, "cpu.matmul_q4", [](bp_dtype) { return std::vector<bp_dtype>{BP_DTYPE_F32, BP_DTYPE_U8, BP_DTYPE_F16, BP_DTYPE_F32}; },
      {kContiguous, kContiguous, kContiguous});
  add_rows<MatmulQ8A8K, BP_DTYPE_F32>(
      t, "cpu.matmul_q8_a8", [](bp_dtype) { return std::vector<bp_dtype>{BP_DTYPE_F32, BP_DTYPE_I8, BP_DTYPE_F16, BP_DTYPE_F32}; },
      {kContiguous, kContiguous, kContiguous});
  add_rows<MatmulQ4A8K, BP_DTYPE_F32>(
      t, "cpu.matmul_q4_a8", [](bp_dtype) { return std::vector<bp_dtype>{BP_DTYPE_F32, BP_DTYPE_U8, BP_DTYPE_F16, BP_DTYPE_F32}; },
      {kContiguous, kContiguous, kContiguous});
}

}  // namespace backplane::cpu
