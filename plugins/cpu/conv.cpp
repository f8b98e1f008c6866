// conv2d (float dtypes, as docs/ops.md says): on the packed GEMM (gemm.hpp)
// with its B operand packed straight from the image (implicit im2col), the
// direct depthwise kernel, Winograd for wide 3x3 stride-1 convolutions
// (winograd.cpp), oneDNN where it is faster (onednn.cpp); and the fused
// vendor ops cpu.conv2d_relu / cpu.conv2d_clamp.
#include "gemm.hpp"
#include "kernels.hpp"
#include "onednn.hpp"
#include "stem.hpp"
#include "packed.hpp"
#include "winograd.hpp"

#include <backplane/sdk/params.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

namespace backplane::cpu {
namespace {

// conv2d's B operand, [Cg*kH*kW, OH*OW], read straight from the image
// (implicit im2col). A panel's columns are cut into runs along one output
// row; for each (channel, kh, kw) row a run reads one input row at a fixed
// step, with the columns that fall in the padding found by arithmetic, not
// tested one by one (the reduction rows' offsets are computed once per call,
// not with three divisions per row and panel).
template <class T, class P> struct Im2colB {
  const T* x;  // the image's first channel of the group
  int64_t xs1, xs2, xs3;
  int64_t H, W, kH, kW, OW, sh, sw, pt, pl, dh, dw;
  void pack(int64_t pc, int64_t kc, int64_t jc, int64_t nc, int64_t nr, int64_t p0, int64_t p1, P* bp) const {
    constexpr int64_t kMaxKc = 256, kMaxNr = 64;  // gemm_packed's KC; the widest NR is 32
    int64_t koff[kMaxKc], kdh[kMaxKc], kdw[kMaxKc];
    for (int64_t k = 0; k < kc; ++k) {
      const int64_t r = pc + k, ci = r / (kH * kW), kh = (r / kW) % kH, kw = r % kW;
      koff[k] = ci * xs1;
      kdh[k] = kh * dh;
      kdw[k] = kw * dw;
    }
    struct Run {
      int64_t j0, len, ih0, iw0;
    } runs[kMaxNr];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t cols = std::min(nr, nc - p * nr);
      P* dst = bp + p * nr * kc;
      int64_t nrun = 0;
      for (int64_t j = 0; j < cols;) {
        const int64_t q = jc + p * nr + j, oh = q / OW, ow = q % OW;
        const int64_t len = std::min(cols - j, OW - ow);
        runs[nrun++] = Run{j, len, oh * sh - pt, ow * sw - pl};
        j += len;
      }
      for (int64_t k = 0; k < kc; ++k) {
        P* d = dst + k * nr;
        const T* xk = x + koff[k];
        for (int64_t ri = 0; ri < nrun; ++ri) {
          const Run& u = runs[ri];
          P* dr = d + u.j0;
          const int64_t ih = u.ih0 + kdh[k];
          if (ih < 0 || ih >= H) {
            std::fill(dr, dr + u.len, P(0));
            continue;
          }
          // Column i of the run reads input column iw0 + i * sw: inside for i in [a, b).
          const int64_t iw0 = u.iw0 + kdw[k];
          const int64_t a = iw0 >= 0 ? 0 : std::min(u.len, (sw - 1 - iw0) / sw);
          const int64_t b = std::max(a, std::min(u.len, iw0 < W ? (W - iw0 + sw - 1) / sw : int64_t{0}));
          std::fill(dr, dr + a, P(0));
          const T* xr = xk + ih * xs2 + (iw0 + a * sw) * xs3;
          const int64_t step = sw * xs3;
          P* __restrict o = dr + a;
          if (step == 1) {
            for (int64_t i = 0; i < b - a; ++i) o[i] = static_cast<P>(ld(xr[i]));
          } else {
            for (int64_t i = 0; i < b - a; ++i) o[i] = static_cast<P>(ld(xr[i * step]));
          }
          std::fill(dr + b, dr + u.len, P(0));
        }
        std::fill(d + cols, d + nr, P(0));  // columns past n
      }
    }
  }
};

// Depthwise conv2d (one input channel per filter): a direct sum per output
// plane. The input plane is first copied, converted to P and padded with
// zeros, as `sw` phase planes (phase p holds columns p, p + sw, ...), so
// every filter tap is one contiguous multiply-add run along an output row,
// whatever the stride; a 3x3 filter takes its nine taps in one pass.
struct DwGeom {
  int64_t N, H, W, O, Og, kH, kW, sh, sw, dh, dw, pt, pl, OH, OW;
  int64_t xs0, xs1, xs2, xs3;
  int64_t Hp, Wq;        // padded rows, columns per phase row
  const int64_t* taps;   // [kH * kW]: where each tap's run starts in the phase planes, from output row 0
};

// out[OH, OW] = bias + the taps of w [kH, kW] over the phase planes pb
// ([sw][Hp][Wq]).
template <class P>
[[gnu::always_inline]] inline void dw_plane(const DwGeom& g, const P* __restrict pb, const P* w, P bias, P* __restrict out) {
  const int64_t OW = g.OW;
  const int64_t* t = g.taps;
  for (int64_t oh = 0; oh < g.OH; ++oh) {
    P* __restrict acc = out + oh * OW;
    const P* row = pb + oh * g.sh * g.Wq;
    if (g.kH == 3 && g.kW == 3) {
      const P* __restrict s0 = row + t[0];
      const P* __restrict s1 = row + t[1];
      const P* __restrict s2 = row + t[2];
      const P* __restrict s3 = row + t[3];
      const P* __restrict s4 = row + t[4];
      const P* __restrict s5 = row + t[5];
      const P* __restrict s6 = row + t[6];
      const P* __restrict s7 = row + t[7];
      const P* __restrict s8 = row + t[8];
      for (int64_t i = 0; i < OW; ++i)
        acc[i] = bias + w[0] * s0[i] + w[1] * s1[i] + w[2] * s2[i] + w[3] * s3[i] + w[4] * s4[i] + w[5] * s5[i] +
                 w[6] * s6[i] + w[7] * s7[i] + w[8] * s8[i];
      continue;
    }
    for (int64_t i = 0; i < OW; ++i) acc[i] = bias;
    for (int64_t k = 0; k < g.kH * g.kW; ++k) {
      const P* __restrict src = row + t[k];
      const P wv = w[k];
      for (int64_t i = 0; i < OW; ++i) acc[i] += wv * src[i];
    }
  }
}

template <class P> using DwPlaneFn = void (*)(const DwGeom&, const P*, const P*, P, P*);
#define BP_CPU_DW(NAME, TARGET, P) \
  TARGET void NAME(const DwGeom& g, const P* pb, const P* w, P bias, P* out) { dw_plane<P>(g, pb, w, bias, out); }
#if defined(__x86_64__)
BP_CPU_DW(dw_f32_avx512, BP_CPU_AVX512, float)
BP_CPU_DW(dw_f64_avx512, BP_CPU_AVX512, double)
BP_CPU_DW(dw_f32_avx2, BP_CPU_AVX2, float)
BP_CPU_DW(dw_f64_avx2, BP_CPU_AVX2, double)
#endif
BP_CPU_DW(dw_f32_base, , float)
BP_CPU_DW(dw_f64_base, , double)
#undef BP_CPU_DW

template <class P> DwPlaneFn<P> pick_dw() {
  constexpr bool f = std::is_same_v<P, float>;
#if defined(__x86_64__)
  switch (isa()) {
    case Isa::avx512:
      if constexpr (f) return dw_f32_avx512;
      else return dw_f64_avx512;
    case Isa::avx2:
      if constexpr (f) return dw_f32_avx2;
      else return dw_f64_avx2;
    default:
      break;
  }
#endif
  if constexpr (f) return dw_f32_base;
  else return dw_f64_base;
}

// Phase rows of one input row xr (padded row r of each phase plane, d at
// phase 0's): element j of phase p is input column j * sw + p - pl, zero
// outside the image. Stride 2 reads each pair of columns once.
template <class T, class P> void dw_fill_row(const T* xr, const DwGeom& g, P* d) {
  const int64_t sw = g.sw, pl = g.pl, cs = g.xs3, plane = g.Hp * g.Wq;
  // Phase p is inside the image for j in [lo(p), hi(p)).
  auto lo = [&](int64_t p) { return std::clamp<int64_t>((pl - p + sw - 1) / sw, 0, g.Wq); };
  auto hi = [&](int64_t p) { return std::clamp<int64_t>((g.W + pl - p + sw - 1) / sw, lo(p), g.Wq); };
  auto phase = [&](int64_t p, int64_t j0, int64_t j1) {
    P* __restrict dp = d + p * plane;
    for (int64_t j = j0; j < j1; ++j) dp[j] = static_cast<P>(ld(xr[(j * sw + p - pl) * cs]));
  };
  for (int64_t p = 0; p < sw; ++p) {
    P* dp = d + p * plane;
    std::fill(dp, dp + lo(p), P(0));
    std::fill(dp + hi(p), dp + g.Wq, P(0));
  }
  if (sw == 1 && cs == 1) {
    const T* __restrict src = xr + lo(0) - pl;
    P* __restrict dst = d + lo(0);
    const int64_t n = hi(0) - lo(0);
    if constexpr (std::is_same_v<T, P>) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(P));
    else for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<P>(ld(src[j]));
    return;
  }
  if (sw == 2 && cs == 1) {
    const int64_t j0 = std::max(lo(0), lo(1)), j1 = std::max(j0, std::min(hi(0), hi(1)));
    phase(0, lo(0), j0);
    phase(1, lo(1), j0);
    const T* __restrict src = xr + 2 * j0 - pl;
    P* __restrict d0 = d + j0;
    P* __restrict d1 = d + plane + j0;
    for (int64_t k = 0; k < j1 - j0; ++k) {
      d0[k] = static_cast<P>(ld(src[2 * k]));
      d1[k] = static_cast<P>(ld(src[2 * k + 1]));
    }
    phase(0, j1, hi(0));
    phase(1, j1, hi(1));
    return;
  }
  for (int64_t p = 0; p < sw; ++p) phase(p, lo(p), hi(p));
}

// v clipped to [lo, hi], NaN kept (std::max/min return their first argument
// when a comparison is false), branch-free so loops of it vectorize.
template <class P> inline P clip(P v, P lo, P hi) { return std::min(std::max(v, lo), hi); }

// An activation's bounds: relu is [0, inf).
inline std::pair<float, float> act_bounds(const onednn::Activation& act) {
  if (act.kind == onednn::Activation::Relu) return {0.0f, INFINITY};
  if (act.kind == onednn::Activation::Clip) return {act.lo, act.hi};
  return {-INFINITY, INFINITY};
}

// y (dense) = act(depthwise conv2d(x, w) + bias): x at x[0, 0, 0, 0], w dense
// [O, 1, kH, kW] and bias [O] in P. Output planes are split over the threads;
// the activation runs on each plane while it is still in cache.
template <class T, class P>
void conv2d_depthwise(const Call& c, DwGeom g, const T* x, const P* w, const P* bias, T* y,
                      const onednn::Activation& act = {}) {
  const bool has_act = act.kind != onednn::Activation::None;
  const auto [act_lo, act_hi] = act_bounds(act);
  const P lo = static_cast<P>(act_lo), hi = static_cast<P>(act_hi);
  g.Hp = (g.OH - 1) * g.sh + (g.kH - 1) * g.dh + 1;
  g.Wq = g.OW + ((g.kW - 1) * g.dw) / g.sw;
  std::vector<int64_t> taps(static_cast<size_t>(g.kH * g.kW));
  for (int64_t kh = 0; kh < g.kH; ++kh)
    for (int64_t kw = 0; kw < g.kW; ++kw)
      taps[static_cast<size_t>(kh * g.kW + kw)] =
          ((kw * g.dw) % g.sw) * g.Hp * g.Wq + kh * g.dh * g.Wq + (kw * g.dw) / g.sw;
  g.taps = taps.data();
  const DwPlaneFn<P> plane_fn = pick_dw<P>();
  const int64_t planes = g.N * g.O, L = g.OH * g.OW;
  pfor(c, planes, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, L * g.kH * g.kW)), [&](int64_t p0, int64_t p1) {
    std::vector<P> pb(static_cast<size_t>(g.sw * g.Hp * g.Wq)), tmp(std::is_same_v<T, P> ? 0 : static_cast<size_t>(L));
    int64_t filled = -1;  // the input plane pb holds (planes of one channel share it)
    for (int64_t pi = p0; pi < p1; ++pi) {
      const int64_t o = pi % g.O, n = pi / g.O, ci = n * (g.O / g.Og) + o / g.Og;
      if (ci != filled) {
        const T* xc = x + n * g.xs0 + (o / g.Og) * g.xs1;
        for (int64_t r = 0; r < g.Hp; ++r) {
          P* d = pb.data() + r * g.Wq;
          const int64_t ih = r - g.pt;
          if (ih < 0 || ih >= g.H) {
            for (int64_t p = 0; p < g.sw; ++p) std::fill(d + p * g.Hp * g.Wq, d + p * g.Hp * g.Wq + g.Wq, P(0));
            continue;
          }
          dw_fill_row<T, P>(xc + ih * g.xs2, g, d);
        }
        filled = ci;
      }
      T* yp = y + pi * L;
      if constexpr (std::is_same_v<T, P>) {
        plane_fn(g, pb.data(), w + o * g.kH * g.kW, bias[o], yp);
        if (has_act)
          for (int64_t i = 0; i < L; ++i) yp[i] = clip(yp[i], lo, hi);
      } else {
        plane_fn(g, pb.data(), w + o * g.kH * g.kW, bias[o], tmp.data());
        if (has_act)
          for (int64_t i = 0; i < L; ++i) tmp[static_cast<size_t>(i)] = clip(tmp[static_cast<size_t>(i)], lo, hi);
        for (int64_t i = 0; i < L; ++i) yp[i] = st<T>(static_cast<comp_t<T>>(tmp[static_cast<size_t>(i)]));
      }
    }
  });
}


template <class T> void activate(const Call& c, const onednn::Activation& act);
template <class T> void add_residual(const Call& c, const onednn::Activation& act, bool nhwc, const onednn::Residual& r);

// Whether l covers [offset, offset + numel) exactly once: a dense layout
// with its dims in some order (a permute view of a dense value).
bool dense_permuted(const bp_layout& l) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims that are not 1
  for (uint32_t d = 0; d < l.rank; ++d)
    if (l.shape[d] != 1) dims.emplace_back(l.strides[d], l.shape[d]);
  std::sort(dims.begin(), dims.end());
  int64_t expect = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expect) return false;
    expect *= size;
  }
  return true;
}

// The largest |element| of f32 input i, or NaN when an element is NaN or
// infinite. Constant inputs (weights) are scanned once and the answer kept
// with them.
float max_abs_f32(const Call& c, size_t i) {
  auto scan = [&] {
    const bp_layout& given = c.in_layout(i);
    // A permute of a dense value (a channels-last view) is read as the one
    // run of memory it covers: the maximum does not depend on the order.
    bp_layout flat{};
    if (dense_permuted(given)) {
      flat = given;
      flat.rank = 1;
      flat.shape[0] = sdk::numel(given);
      flat.strides[0] = 1;
    }
    const bp_layout& l = flat.rank == 1 ? flat : given;
    const float* base = c.in_data<float>(i);
    float m = 0.0f, z = 0.0f;  // z: the sum of v * 0, NaN once any v is NaN or infinite
    const sdk::StridedWalker<1> walk(l.rank, l.shape, {&l});
    walk.run_all([&](const int64_t* off, int64_t n, const int64_t* st) {
      const float* p = base + off[0];
      if (st[0] == 1) {
        for (int64_t k = 0; k < n; ++k) {
          m = std::max(m, std::fabs(p[k]));
          z += p[k] * 0.0f;
        }
      } else {
        for (int64_t k = 0; k < n; ++k) {
          m = std::max(m, std::fabs(p[k * st[0]]));
          z += p[k * st[0]] * 0.0f;
        }
      }
    });
    return z == 0.0f ? m : NAN;
  };
  if (!packed::constant(c, i)) return scan();
  return *packed::get<float>(c, i, "max_abs", [&] { return std::make_shared<float>(scan()); });
}

// Whether relu or clip of conv2d(x, w, b) may run as oneDNN's post-op: its
// injector turns NaN into a bound where docs/ops.md keeps NaN, so only when
// no output can be NaN or infinite: x, w and b finite and K * max|x| * max|w|
// + max|b| below f32's largest value.
bool post_op_safe(const Call& c, int64_t K) {
  const float mx = max_abs_f32(c, 0), mw = max_abs_f32(c, 1), mb = c.has_input(2) ? max_abs_f32(c, 2) : 0.0f;
  const double bound = static_cast<double>(K) * mx * mw + mb;
  return bound < 1e38;  // false when any is NaN
}

template <bp_dtype D> struct Conv2dK {
  static void impl(const Call& c) { run(c, {}); }
  // conv2d, then `act` over its output: fused into oneDNN's output pass
  // (a post-op) where oneDNN runs it, else one pass over y afterwards.
  // `res`: act(conv2d + res) (cpu.conv2d_add_relu*, f32).
  static void run(const Call& c, const onednn::Activation& act, bool nhwc = false,
                  const onednn::Residual* res = nullptr) {
    if (res && !nhwc) {
      conv(c, {});
      add_residual<st_t<D>>(c, act, false, *res);
      return;
    }
    if (!conv(c, act, nhwc, res)) activate<st_t<D>>(c, act);
  }
  // True when `act` (and `res`, which only the channels-last form takes)
  // was applied too. `nhwc`: the output layout is the [N, O, OH, OW] view (a
  // permute) of a dense channels-last output (cpu.conv2d*_nhwc), and y is
  // written channels-last.
  static bool conv(const Call& c, const onednn::Activation& act, bool nhwc = false,
                   const onednn::Residual* res = nullptr) {
    c.expect(3, BP_PARAMS_CONV2D);
    using T = st_t<D>;
    using P = gemm_p_t<T>;
    const bp_conv2d_params& p = c.params->u.conv2d;
    const bp_layout& lx = c.in_layout(0);
    const bp_layout& lw = c.in_layout(1);
    const bp_layout& lo = c.out_layout();
    BP_SDK_CHECK(lx.rank == 4 && lw.rank == 4 && lo.rank == 4, BP_ERR_INVALID_ARGUMENT,
               std::string(c.op) + ": x, w and the output must be 4-D");
    const int64_t N = lx.shape[0], C = lx.shape[1], H = lx.shape[2], W = lx.shape[3];
    const int64_t O = lw.shape[0], Cg = lw.shape[1], kH = lw.shape[2], kW = lw.shape[3], G = p.groups;
    const int64_t sh = p.stride[0], sw = p.stride[1], dh = p.dilation[0], dw = p.dilation[1];
    const int64_t pt = p.padding[0], pl = p.padding[1], pb = p.padding[2], pr = p.padding[3];
    BP_SDK_CHECK(G >= 1 && C == Cg * G && O % G == 0 && sh >= 1 && sw >= 1 && dh >= 1 && dw >= 1 && pt >= 0 && pl >= 0 &&
                   pb >= 0 && pr >= 0,
               BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": bad geometry for x " + dims_str(lx) + ", w " + dims_str(lw));
    const int64_t OH = (H + pt + pb - dh * (kH - 1) - 1) / sh + 1, OW = (W + pl + pr - dw * (kW - 1) - 1) / sw + 1;
    BP_SDK_CHECK(lo.shape[0] == N && lo.shape[1] == O && lo.shape[2] == std::max<int64_t>(OH, 0) &&
                   lo.shape[3] == std::max<int64_t>(OW, 0),
               BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": output " + dims_str(lo) + " does not match the geometry");
    const bool has_bias = c.has_input(2);
    if (has_bias) expect_numel(c, c.in_layout(2), O, "bias");
    if (sdk::numel(lo) == 0) return true;
    const int64_t Og = O / G, Kd = Cg * kH * kW, L = OH * OW;
    // Depthwise convolutions (MobileNet's 3x3s) always take the direct
    // kernel below: oneDNN's reorders of x into and y out of its channel-last
    // format cost several times its arithmetic (1x32x112x112: 4.8 against
    // 0.24 ms on one thread), and a GEMM of one row per group wastes the tile.
    const bool depthwise = Cg == 1 && Og <= 4;
    const int64_t xs0 = lx.strides[0], xs1 = lx.strides[1], xs2 = lx.strides[2], xs3 = lx.strides[3];
    const WinogradConv wg{N, C, H, W, O, G, pt, pl, OH, OW, {xs0, xs1, xs2, xs3}};
    const bool winograd = !std::is_same_v<P, double> && kH == 3 && kW == 3 && sh == 1 && sw == 1 && dh == 1 && dw == 1 &&
                          winograd_pays(wg);
    // f32 3x3 stride-1 convolutions with tiles enough to spread the filter
    // transform over take Winograd before oneDNN: 2.25x fewer multiplies
    // beat oneDNN's direct brgconv on AVX-512 (CPU time on one thread,
    // 1x64x56x56 -> 64: 1.4 against 2.6 ms; 1x128x28x28: 1.9 against 2.6;
    // 8x64x56x56: 12.2 against 22.1), but not 1x256x14x14 (3.7 against 2.7).
    const int64_t tiles = N * ((OH + 1) / 2) * ((OW + 1) / 2);
    const bool winograd_first = winograd && D == BP_DTYPE_F32 && tiles * 512 >= Cg * Og;
    if (nhwc) {
      // oneDNN's channels-last kernels, with no reorder on either side (the
      // activation applied exactly, NaN kept, on each piece while it is in
      // cache); else the NCHW paths below into a scratch output, transposed
      // into y.
      const onednn::ConvGeom geom{N,  C,  H,  W,  O,  Cg, kH, kW, G,  sh,  sw,
                                  dh, dw, pt, pl, pb, pr, OH, OW, act, res ? *res : onednn::Residual{}};
      if constexpr (D == BP_DTYPE_F32)
        if (stem_nhwc(c, geom)) return true;
      if (onednn::conv2d_nhwc(c, D, geom)) return true;
      std::vector<T> tmp(static_cast<size_t>(N * O * L));
      bp_storage tmp_out = c.out[0];
      tmp_out.data = tmp.data();
      tmp_out.byte_size = tmp.size() * sizeof(T);
      std::vector<bp_layout> lays(c.lay, c.lay + c.n_in + 1);
      lays[c.n_in] = sdk::contiguous_layout(lo.shape, 4);
      Call t = c;
      t.out = &tmp_out;
      t.lay = lays.data();
      if (res)
        conv(t, {});
      else if (!conv(t, act))
        activate<T>(t, act);
      T* yd = c.out_data<T>();
      pfor(c, N * L, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, O)), [&](int64_t q0, int64_t q1) {
        for (int64_t q = q0; q < q1; ++q) {
          const int64_t n = q / L, i = q % L;
          const T* src = tmp.data() + n * O * L + i;
          T* dst = yd + q * O;
          for (int64_t o = 0; o < O; ++o) dst[o] = src[o * L];
        }
      });
      if (res) add_residual<T>(c, act, true, *res);
      return true;
    }
    if (!depthwise && !winograd_first) {
      onednn::Activation fused = act;
      if (act.kind != onednn::Activation::None && !(D == BP_DTYPE_F32 && post_op_safe(c, Kd))) fused = {};
      if (onednn::conv2d(c, D, {N, C, H, W, O, Cg, kH, kW, G, sh, sw, dh, dw, pt, pl, pb, pr, OH, OW, fused}))
        return fused.kind == act.kind;
    }
    const T* x = c.in_data<T>(0);
    T* y = c.out_data<T>();
    // Constant weights transformed for Winograd are made once and kept with
    // them (packed.hpp): keyed on the geometry and the weights' layout.
    std::shared_ptr<const WinogradFilters> kept;
    const bool keep = winograd && std::is_same_v<P, float> && packed::constant(c, 1);
    // Weights dense as [O, Kd] in the GEMM type (not needed when kept ones serve).
    std::vector<P> wd;
    auto dense_weights = [&] {
      wd.resize(static_cast<size_t>(O * Kd));
      const T* w = c.in_data<T>(1);
      int64_t k = 0;
      const sdk::StridedWalker<1> ww(lw.rank, lw.shape, {&lw});
      ww.run_all([&](const int64_t* off, int64_t n, const int64_t* s) {
        for (int64_t i = 0; i < n; ++i) wd[static_cast<size_t>(k++)] = static_cast<P>(ld(w[off[0] + i * s[0]]));
      });
    };
    if constexpr (std::is_same_v<P, float>) {
      if (keep) {
        std::string key = "winograd";
        for (int64_t v : {N, C, H, W, O, G, pt, pl, OH, OW, lw.offset, lw.strides[0], lw.strides[1], lw.strides[2],
                          lw.strides[3], static_cast<int64_t>(D)})
          key.append(",").append(std::to_string(v));
        kept = packed::get<WinogradFilters>(c, 1, key, [&] {
          dense_weights();
          return std::const_pointer_cast<WinogradFilters>(winograd_filters(c, wg, wd.data()));
        });
      }
    }
    if (!kept) dense_weights();
    std::vector<P> bias(static_cast<size_t>(O), P(0));
    if (has_bias) {
      const bp_layout& lbias = c.in_layout(2);
      const T* bsrc = c.in_data<T>(2);
      for (int64_t o = 0; o < O; ++o) bias[o] = static_cast<P>(ld(bsrc[lbias.offset + o * lbias.strides[0]]));
    }
    if (depthwise) {
      conv2d_depthwise<T, P>(c, DwGeom{N, H, W, O, Og, kH, kW, sh, sw, dh, dw, pt, pl, OH, OW, xs0, xs1, xs2, xs3, 0, 0, nullptr},
                             x + lx.offset, wd.data(), bias.data(), y, act);
      return true;
    }
    if constexpr (std::is_same_v<P, float>) {
      if (winograd) {
        conv2d_winograd<T>(c, wg, x + lx.offset, kept ? nullptr : wd.data(), bias.data(), y, kept.get());
        return false;
      }
    }
    // A 1x1 convolution at stride 1 without padding is a plain GEMM whose B
    // is the image itself, [Cg, H * W], when its pixels are one stride apart.
    const bool pointwise = kH == 1 && kW == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && pb == 0 && pr == 0 &&
                           (H == 1 || W == 1 || xs2 == W * xs3);
    const int64_t pixel_stride = W == 1 ? xs2 : xs3;
    // The activation, in the bias pass of each product.
    const bool has_act = act.kind != onednn::Activation::None;
    const P act_lo_p = static_cast<P>(act_bounds(act).first), act_hi_p = static_cast<P>(act_bounds(act).second);
    // One (image, group) product; tmp holds the f32 result of a half type.
    auto product = [&](int64_t n, int64_t g, std::vector<P>& tmp) {
      const T* xg = x + lx.offset + n * xs0 + g * Cg * xs1;
      const P* wg = wd.data() + g * Og * Kd;
      T* yg = y + (n * O + g * Og) * L;
      P* cg = nullptr;
      if constexpr (std::is_same_v<T, P>) {
        cg = yg;
      } else {
        tmp.resize(static_cast<size_t>(Og * L));
        cg = tmp.data();
      }
      if (pointwise)
        gemm_packed<P>(c, Og, L, Kd, StridedA<P, P>{wg, Kd, 1}, StridedB<T, P>{xg, xs1, pixel_stride}, cg, L);
      else
        gemm_packed<P>(c, Og, L, Kd, StridedA<P, P>{wg, Kd, 1},
                       Im2colB<T, P>{xg, xs1, xs2, xs3, H, W, kH, kW, OW, sh, sw, pt, pl, dh, dw}, cg, L);
      pfor(c, Og, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, L)), [&](int64_t o0, int64_t o1) {
        for (int64_t o = o0; o < o1; ++o) {
          const P bv = bias[g * Og + o];
          P* row = cg + o * L;
          T* orow = yg + o * L;
          if (has_act)
            for (int64_t i = 0; i < L; ++i) orow[i] = st<T>(static_cast<comp_t<T>>(clip(row[i] + bv, act_lo_p, act_hi_p)));
          else
            for (int64_t i = 0; i < L; ++i) orow[i] = st<T>(static_cast<comp_t<T>>(row[i] + bv));
        }
      });
    };
    // Products too small for the GEMM to split (groups, small images) go one
    // per thread; larger ones one after another, each on every thread.
    const double flops = static_cast<double>(Og) * static_cast<double>(L) * static_cast<double>(Kd);
    if (N * G > 1 && flops < 2e6) {
      pfor(c, N * G, std::max<int64_t>(1, static_cast<int64_t>(2e6 / std::max(flops, 1.0))), [&](int64_t i0, int64_t i1) {
        std::vector<P> tmp;
        for (int64_t i = i0; i < i1; ++i) product(i / G, i % G, tmp);
      });
      return true;
    }
    std::vector<P> tmp;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < G; ++g) product(n, g, tmp);
    return true;
  }
};

// y = act(y) over the dense output (after the Winograd path): relu keeps
// NaN, clip is max(·, lo) then min(·, hi) and keeps NaN (docs/ops.md's relu
// and clamp).
template <class T> void activate(const Call& c, const onednn::Activation& act) {
  if (act.kind == onednn::Activation::None) return;
  T* y = c.out_data<T>();
  const int64_t n = sdk::numel(c.out_layout());
  const float lo = act_bounds(act).first, hi = act_bounds(act).second;
  pfor(c, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto v = ld(y[i]);
      y[i] = st<T>(static_cast<comp_t<T>>(clip<decltype(v)>(v, lo, hi)));
    }
  });
}

// y = act(y + r) over the dense output ([N, O, OH, OW], or [N, OH, OW, O]
// when `nhwc`; c.out_layout() is the [N, O, OH, OW] view either way), r read
// through its strides: the f32 add rounds as the add op does, then the
// activation keeps NaN as relu and clamp do.
template <class T> void add_residual(const Call& c, const onednn::Activation& act, bool nhwc, const onednn::Residual& r) {
  if constexpr (!std::is_same_v<T, float>) {
    BP_SDK_CHECK(false, BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": a shortcut input is f32 only");
  } else {
    const bp_layout& lo = c.out_layout();
    const int64_t N = lo.shape[0], O = lo.shape[1], H = lo.shape[2], W = lo.shape[3];
    const float lo_b = act_bounds(act).first, hi_b = act_bounds(act).second;
    float* y = c.out_data<float>();
    pfor(c, N * H, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, W * O)), [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        const int64_t n = row / H, h = row % H;
        for (int64_t w = 0; w < W; ++w)
          for (int64_t o = 0; o < O; ++o) {
            float& v = y[nhwc ? ((n * H + h) * W + w) * O + o : ((n * O + o) * H + h) * W + w];
            v = clip(v + r.data[n * r.s[0] + o * r.s[1] + h * r.s[2] + w * r.s[3]], lo_b, hi_b);
          }
      }
    });
  }
}

// The CPU plugin's fused vendor ops (manifests/cpu.json declares them with
// their decompositions, which are also the patterns the host substitutes):
//   cpu.conv2d_relu   relu(conv2d(x, w, b))
//   cpu.conv2d_clamp  clamp(conv2d(x, w, b), min, max)
// Params are conv2d's (stride, padding, dilation, groups in any of the forms
// docs/ops.md allows) and clamp's min and max (absent or null: no bound).
onednn::Activation read_conv_params(const Call& c, bp_op_params& out, onednn::Activation::Kind kind) {
  const bool clamp = kind == onednn::Activation::Clip;
  const sdk::VendorParams p(c.params, c.op);
  if (clamp)
    p.allow_only({"stride", "padding", "dilation", "groups", "min", "max"});
  else
    p.allow_only({"stride", "padding", "dilation", "groups"});
  auto pair = [&](const char* name, int64_t dflt, int64_t* dst, size_t n) { vendor_ints(p, c.op, name, dflt, dst, n); };
  std::memset(&out, 0, sizeof out);
  out.struct_size = sizeof out;
  out.kind = BP_PARAMS_CONV2D;
  pair("stride", 1, out.u.conv2d.stride, 2);
  pair("padding", 0, out.u.conv2d.padding, 4);
  pair("dilation", 1, out.u.conv2d.dilation, 2);
  out.u.conv2d.groups = p.integer("groups", 1);
  onednn::Activation act;
  act.kind = kind;
  if (clamp) {
    auto bound = [&](const char* name, float dflt) {
      const auto* raw = p.find(name);
      return !raw || raw->kind == sdk::VendorParams::Kind::Null ? dflt : static_cast<float>(p.number(name));
    };
    act.lo = bound("min", -INFINITY);
    act.hi = bound("max", INFINITY);
  }
  return act;
}

template <bp_dtype D, onednn::Activation::Kind Act> struct ConvActK {
  static void impl(const Call& c) {
    bp_op_params conv_params;
    const onednn::Activation act = read_conv_params(c, conv_params, Act);
    Call inner = c;
    inner.params = &conv_params;
    Conv2dK<D>::run(inner, act);
  }
};
template <bp_dtype D> using ConvReluK = ConvActK<D, onednn::Activation::Relu>;
template <bp_dtype D> using ConvClampK = ConvActK<D, onednn::Activation::Clip>;

// The channels-last variants (cpu.conv2d_nhwc, cpu.conv2d_relu_nhwc,
// cpu.conv2d_clamp_nhwc): permute(conv(...), [0, 2, 3, 1]), y dense
// [N, OH, OW, O]. The host's layout pass (docs/architecture.md) puts them
// where a chain of convolutions can stay channels-last; the convolution
// then sees y as the [N, O, OH, OW] view of that buffer.
// The [N, O, OH, OW] view (a permute) of a dense channels-last output
// [N, OH, OW, O]: what the convolution computes into.
bp_layout nchw_view_of_nhwc(const Call& c) {
  const bp_layout& lo = c.out_layout();
  BP_SDK_CHECK(lo.rank == 4, BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": the output must be 4-D [N, OH, OW, O]");
  const int64_t N = lo.shape[0], OH = lo.shape[1], OW = lo.shape[2], O = lo.shape[3];
  bp_layout v = lo;
  const int64_t shape[4] = {N, O, OH, OW}, strides[4] = {OH * OW * O, 1, OW * O, O};
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  return v;
}

template <bp_dtype D, onednn::Activation::Kind Act> struct ConvNhwcK {
  static void impl(const Call& c) {
    bp_op_params conv_params;
    const onednn::Activation act = read_conv_params(c, conv_params, Act);
    BP_SDK_CHECK(c.lay != nullptr && c.n_out == 1, BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": expected 1 output");
    std::vector<bp_layout> lays(c.lay, c.lay + c.n_in + 1);
    lays[c.n_in] = nchw_view_of_nhwc(c);
    Call inner = c;
    inner.params = &conv_params;
    inner.lay = lays.data();
    Conv2dK<D>::run(inner, act, true);
  }
};
// cpu.conv2d_add_relu (x, w, b, r): relu(conv2d(x, w, b) + r), a ResNet
// block's last convolution with its shortcut and activation in one pass
// over y; and cpu.conv2d_add_relu_nhwc, its channels-last variant. r has
// the output's [N, O, OH, OW] shape, any strides (the channels-last view of
// the block's input, in a chain).
template <bp_dtype D, bool Nhwc> struct ConvAddReluK {
  static void impl(const Call& c) {
    c.expect(4, BP_PARAMS_NONE);  // counts, ranks, every layout inside its storage
    BP_SDK_CHECK(c.has_input(3), BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": the shortcut r is missing");
    bp_op_params conv_params;
    const onednn::Activation act = read_conv_params(c, conv_params, onednn::Activation::Relu);
    const bp_layout& lr = c.in_layout(3);
    BP_SDK_CHECK(lr.rank == 4 && c.out_layout().rank == 4, BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": r and the output must be 4-D");
    std::vector<bp_layout> lays = {c.lay[0], c.lay[1], c.lay[2], Nhwc ? nchw_view_of_nhwc(c) : c.out_layout()};
    for (int i = 0; i < 4; ++i)
      BP_SDK_CHECK(lr.shape[i] == lays[3].shape[i], BP_ERR_INVALID_ARGUMENT,
                   std::string(c.op) + ": r " + dims_str(lr) + " is not the convolution's output shape");
    onednn::Residual res;
    res.data = c.in_data<float>(3) + lr.offset;
    for (int i = 0; i < 4; ++i) res.s[i] = lr.strides[i];
    Call inner = c;
    inner.n_in = 3;
    inner.params = &conv_params;
    inner.lay = lays.data();
    Conv2dK<D>::run(inner, act, Nhwc, &res);
  }
};
template <bp_dtype D> using ConvAddReluNchwK = ConvAddReluK<D, false>;
template <bp_dtype D> using ConvAddReluNhwcK = ConvAddReluK<D, true>;

template <bp_dtype D> using ConvNhwcNoneK = ConvNhwcK<D, onednn::Activation::None>;
template <bp_dtype D> using ConvReluNhwcK = ConvNhwcK<D, onednn::Activation::Relu>;
template <bp_dtype D> using ConvClampNhwcK = ConvNhwcK<D, onednn::Activation::Clip>;

}  // namespace

void register_conv(sdk::KernelTable& t) {
  const auto k31 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, d, d}; };
  add_rows<Conv2dK, BP_CPU_FLOAT_DTYPES>(t, "conv2d", k31, {kStrided, kStrided, kStrided});
  add_rows<ConvReluK, BP_DTYPE_F32>(t, "cpu.conv2d_relu", k31, {kStrided, kStrided, kStrided});
  add_rows<ConvClampK, BP_DTYPE_F32>(t, "cpu.conv2d_clamp", k31, {kStrided, kStrided, kStrided});
  add_rows<ConvNhwcNoneK, BP_DTYPE_F32>(t, "cpu.conv2d_nhwc", k31, {kStrided, kStrided, kStrided});
  add_rows<ConvReluNhwcK, BP_DTYPE_F32>(t, "cpu.conv2d_relu_nhwc", k31, {kStrided, kStrided, kStrided});
  add_rows<ConvClampNhwcK, BP_DTYPE_F32>(t, "cpu.conv2d_clamp_nhwc", k31, {kStrided, kStrided, kStrided});
  const auto k41 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, d, d, d}; };
  add_rows<ConvAddReluNchwK, BP_DTYPE_F32>(t, "cpu.conv2d_add_relu", k41, {kStrided, kStrided, kStrided, kStrided});
  add_rows<ConvAddReluNhwcK, BP_DTYPE_F32>(t, "cpu.conv2d_add_relu_nhwc", k41, {kStrided, kStrided, kStrided, kStrided});
}

}  // namespace backplane::cpu
