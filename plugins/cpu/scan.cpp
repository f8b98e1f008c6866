// Scans: cumsum along one dim, and selective_scan, Mamba's S6 recurrence
// (docs/ops.md). In selective_scan every (batch, channel) pair carries its
// own state h[N] through the L steps, so pairs are the unit of parallel
// work; the state is f32 (f64 for f64 inputs).
#include "kernels.hpp"
#include "rowwalk.hpp"
#include "vecmath.hpp"

#include <algorithm>

namespace backplane::cpu {
namespace {

template <bp_dtype D> struct SelectiveScanK {
  static void impl(const Call& c) {
    c.expect(5, BP_PARAMS_SELECTIVE_SCAN);
    using T = st_t<D>;
    using S = comp_t<T>;  // float, or double for f64
    const bp_layout& lu = c.in_layout(0);
    const bp_layout& ld_ = c.in_layout(1);
    const bp_layout& la = c.in_layout(2);
    const bp_layout& lb = c.in_layout(3);
    const bp_layout& lc = c.in_layout(4);
    BP_SDK_CHECK(lu.rank == 3 && ld_.rank == 3 && la.rank == 2 && lb.rank == 3 && lc.rank == 3, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": expected u, delta [B,L,D], a [D,N], b, c [B,L,N]");
    const int64_t B = lu.shape[0], L = lu.shape[1], Dn = lu.shape[2], N = la.shape[1];
    bool ok = ld_.shape[0] == B && ld_.shape[1] == L && ld_.shape[2] == Dn && la.shape[0] == Dn;
    for (const bp_layout* l : {&lb, &lc}) ok = ok && l->shape[0] == B && l->shape[1] == L && l->shape[2] == N;
    BP_SDK_CHECK(ok, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": shapes u " + dims_str(lu) + ", delta " + dims_str(ld_) + ", a " + dims_str(la) +
                   ", b " + dims_str(lb) + ", c " + dims_str(lc) + " do not fit");
    expect_numel(c, c.slot(0).layout, B * L * Dn, "y");
    expect_numel(c, c.slot(1).layout, B * Dn * N, "last_state");
    const bool softplus = c.params->u.selective_scan.delta_softplus;
    const T* u = c.in_data<T>(0);
    const T* dl = c.in_data<T>(1);
    const T* a = c.in_data<T>(2);
    const T* bm = c.in_data<T>(3);
    const T* cm = c.in_data<T>(4);
    T* y = c.slot_data<T>(0);
    T* last = c.slot_data<T>(1);
    const int64_t cost = std::max<int64_t>(1, L * std::max<int64_t>(N, 1) * 8);
    pfor(c, B * Dn, kGrain / cost, [&](int64_t p0, int64_t p1) {
      std::vector<S> h(static_cast<size_t>(N)), ai(static_cast<size_t>(N)), bt(static_cast<size_t>(N)), ct(static_cast<size_t>(N)),
          ea(static_cast<size_t>(N));
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t bb = p / Dn, i = p % Dn;
        for (int64_t j = 0; j < N; ++j) {
          h[j] = S(0);
          ai[j] = ld(a[la.offset + i * la.strides[0] + j * la.strides[1]]);
        }
        for (int64_t t = 0; t < L; ++t) {
          S d = ld(dl[ld_.offset + bb * ld_.strides[0] + t * ld_.strides[1] + i * ld_.strides[2]]);
          if (softplus) d = (d > S(0) ? d : S(0)) + std::log1p(std::exp(-std::fabs(d)));
          const S ut = ld(u[lu.offset + bb * lu.strides[0] + t * lu.strides[1] + i * lu.strides[2]]);
          const T* brow = bm + lb.offset + bb * lb.strides[0] + t * lb.strides[1];
          const T* crow = cm + lc.offset + bb * lc.strides[0] + t * lc.strides[1];
          for (int64_t j = 0; j < N; ++j) {
            bt[j] = ld(brow[j * lb.strides[2]]);
            ct[j] = ld(crow[j * lc.strides[2]]);
          }
          const S du = d * ut;
          for (int64_t j = 0; j < N; ++j) ea[j] = d * ai[j];
          if constexpr (std::is_same_v<S, float>) {
            exp_shifted(ea.data(), 0.0f, ea.data(), N);
          } else {
            for (int64_t j = 0; j < N; ++j) ea[j] = std::exp(ea[j]);
          }
          S acc = S(0);
          for (int64_t j = 0; j < N; ++j) {
            h[j] = ea[j] * h[j] + du * bt[j];
            acc += h[j] * ct[j];
          }
          y[(bb * L + t) * Dn + i] = st<T>(acc);
        }
        for (int64_t j = 0; j < N; ++j) last[(bb * Dn + i) * N + j] = st<T>(h[j]);
      }
    });
  }
};

template <bp_dtype D> struct CumsumK {
  static void impl(const Call& c) {
    c.expect(1, BP_PARAMS_DIM);
    using T = st_t<D>;
    using A = sum_acc_t<D>;
    const bp_layout& in = c.in_layout(0);
    const bp_layout& ol = c.out_layout();
    const bp_dim_params& p = c.params->u.dim;
    const int dim = checked_dim(c, in, p.dim);
    expect_numel(c, ol, sdk::numel(in));
    if (sdk::numel(in) == 0) return;
    const int64_t n = in.shape[dim], s = in.strides[dim], so = ol.strides[dim];
    const T* x = c.in_data<T>(0);
    T* y = c.out_data<T>();
    const bool excl = p.exclusive, rev = p.reverse;
    for_row_runs<2>(c, in, dim, {&in, &ol}, n, [&] {
      return [&](const int64_t* roff, int64_t cnt, const int64_t* rs) {
        if (rs[0] == 1 && rs[1] == 1 && s != 1 && cnt >= 8) {
          // Side by side over adjacent rows (each step reads a contiguous stretch).
          for (int64_t r0 = 0; r0 < cnt; r0 += kColumns) {
            const int64_t R = std::min(kColumns, cnt - r0);
            const T* x0 = x + roff[0] + r0;
            T* y0 = y + roff[1] + r0;
            A acc[kColumns] = {};
            for (int64_t k = 0; k < n; ++k) {
              const int64_t i = rev ? n - 1 - k : k;
              for (int64_t r = 0; r < R; ++r) {
                const A v = widen<D>(x0[i * s + r]);
                if (excl) {
                  y0[i * so + r] = narrow<D>(acc[r]);
                  acc[r] += v;
                } else {
                  acc[r] += v;
                  y0[i * so + r] = narrow<D>(acc[r]);
                }
              }
            }
          }
          return;
        }
        for (int64_t rr = 0; rr < cnt; ++rr) {
        const T* row = x + roff[0] + rr * rs[0];
        T* out = y + roff[1] + rr * rs[1];
        A acc = 0;
        for (int64_t k = 0; k < n; ++k) {
          const int64_t i = rev ? n - 1 - k : k;
          const A v = widen<D>(row[i * s]);  // read before the write: in-place is fine
          if (excl) {
            out[i * so] = narrow<D>(acc);
            acc += v;
          } else {
            acc += v;
            out[i * so] = narrow<D>(acc);
          }
        }
        }
      };
    });
  }
};

}  // namespace

void register_scan(sdk::KernelTable& t) {
  const auto key = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, d, d, d, d}; };
  add_rows<SelectiveScanK, BP_CPU_FLOAT_DTYPES>(t, "selective_scan", key,
                                                {kStrided, kStrided, kStrided, kStrided, kStrided}, 2);
}

namespace scan {
void register_cumsum(sdk::KernelTable& t) {
  const auto k11 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d}; };
  add_rows<CumsumK, BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES>(t, "cumsum", k11, {kStrided});
}
}  // namespace scan

}  // namespace backplane::cpu
