// max_pool2d and avg_pool2d (float dtypes; x strided, any strides).
//
// Each of x's N·C planes is one task of the host's parallel_for. A block of
// output rows at a time, the input rows its windows reach are copied into a
// padded buffer of the compute type (f16/bf16 widen to f32, so they
// accumulate in f32), the padding (and a ceil_mode window's overhang)
// holding -inf for max and 0 for avg. The window is then reduced in two
// separable passes, along each row (tmp[r][ow] over kw) and down the columns
// (y[oh][ow] over kh), so a kH x kW window costs kH + kW operations per
// output and every inner loop runs over consecutive output columns with no
// bounds checks (vectorisable; at stride 1 its loads are consecutive too, at
// stride 2 evenly spaced). The loops are compiled twice, for baseline x86-64
// and for AVX2 (chosen by the ISA picked at initialize).
//
// max: NaN propagates (a window holding one gives NaN); an all-padding
// window gives -inf. avg: the divisor is a product of the window's row and
// column counts inside the padded input (count_include_pad) or inside x; a
// window with none divides 0 by 0 (NaN).
#include "kernels.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace backplane::cpu {
namespace {

template <class A> struct MaxOp {
  static A pad() { return -std::numeric_limits<A>::infinity(); }
  // NaN wins: once acc is NaN, v > acc is false and v != v too.
  static A step(A acc, A v) { return (v > acc || v != v) ? v : acc; }
};
template <class A> struct SumOp {
  static A pad() { return A(0); }
  static A step(A acc, A v) { return acc + v; }
};

// Positions k in [0, n) with start + k * dil inside [lo, hi).
inline int64_t count_inside(int64_t start, int64_t n, int64_t dil, int64_t lo, int64_t hi) {
  int64_t c = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t r = start + k * dil;
    c += r >= lo && r < hi;
  }
  return c;
}

// What one call's planes share.
template <class A> struct Geom {
  int64_t C, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl;
  int64_t xs0, xs1, xs2, xs3, offset;
  int64_t RW, span_h, bh, rows_max;
  const A* cnt_h;  // avg: the divisor's row and column factors
  const A* cnt_w;
};

// Planes [b, e) of the call (always inlined into one function per ISA).
template <class T, class A, class Op, bool kAvg>
__attribute__((always_inline)) inline void run_planes(const Geom<A>& g, const T* x, T* y, int64_t b, int64_t e) {
  const int64_t C = g.C, H = g.H, W = g.W, OH = g.OH, OW = g.OW, kh = g.kh, kw = g.kw, sh = g.sh, sw = g.sw;
  const int64_t dh = g.dh, dw = g.dw, pt = g.pt, pl = g.pl, RW = g.RW, xs2 = g.xs2, xs3 = g.xs3;
  std::vector<A> buf(static_cast<size_t>(g.rows_max * RW)), tmp(static_cast<size_t>(g.rows_max * OW));
  const A padv = Op::pad();
  const int64_t c0 = std::min(pl, RW), c1 = std::min(pl + W, RW);  // x's columns land in [c0, c1)
  for (int64_t pc = b; pc < e; ++pc) {
    const int64_t n = pc / C, ch = pc % C;
    const int64_t base = g.offset + n * g.xs0 + ch * g.xs1;  // element (n, ch, 0, 0) of x
    T* out = y + pc * OH * OW;
    for (int64_t oh0 = 0; oh0 < OH; oh0 += g.bh) {
      const int64_t oh1 = std::min(OH, oh0 + g.bh);
      const int64_t r0 = oh0 * sh, nr = (oh1 - 1 - oh0) * sh + g.span_h;  // padded rows [r0, r0 + nr)
      // The padded rows.
      for (int64_t j = 0; j < nr; ++j) {
        A* dst = buf.data() + j * RW;
        const int64_t ih = r0 + j - pt;
        if (ih < 0 || ih >= H) {
          std::fill(dst, dst + RW, padv);
          continue;
        }
        std::fill(dst, dst + c0, padv);
        const int64_t row = base + ih * xs2;  // x[n, ch, ih, col - pl] at row + (col - pl)·xs3
        if (xs3 == 1) {
          const T* xr = x + row;
          for (int64_t col = c0; col < c1; ++col) dst[col] = ld(xr[col - pl]);
        } else {
          for (int64_t col = c0; col < c1; ++col) dst[col] = ld(x[row + (col - pl) * xs3]);
        }
        std::fill(dst + c1, dst + RW, padv);
      }
      // Along the rows: tmp[j][ow] = op over kw of buf[j][ow·sw + kw·dw]
      // (stride 1 and 2 with constant strides, so the loads vectorise).
      for (int64_t j = 0; j < nr; ++j) {
        const A* in = buf.data() + j * RW;
        A* t = tmp.data() + j * OW;
        if (sw == 1) {
          for (int64_t ow = 0; ow < OW; ++ow) t[ow] = in[ow];
          for (int64_t k = 1; k < kw; ++k) {
            const A* ink = in + k * dw;
            for (int64_t ow = 0; ow < OW; ++ow) t[ow] = Op::step(t[ow], ink[ow]);
          }
        } else if (sw == 2) {
          for (int64_t ow = 0; ow < OW; ++ow) t[ow] = in[2 * ow];
          for (int64_t k = 1; k < kw; ++k) {
            const A* ink = in + k * dw;
            for (int64_t ow = 0; ow < OW; ++ow) t[ow] = Op::step(t[ow], ink[2 * ow]);
          }
        } else {
          for (int64_t ow = 0; ow < OW; ++ow) t[ow] = in[ow * sw];
          for (int64_t k = 1; k < kw; ++k) {
            const A* ink = in + k * dw;
            for (int64_t ow = 0; ow < OW; ++ow) t[ow] = Op::step(t[ow], ink[ow * sw]);
          }
        }
      }
      // Down the columns, into the (dense) output plane.
      A acc[256];
      for (int64_t oh = oh0; oh < oh1; ++oh) {
        const A* t0 = tmp.data() + (oh - oh0) * sh * OW;
        for (int64_t ow0 = 0; ow0 < OW; ow0 += 256) {
          const int64_t m = std::min<int64_t>(256, OW - ow0);
          for (int64_t i = 0; i < m; ++i) acc[i] = t0[ow0 + i];
          for (int64_t k = 1; k < kh; ++k) {
            const A* tk = t0 + k * dh * OW + ow0;
            for (int64_t i = 0; i < m; ++i) acc[i] = Op::step(acc[i], tk[i]);
          }
          T* o = out + oh * OW + ow0;
          if constexpr (kAvg) {
            const A nh = g.cnt_h[oh];
            const A* nw = g.cnt_w + ow0;
            for (int64_t i = 0; i < m; ++i) o[i] = st<T>(acc[i] / (nh * nw[i]));
          } else {
            for (int64_t i = 0; i < m; ++i) o[i] = st<T>(acc[i]);
          }
        }
      }
    }
  }
}

template <class T, class A, class Op, bool kAvg>
void run_planes_baseline(const Geom<A>& g, const T* x, T* y, int64_t b, int64_t e) {
  run_planes<T, A, Op, kAvg>(g, x, y, b, e);
}
#if defined(__x86_64__)
// The same loops with 256-bit vectors (the ISA picked at initialize is
// avx2 or wider).
template <class T, class A, class Op, bool kAvg>
__attribute__((target("avx2"))) void run_planes_avx2(const Geom<A>& g, const T* x, T* y, int64_t b, int64_t e) {
  run_planes<T, A, Op, kAvg>(g, x, y, b, e);
}
#endif

template <bp_dtype D, bool kAvg> struct Pool2dK {
  static void impl(const Call& c) {
    c.expect(1, BP_PARAMS_POOL2D);
    using T = st_t<D>;
    using A = comp_t<T>;  // f32 for f32/f16/bf16, f64 for f64
    using Op = std::conditional_t<kAvg, SumOp<A>, MaxOp<A>>;
    const bp_pool2d_params& p = c.params->u.pool2d;
    const bp_layout& lx = c.in_layout(0);
    const bp_layout& lo = c.out_layout();
    BP_SDK_CHECK(lx.rank == 4 && lo.rank == 4, BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": x and the output must be 4-D");
    const int64_t N = lx.shape[0], C = lx.shape[1], H = lx.shape[2], W = lx.shape[3];
    const int64_t kh = p.kernel[0], kw = p.kernel[1], sh = p.stride[0], sw = p.stride[1];
    const int64_t dh = p.dilation[0], dw = p.dilation[1];
    const int64_t pt = p.padding[0], pl = p.padding[1], pb = p.padding[2], pr = p.padding[3];
    BP_SDK_CHECK(kh >= 1 && kw >= 1 && sh >= 1 && sw >= 1 && dh >= 1 && dw >= 1 && pt >= 0 && pl >= 0 && pb >= 0 && pr >= 0,
                 BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": bad pooling params");
    const int64_t OH = lo.shape[2], OW = lo.shape[3];
    BP_SDK_CHECK(lo.shape[0] == N && lo.shape[1] == C && OH >= 0 && OW >= 0, BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": output " + dims_str(lo) + " does not match x " + dims_str(lx));
    if (sdk::numel(lo) == 0) return;
    // Rows and columns of the padded plane the windows reach (past the
    // bottom/right padding for a ceil_mode window, short of it when the
    // last rows are never reached).
    const int64_t RH = (OH - 1) * sh + (kh - 1) * dh + 1, RW = (OW - 1) * sw + (kw - 1) * dw + 1;
    // The divisor of each output row and column (avg).
    std::vector<A> cnt_h, cnt_w;
    if constexpr (kAvg) {
      const int64_t hi_h = p.count_include_pad ? H + pt + pb : pt + H, lo_h = p.count_include_pad ? 0 : pt;
      const int64_t hi_w = p.count_include_pad ? W + pl + pr : pl + W, lo_w = p.count_include_pad ? 0 : pl;
      cnt_h.resize(static_cast<size_t>(OH));
      cnt_w.resize(static_cast<size_t>(OW));
      for (int64_t o = 0; o < OH; ++o) cnt_h[static_cast<size_t>(o)] = static_cast<A>(count_inside(o * sh, kh, dh, lo_h, hi_h));
      for (int64_t o = 0; o < OW; ++o) cnt_w[static_cast<size_t>(o)] = static_cast<A>(count_inside(o * sw, kw, dw, lo_w, hi_w));
    }
    // Output rows are taken in blocks whose padded input rows fit ~64K
    // elements (the rows a window spans at least), so the buffers stay in
    // cache and never grow with the plane.
    const int64_t span_h = (kh - 1) * dh + 1;
    const int64_t bh = std::clamp<int64_t>(((int64_t{1} << 16) / RW - span_h) / sh + 1, 1, OH);
    const Geom<A> g{C, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl,
                    lx.strides[0], lx.strides[1], lx.strides[2], lx.strides[3], lx.offset,
                    RW, span_h, bh, (bh - 1) * sh + span_h, cnt_h.data(), cnt_w.data()};
    auto run = &run_planes_baseline<T, A, Op, kAvg>;
#if defined(__x86_64__)
    if (isa() >= Isa::avx2) run = &run_planes_avx2<T, A, Op, kAvg>;
#endif
    const T* x = c.in_data<T>(0);
    T* y = c.out_data<T>();
    const int64_t plane_cost = RH * RW + RH * OW * kw + OH * OW * kh;
    pfor(c, N * C, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, plane_cost)),
         [&](int64_t b, int64_t e) { run(g, x, y, b, e); });
  }
};

template <bp_dtype D> using MaxPool2dK = Pool2dK<D, false>;
template <bp_dtype D> using AvgPool2dK = Pool2dK<D, true>;

// cpu.max_pool2d_nhwc: permute(max_pool2d(x), [0, 2, 3, 1]), y dense
// [N, OH, OW, C] (f32). The host's layout pass puts it between channels-last
// convolutions (a ResNet's stem), where x arrives as the channels-last view
// of the convolution's output: each output pixel is then the running
// maximum of its window's pixels, C consecutive floats at a time
// (max_pool_nhwc_row, compiled per ISA). Params
// are max_pool2d's (its forms; stride absent or null: kernel_size). NaN
// propagates; an all-padding window gives -inf.
// One output row of cpu.max_pool2d_nhwc: for each output pixel the running
// maximum over its window's pixels, C consecutive channels at a time (a loop
// the compiler vectorizes: a plain max, NaN noted in a flag per channel and
// put back at the end, so NaN propagates as in max_pool2d).
struct PoolNhwcGeom {
  int64_t C, H, W, OW, kh, kw, sh, sw, pt, pl, dh, dw, xs0, xs1, xs2, xs3;
};
[[gnu::always_inline]] inline void max_pool_nhwc_row(const PoolNhwcGeom& g, const float* x, int64_t n, int64_t oh, float* y,
                                                     int32_t* nan) {
  const int64_t C = g.C;
  for (int64_t ow = 0; ow < g.OW; ++ow) {
    float* __restrict acc = y + ow * C;
    int32_t* __restrict bad = nan;
    for (int64_t ch = 0; ch < C; ++ch) {
      acc[ch] = -std::numeric_limits<float>::infinity();
      bad[ch] = 0;
    }
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t ih = oh * g.sh - g.pt + i * g.dh;
      if (ih < 0 || ih >= g.H) continue;
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t iw = ow * g.sw - g.pl + j * g.dw;
        if (iw < 0 || iw >= g.W) continue;
        const float* __restrict v = x + n * g.xs0 + ih * g.xs2 + iw * g.xs3;
        if (g.xs1 == 1) {
          for (int64_t ch = 0; ch < C; ++ch) {
            acc[ch] = v[ch] > acc[ch] ? v[ch] : acc[ch];
            bad[ch] |= static_cast<int32_t>(v[ch] != v[ch]);
          }
        } else {
          for (int64_t ch = 0; ch < C; ++ch) {
            const float e = v[ch * g.xs1];
            acc[ch] = e > acc[ch] ? e : acc[ch];
            bad[ch] |= static_cast<int32_t>(e != e);
          }
        }
      }
    }
    for (int64_t ch = 0; ch < C; ++ch)
      if (bad[ch]) acc[ch] = std::numeric_limits<float>::quiet_NaN();
  }
}
// The same row when channels are contiguous (xs1 == 1): each block of
// channels keeps its maxima and NaN flags in registers over the whole
// window, four vectors of channels at a time (four independent chains of
// max), instead of a load and store of both per window pixel.
typedef float pool_v8f __attribute__((vector_size(32)));
typedef int32_t pool_v8i __attribute__((vector_size(32)));
typedef float pool_v16f __attribute__((vector_size(64)));
typedef int32_t pool_v16i __attribute__((vector_size(64)));
// NV vectors of channels [ch, ch + NV * lanes) of one output pixel (V may
// be float: one channel); NV independent chains of max.
template <class V, class VI, int NV>
[[gnu::always_inline]] inline void max_pool_nhwc_block(const float* x, const int64_t* rows, int64_t nrows,
                                                       const int64_t* cols, int64_t ncols, int64_t ch, float* out) {
  constexpr int64_t L = sizeof(V) / sizeof(float);
  V a[NV];
  VI b[NV];
#pragma GCC unroll 4
  for (int k = 0; k < NV; ++k) a[k] = V{} - std::numeric_limits<float>::infinity(), b[k] = VI{};
  for (int64_t r = 0; r < nrows; ++r)
    for (int64_t q = 0; q < ncols; ++q) {
      const float* p = x + rows[r] + cols[q] + ch;
#pragma GCC unroll 4
      for (int k = 0; k < NV; ++k) {
        V v;
        std::memcpy(&v, p + k * L, sizeof v);
        b[k] |= v != v;
        a[k] = v > a[k] ? v : a[k];
      }
    }
#pragma GCC unroll 4
  for (int k = 0; k < NV; ++k) {
    const V r = b[k] != 0 ? V{} + std::numeric_limits<float>::quiet_NaN() : a[k];
    std::memcpy(out + ch + k * L, &r, sizeof r);
  }
}
template <class V, class VI, class V8, class VI8>
[[gnu::always_inline]] inline void max_pool_nhwc_row_vec(const PoolNhwcGeom& g, const float* x, int64_t n, int64_t oh,
                                                         float* y) {
  constexpr int64_t L = sizeof(V) / sizeof(float);
  const int64_t C = g.C;
  int64_t rows[16], nrows = 0;  // valid input rows of the window (kh <= 16 here)
  for (int64_t i = 0; i < g.kh; ++i) {
    const int64_t ih = oh * g.sh - g.pt + i * g.dh;
    if (ih >= 0 && ih < g.H) rows[nrows++] = n * g.xs0 + ih * g.xs2;
  }
  for (int64_t ow = 0; ow < g.OW; ++ow) {
    int64_t cols[16], ncols = 0;
    for (int64_t j = 0; j < g.kw; ++j) {
      const int64_t iw = ow * g.sw - g.pl + j * g.dw;
      if (iw >= 0 && iw < g.W) cols[ncols++] = iw * g.xs3;
    }
    float* out = y + ow * C;
    int64_t ch = 0;
    for (; ch + 4 * L <= C; ch += 4 * L) max_pool_nhwc_block<V, VI, 4>(x, rows, nrows, cols, ncols, ch, out);
    for (; ch + L <= C; ch += L) max_pool_nhwc_block<V, VI, 1>(x, rows, nrows, cols, ncols, ch, out);
    if constexpr (L == 16)  // 24 channels (ShuffleNet's stem): one 16, one 8
      for (; ch + 8 <= C; ch += 8) max_pool_nhwc_block<V8, VI8, 1>(x, rows, nrows, cols, ncols, ch, out);
    for (; ch < C; ++ch) max_pool_nhwc_block<float, int32_t, 1>(x, rows, nrows, cols, ncols, ch, out);
  }
}
using PoolNhwcRowFn = void (*)(const PoolNhwcGeom&, const float*, int64_t, int64_t, float*, int32_t*);
void max_pool_nhwc_row_base(const PoolNhwcGeom& g, const float* x, int64_t n, int64_t oh, float* y, int32_t* nan) {
  max_pool_nhwc_row(g, x, n, oh, y, nan);
}
#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void max_pool_nhwc_row_avx2(const PoolNhwcGeom& g, const float* x, int64_t n,
                                                                 int64_t oh, float* y, int32_t* nan) {
  if (g.xs1 == 1 && g.kh <= 16 && g.kw <= 16) return max_pool_nhwc_row_vec<pool_v8f, pool_v8i, pool_v8f, pool_v8i>(g, x, n, oh, y);
  max_pool_nhwc_row(g, x, n, oh, y, nan);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void max_pool_nhwc_row_avx512(
    const PoolNhwcGeom& g, const float* x, int64_t n, int64_t oh, float* y, int32_t* nan) {
  if (g.xs1 == 1 && g.kh <= 16 && g.kw <= 16) return max_pool_nhwc_row_vec<pool_v16f, pool_v16i, pool_v8f, pool_v8i>(g, x, n, oh, y);
  max_pool_nhwc_row(g, x, n, oh, y, nan);
}
#endif

template <bp_dtype D> struct MaxPoolNhwcK {
  static void impl(const Call& c) {
    c.expect(1, BP_PARAMS_NONE);  // counts, ranks, the layout inside its storage
    const sdk::VendorParams p(c.params, c.op);
    p.allow_only({"kernel_size", "stride", "padding", "dilation", "ceil_mode"});
    int64_t k[2], st[2], pad[4], dil[2];
    vendor_ints(p, c.op, "kernel_size", 1, k, 2);
    vendor_ints(p, c.op, "stride", 0, st, 2);
    if (st[0] == 0) st[0] = k[0];
    if (st[1] == 0) st[1] = k[1];
    vendor_ints(p, c.op, "padding", 0, pad, 4);
    vendor_ints(p, c.op, "dilation", 1, dil, 2);
    const bp_layout& lx = c.in_layout(0);
    const bp_layout& lo = c.out_layout();
    BP_SDK_CHECK(lx.rank == 4 && lo.rank == 4, BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": x and the output must be 4-D");
    const int64_t N = lx.shape[0], C = lx.shape[1], H = lx.shape[2], W = lx.shape[3];
    const int64_t OH = lo.shape[1], OW = lo.shape[2];
    BP_SDK_CHECK(k[0] >= 1 && k[1] >= 1 && st[0] >= 1 && st[1] >= 1 && dil[0] >= 1 && dil[1] >= 1 && pad[0] >= 0 &&
                     pad[1] >= 0 && pad[2] >= 0 && pad[3] >= 0,
                 BP_ERR_INVALID_ARGUMENT, std::string(c.op) + ": bad pooling params");
    BP_SDK_CHECK(lo.shape[0] == N && lo.shape[3] == C && OH >= 0 && OW >= 0, BP_ERR_INVALID_ARGUMENT,
                 std::string(c.op) + ": output " + dims_str(lo) + " does not match x " + dims_str(lx));
    if (sdk::numel(lo) == 0) return;
    const float* x = c.in_data<float>(0) + lx.offset;
    float* y = c.out_data<float>();
    const PoolNhwcGeom pg{C, H, W, OW, k[0], k[1], st[0], st[1], pad[0], pad[1], dil[0], dil[1],
                          lx.strides[0], lx.strides[1], lx.strides[2], lx.strides[3]};
    auto row = &max_pool_nhwc_row_base;
#if defined(__x86_64__)
    if (isa() >= Isa::avx512) row = &max_pool_nhwc_row_avx512;
    else if (isa() >= Isa::avx2) row = &max_pool_nhwc_row_avx2;
#endif
    pfor(c, N * OH, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, OW * C * k[0] * k[1])), [&](int64_t r0, int64_t r1) {
      std::vector<int32_t> nan(static_cast<size_t>(C));
      for (int64_t r = r0; r < r1; ++r) row(pg, x, r / OH, r % OH, y + r * OW * C, nan.data());
    });
  }
};

}  // namespace

void register_pool(sdk::KernelTable& t) {
  const auto k11 = [](bp_dtype d) { return std::vector<bp_dtype>{d, d}; };
  add_rows<MaxPool2dK, BP_CPU_FLOAT_DTYPES>(t, "max_pool2d", k11, {kStrided});
  add_rows<AvgPool2dK, BP_CPU_FLOAT_DTYPES>(t, "avg_pool2d", k11, {kStrided});
  add_rows<MaxPoolNhwcK, BP_DTYPE_F32>(t, "cpu.max_pool2d_nhwc", k11, {kStrided});
}

}  // namespace backplane::cpu
