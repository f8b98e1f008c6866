// scaled_dot_product_attention: softmax(q kᵀ scale + mask) v, one block of
// query rows at a time against blocks of keys, with the softmax done online
// (a running maximum and sum per row, the partial output rescaled when the
// maximum grows). The score matrix is never formed: a task holds BQ x BK
// scores, and a thread one batch's packed k and v, so memory stays
// O(BQ · (BK + Dv) + Sk · (D + Dv)) per thread.
//
// Both products run on the plugin's GEMM micro-kernels (gemm.hpp) without
// its threading: q's block is packed once per task (scaled as it is
// packed), a batch's k and v once per thread for all its query blocks (as
// the B operands, per key block), and the probabilities as the A operand of
// the second product. The exp and max
// passes use the rows:: primitives when the ISA allows.
#include "gemm.hpp"
#include "kernels.hpp"
#include "rowops.hpp"
#include "vecmath.hpp"

#include <limits>
#include <type_traits>
#include <vector>

namespace backplane::cpu {
namespace {

constexpr int64_t kBlockQ = 64;   // query rows per task
constexpr int64_t kBlockK = 256;  // keys per block (the GEMM's deepest panel)

// Element offsets of batch b in each of the layouts (the leading `nb` dims,
// mask dims aligned from the right; a missing or size-1 mask dim stays 0).
struct BatchWalk {
  uint32_t nb = 0;
  int64_t shape[BP_MAX_RANK] = {};
  int64_t stride[5][BP_MAX_RANK] = {};
  void offsets(int64_t b, int64_t* off) const {
    for (int t = 0; t < 5; ++t) off[t] = 0;
    for (uint32_t d = nb; d-- > 0;) {
      const int64_t i = b % shape[d];
      b /= shape[d];
      for (int t = 0; t < 5; ++t) off[t] += i * stride[t][d];
    }
  }
};

// The mask's strides aligned to the scores' [batch..., Sq, Sk]: 0 where the
// mask has no such dim or a dim of 1.
void mask_strides(const bp_layout& m, uint32_t rank, int64_t* out) {
  for (uint32_t d = 0; d < rank; ++d) out[d] = 0;
  const uint32_t lead = rank - m.rank;
  for (uint32_t d = 0; d < m.rank; ++d) out[lead + d] = m.shape[d] == 1 ? 0 : m.strides[d];
}

float row_max(const float* x, int64_t n, bool* nan) {
  if (rows::enabled()) return rows::max(x, n, nan);
  float m = -std::numeric_limits<float>::infinity();
  *nan = false;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) *nan = true;
    m = x[i] > m ? x[i] : m;
  }
  return m;
}

double exp_sum(float* x, float m, int64_t n) {
  if (rows::enabled()) return rows::exp_sum(x, m, x, n);
  exp_shifted(x, m, x, n);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

// One query row against every key it sees, without packing: for a few
// rows (generation: one new token against a KV cache) reading k and v once
// in place beats packing them for the GEMM. f32 with unit inner strides.
// s: scratch of n floats; o: Dv floats, overwritten with the row's output.
struct DirectRow {
  const float* q;  // the row, already scaled, dense
  const float* k;  // key 0's row; rows kr apart
  int64_t kr;
  const float* v;  // value 0's row; rows vr apart
  int64_t vr;
  const float* mask;  // nullptr, or the mask's row (elements mc apart)
  int64_t mc;
  int64_t n, d, dv;  // keys seen, q/k width, v width
};

template <int W> [[gnu::always_inline]] inline void direct_row(const DirectRow& r, float* s, float* o) {
  using V = typename Vec<float, W>::type;
  for (int64_t j = 0; j < r.n; ++j) {
    const float* kj = r.k + j * r.kr;
    V acc = V{};
    int64_t e = 0;
    for (; e + W <= r.d; e += W) {
      V a, b;
      std::memcpy(&a, r.q + e, sizeof a);
      std::memcpy(&b, kj + e, sizeof b);
      acc += a * b;
    }
    float t = 0;
    for (int l = 0; l < W; ++l) t += acc[l];
    for (; e < r.d; ++e) t += r.q[e] * kj[e];
    s[j] = r.mask ? t + r.mask[j * r.mc] : t;
  }
  bool nan = false;
  const float m = row_max(s, r.n, &nan);
  const float inv = static_cast<float>(1.0 / exp_sum(s, nan ? std::numeric_limits<float>::quiet_NaN() : m, r.n));
  std::fill(o, o + r.dv, 0.0f);
  for (int64_t j = 0; j < r.n; ++j) {
    const float p = s[j];
    const float* vj = r.v + j * r.vr;
    int64_t e = 0;
    for (; e + W <= r.dv; e += W) {
      V a, b;
      std::memcpy(&a, o + e, sizeof a);
      std::memcpy(&b, vj + e, sizeof b);
      a += p * b;
      std::memcpy(o + e, &a, sizeof a);
    }
    for (; e < r.dv; ++e) o[e] += p * vj[e];
  }
  for (int64_t e = 0; e < r.dv; ++e) o[e] *= inv;
}

#if defined(__x86_64__)
BP_CPU_AVX512 void direct_row_avx512(const DirectRow& r, float* s, float* o) { direct_row<16>(r, s, o); }
BP_CPU_AVX2 void direct_row_avx2(const DirectRow& r, float* s, float* o) { direct_row<8>(r, s, o); }
#endif
void direct_row_base(const DirectRow& r, float* s, float* o) { direct_row<4>(r, s, o); }

void run_direct_row(const DirectRow& r, float* s, float* o) {
#if defined(__x86_64__)
  if (isa() == Isa::avx512) return direct_row_avx512(r, s, o);
  if (isa() == Isa::avx2) return direct_row_avx2(r, s, o);
#endif
  direct_row_base(r, s, o);
}

// Rows per task at or below which the direct form runs.
constexpr int64_t kDirectRows = 4;

template <bp_dtype D> struct AttentionK {
  using T = st_t<D>;
  static void impl(const Call& c) {
    c.expect(4, BP_PARAMS_ATTENTION);
    const bp_layout& lq = c.in_layout(0);
    const bp_layout& lk = c.in_layout(1);
    const bp_layout& lv = c.in_layout(2);
    const bp_layout& ly = c.out_layout();
    const uint32_t rank = lq.rank;
    BP_SDK_CHECK(rank >= 2 && lk.rank == rank && lv.rank == rank && ly.rank == rank, BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": q, k, v and y must have one rank of at least 2");
    const int64_t Sq = lq.shape[rank - 2], Dh = lq.shape[rank - 1], Sk = lk.shape[rank - 2], Dv = lv.shape[rank - 1];
    BP_SDK_CHECK(lk.shape[rank - 1] == Dh && lv.shape[rank - 2] == Sk && ly.shape[rank - 2] == Sq &&
                     ly.shape[rank - 1] == Dv,
                 BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": shapes q " + dims_str(lq) + ", k " + dims_str(lk) +
                                              ", v " + dims_str(lv) + ", y " + dims_str(ly) + " do not fit");
    BatchWalk w;
    w.nb = rank - 2;
    int64_t nbatch = 1;
    for (uint32_t d = 0; d < w.nb; ++d) {
      BP_SDK_CHECK(lk.shape[d] == lq.shape[d] && lv.shape[d] == lq.shape[d] && ly.shape[d] == lq.shape[d],
                   BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": batch dims differ");
      w.shape[d] = lq.shape[d];
      w.stride[0][d] = lq.strides[d];
      w.stride[1][d] = lk.strides[d];
      w.stride[2][d] = lv.strides[d];
      w.stride[4][d] = ly.strides[d];
      nbatch *= lq.shape[d];
    }
    const bool has_mask = c.has_input(3);
    int64_t ms[BP_MAX_RANK] = {};
    if (has_mask) {
      const bp_layout& lm = c.in_layout(3);
      BP_SDK_CHECK(lm.rank <= rank, BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": mask of higher rank than the scores");
      for (uint32_t d = 0; d < lm.rank; ++d) {
        const uint32_t at = rank - lm.rank + d;  // the scores' dim this one aligns with
        const int64_t want = at == rank - 1 ? Sk : at == rank - 2 ? Sq : lq.shape[at];
        BP_SDK_CHECK(lm.shape[d] == 1 || lm.shape[d] == want, BP_ERR_INVALID_ARGUMENT,
                     std::string(c.op) + ": mask " + dims_str(lm) + " does not broadcast to the scores");
      }
      mask_strides(lm, rank, ms);
      for (uint32_t d = 0; d < w.nb; ++d) w.stride[3][d] = ms[d];
    }
    if (nbatch == 0 || Sq == 0 || Dv == 0) return;
    const auto& p = c.params->u.attention;
    if (Sk == 0) {
      // No keys at all: zeros, as the composed ops give (an empty softmax
      // times an empty v), unlike a row whose keys are all masked.
      T* y0 = c.out_data<T>() + ly.offset;
      for (int64_t b = 0; b < nbatch; ++b) {
        int64_t off[5];
        w.offsets(b, off);
        for (int64_t i = 0; i < Sq; ++i)
          for (int64_t cc = 0; cc < Dv; ++cc)
            y0[off[4] + i * ly.strides[rank - 2] + cc * ly.strides[rank - 1]] = st<T>(0.0f);
      }
      return;
    }
    const float scale = static_cast<float>(p.scale);
    const bool causal = p.causal;
    // Each layout's element offset is part of its position (a slice's start).
    const T* q = c.in_data<T>(0) + lq.offset;
    const T* k = c.in_data<T>(1) + lk.offset;
    const T* v = c.in_data<T>(2) + lv.offset;
    const T* mask = has_mask ? c.in_data<T>(3) + c.in_layout(3).offset : nullptr;
    T* y = c.out_data<T>() + ly.offset;
    const int64_t qr = lq.strides[rank - 2], qc = lq.strides[rank - 1];
    const int64_t kr = lk.strides[rank - 2], kc_ = lk.strides[rank - 1];
    const int64_t vr = lv.strides[rank - 2], vc = lv.strides[rank - 1];
    const int64_t yr = ly.strides[rank - 2], yc = ly.strides[rank - 1];
    const int64_t mr_ = ms[rank - 2], mc = ms[rank - 1];

    const GemmKernel<float> kern = pick_kernel<float>();
    const int64_t MR = kern.mr, NR = kern.nr;
    auto round_up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
    const int64_t nqb = (Sq + kBlockQ - 1) / kBlockQ;
    const int64_t rq = round_up(std::min(Sq, kBlockQ), MR);
    const int64_t bk_max = std::min(Sk, kBlockK);
    const int64_t cost = std::min(Sq, kBlockQ) * std::max<int64_t>(Sk, 1) * (Dh + Dv);
    const int64_t tasks = nbatch * nqb;
    const int64_t grain = std::max<int64_t>(
        1, std::min<int64_t>(200000 / std::max<int64_t>(cost, 1), tasks / (2 * static_cast<int64_t>(num_threads(c)))));
    // The direct form: few rows, f32 with k and v rows dense.
    const bool direct = std::is_same_v<T, float> && Sq <= kDirectRows && kc_ == 1 && vc == 1;
    if constexpr (std::is_same_v<T, float>) {
      if (direct) {
        pfor(c, tasks, grain, [&](int64_t t0, int64_t t1) {
          std::vector<float> qrow(static_cast<size_t>(Dh)), srow(static_cast<size_t>(Sk)), orow(static_cast<size_t>(Dv));
          for (int64_t t = t0; t < t1; ++t) {
            int64_t off[5];
            w.offsets(t, off);
            for (int64_t i = 0; i < Sq; ++i) {
              for (int64_t e = 0; e < Dh; ++e) qrow[static_cast<size_t>(e)] = q[off[0] + i * qr + e * qc] * scale;
              DirectRow r{qrow.data(), k + off[1], kr, v + off[2], vr,
                          mask ? mask + off[3] + i * mr_ : nullptr, mc,
                          causal ? std::clamp<int64_t>(i + Sk - Sq + 1, 0, Sk) : Sk, Dh, Dv};
              if (r.n == 0) {
                // Every key hidden: NaN, as the composed softmax of -inf gives.
                std::fill(orow.begin(), orow.end(), std::numeric_limits<float>::quiet_NaN());
              } else {
                run_direct_row(r, srow.data(), orow.data());
              }
              for (int64_t e = 0; e < Dv; ++e) y[off[4] + i * yr + e * yc] = orow[static_cast<size_t>(e)];
            }
          }
        });
        return;
      }
    }
    // k and v are packed once per batch for all its query blocks (a chunk of
    // tasks repacks only when its batch changes), so chunks follow batches:
    // each batch's query blocks split into just enough chunks to keep every
    // thread busy.
    const int64_t per_batch = std::max<int64_t>(
        1, (2 * static_cast<int64_t>(num_threads(c)) + nbatch - 1) / std::max<int64_t>(nbatch, 1));
    const int64_t bgrain = std::max<int64_t>(1, (nqb + per_batch - 1) / per_batch);
    // Key block jb's packed kᵀ (all 256-deep slices of D) and v start at
    // koff[jb] and voff[jb].
    const int64_t nkb = (Sk + kBlockK - 1) / kBlockK;
    std::vector<int64_t> koff(static_cast<size_t>(nkb) + 1, 0), voff(static_cast<size_t>(nkb) + 1, 0);
    for (int64_t jb = 0; jb < nkb; ++jb) {
      const int64_t bk = std::min(kBlockK, Sk - jb * kBlockK);
      koff[static_cast<size_t>(jb) + 1] = koff[static_cast<size_t>(jb)] + round_up(bk, NR) * Dh;
      voff[static_cast<size_t>(jb) + 1] = voff[static_cast<size_t>(jb)] + round_up(Dv, NR) * bk;
    }
    pfor(c, tasks, bgrain, [&](int64_t t0, int64_t t1) {
      const AlignedBuffer<float> kall(std::max<int64_t>(1, koff.back())), vall(std::max<int64_t>(1, voff.back()));
      int64_t packed_batch = -1;
      const AlignedBuffer<float> qbuf(std::max<int64_t>(1, rq * Dh)), qpack(std::max<int64_t>(1, rq * Dh)),
          ppack(std::max<int64_t>(1, rq * std::max<int64_t>(bk_max, 1))), sbuf(std::max<int64_t>(1, rq * kBlockK)),
          obuf(std::max<int64_t>(1, rq * Dv));
      std::vector<float> row_m(static_cast<size_t>(rq)), row_l(static_cast<size_t>(rq));
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / nqb, i0 = (t % nqb) * kBlockQ, mq = std::min(kBlockQ, Sq - i0);
        int64_t off[5];
        w.offsets(b, off);
        if (b != packed_batch) {
          // This batch's kᵀ (per key block, per 256-deep slice of D) and v
          // as the two products' B panels, once for all its query blocks.
          for (int64_t jb = 0; jb < nkb; ++jb) {
            const int64_t j0 = jb * kBlockK, bk = std::min(kBlockK, Sk - j0), npan = (bk + NR - 1) / NR;
            float* kp = kall.get() + koff[static_cast<size_t>(jb)];
            for (int64_t pc = 0; pc < Dh; pc += kBlockK)
              pack_b_panels<T, float>(k + off[1] + j0 * kr + pc * kc_, kc_, kr, bk, std::min(kBlockK, Dh - pc), NR,
                                      0, npan, kp + round_up(bk, NR) * pc);
            pack_b_panels<T, float>(v + off[2] + j0 * vr, vr, vc, Dv, bk, NR, 0, (Dv + NR - 1) / NR,
                                    vall.get() + voff[static_cast<size_t>(jb)]);
          }
          packed_batch = b;
        }
        // q's rows, scaled, packed as the first product's A panels (one
        // region per 256-deep slice of D).
        float* qs = qbuf.get();
        for (int64_t i = 0; i < mq; ++i)
          for (int64_t d = 0; d < Dh; ++d) qs[i * Dh + d] = ld(q[off[0] + (i0 + i) * qr + d * qc]) * scale;
        for (int64_t pc = 0; pc < Dh; pc += kBlockK) {
          const int64_t kcw = std::min(kBlockK, Dh - pc);
          for (int64_t pp = 0; pp * MR < mq; ++pp)
            pack_a_panel<float, float>(qs + pp * MR * Dh + pc, Dh, 1, std::min(MR, mq - pp * MR), kcw, MR,
                                       qpack.get() + rq * pc + pp * MR * kcw);
        }
        float* o = obuf.get();
        std::fill(o, o + mq * Dv, 0.0f);
        std::fill(row_m.begin(), row_m.end(), -std::numeric_limits<float>::infinity());
        std::fill(row_l.begin(), row_l.end(), 0.0f);
        // Keys past the last one any row of the block sees (causal) are skipped.
        const int64_t k_end = causal ? std::clamp<int64_t>(i0 + mq + Sk - Sq, 0, Sk) : Sk;
        for (int64_t j0 = 0; j0 < k_end; j0 += kBlockK) {
          // The whole packed block (its panels are laid out for all its
          // keys); keys a causal row does not see get -inf below.
          const int64_t jb = j0 / kBlockK, bk = std::min(kBlockK, Sk - j0);
          float* s = sbuf.get();
          // s[mq x bk] = (q scale) kᵀ, row stride kBlockK.
          const float* kp = kall.get() + koff[static_cast<size_t>(jb)];
          for (int64_t pc = 0; pc < Dh; pc += kBlockK)
            kern.macro(mq, bk, std::min(kBlockK, Dh - pc), qpack.get() + rq * pc, kp + round_up(bk, NR) * pc, s,
                       kBlockK, pc == 0);
          if (Dh == 0)
            for (int64_t i = 0; i < mq; ++i) std::fill(s + i * kBlockK, s + i * kBlockK + bk, 0.0f);
          // Mask, causal limit, and the online softmax per row.
          for (int64_t i = 0; i < mq; ++i) {
            float* row = s + i * kBlockK;
            const int64_t gi = i0 + i;
            if (mask) {
              const T* mrow = mask + off[3] + gi * mr_ + j0 * mc;
              for (int64_t j = 0; j < bk; ++j) row[j] += ld(mrow[j * mc]);
            }
            if (causal)
              for (int64_t j = std::max<int64_t>(0, gi + Sk - Sq + 1 - j0); j < bk; ++j)
                row[j] = -std::numeric_limits<float>::infinity();
            bool nan = false;
            const float bm = row_max(row, bk, &nan);
            const float m_old = row_m[static_cast<size_t>(i)];
            const float m_new = nan ? std::numeric_limits<float>::quiet_NaN() : std::max(m_old, bm);
            if (m_new == -std::numeric_limits<float>::infinity()) {
              // Nothing seen yet: the row's weights are all 0 so far.
              std::fill(row, row + bk, 0.0f);
              continue;
            }
            const float alpha = std::isnan(m_old) ? m_old : std::exp(m_old - m_new);
            const double sum = exp_sum(row, m_new, bk);
            row_l[static_cast<size_t>(i)] = row_l[static_cast<size_t>(i)] * alpha + static_cast<float>(sum);
            row_m[static_cast<size_t>(i)] = m_new;
            if (alpha != 1.0f)
              for (int64_t cc = 0; cc < Dv; ++cc) o[i * Dv + cc] *= alpha;
          }
          // o[mq x Dv] += p v_block.
          for (int64_t pp = 0; pp * MR < mq; ++pp)
            pack_a_panel<float, float>(s + pp * MR * kBlockK, kBlockK, 1, std::min(MR, mq - pp * MR), bk, MR,
                                       ppack.get() + pp * MR * bk);
          kern.macro(mq, Dv, bk, ppack.get(), vall.get() + voff[static_cast<size_t>(jb)], o, Dv, false);
        }
        // A row that saw no key keeps l = 0: 0/0 gives NaN, as the composed
        // softmax of -inf does.
        for (int64_t i = 0; i < mq; ++i) {
          const float inv = 1.0f / row_l[static_cast<size_t>(i)];
          T* yrow = y + off[4] + (i0 + i) * yr;
          for (int64_t cc = 0; cc < Dv; ++cc) yrow[cc * yc] = st<T>(o[i * Dv + cc] * inv);
        }
      }
    });
  }
};

}  // namespace

void register_attention(sdk::KernelTable& t) {
  const auto k31 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, d, d, d}; };
  add_rows<AttentionK, BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16>(t, "scaled_dot_product_attention", k31,
                                                                  {kStrided, kStrided, kStrided, kStrided});
}

}  // namespace backplane::cpu
