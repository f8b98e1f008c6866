// Softmax, log_softmax and layer_norm: along one dim (softmax) or the
// trailing dims (layer_norm), with the row kernels of rowops.cpp for
// contiguous f32 rows.
#include "kernels.hpp"
#include "rowops.hpp"
#include "rowwalk.hpp"
#include "vecmath.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace backplane::cpu {
namespace {

template <bool Log> struct SoftmaxK {
  template <bp_dtype D> struct K {
    static void impl(const Call& c) {
      c.expect(1, BP_PARAMS_DIM);
      using T = st_t<D>;
      using C = comp_t<T>;
      const bp_layout& in = c.in_layout(0);
      const bp_layout& ol = c.out_layout();
      const int dim = checked_dim(c, in, c.params->u.dim.dim);
      expect_numel(c, ol, sdk::numel(in));
      if (sdk::numel(in) == 0) return;
      const int64_t n = in.shape[dim], s = in.strides[dim], so = ol.strides[dim];
      const T* x = c.in_data<T>(0);
      T* y = c.out_data<T>();
      // Outputs far larger than the cache are written around it (non-temporal).
      [[maybe_unused]] const bool stream = sdk::numel(ol) * static_cast<int64_t>(sizeof(T)) >= (int64_t{8} << 20);
      auto exp_all = [](C* v, int64_t cnt) {
        if constexpr (std::is_same_v<C, float>) {
          exp_shifted(v, 0.0f, v, cnt);
        } else {
          for (int64_t k = 0; k < cnt; ++k) v[k] = std::exp(v[k]);
        }
      };
      // Side by side: up to kColumns adjacent rows, each step along dim reads
      // one contiguous stretch. exp is computed twice rather than stored.
      auto columns = [&](const T* x0, T* y0, int64_t R) {
        C m[kColumns], t[kColumns];
        double sum[kColumns];
        bool nan[kColumns];
        for (int64_t r = 0; r < R; ++r) {
          m[r] = -std::numeric_limits<C>::infinity();
          nan[r] = false;
          sum[r] = 0;
        }
        for (int64_t i = 0; i < n; ++i)
          for (int64_t r = 0; r < R; ++r) {
            const C v = ld(x0[i * s + r]);
            nan[r] |= v != v;
            m[r] = v > m[r] ? v : m[r];
          }
        for (int64_t r = 0; r < R; ++r)
          if (nan[r]) m[r] = std::numeric_limits<C>::quiet_NaN();
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t r = 0; r < R; ++r) t[r] = ld(x0[i * s + r]) - m[r];
          exp_all(t, R);
          for (int64_t r = 0; r < R; ++r) sum[r] += static_cast<double>(t[r]);
        }
        if constexpr (Log) {
          for (int64_t r = 0; r < R; ++r) t[r] = m[r] + static_cast<C>(std::log(sum[r]));
          for (int64_t i = 0; i < n; ++i)
            for (int64_t r = 0; r < R; ++r) y0[i * so + r] = st<T>(ld(x0[i * s + r]) - t[r]);
        } else {
          C inv[kColumns];
          for (int64_t r = 0; r < R; ++r) inv[r] = static_cast<C>(1.0 / sum[r]);
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t r = 0; r < R; ++r) t[r] = ld(x0[i * s + r]) - m[r];
            exp_all(t, R);
            for (int64_t r = 0; r < R; ++r) y0[i * so + r] = st<T>(t[r] * inv[r]);
          }
        }
      };
      for_row_runs<2>(c, in, dim, {&in, &ol}, 4 * n, [&] {
        return [&, buf = std::vector<C>(), ebuf = std::vector<C>()](const int64_t* roff, int64_t cnt, const int64_t* rs) mutable {
          if (rs[0] == 1 && rs[1] == 1 && s != 1 && cnt >= 8) {
            for (int64_t r0 = 0; r0 < cnt; r0 += kColumns)
              columns(x + roff[0] + r0, y + roff[1] + r0, std::min(kColumns, cnt - r0));
            return;
          }
          buf.resize(static_cast<size_t>(n));
          ebuf.resize(static_cast<size_t>(n));
          if constexpr (D == BP_DTYPE_F32) {
            if (s == 1 && so == 1 && rows::enabled()) {
              // Three passes over a row that stays in cache: max, exp (into
              // the output, or scratch for log_softmax) with its sum, scale.
              for (int64_t rr = 0; rr < cnt; ++rr) {
                const float* row = x + roff[0] + rr * rs[0];
                float* out = y + roff[1] + rr * rs[1];
                bool nan = false;
                float m = rows::max(row, n, &nan);
                if (nan) m = std::numeric_limits<float>::quiet_NaN();
                if constexpr (Log) {
                  const float ls = static_cast<float>(std::log(rows::exp_sum(row, m, ebuf.data(), n)));
                  for (int64_t k = 0; k < n; ++k) out[k] = row[k] - m - ls;
                } else if (stream) {  // exp into scratch, then one streamed write of the output
                  const double sum = rows::exp_sum(row, m, ebuf.data(), n);
                  rows::scale_to(out, ebuf.data(), static_cast<float>(1.0 / sum), n, true);
                } else {
                  const double sum = rows::exp_sum(row, m, out, n);
                  rows::scale(out, static_cast<float>(1.0 / sum), n);
                }
              }
              if (stream) rows::fence();
              return;
            }
          }
          for (int64_t rr = 0; rr < cnt; ++rr) {
          const int64_t off[2] = {roff[0] + rr * rs[0], roff[1] + rr * rs[1]};
          const T* row = x + off[0];
          T* out = y + off[1];
          C* bp = buf.data();
          if (s == 1) {
            for (int64_t i = 0; i < n; ++i) bp[i] = ld(row[i]);
          } else {
            for (int64_t i = 0; i < n; ++i) bp[i] = ld(row[i * s]);
          }
          // Max in 8 lanes; NaN is tracked apart (a NaN row is all NaN).
          C lm[8];
          bool nan = false;
          for (C& l : lm) l = -std::numeric_limits<C>::infinity();
          int64_t i = 0;
          for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; ++j) {
              nan |= bp[i + j] != bp[i + j];
              lm[j] = bp[i + j] > lm[j] ? bp[i + j] : lm[j];
            }
          for (; i < n; ++i) {
            nan |= bp[i] != bp[i];
            lm[0] = bp[i] > lm[0] ? bp[i] : lm[0];
          }
          C m = lm[0];
          for (const C l : lm) m = l > m ? l : m;
          if (nan) m = std::numeric_limits<C>::quiet_NaN();
          // All -inf: m is -inf and x - m is NaN, as in PyTorch.
          C* eb = ebuf.data();
          if constexpr (std::is_same_v<C, float>) {
            exp_shifted(bp, m, eb, n);
          } else {
            for (int64_t k = 0; k < n; ++k) eb[k] = std::exp(bp[k] - m);
          }
          double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          for (i = 0; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; ++j) lanes[j] += static_cast<double>(eb[i + j]);
          for (; i < n; ++i) lanes[0] += static_cast<double>(eb[i]);
          const double sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
          if constexpr (Log) {
            const C ls = static_cast<C>(std::log(sum));
            for (int64_t k = 0; k < n; ++k) out[k * so] = st<T>(bp[k] - m - ls);
          } else {
            const C inv = static_cast<C>(1.0 / sum);
            if (so == 1) {
              for (int64_t k = 0; k < n; ++k) out[k] = st<T>(eb[k] * inv);
            } else {
              for (int64_t k = 0; k < n; ++k) out[k * so] = st<T>(eb[k] * inv);
            }
          }
          }
        };
      });
    }
  };
};

template <bp_dtype D> struct LayerNormK {
  static void impl(const Call& c) {
    c.expect(3, BP_PARAMS_LAYER_NORM);
    using T = st_t<D>;
    const bp_layer_norm_params& p = c.params->u.layer_norm;
    const bp_layout& in = c.in_layout(0);
    BP_SDK_CHECK(p.n_dims >= 1 && p.n_dims <= in.rank, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": cannot normalise " + std::to_string(p.n_dims) + " trailing dims of rank " +
                   std::to_string(in.rank));
    expect_numel(c, c.out_layout(), sdk::numel(in));
    if (sdk::numel(in) == 0) return;
    const uint32_t lead = in.rank - p.n_dims;
    bp_layout rows = in, inner = in;
    inner.offset = 0;
    int64_t n = 1;
    for (uint32_t i = 0; i < in.rank; ++i) (i < lead ? inner.shape[i] : rows.shape[i]) = 1;
    for (uint32_t i = lead; i < in.rank; ++i) n *= in.shape[i];
    // Weight and bias, when given, are the trailing shape: gather them dense.
    auto gather_param = [&](size_t idx, double fallback) {
      std::vector<double> v(static_cast<size_t>(n), fallback);
      if (!c.has_input(idx)) return v;
      const bp_layout& l = c.in_layout(idx);
      BP_SDK_CHECK(sdk::numel(l) == n, BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": " + (idx == 1 ? "weight" : "bias") + " has " + std::to_string(sdk::numel(l)) +
                     " elements, the normalised shape " + std::to_string(n));
      const T* w = c.in_data<T>(idx);
      const sdk::StridedWalker<1> ww(l.rank, l.shape, {&l});
      int64_t k = 0;
      ww.run_all([&](const int64_t* off, int64_t cnt, const int64_t* st) {
        for (int64_t i = 0; i < cnt; ++i) v[static_cast<size_t>(k++)] = ld(w[off[0] + i * st[0]]);
      });
      return v;
    };
    const std::vector<double> weight = gather_param(1, 1.0), bias = gather_param(2, 0.0);
    const T* x = c.in_data<T>(0);
    T* y = c.out_data<T>();
    const sdk::StridedWalker<1> rw(in.rank, rows.shape, {&rows});
    const sdk::StridedWalker<1> iw(in.rank, inner.shape, {&inner});
    const double eps = p.eps;
    if constexpr (D == BP_DTYPE_F32) {
      // Contiguous f32 rows: the mean, then the moments about it, summed in
      // double by the vector row loops; the affine pass in f32.
      bool dense = rows::enabled();
      int64_t want = 1;
      for (uint32_t i = in.rank; dense && i-- > lead;) {
        if (in.shape[i] == 1) continue;
        dense = in.strides[i] == want;
        want *= in.shape[i];
      }
      if (dense) {
        std::vector<float> wf(weight.begin(), weight.end()), bf(bias.begin(), bias.end());
        pfor(c, rw.numel(), kGrain / std::max<int64_t>(1, 3 * n), [&](int64_t b, int64_t e) {
          int64_t r = b;
          rw.run(b, e, [&](const int64_t* off, int64_t cnt, const int64_t* rs) {
            for (int64_t i = 0; i < cnt; ++i, ++r) {
              const float* row = x + off[0] + i * rs[0];
              const double mean = rows::sum(row, n) / static_cast<double>(n);
              double s1 = 0, s2 = 0;
              rows::moments(row, n, mean, &s1, &s2);
              const double d = s1 / static_cast<double>(n);
              const double var = std::max(s2 / static_cast<double>(n) - d * d, 0.0);
              const double m = mean + d;
              const float mh = static_cast<float>(m);
              rows::norm_affine(row, n, mh, static_cast<float>(m - static_cast<double>(mh)),
                                static_cast<float>(1.0 / std::sqrt(var + eps)), wf.data(), bf.data(), y + r * n);
            }
          });
        });
        return;
      }
    }
    pfor(c, rw.numel(), kGrain / std::max<int64_t>(1, 3 * n), [&](int64_t b, int64_t e) {
      std::vector<double> buf(static_cast<size_t>(n));
      int64_t r = b;
      rw.run(b, e, [&](const int64_t* off, int64_t cnt, const int64_t* rs) {
        for (int64_t i = 0; i < cnt; ++i, ++r) {
          const T* row = x + off[0] + i * rs[0];
          double* bp = buf.data();
          iw.run_all([&](const int64_t* io, int64_t in_n, const int64_t* is) {
            for (int64_t k = 0; k < in_n; ++k) *bp++ = ld(row[io[0] + k * is[0]]);
          });
          double l[4] = {0, 0, 0, 0};
          int64_t k = 0;
          for (; k + 4 <= n; k += 4)
            for (int j = 0; j < 4; ++j) l[j] += buf[k + j];
          for (; k < n; ++k) l[0] += buf[k];
          const double mean = ((l[0] + l[1]) + (l[2] + l[3])) / static_cast<double>(n);
          double q[4] = {0, 0, 0, 0};
          for (k = 0; k + 4 <= n; k += 4)
            for (int j = 0; j < 4; ++j) q[j] += (buf[k + j] - mean) * (buf[k + j] - mean);
          for (; k < n; ++k) q[0] += (buf[k] - mean) * (buf[k] - mean);
          const double var = ((q[0] + q[1]) + (q[2] + q[3])) / static_cast<double>(n);
          const double rstd = 1.0 / std::sqrt(var + eps);
          T* out = y + r * n;
          for (k = 0; k < n; ++k)
            out[k] = st<T>(static_cast<comp_t<T>>((buf[k] - mean) * rstd * weight[k] + bias[k]));
        }
      });
    });
  }
};

}  // namespace

namespace norm {
void register_rows(sdk::KernelTable& t) {
  const auto k11 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d}; };
  const std::vector<uint8_t> s1{kStrided};
  add_rows<SoftmaxK<false>::K, BP_CPU_FLOAT_DTYPES>(t, "softmax", k11, s1);
  add_rows<SoftmaxK<true>::K, BP_CPU_FLOAT_DTYPES>(t, "log_softmax", k11, s1);
}
void register_layer_norm(sdk::KernelTable& t) {
  const auto kln = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, d, d}; };
  add_rows<LayerNormK, BP_CPU_FLOAT_DTYPES>(t, "layer_norm", kln, {kStrided, kStrided, kStrided});
}
}  // namespace norm

}  // namespace backplane::cpu
