// conv2d by Winograd F(2x2, 3x3) (Lavin & Gray, "Fast Algorithms for
// Convolutional Neural Networks"): every 2x2 block of output pixels (a tile)
// comes from a 4x4 input window d as Y = A^T [(G g G^T) . (B^T d B)] A, so a
// 3x3 filter costs 16 multiplies per tile instead of 36. Summed over input
// channels, the 16 elementwise products become 16 GEMMs
//   M[xi] (Og x tiles) = U[xi] (Og x Cg) * V[xi] (Cg x tiles),
// with U the transformed filters and V the transformed input windows.
//
// The tiles of all N images are numbered in one sequence and cut into blocks
// of TB tiles; a thread takes a block through every step while it stays in
// its caches: gather and transform the input windows straight into GEMM
// panels, run the 16 products with a register-tiled micro-kernel (up to 256
// channels of the reduction per call), transform back, add the bias and
// store. F(2x2, 3x3) rather than F(4x4, 3x3): the larger tile's transforms
// (constants up to 8 and 1/24) lose accuracy that docs/ops.md's f32 bound for conv
// (rel 1e-4 per element) does not leave much room for; F(2x2, 3x3) measures
// at a few 1e-6 relative, close to the direct sum.
#include "winograd.hpp"

#include "kernels.hpp"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <new>

namespace backplane::cpu {
namespace {

typedef float V8 __attribute__((vector_size(32)));
typedef int32_t V8i __attribute__((vector_size(32)));

// Unaligned loads and stores. Vectors go by reference: passing a 32-byte
// vector by value outside an avx function has no stable ABI.
[[gnu::always_inline]] inline void vload(V8& v, const float* p) { std::memcpy(&v, p, sizeof v); }
[[gnu::always_inline]] inline void vstore(float* p, const V8& v) { std::memcpy(p, &v, sizeof v); }

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using FloatBuf = std::unique_ptr<float, FreeDeleter>;

FloatBuf alloc_floats(int64_t n, bool zero) {
  void* raw = nullptr;
  const size_t bytes = (static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float) + 63) / 64 * 64;
  if (posix_memalign(&raw, 64, bytes) != 0 || raw == nullptr) throw std::bad_alloc();
  if (zero) std::memset(raw, 0, bytes);
  return FloatBuf(static_cast<float*>(raw));
}

// One call's geometry, for one group; every block shares it.
struct Plan {
  int64_t Cg, Og, H, W, pt, pl, OH, OW, TH, TW, tiles;  // tiles = N * TH * TW
  int64_t xs0, xs1, xs2, xs3;
  int64_t ys0;  // output elements per image (O * OH * OW)
  int64_t MR, NR, Opad, TB;  // micro-tile, Og rounded up to MR, tiles per block (a multiple of NR)
};

// A run of tiles in one tile row of one image, at block position q.
struct Seg {
  int64_t n, ti, tj, len, q;
};

// One thread's working memory for a block.
struct Scratch {
  float* v;   // [16][TB / NR] panels [Cg][NR] (panel_size apart): transformed windows
  float* m;   // [16][Opad][TB] the 16 products
  float* x;   // [16][TB + 8] window element (r, j) of each tile, for one channel
  float* yb;  // [4][TB] one filter's 2x2 outputs per tile
  Seg* seg;   // [TB]
};

// MR x NR tile of M (row stride ldc) = a_panel [K][MR] * b_panel [K][NR].
template <int MR, int NV>
[[gnu::always_inline]] inline void micro_tile(int64_t K, const float* __restrict a, const float* __restrict b, float* c,
                                              int64_t ldc, bool add) {
  constexpr int NR = 8 * NV;
  V8 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = V8{};
#pragma GCC unroll 4
  for (int64_t k = 0; k < K; ++k) {
    V8 bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) vload(bv[j], b + k * NR + j * 8);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const V8 av = a[k * MR + i] - V8{};  // broadcast
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] += av * bv[j];
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      if (add) {
        V8 cur;
        vload(cur, c + i * ldc + j * 8);
        acc[i][j] += cur;
      }
      vstore(c + i * ldc + j * 8, acc[i][j]);
    }
}

template <class T> [[gnu::always_inline]] inline float ldf(const T& v) { return static_cast<float>(ld(v)); }

// Element (r, j) of the 4x4 input window of every tile of the block, for
// channel xc: xb[(4r + j) * XS + q]. Columns 2 and 3 of a tile are columns 0
// and 1 of its right neighbour, so each row gathers even and odd columns
// once (one past the run) and copies them shifted.
template <class T>
[[gnu::always_inline]] inline void gather_windows(const Plan& p, const T* xc, const Seg* segs, int64_t nseg, float* xb,
                                                  int64_t XS) {
  for (int64_t s = 0; s < nseg; ++s) {
    const Seg& sg = segs[s];
    const int64_t len = sg.len, iw0 = 2 * sg.tj - p.pl;
    // Pairs k in [k0, k1) have both columns iw0 + 2k and iw0 + 2k + 1 inside.
    const int64_t k0 = std::clamp<int64_t>((1 - iw0) / 2, 0, len + 1);
    const int64_t k1 = std::clamp<int64_t>(p.W - iw0 >= 2 ? (p.W - iw0) / 2 : 0, k0, len + 1);
    for (int64_t r = 0; r < 4; ++r) {
      float* e = xb + (4 * r) * XS + sg.q;
      float* o = xb + (4 * r + 1) * XS + sg.q;
      const int64_t ih = 2 * sg.ti - p.pt + r;
      if (ih < 0 || ih >= p.H) {
        std::fill(e, e + len + 1, 0.0f);
        std::fill(o, o + len + 1, 0.0f);
      } else {
        const T* row = xc + sg.n * p.xs0 + ih * p.xs2;
        const auto edge = [&](int64_t k) {
          const int64_t iw = iw0 + 2 * k;
          e[k] = iw >= 0 && iw < p.W ? ldf(row[iw * p.xs3]) : 0.0f;
          o[k] = iw + 1 >= 0 && iw + 1 < p.W ? ldf(row[(iw + 1) * p.xs3]) : 0.0f;
        };
        for (int64_t k = 0; k < k0; ++k) edge(k);
        if (p.xs3 == 1) {
          int64_t k = k0;
          if constexpr (std::is_same_v<T, float>) {
            for (; k + 8 <= k1; k += 8) {  // deinterleave 16 columns
              V8 a, b;
              vload(a, row + iw0 + 2 * k);
              vload(b, row + iw0 + 2 * k + 8);
              vstore(e + k, __builtin_shuffle(a, b, V8i{0, 2, 4, 6, 8, 10, 12, 14}));
              vstore(o + k, __builtin_shuffle(a, b, V8i{1, 3, 5, 7, 9, 11, 13, 15}));
            }
          }
          for (; k < k1; ++k) {
            e[k] = ldf(row[iw0 + 2 * k]);
            o[k] = ldf(row[iw0 + 2 * k + 1]);
          }
        } else {
          const int64_t cs = p.xs3;
          for (int64_t k = k0; k < k1; ++k) {
            e[k] = ldf(row[(iw0 + 2 * k) * cs]);
            o[k] = ldf(row[(iw0 + 2 * k + 1) * cs]);
          }
        }
        for (int64_t k = k1; k <= len; ++k) edge(k);
      }
      std::memcpy(xb + (4 * r + 2) * XS + sg.q, e + 1, static_cast<size_t>(len) * sizeof(float));
      std::memcpy(xb + (4 * r + 3) * XS + sg.q, o + 1, static_cast<size_t>(len) * sizeof(float));
    }
  }
}

// Floats per V panel ([Cg][NR]) plus one cache line, so that the 16 * TB/NR
// panels a channel's windows are stored into do not all fall in one cache
// set (Cg * NR floats is often a multiple of 4 KiB).
inline int64_t panel_size(int64_t Cg, int64_t NR) { return Cg * NR + 16; }

// V = B^T d B for 8 tiles at window position q, stored at dst + xi * xis.
// B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
[[gnu::always_inline]] inline void transform_windows(const float* xb, int64_t XS, int64_t q, float* dst, int64_t xis) {
  V8 t[4][4];  // B^T d: row combinations, per window column
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    V8 d0, d1, d2, d3;
    vload(d0, xb + (0 + j) * XS + q);
    vload(d1, xb + (4 + j) * XS + q);
    vload(d2, xb + (8 + j) * XS + q);
    vload(d3, xb + (12 + j) * XS + q);
    t[0][j] = d0 - d2;
    t[1][j] = d1 + d2;
    t[2][j] = d2 - d1;
    t[3][j] = d1 - d3;
  }
#pragma GCC unroll 4
  for (int a = 0; a < 4; ++a) {
    vstore(dst + (4 * a + 0) * xis, t[a][0] - t[a][2]);
    vstore(dst + (4 * a + 1) * xis, t[a][1] + t[a][2]);
    vstore(dst + (4 * a + 2) * xis, t[a][2] - t[a][1]);
    vstore(dst + (4 * a + 3) * xis, t[a][1] - t[a][3]);
  }
}

// Y = A^T M A (+ bias) for 8 tiles at position q of filter row mo.
// A^T = [1 1 1 0; 0 1 -1 -1].
[[gnu::always_inline]] inline void transform_back(const float* mo, int64_t xi_stride, int64_t q, float bias, float* yb,
                                                  int64_t TB) {
  V8 s[2][4];
#pragma GCC unroll 4
  for (int b = 0; b < 4; ++b) {
    V8 m0, m1, m2, m3;
    vload(m0, mo + (0 + b) * xi_stride + q);
    vload(m1, mo + (4 + b) * xi_stride + q);
    vload(m2, mo + (8 + b) * xi_stride + q);
    vload(m3, mo + (12 + b) * xi_stride + q);
    s[0][b] = m0 + m1 + m2;
    s[1][b] = m1 - m2 - m3;
  }
  const V8 bv = bias - V8{};
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    vstore(yb + (2 * i) * TB + q, s[i][0] + s[i][1] + s[i][2] + bv);
    vstore(yb + (2 * i + 1) * TB + q, s[i][1] - s[i][2] - s[i][3] + bv);
  }
}

// One output row of a run of tiles: columns 2i, 2i + 1 from a[i], b[i] for
// i < full, and a[full] alone when odd is set.
template <class T>
[[gnu::always_inline]] inline void store_row(const float* a, const float* b, int64_t full, bool odd, T* out) {
  int64_t i = 0;
  if constexpr (std::is_same_v<T, float>) {
    for (; i + 8 <= full; i += 8) {
      V8 va, vb;
      vload(va, a + i);
      vload(vb, b + i);
      vstore(out + 2 * i, __builtin_shuffle(va, vb, V8i{0, 8, 1, 9, 2, 10, 3, 11}));
      vstore(out + 2 * i + 8, __builtin_shuffle(va, vb, V8i{4, 12, 5, 13, 6, 14, 7, 15}));
    }
  }
  for (; i < full; ++i) {
    out[2 * i] = st<T>(a[i]);
    out[2 * i + 1] = st<T>(b[i]);
  }
  if (odd) out[2 * full] = st<T>(a[full]);
}

// One block: tiles [t0, t0 + TB) of one group. x at the group's first
// channel, y at the group's first output channel, up the group's U panels
// [16][Opad / MR][Cg][MR].
template <class T, int MR, int NV>
[[gnu::always_inline]] inline void block_impl(const Plan& p, const T* x, const float* up, const float* bias, T* y, int64_t t0,
                                              const Scratch& s) {
  constexpr int64_t NR = 8 * NV;
  const int64_t TB = p.TB, XS = TB + 8, Cg = p.Cg, Opad = p.Opad;
  const int64_t nt = std::min(TB, p.tiles - t0), ntp = (nt + NR - 1) / NR * NR;
  const int64_t per_image = p.TH * p.TW;
  int64_t nseg = 0;
  for (int64_t q = 0; q < nt;) {
    const int64_t t = t0 + q, n = t / per_image, ti = (t % per_image) / p.TW, tj = t % p.TW;
    const int64_t len = std::min(p.TW - tj, nt - q);
    s.seg[nseg++] = Seg{n, ti, tj, len, q};
    q += len;
  }

  // Input windows -> V panels.
  const int64_t ps = panel_size(Cg, NR), xis = (TB / NR) * ps;
  for (int64_t c = 0; c < Cg; ++c) {
    gather_windows<T>(p, x + c * p.xs1, s.seg, nseg, s.x, XS);
    for (int64_t q = 0; q < ntp; q += 8) transform_windows(s.x, XS, q, s.v + (q / NR) * ps + c * NR + q % NR, xis);
  }

  // The 16 products, over at most KC channels at a time so that a V panel
  // stays in L1 while the U panels pass by.
  constexpr int64_t KC = 256;
  for (int64_t xi = 0; xi < 16; ++xi) {
    const float* u = up + xi * Opad * Cg;
    const float* v = s.v + xi * xis;
    float* m = s.m + xi * Opad * TB;
    for (int64_t pc = 0; pc < Cg; pc += KC) {
      const int64_t kc = std::min(KC, Cg - pc);
      for (int64_t i = 0; i < Opad; i += MR)
        for (int64_t j = 0; j < ntp; j += NR)
          micro_tile<MR, NV>(kc, u + i * Cg + pc * MR, v + (j / NR) * ps + pc * NR, m + i * TB + j, TB, pc > 0);
    }
  }

  // Back to pixels, one filter at a time.
  for (int64_t o = 0; o < p.Og; ++o) {
    for (int64_t q = 0; q < ntp; q += 8) transform_back(s.m + o * TB, Opad * TB, q, bias[o], s.yb, TB);
    for (int64_t k = 0; k < nseg; ++k) {
      const Seg& sg = s.seg[k];
      const int64_t oh = 2 * sg.ti, ow0 = 2 * sg.tj;
      T* out = y + sg.n * p.ys0 + (o * p.OH + oh) * p.OW + ow0;
      // The last tile of a row may hang over an odd width by one column,
      // the last tile row over an odd height by one row.
      const int64_t full = std::min(sg.len, (p.OW - ow0) / 2);
      for (int64_t i = 0; i < 2 && oh + i < p.OH; ++i)
        store_row<T>(s.yb + 2 * i * TB + sg.q, s.yb + (2 * i + 1) * TB + sg.q, full, full < sg.len, out + i * p.OW);
    }
  }
}

template <class T> using BlockFn = void (*)(const Plan&, const T*, const float*, const float*, T*, int64_t, const Scratch&);

#define BP_WG_BLOCK(NAME, TARGET, MR, NV)                                                                        \
  template <class T>                                                                                             \
  TARGET void NAME(const Plan& p, const T* x, const float* up, const float* bias, T* y, int64_t t0, const Scratch& s) { \
    block_impl<T, MR, NV>(p, x, up, bias, y, t0, s);                                                             \
  }
#if defined(__x86_64__)
// avx512 processors take the avx2 kernel (an avx512 one would need a
// processor to measure and test it on).
BP_WG_BLOCK(block_avx2, __attribute__((target("avx2,fma"))), 6, 2)
#endif
BP_WG_BLOCK(block_base, , 4, 1)
#undef BP_WG_BLOCK

struct Kernel {
  int64_t mr, nr;
};

Kernel kernel_shape() {
#if defined(__x86_64__)
  if (isa() != Isa::baseline) return {6, 16};
#endif
  return {4, 8};
}

template <class T> BlockFn<T> block_fn() {
#if defined(__x86_64__)
  if (isa() != Isa::baseline) return &block_avx2<T>;
#endif
  return &block_base<T>;
}

// U = G g G^T per filter and channel, G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1],
// in double, packed as [16][Opad / MR][Cg][MR]: row panels [ip0, ip1) of
// group gi (zero rows past Og).
void transform_filters(const float* w, int64_t gi, int64_t ip0, int64_t ip1, int64_t Og, int64_t Cg, int64_t MR, int64_t Opad,
                       float* up) {
  constexpr int64_t CB = 64;  // channels per pass: the 16 outputs go through a small buffer
  float buf[16][CB * 8];
  for (int64_t ip = ip0; ip < ip1; ++ip)
    for (int64_t c0 = 0; c0 < Cg; c0 += CB) {
      const int64_t cn = std::min(CB, Cg - c0);
      for (int64_t r = 0; r < MR; ++r) {
        const int64_t o = ip * MR + r;
        if (o >= Og) {
          for (int64_t xi = 0; xi < 16; ++xi)
            for (int64_t c = 0; c < cn; ++c) buf[xi][c * MR + r] = 0.0f;
          continue;
        }
        const float* f = w + ((gi * Og + o) * Cg + c0) * 9;
        for (int64_t c = 0; c < cn; ++c, f += 9) {
          double t[3][4];
          for (int i = 0; i < 3; ++i) {
            const double a = f[3 * i], b = f[3 * i + 1], d = f[3 * i + 2];
            t[i][0] = a;
            t[i][1] = 0.5 * (a + b + d);
            t[i][2] = 0.5 * (a - b + d);
            t[i][3] = d;
          }
          for (int j = 0; j < 4; ++j) {
            buf[0 + j][c * MR + r] = static_cast<float>(t[0][j]);
            buf[4 + j][c * MR + r] = static_cast<float>(0.5 * (t[0][j] + t[1][j] + t[2][j]));
            buf[8 + j][c * MR + r] = static_cast<float>(0.5 * (t[0][j] - t[1][j] + t[2][j]));
            buf[12 + j][c * MR + r] = static_cast<float>(t[2][j]);
          }
        }
      }
      for (int64_t xi = 0; xi < 16; ++xi)
        std::memcpy(up + ((xi * (Opad / MR) + ip) * Cg + c0) * MR, buf[xi], static_cast<size_t>(cn * MR) * sizeof(float));
    }
}

}  // namespace

bool winograd_pays(const WinogradConv& g) {
  const int64_t Cg = g.C / g.G, Og = g.O / g.G, tiles = g.N * ((g.OH + 1) / 2) * ((g.OW + 1) / 2);
  // Below ~16 channels or filters the 16 products are too thin to repay the
  // transforms. The transformed filters (16 * Og * Cg floats, built per call
  // and streamed through once per block) need enough tiles to pay off:
  // measured break-even near 16 tiles at 64-128 channels, 32 at 256, over
  // 64 at 512.
  return Cg >= 16 && Og >= 16 && tiles >= std::max<int64_t>(16, Cg * Og / 2048);
}

struct WinogradFilters {
  int64_t usize = 0;  // one group's U, floats
  FloatBuf up;        // G groups of U
};

std::shared_ptr<const WinogradFilters> winograd_filters(const Call& c, const WinogradConv& g, const float* w) {
  const Kernel k = kernel_shape();
  const int64_t Cg = g.C / g.G, Og = g.O / g.G, Opad = (Og + k.mr - 1) / k.mr * k.mr;
  auto f = std::make_shared<WinogradFilters>();
  f->usize = 16 * Opad * Cg;
  f->up = alloc_floats(g.G * f->usize, false);
  const int64_t np = Opad / k.mr;  // row panels per group
  float* up = f->up.get();
  pfor(c, g.G * np, std::max<int64_t>(1, kGrain / (16 * k.mr * Cg)), [&](int64_t b, int64_t e) {
    for (int64_t gi = b / np; gi * np < e; ++gi) {
      const int64_t i0 = std::max(b - gi * np, int64_t{0}), i1 = std::min(e - gi * np, np);
      transform_filters(w, gi, i0, i1, Og, Cg, k.mr, Opad, up + gi * f->usize);
    }
  });
  return f;
}

template <class T>
void conv2d_winograd(const Call& c, const WinogradConv& g, const T* x, const float* w, const float* bias, T* y,
                     const WinogradFilters* u) {
  const Kernel k = kernel_shape();
  Plan p{};
  p.Cg = g.C / g.G;
  p.Og = g.O / g.G;
  p.H = g.H;
  p.W = g.W;
  p.pt = g.pt;
  p.pl = g.pl;
  p.OH = g.OH;
  p.OW = g.OW;
  p.TH = (g.OH + 1) / 2;
  p.TW = (g.OW + 1) / 2;
  p.tiles = g.N * p.TH * p.TW;
  p.xs0 = g.xs[0];
  p.xs1 = g.xs[1];
  p.xs2 = g.xs[2];
  p.xs3 = g.xs[3];
  p.ys0 = g.O * g.OH * g.OW;
  p.MR = k.mr;
  p.NR = k.nr;
  p.Opad = (p.Og + k.mr - 1) / k.mr * k.mr;
  // Tiles per block: the block's V panels (16 * Cg * TB floats) within
  // about 384 KiB, so they and the products stay in L2; at least a few
  // blocks per thread when there are tiles enough.
  const int64_t threads = num_threads(c);
  int64_t tb = std::clamp<int64_t>(384 * 1024 / (16 * 4 * p.Cg), 2 * k.nr, 128);
  tb = std::min(tb, (p.tiles + 4 * threads - 1) / (4 * threads));
  p.TB = std::max<int64_t>(k.nr, (tb + k.nr - 1) / k.nr * k.nr);

  // The transformed filters: given (kept with constant weights), or made now.
  std::shared_ptr<const WinogradFilters> made;
  if (!u) {
    made = winograd_filters(c, g, w);
    u = made.get();
  }
  const int64_t usize = u->usize;
  const float* up = u->up.get();

  const BlockFn<T> fn = block_fn<T>();
  const int64_t nblk = (p.tiles + p.TB - 1) / p.TB;
  pfor(c, g.G * nblk, 1, [&](int64_t b0, int64_t b1) {
    // Only the window buffer is read before written (its columns past the
    // last tile feed the unused columns of the products).
    const FloatBuf v = alloc_floats(16 * (p.TB / p.NR) * panel_size(p.Cg, p.NR), false),
                   m = alloc_floats(16 * p.Opad * p.TB, false), xb = alloc_floats(16 * (p.TB + 8), true),
                   yb = alloc_floats(4 * p.TB, false);
    std::vector<Seg> segs(static_cast<size_t>(p.TB));
    const Scratch s{v.get(), m.get(), xb.get(), yb.get(), segs.data()};
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t gi = b / nblk, t0 = (b % nblk) * p.TB;
      fn(p, x + gi * p.Cg * p.xs1, up + gi * usize, bias + gi * p.Og, y + gi * p.Og * p.OH * p.OW, t0, s);
    }
  });
}

template void conv2d_winograd<float>(const Call&, const WinogradConv&, const float*, const float*, const float*, float*,
                                     const WinogradFilters*);
template void conv2d_winograd<f16>(const Call&, const WinogradConv&, const f16*, const float*, const float*, f16*,
                                   const WinogradFilters*);
template void conv2d_winograd<bf16>(const Call&, const WinogradConv&, const bf16*, const float*, const float*, bf16*,
                                    const WinogradFilters*);

}  // namespace backplane::cpu
