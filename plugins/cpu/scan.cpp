// selective_scan: Mamba's S6 recurrence (docs/ops.md). Every (batch, channel)
// pair carries its own state h[N] through the L steps, so pairs are the unit
// of parallel work; the state is f32 (f64 for f64 inputs).
#include "kernels.hpp"
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

}  // namespace

void register_scan(sdk::KernelTable& t) {
  const auto key = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, d, d, d, d}; };
  add_rows<SelectiveScanK, BP_CPU_FLOAT_DTYPES>(t, "selective_scan", key,
                                                {kStrided, kStrided, kStrided, kStrided, kStrided}, 2);
}

}  // namespace backplane::cpu
