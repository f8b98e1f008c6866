// matmul and conv2d through oneDNN; see onednn.hpp for when and how.
#include "onednn.hpp"
#include "packed.hpp"

#include <cstdio>

#if BACKPLANE_CPU_HAVE_ONEDNN
#include <dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#if __has_include(<omp.h>)
#include <omp.h>
#else
extern "C" int omp_get_max_threads(void);
extern "C" void omp_set_num_threads(int);
#endif
#endif

namespace backplane::cpu::onednn {

#if !BACKPLANE_CPU_HAVE_ONEDNN

void configure(Cap, bool, char* desc, size_t desc_size) noexcept {
  if (desc_size) desc[0] = '\0';
}
void release() noexcept {}
bool enabled() noexcept { return false; }
bool matmul(const Call&, bp_dtype, const std::vector<std::array<int64_t, 3>>&, int64_t, int64_t, int64_t, int64_t, int64_t,
            int64_t, int64_t) {
  return false;
}
bool conv2d(const Call&, bp_dtype, const ConvGeom&) { return false; }
bool conv2d_nhwc(const Call&, bp_dtype, const ConvGeom&) { return false; }

#else

namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

Cap g_cap = Cap::off;
// Created by configure, deleted by release (no static object with a
// destructor: see docs/plugin-guide.md).
dnnl::engine* g_engine = nullptr;
// What the effective oneDNN ISA has (bits of dnnl_cpu_isa_t).
bool g_avx512 = false, g_bf16 = false;
double g_min_macs = 0;

bool has(dnnl::cpu_isa isa, dnnl_cpu_isa_t want) {
  return (static_cast<unsigned>(isa) & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
}

const char* isa_text(dnnl::cpu_isa isa) {
  const unsigned v = static_cast<unsigned>(isa);
  if (has(isa, dnnl_cpu_isa_avx512_core_amx)) return "avx512_core_amx";
  if (has(isa, dnnl_cpu_isa_avx512_core_bf16)) return "avx512_core_bf16";
  if (has(isa, dnnl_cpu_isa_avx512_core_vnni)) return "avx512_core_vnni";
  if (has(isa, dnnl_cpu_isa_avx512_core)) return "avx512_core";
  if (has(isa, dnnl_cpu_isa_avx2_vnni)) return "avx2_vnni";
  if (has(isa, dnnl_cpu_isa_avx2)) return "avx2";
  return v ? "sse41" : "none";
}

// The calling thread's OpenMP thread count is 1 while a oneDNN primitive is
// made or run (so it runs inline, never starting an OpenMP team), and what
// the thread had before afterwards (an application's own OpenMP setting
// survives).
class OneThread {
 public:
  OneThread() : saved_(omp_get_max_threads()) {
    if (saved_ != 1) omp_set_num_threads(1);
  }
  ~OneThread() {
    if (saved_ != 1) omp_set_num_threads(saved_);
  }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_;
};

// Scratch memory, 64-byte aligned.
struct Scratch {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> p;
  explicit Scratch(size_t bytes) {
    if (bytes == 0) return;
    void* raw = nullptr;
    if (posix_memalign(&raw, 64, (bytes + 63) / 64 * 64) != 0 || raw == nullptr) throw std::bad_alloc();
    p.reset(raw);
  }
  void* get() const { return p.get(); }
};

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

// Runs a primitive with its own scratchpad (user mode: nothing shared
// between threads that run primitives at the same time).
void run(const dnnl::primitive& p, const dnnl::memory::desc& scratch_md, std::unordered_map<int, dnnl::memory> args) {
  const size_t bytes = scratch_md.get_size();
  Scratch sp(bytes);
  if (bytes) args.insert({DNNL_ARG_SCRATCHPAD, dnnl::memory(scratch_md, *g_engine, sp.get())});
  dnnl::stream s(*g_engine);
  p.execute(s, args);
  s.wait();
}

// A reference (unoptimised) implementation is never worth taking over the
// plugin's own kernels.
bool fast_impl(const char* info) { return info != nullptr && std::string_view(info).find("ref") == std::string_view::npos; }

std::optional<dt> dnnl_type(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F32: return g_avx512 ? std::optional<dt>(dt::f32) : std::nullopt;
    case BP_DTYPE_BF16: return g_bf16 ? std::optional<dt>(dt::bf16) : std::nullopt;
    default: return std::nullopt;  // f16: oneDNN 2.x has no fast CPU path; f64: none at all
  }
}

size_t dsize(bp_dtype d) { return d == BP_DTYPE_F32 ? 4 : 2; }

// Size-1 dims have no meaningful stride; give them one oneDNN accepts.
void fix_unit_strides(int64_t rows, int64_t cols, int64_t& rs, int64_t& cs) {
  if (rows == 1) rs = cs == 1 ? cols : 1;
  if (cols == 1) cs = rs == 1 ? rows : 1;
}
bool plain_2d(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return (cs == 1 && rs >= cols) || (rs == 1 && cs >= rows);
}

// Splits [0, n) into `parts` near-equal ranges, each boundary a multiple of
// `align` (oneDNN's blocking); piece i is [lo(i), lo(i+1)), possibly empty.
struct Split {
  int64_t n, parts, align = 1;
  int64_t lo(int64_t i) const {
    if (i >= parts) return n;
    return std::min(n, (i * n / parts + align - 1) / align * align);
  }
};

// Several pieces per thread, so a thread that the OS parks does not hold
// the others up (the host pool hands pieces out as threads come for them).
constexpr int64_t kPiecesPerThread = 4;

// Work below this many multiply-adds stays on the plugin's own kernels (the
// per-call set-up of a oneDNN primitive, even cached, costs microseconds).
constexpr double kMinMacs = 1 << 18;
// A piece handed to another thread does at least this many multiply-adds
// (a pool wake costs a few microseconds; oneDNN does ~100 GMAC/s per core).
constexpr double kMinMacsPerThread = 2e6;
// A batch-1 convolution split by output channels: fewer, larger pieces (each
// is a primitive run with its own scratchpad and output reorder, and thin
// pieces run oneDNN's kernels less efficiently: at 4 pieces per thread a
// 512-channel 7x7 layer took ~45% more CPU time in all than unsplit).
constexpr int64_t kChannelPiecesPerThread = 2;
constexpr double kMinMacsPerChannelPiece = 8e6;
// Channels-last convolutions (conv2d_nhwc): one piece per thread, and
// smaller pieces than above pay (no reorder per piece; MobileNetV2 at batch
// 1 on 2 threads, alternating runs: 2 pieces per thread and 2e6 MACs each
// 5.7-5.9 ms, 1 and 3e5 5.0-5.4 ms; ResNet-18 14.1-14.8 against 13.6).
constexpr int64_t kNhwcPiecesPerThread = 1;
constexpr double kNhwcMinMacsPerPiece = 3e5;

}  // namespace

namespace {
// Every Runtime that loads the plugin initializes it and shuts it down; the
// engine lives from the first initialize to the last shutdown, so one
// runtime's shutdown never pulls it from under another's kernels.
std::mutex g_users_mutex;  // trivially destructible in libstdc++
int g_users = 0;
char g_desc[64] = "";

void teardown() noexcept {
  delete g_engine;
  g_engine = nullptr;
  g_cap = Cap::off;
  g_avx512 = g_bf16 = false;
  g_desc[0] = '\0';
}
}  // namespace

void configure(Cap cap, bool always, char* desc, size_t desc_size) noexcept {
  if (desc_size) desc[0] = '\0';
  std::lock_guard<std::mutex> lock(g_users_mutex);
  if (g_users++ == 0 && cap != Cap::off) {
    try {
      // The first call in the process sets oneDNN's highest ISA; later ones
      // (the plugin reloaded) are refused by oneDNN and keep the first.
      try {
        dnnl::set_max_cpu_isa(cap == Cap::avx512_bf16 ? dnnl::cpu_isa::avx512_core_bf16 : dnnl::cpu_isa::all);
      } catch (const dnnl::error&) {
      }
      const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
      g_avx512 = has(isa, dnnl_cpu_isa_avx512_core);
      g_bf16 = has(isa, dnnl_cpu_isa_avx512_core_bf16);
      g_engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
      g_cap = cap;
      g_min_macs = always ? 0 : kMinMacs;
      const dnnl_version_t* v = dnnl_version();
      std::snprintf(g_desc, sizeof g_desc, "oneDNN %d.%d.%d %s", v->major, v->minor, v->patch, isa_text(isa));
    } catch (...) {
      teardown();
    }
  }
  if (desc_size) std::snprintf(desc, desc_size, "%s", g_desc);
}

void release() noexcept {
  std::lock_guard<std::mutex> lock(g_users_mutex);
  if (g_users > 0 && --g_users == 0) teardown();
}

bool enabled() noexcept { return g_cap != Cap::off && g_engine != nullptr; }

bool matmul(const Call& c, bp_dtype d, const std::vector<std::array<int64_t, 3>>& offs, int64_t M, int64_t N, int64_t K,
            int64_t rsa, int64_t csa, int64_t rsb, int64_t csb) {
  if (!enabled() || M <= 0 || N <= 0 || K <= 0 || offs.empty()) return false;
  const std::optional<dt> t = dnnl_type(d);
  if (!t) return false;
  const double macs = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  if (macs < g_min_macs) return false;
  fix_unit_strides(M, K, rsa, csa);
  fix_unit_strides(K, N, rsb, csb);
  if (!plain_2d(M, K, rsa, csa) || !plain_2d(K, N, rsb, csb)) return false;

  // Pieces: each batch whole when there are batches enough for the
  // threads, else each product split by output columns (each piece then
  // reformats only its own columns of b; a is read in place), or by rows
  // when there are too few columns.
  const int64_t batches = static_cast<int64_t>(offs.size());
  const int64_t threads = num_threads(c);
  const bool split_m = N < 128 && M > N;
  const int64_t side = split_m ? M : N, align = split_m ? 16 : 64;
  const int64_t want = threads * kPiecesPerThread;
  int64_t parts = threads == 1 || batches >= want ? 1 : (want + batches - 1) / batches;
  parts = std::min(parts, std::max<int64_t>(1, side / align));
  while (parts > 1 && macs / static_cast<double>(parts) < kMinMacsPerThread) --parts;
  const Split split{side, parts, parts > 1 ? align : 1};

  // The piece sizes' primitives (at most a few distinct), made on this
  // thread (oneDNN caches them, so a plan run again finds them).
  OneThread one;
  struct Prim {
    int64_t size = -1;
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul prim;
  };
  std::vector<Prim> prims;
  auto prim_for = [&](int64_t sz) -> const Prim* {
    for (const Prim& p : prims)
      if (p.size == sz) return &p;
    return nullptr;
  };
  try {
    for (int64_t i = 0; i < parts; ++i) {
      const int64_t sz = split.lo(i + 1) - split.lo(i);
      if (sz <= 0 || prim_for(sz)) continue;
      Prim p;
      const int64_t m = split_m ? sz : M, n = split_m ? N : sz;
      const dnnl::memory::desc a({m, K}, *t, dims{rsa, csa}), b({K, n}, *t, dims{rsb, csb}), y({m, n}, *t, dims{N, 1});
      p.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, y), user_scratchpad(), *g_engine);
      if (!fast_impl(p.pd.impl_info_str())) return false;
      p.prim = dnnl::matmul(p.pd);
      p.size = sz;
      prims.push_back(std::move(p));
    }
  } catch (const dnnl::error&) {
    return false;  // a shape or layout this oneDNN does not take: the plugin's own GEMM runs
  }

  char* a = static_cast<char*>(const_cast<void*>(c.in[0].data));
  char* b = static_cast<char*>(const_cast<void*>(c.in[1].data));
  char* y = static_cast<char*>(c.out[0].data);
  const size_t es = dsize(d);
  const double per_item = macs / static_cast<double>(parts);
  const int64_t grain = parts > 1 ? 1 : std::max<int64_t>(1, static_cast<int64_t>(kMinMacsPerThread / per_item));
  pfor(c, batches * parts, grain, [&](int64_t i0, int64_t i1) {
    OneThread inner;
    for (int64_t i = i0; i < i1; ++i) {
      const auto& o = offs[static_cast<size_t>(i / parts)];
      const int64_t lo = split.lo(i % parts), sz = split.lo(i % parts + 1) - lo;
      if (sz <= 0) continue;
      const Prim& p = *prim_for(sz);
      const int64_t ao = o[0] + (split_m ? lo * rsa : 0), bo = o[1] + (split_m ? 0 : lo * csb),
                    yo = o[2] + (split_m ? lo * N : lo);
      run(p.prim, p.pd.scratchpad_desc(),
          {{DNNL_ARG_SRC, dnnl::memory(p.pd.src_desc(), *g_engine, a + ao * static_cast<int64_t>(es))},
           {DNNL_ARG_WEIGHTS, dnnl::memory(p.pd.weights_desc(), *g_engine, b + bo * static_cast<int64_t>(es))},
           {DNNL_ARG_DST, dnnl::memory(p.pd.dst_desc(), *g_engine, y + yo * static_cast<int64_t>(es))}});
    }
  });
  return true;
}

// A reorder between a user layout and a primitive's, made once per
// primitive for all the pieces of one size (making a reorder's
// primitive_desc costs tens of microseconds; oneDNN caches primitives, not
// descriptors).
struct Reorder {
  bool needed = false;
  dnnl::reorder::primitive_desc pd;
  dnnl::reorder prim;
  void make(const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
    needed = from != to;
    if (!needed) return;
    pd = dnnl::reorder::primitive_desc(*g_engine, from, *g_engine, to, user_scratchpad());
    prim = dnnl::reorder(pd);
  }
  void operator()(const dnnl::memory& from, const dnnl::memory& to) const {
    run(prim, pd.scratchpad_desc(), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
  }
};
// One convolution primitive per distinct (images, units) piece size.
struct ConvPrim {
  int64_t n = -1, u = -1;
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  Reorder rx, rw, ry;  // x into the primitive's format, w into it, y out of it
};
// A convolution's primitives, and for constant weights (BP_INPUT_CONSTANT)
// the weights of each channel piece in their primitive's format, made once
// and kept with the weights (packed.hpp). ok: oneDNN takes this geometry.
struct ConvPlan {
  bool ok = false;
  std::vector<ConvPrim> prims;
  bool share_src = false;
  bool packed = false;        // wbuf holds the weights, reordered
  std::vector<Scratch> wbuf;  // per channel piece (empty where no reorder is needed)
};

// A convolution's attributes: user scratchpad, and `act` as a post-op.
// oneDNN's injector turns NaN into a bound (docs/ops.md keeps it): the
// caller asks for a post-op only when no output can be NaN (conv.cpp,
// post_op_safe).
dnnl::primitive_attr conv_attr(const Activation& act) {
  dnnl::primitive_attr attr = user_scratchpad();
  if (act.kind != Activation::None) {
    dnnl::post_ops po;
    if (act.kind == Activation::Relu)
      po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    else
      po.append_eltwise(1.0f, dnnl::algorithm::eltwise_clip_v2, act.lo, act.hi);
    attr.set_post_ops(po);
  }
  return attr;
}

// A forward-inference convolution's descriptor, with or without a bias.
dnnl::convolution_forward::desc conv_desc(const dnnl::memory::desc& src, const dnnl::memory::desc& w,
                                          const dnnl::memory::desc& bias, const dnnl::memory::desc& dst, bool has_bias,
                                          const dims& strides, const dims& dil, const dims& pl, const dims& pr) {
  using F = dnnl::convolution_forward;
  return has_bias ? F::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, w, bias, dst,
                            strides, dil, pl, pr)
                  : F::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, w, dst,
                            strides, dil, pl, pr);
}

// The key a plan kept with constant weights is found by: `name` and every
// number it depends on.
std::string kept_key(const char* name, std::initializer_list<int64_t> values) {
  std::string key = name;
  for (int64_t v : values) key.append(",").append(std::to_string(v));
  return key;
}

// The bias of a convolution in f32 (oneDNN's bias type here), or empty.
std::vector<float> conv_bias(const Call& c, bp_dtype d, int64_t O) {
  std::vector<float> bias;
  if (!c.has_input(2)) return bias;
  const bp_layout& lb = c.in_layout(2);
  bias.resize(static_cast<size_t>(O));
  if (d == BP_DTYPE_F32) {
    const float* src = c.in_data<float>(2);
    for (int64_t o = 0; o < O; ++o) bias[static_cast<size_t>(o)] = src[lb.offset + o * lb.strides[0]];
  } else {
    const bf16* src = c.in_data<bf16>(2);
    for (int64_t o = 0; o < O; ++o) bias[static_cast<size_t>(o)] = ld(src[lb.offset + o * lb.strides[0]]);
  }
  return bias;
}

bool conv2d(const Call& c, bp_dtype d, const ConvGeom& g) {
  if (!enabled()) return false;
  const std::optional<dt> t = dnnl_type(d);
  if (!t) return false;
  if (g.N <= 0 || g.C <= 0 || g.H <= 0 || g.W <= 0 || g.O <= 0 || g.Cg <= 0 || g.OH <= 0 || g.OW <= 0) return false;
  const double macs = static_cast<double>(g.N) * static_cast<double>(g.O) * static_cast<double>(g.OH * g.OW) *
                      static_cast<double>(g.Cg * g.kH * g.kW);
  if (macs < g_min_macs) return false;
  const bp_layout& lx = c.in_layout(0);
  const bp_layout& lw = c.in_layout(1);
  // Positive strides only (a size-1 dim's stride is free; give it 1).
  int64_t xs[4], ws[4];
  for (int i = 0; i < 4; ++i) {
    xs[i] = lx.shape[i] == 1 ? 1 : lx.strides[i];
    ws[i] = lw.shape[i] == 1 ? 1 : lw.strides[i];
    if (xs[i] <= 0 || ws[i] <= 0) return false;
  }
  const int64_t Og = g.O / g.G;
  const bool grouped = g.G > 1;
  const bool has_bias = c.has_input(2);

  // Pieces: images over the threads; when there are fewer images than
  // pieces wanted (batch 1), each image is also split by output channels
  // (whole groups when grouped: a piece then reads only its groups' input
  // channels), 16 channels at a time where there are enough (oneDNN's
  // blocking on AVX-512).
  const int64_t threads = num_threads(c);
  const int64_t want = threads * kPiecesPerThread;
  int64_t nparts = threads == 1 ? 1 : std::min(want, g.N);
  while (nparts > 1 && macs / static_cast<double>(nparts) < kMinMacsPerThread) --nparts;
  const int64_t units = grouped ? g.G : g.O;  // what a channel piece takes a range of
  const int64_t ualign = grouped ? std::max<int64_t>(1, 16 / Og) : 16;
  int64_t cparts = 1;
  const int64_t cwant = threads * kChannelPiecesPerThread;
  if (threads > 1 && nparts < cwant) {
    cparts = std::min((cwant + nparts - 1) / nparts, std::max<int64_t>(1, units / ualign));
    while (cparts > 1 && macs / static_cast<double>(nparts * cparts) < kMinMacsPerChannelPiece) --cparts;
  }
  const Split nsplit{g.N, nparts}, csplit{units, cparts, cparts > 1 ? ualign : 1};

  // One primitive per distinct (images, units) piece size (at most a few),
  // made on this thread (oneDNN caches them, so a plan run again finds them).
  OneThread one;
  auto with_units = [](const std::vector<ConvPrim>& prims, int64_t u) -> const ConvPrim* {
    for (const ConvPrim& p : prims)
      if (p.u == u) return &p;
    return nullptr;
  };
  auto prim_for = [](const std::vector<ConvPrim>& prims, int64_t n, int64_t u) -> const ConvPrim* {
    for (const ConvPrim& p : prims)
      if (p.n == n && p.u == u) return &p;
    return nullptr;
  };
  // Per piece of units: channels in and out, and the weights' dims.
  auto cin = [&](int64_t u) { return grouped ? u * g.Cg : g.C; };
  auto cout = [&](int64_t u) { return grouped ? u * Og : u; };
  auto wdims = [&](int64_t u) { return grouped ? dims{u, Og, g.Cg, g.kH, g.kW} : dims{u, g.Cg, g.kH, g.kW}; };
  const dims wstrides = grouped ? dims{Og * ws[0], ws[0], ws[1], ws[2], ws[3]} : dims{ws[0], ws[1], ws[2], ws[3]};
  const int64_t ystride = g.O * g.OH * g.OW;
  // The user's x, w and y of a piece, as oneDNN memory descriptors.
  auto x_user = [&](int64_t n, int64_t u) { return dnnl::memory::desc({n, cin(u), g.H, g.W}, *t, dims{xs[0], xs[1], xs[2], xs[3]}); };
  auto w_user = [&](int64_t u) { return dnnl::memory::desc(wdims(u), *t, wstrides); };
  auto y_user = [&](int64_t n, int64_t u) {
    return dnnl::memory::desc({n, cout(u), g.OH, g.OW}, *t, dims{ystride, g.OH * g.OW, g.OW, 1});
  };
  const size_t es = dsize(d);
  char* x = static_cast<char*>(const_cast<void*>(c.in[0].data)) + lx.offset * static_cast<int64_t>(es);
  char* w = static_cast<char*>(const_cast<void*>(c.in[1].data)) + lw.offset * static_cast<int64_t>(es);
  char* y = static_cast<char*>(c.out[0].data);
  auto w_piece = [&](int64_t u0) { return w + u0 * (grouped ? Og : 1) * ws[0] * static_cast<int64_t>(es); };
  // The primitives (and, when `pack`, the weights in their formats).
  auto make_plan = [&](bool pack) {
    auto cp = std::make_shared<ConvPlan>();
    try {
      for (int64_t i = 0; i < nparts; ++i)
        for (int64_t j = 0; j < cparts; ++j) {
          const int64_t n = nsplit.lo(i + 1) - nsplit.lo(i), u = csplit.lo(j + 1) - csplit.lo(j);
          if (n <= 0 || u <= 0 || prim_for(cp->prims, n, u)) continue;
          ConvPrim p;
          const dnnl::memory::desc src({n, cin(u), g.H, g.W}, *t, dnnl::memory::format_tag::any);
          const dnnl::memory::desc dst({n, cout(u), g.OH, g.OW}, *t, dnnl::memory::format_tag::any);
          const dnnl::memory::desc any_w(wdims(u), *t, dnnl::memory::format_tag::any);
          const dnnl::memory::desc bias_md({cout(u)}, dt::f32, dnnl::memory::format_tag::x);
          const dims strides{g.sh, g.sw}, dil{g.dh - 1, g.dw - 1}, pl{g.pt, g.pl}, pr{g.pb, g.pr};
          const auto desc = conv_desc(src, any_w, bias_md, dst, has_bias, strides, dil, pl, pr);
          p.pd = dnnl::convolution_forward::primitive_desc(desc, conv_attr(g.act), *g_engine);
          if (!fast_impl(p.pd.impl_info_str())) return cp;
          p.prim = dnnl::convolution_forward(p.pd);
          p.rx.make(x_user(n, u), p.pd.src_desc());
          p.rw.make(w_user(u), p.pd.weights_desc());
          p.ry.make(p.pd.dst_desc(), y_user(n, u));
          p.n = n;
          p.u = u;
          cp->prims.push_back(std::move(p));
        }
      // One weights buffer per channel piece serves every image piece: their
      // primitives must agree on its format.
      for (const ConvPrim& p : cp->prims)
        for (const ConvPrim& q : cp->prims)
          if (p.u == q.u && p.pd.weights_desc() != q.pd.weights_desc()) return cp;
    } catch (const dnnl::error&) {
      return cp;
    }
    // Ungrouped channel pieces all read the whole image: reformat it once per
    // image piece (when their primitives agree on the format) instead of once
    // per piece.
    cp->share_src = !grouped && cparts > 1;
    for (const ConvPrim& p : cp->prims)
      for (const ConvPrim& q : cp->prims)
        if (p.n == q.n && p.pd.src_desc() != q.pd.src_desc()) cp->share_src = false;
    cp->wbuf.reserve(static_cast<size_t>(cparts));
    for (int64_t j = 0; j < cparts; ++j) {
      const ConvPrim* p = with_units(cp->prims, csplit.lo(j + 1) - csplit.lo(j));
      cp->wbuf.emplace_back(p && p->rw.needed ? p->pd.weights_desc().get_size() : 0);
    }
    if (pack) {
      pfor(c, cparts, 1, [&](int64_t j0, int64_t j1) {
        OneThread inner;
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t u0 = csplit.lo(j), u = csplit.lo(j + 1) - u0;
          const ConvPrim* p = u > 0 ? with_units(cp->prims, u) : nullptr;
          if (!p || !p->rw.needed) continue;
          p->rw(dnnl::memory(w_user(u), *g_engine, w_piece(u0)),
                dnnl::memory(p->pd.weights_desc(), *g_engine, cp->wbuf[static_cast<size_t>(j)].get()));
        }
      });
      cp->packed = true;
    }
    cp->ok = true;
    return cp;
  };
  // Constant weights: the plan and the packed weights are kept with them,
  // keyed on everything they depend on.
  std::shared_ptr<const ConvPlan> plan;
  if (packed::constant(c, 1)) {
    std::string key = kept_key("onednn.conv2d", {g.N, g.C, g.H, g.W, g.O, g.Cg, g.kH, g.kW, g.G, g.sh, g.sw, g.dh, g.dw,
                                                 g.pt, g.pl, g.pb, g.pr, xs[0], xs[1], xs[2], xs[3], ws[0], ws[1], ws[2],
                                                 ws[3], lw.offset, nparts, cparts, static_cast<int64_t>(d),
                                                 int64_t{has_bias}, static_cast<int64_t>(g.act.kind)});
    if (g.act.kind == Activation::Clip) {
      char bounds[64];
      std::snprintf(bounds, sizeof bounds, ",%a,%a", static_cast<double>(g.act.lo), static_cast<double>(g.act.hi));
      key += bounds;
    }
    plan = packed::get<ConvPlan>(c, 1, key, [&] { return make_plan(true); });
  } else {
    plan = make_plan(false);
  }
  if (!plan->ok) return false;
  const std::vector<ConvPrim>& prims = plan->prims;
  const bool share_src = plan->share_src;

  // Element offset of piece (image n0, unit u0) in x and y.
  auto x_off = [&](int64_t n0, int64_t u0) { return n0 * xs[0] + (grouped ? u0 * g.Cg * xs[1] : 0); };

  std::vector<float> bias = conv_bias(c, d, g.O);

  // Weights (per channel piece) and the shared images in the primitives'
  // formats, first, spread over the threads.
  std::vector<Scratch> xbuf;
  // Each channel piece's weights in its primitive's format: the plan's
  // buffers (packed already, or filled below), or the user's in place.
  std::vector<char*> wptr;
  for (int64_t j = 0; j < cparts; ++j) {
    const ConvPrim* p = with_units(prims, csplit.lo(j + 1) - csplit.lo(j));
    wptr.push_back(p && p->rw.needed ? static_cast<char*>(plan->wbuf[static_cast<size_t>(j)].get()) : w_piece(csplit.lo(j)));
  }
  if (share_src) {
    xbuf.reserve(static_cast<size_t>(nparts));
    for (int64_t i = 0; i < nparts; ++i) {
      const int64_t n = nsplit.lo(i + 1) - nsplit.lo(i);
      const ConvPrim* p = prim_for(prims, n, csplit.lo(1) - csplit.lo(0));
      xbuf.emplace_back(p && p->rx.needed ? p->pd.src_desc().get_size() : 0);
    }
  }
  // Weights not packed yet (they are not constant) go into the plan's
  // buffers here, beside the shared images.
  const int64_t wprep = plan->packed ? 0 : cparts;
  const int64_t prep = wprep + (share_src ? nparts : 0);
  pfor(c, prep, 1, [&](int64_t i0, int64_t i1) {
    OneThread inner;
    for (int64_t i = i0; i < i1; ++i) {
      if (i < wprep) {
        const int64_t u0 = csplit.lo(i), u = csplit.lo(i + 1) - u0;
        if (u <= 0) continue;
        const ConvPrim* p = with_units(prims, u);
        if (!p->rw.needed) continue;
        p->rw(dnnl::memory(w_user(u), *g_engine, w_piece(u0)),
              dnnl::memory(p->pd.weights_desc(), *g_engine, wptr[static_cast<size_t>(i)]));
      } else {
        const int64_t k = i - wprep, n0 = nsplit.lo(k), n = nsplit.lo(k + 1) - n0;
        if (n <= 0 || !xbuf[static_cast<size_t>(k)].get()) continue;
        const ConvPrim* p = prim_for(prims, n, csplit.lo(1) - csplit.lo(0));
        p->rx(dnnl::memory(x_user(n, 0), *g_engine, x + x_off(n0, 0) * static_cast<int64_t>(es)),
              dnnl::memory(p->pd.src_desc(), *g_engine, xbuf[static_cast<size_t>(k)].get()));
      }
    }
  });

  pfor(c, nparts * cparts, 1, [&](int64_t i0, int64_t i1) {
    OneThread inner;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t ip = i / cparts, jp = i % cparts;
      const int64_t n0 = nsplit.lo(ip), n = nsplit.lo(ip + 1) - n0;
      const int64_t u0 = csplit.lo(jp), u = csplit.lo(jp + 1) - u0;
      if (n <= 0 || u <= 0) continue;
      const ConvPrim& p = *prim_for(prims, n, u);
      const int64_t o0 = grouped ? u0 * Og : u0;
      const dnnl::memory xu(x_user(n, u), *g_engine, x + x_off(n0, u0) * static_cast<int64_t>(es));
      const dnnl::memory yu(y_user(n, u), *g_engine, y + (n0 * ystride + o0 * g.OH * g.OW) * static_cast<int64_t>(es));
      // Input in the primitive's format: shared, in place, or reformatted here.
      std::optional<Scratch> xown;
      dnnl::memory xp = xu;
      if (share_src && xbuf[static_cast<size_t>(ip)].get()) {
        xp = dnnl::memory(p.pd.src_desc(), *g_engine, xbuf[static_cast<size_t>(ip)].get());
      } else if (p.rx.needed) {
        xown.emplace(p.pd.src_desc().get_size());
        xp = dnnl::memory(p.pd.src_desc(), *g_engine, xown->get());
        p.rx(xu, xp);
      }
      std::optional<Scratch> ybuf;
      dnnl::memory yp = yu;
      if (p.ry.needed) {
        ybuf.emplace(p.pd.dst_desc().get_size());
        yp = dnnl::memory(p.pd.dst_desc(), *g_engine, ybuf->get());
      }
      std::unordered_map<int, dnnl::memory> args{
          {DNNL_ARG_SRC, xp},
          {DNNL_ARG_WEIGHTS, dnnl::memory(p.pd.weights_desc(), *g_engine, wptr[static_cast<size_t>(jp)])},
          {DNNL_ARG_DST, yp}};
      if (has_bias)
        args.insert({DNNL_ARG_BIAS, dnnl::memory(dnnl::memory::desc({cout(u)}, dt::f32, dnnl::memory::format_tag::x),
                                                 *g_engine, bias.data() + o0)});
      run(p.prim, p.pd.scratchpad_desc(), std::move(args));
      if (ybuf) p.ry(yp, yu);
    }
  });
  return true;
}

// Channels-last convolution: y is dense [N, OH, OW, O] (oneDNN's nhwc), x is
// read in place when it is channels-last already ([N, C, H, W] with C the
// innermost dim, as a permute view of a channels-last value gives it) and
// reformatted once otherwise. Neither side pays a reorder between two such
// convolutions, which is what keeps MobileNet's depthwise and pointwise
// layers on oneDNN's fast kernels.
//
// Pieces: images, and when there are fewer images than pieces wanted (batch
// 1) each image is split further:
//   - by bands of output rows when the image outweighs the weights: a band
//     reads its band of input rows, with the padding that falls inside it,
//     and is a dense nhwc convolution of its own (one primitive per
//     distinct band);
//   - by slices of output channels when the weights outweigh the image (the
//     7x7 layers of a ResNet: a band would read all the weights again): a
//     slice reads only its weights and writes a dense scratch, copied into
//     its columns of y (oneDNN's fast kernels take no strided nhwc output).
// dst[k] = clip(src[k], lo, hi), NaN kept (docs/ops.md's relu and clamp;
// oneDNN's relu and clip post-ops turn NaN into a bound), src == dst
// allowed; compiled for AVX-512 and picked at run time (the loop runs over
// every element a fused convolution writes).
[[gnu::always_inline]] inline void clip_loop(const float* src, float* dst, int64_t n, float lo, float hi) {
  for (int64_t k = 0; k < n; ++k) dst[k] = std::min(std::max(src[k], lo), hi);
}
void clip_base(const float* src, float* dst, int64_t n, float lo, float hi) { clip_loop(src, dst, n, lo, hi); }
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512vl,avx2"))) void clip_avx512(const float* src, float* dst, int64_t n, float lo,
                                                                   float hi) {
  clip_loop(src, dst, n, lo, hi);
}
#endif
void clip(const float* src, float* dst, int64_t n, float lo, float hi) {
#if defined(__x86_64__)
  if (isa() >= Isa::avx512) return clip_avx512(src, dst, n, lo, hi);
#endif
  clip_base(src, dst, n, lo, hi);
}
// dst[k] = clip(src[k] + r[k], lo, hi): the shortcut added, then the
// activation (src == dst allowed; r contiguous).
[[gnu::always_inline]] inline void add_clip_loop(const float* src, const float* r, float* dst, int64_t n, float lo,
                                                 float hi) {
  for (int64_t k = 0; k < n; ++k) dst[k] = std::min(std::max(src[k] + r[k], lo), hi);
}
void add_clip_base(const float* src, const float* r, float* dst, int64_t n, float lo, float hi) {
  add_clip_loop(src, r, dst, n, lo, hi);
}
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512vl,avx2"))) void add_clip_avx512(const float* src, const float* r, float* dst,
                                                                       int64_t n, float lo, float hi) {
  add_clip_loop(src, r, dst, n, lo, hi);
}
#endif
void add_clip(const float* src, const float* r, float* dst, int64_t n, float lo, float hi) {
#if defined(__x86_64__)
  if (isa() >= Isa::avx512) return add_clip_avx512(src, r, dst, n, lo, hi);
#endif
  add_clip_base(src, r, dst, n, lo, hi);
}

struct NhwcPiece {
  int64_t n0, n, r0, oh, ih0, ih, pt, pb, u0, u;
};
struct NhwcPrim {
  int64_t n = -1, ih = -1, pt = -1, pb = -1, oh = -1, u = -1;
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
};
struct NhwcPlan {
  bool ok = false;
  std::vector<NhwcPrim> prims;
  // Weights in the primitives' formats: one per (first channel, format).
  std::vector<std::pair<std::pair<int64_t, dnnl::memory::desc>, Scratch>> wbufs;
  bool packed = false;
  const NhwcPrim* prim(const NhwcPiece& q) const {
    for (const NhwcPrim& p : prims)
      if (p.n == q.n && p.ih == q.ih && p.pt == q.pt && p.pb == q.pb && p.oh == q.oh && p.u == q.u) return &p;
    return nullptr;
  }
  void* weights(int64_t u0, const dnnl::memory::desc& d) const {
    for (const auto& [key, buf] : wbufs)
      if (key.first == u0 && key.second == d) return buf.get();
    return nullptr;
  }
};

bool conv2d_nhwc(const Call& c, bp_dtype d, const ConvGeom& g) {
  if (!enabled()) return false;
  const std::optional<dt> t = dnnl_type(d);
  if (!t || (g.act.kind != Activation::None && d != BP_DTYPE_F32)) return false;
  if (g.N <= 0 || g.C <= 0 || g.H <= 0 || g.W <= 0 || g.O <= 0 || g.Cg <= 0 || g.OH <= 0 || g.OW <= 0) return false;
  const double macs = static_cast<double>(g.N) * static_cast<double>(g.O) * static_cast<double>(g.OH * g.OW) *
                      static_cast<double>(g.Cg * g.kH * g.kW);
  // No size floor here: the alternative is the NCHW path plus a transpose,
  // slower than oneDNN however small the work (ShuffleNet's 28x28 depthwise).
  const bp_layout& lx = c.in_layout(0);
  const bp_layout& lw = c.in_layout(1);
  int64_t ws[4];
  for (int i = 0; i < 4; ++i) {
    ws[i] = lw.shape[i] == 1 ? 1 : lw.strides[i];
    if (ws[i] <= 0) return false;
    if (lx.shape[i] > 1 && lx.strides[i] <= 0) return false;
  }
  // x channels-last and dense: read in place.
  const int64_t plane = g.H * g.W * g.C;
  const bool x_nhwc = (g.C == 1 || lx.strides[1] == 1) && (g.W == 1 || lx.strides[3] == g.C) &&
                      (g.H == 1 || lx.strides[2] == g.W * g.C) && (g.N == 1 || lx.strides[0] == plane);
  const int64_t Og = g.O / g.G;
  const bool grouped = g.G > 1;
  const bool has_bias = c.has_input(2);

  // The pieces (see above).
  const int64_t threads = num_threads(c);
  const int64_t want = threads * kNhwcPiecesPerThread;
  const int64_t per_image = threads == 1 || g.N >= want ? 1 : (want + g.N - 1) / g.N;
  const double wbytes = static_cast<double>(g.O) * static_cast<double>(g.Cg * g.kH * g.kW);
  const bool by_channels = per_image > 1 && !grouped && wbytes > static_cast<double>(plane);
  int64_t splits = by_channels ? std::min(per_image, std::max<int64_t>(1, g.O / 16))
                               : std::min(per_image, std::max<int64_t>(1, g.OH / 2));
  while (splits > 1 && macs / static_cast<double>(g.N * splits) < kNhwcMinMacsPerPiece) --splits;
  const int64_t nparts = splits > 1 ? g.N : std::min(g.N, threads == 1 ? 1 : want);
  const Split nsplit{g.N, nparts}, rsplit{g.OH, by_channels ? 1 : splits}, usplit{g.O, by_channels ? splits : 1, 16};
  std::vector<NhwcPiece> pieces;
  for (int64_t i = 0; i < nparts; ++i)
    for (int64_t j = 0; j < splits; ++j) {
      NhwcPiece q{};
      q.n0 = nsplit.lo(i);
      q.n = nsplit.lo(i + 1) - q.n0;
      const int64_t bj = by_channels ? 0 : j, uj = by_channels ? j : 0;
      q.r0 = rsplit.lo(bj);
      q.oh = rsplit.lo(bj + 1) - q.r0;
      const int64_t lo = q.r0 * g.sh - g.pt, hi = (q.r0 + q.oh - 1) * g.sh - g.pt + (g.kH - 1) * g.dh + 1;
      q.ih0 = std::max<int64_t>(lo, 0);
      q.ih = std::min(hi, g.H) - q.ih0;
      q.pt = q.ih0 - lo;
      q.pb = hi - std::min(hi, g.H);
      q.u0 = usplit.lo(uj);
      q.u = usplit.lo(uj + 1) - q.u0;
      if (q.n > 0 && q.oh > 0 && q.u > 0) pieces.push_back(q);
    }

  OneThread one;
  const dims wstrides = grouped ? dims{Og * ws[0], ws[0], ws[1], ws[2], ws[3]} : dims{ws[0], ws[1], ws[2], ws[3]};
  auto wdims = [&](int64_t u) { return grouped ? dims{g.G, Og, g.Cg, g.kH, g.kW} : dims{u, g.Cg, g.kH, g.kW}; };
  auto w_user = [&](int64_t u) { return dnnl::memory::desc(wdims(u), *t, wstrides); };
  const size_t es = dsize(d);
  char* w = static_cast<char*>(const_cast<void*>(c.in[1].data)) + lw.offset * static_cast<int64_t>(es);
  auto pack_weights = [&](int64_t u0, int64_t u, const dnnl::memory::desc& to, void* dst) {
    OneThread inner;
    Reorder r;
    r.make(w_user(u), to);
    char* from = w + u0 * ws[0] * static_cast<int64_t>(es);
    if (r.needed)
      r(dnnl::memory(w_user(u), *g_engine, from), dnnl::memory(to, *g_engine, dst));
    else
      std::memcpy(dst, from, to.get_size());
  };
  auto make_plan = [&](bool pack) {
    auto cp = std::make_shared<NhwcPlan>();
    try {
      for (const NhwcPiece& q : pieces) {
        if (!cp->prim(q)) {
          NhwcPrim p;
          const dnnl::memory::desc src({q.n, g.C, q.ih, g.W}, *t, dnnl::memory::format_tag::nhwc);
          const dnnl::memory::desc dst({q.n, q.u, q.oh, g.OW}, *t, dnnl::memory::format_tag::nhwc);
          const dnnl::memory::desc any_w(wdims(q.u), *t, dnnl::memory::format_tag::any);
          const dnnl::memory::desc bias_md({q.u}, dt::f32, dnnl::memory::format_tag::x);
          const dims strides{g.sh, g.sw}, dil{g.dh - 1, g.dw - 1}, pl{q.pt, g.pl}, pr{q.pb, g.pr};
          const auto desc = conv_desc(src, any_w, bias_md, dst, has_bias, strides, dil, pl, pr);
          p.pd = dnnl::convolution_forward::primitive_desc(desc, conv_attr({}), *g_engine);
          if (!fast_impl(p.pd.impl_info_str())) return cp;
          p.prim = dnnl::convolution_forward(p.pd);
          p.n = q.n;
          p.ih = q.ih;
          p.pt = q.pt;
          p.pb = q.pb;
          p.oh = q.oh;
          p.u = q.u;
          cp->prims.push_back(std::move(p));
        }
        const dnnl::memory::desc wdesc = cp->prim(q)->pd.weights_desc();
        if (!cp->weights(q.u0, wdesc)) {
          cp->wbufs.emplace_back(std::make_pair(q.u0, wdesc), Scratch(wdesc.get_size()));
          if (pack) pack_weights(q.u0, q.u, wdesc, cp->wbufs.back().second.get());
        }
      }
    } catch (const dnnl::error&) {
      return cp;
    }
    cp->packed = pack;
    cp->ok = true;
    return cp;
  };
  std::shared_ptr<const NhwcPlan> plan;
  if (packed::constant(c, 1)) {
    const std::string key =
        kept_key("onednn.conv2d_nhwc", {g.N, g.C, g.H, g.W, g.O, g.Cg, g.kH, g.kW, g.G, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl,
                                        g.pb, g.pr, ws[0], ws[1], ws[2], ws[3], lw.offset, nparts, splits,
                                        int64_t{by_channels}, static_cast<int64_t>(d), int64_t{has_bias}});
    plan = packed::get<NhwcPlan>(c, 1, key, [&] { return make_plan(true); });
  } else {
    plan = make_plan(false);
  }
  if (!plan->ok) return false;
  // Weights not kept with a constant buffer: into the plan's buffers now.
  if (!plan->packed)
    for (const auto& [key, buf] : plan->wbufs) {
      const NhwcPiece* q = nullptr;
      for (const NhwcPiece& p : pieces)
        if (p.u0 == key.first) q = &p;
      pack_weights(key.first, q->u, key.second, buf.get());
    }

  // x channels-last: in place, or reformatted here, in blocks of rows over
  // the threads (the stem's image arrives NCHW; oneDNN's fast kernels take
  // no NCHW input with a channels-last output).
  char* x = static_cast<char*>(const_cast<void*>(c.in[0].data)) + lx.offset * static_cast<int64_t>(es);
  std::optional<Scratch> xown;
  if (!x_nhwc) {
    xown.emplace(static_cast<size_t>(g.N * plane) * es);
    char* xd = static_cast<char*>(xown->get());
    const Split hsplit{g.H, std::min<int64_t>(g.H, threads * 2)};
    const int64_t blocks = hsplit.parts;
    // One reorder per distinct block height (at most two), made here once:
    // making one costs tens of microseconds, more than a block's copy.
    struct RowReorder {
      int64_t rows;
      dnnl::memory::desc from, to;
      Reorder r;
    };
    std::vector<RowReorder> reorders;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t rows = hsplit.lo(b + 1) - hsplit.lo(b);
      if (rows <= 0 || std::any_of(reorders.begin(), reorders.end(), [&](const RowReorder& o) { return o.rows == rows; }))
        continue;
      RowReorder o{rows,
                   dnnl::memory::desc({1, g.C, rows, g.W}, *t,
                                      dims{plane, std::max<int64_t>(lx.strides[1], 1), std::max<int64_t>(lx.strides[2], 1),
                                           std::max<int64_t>(lx.strides[3], 1)}),
                   dnnl::memory::desc({1, g.C, rows, g.W}, *t, dnnl::memory::format_tag::nhwc),
                   {}};
      o.r.make(o.from, o.to);
      reorders.push_back(std::move(o));
    }
    pfor(c, g.N * blocks, 1, [&](int64_t i0, int64_t i1) {
      OneThread inner;
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t n = i / blocks, h0 = hsplit.lo(i % blocks), rows = hsplit.lo(i % blocks + 1) - h0;
        if (rows <= 0) continue;
        const RowReorder& o = *std::find_if(reorders.begin(), reorders.end(), [&](const RowReorder& q) { return q.rows == rows; });
        o.r(dnnl::memory(o.from, *g_engine, x + (n * lx.strides[0] + h0 * lx.strides[2]) * static_cast<int64_t>(es)),
            dnnl::memory(o.to, *g_engine, xd + (n * plane + h0 * g.W * g.C) * static_cast<int64_t>(es)));
      }
    });
    x = xd;
  }
  std::vector<float> bias = conv_bias(c, d, g.O);
  char* y = static_cast<char*>(c.out[0].data);
  const int64_t yplane = g.OH * g.OW * g.O;
  // The activation, NaN kept (docs/ops.md's relu and clamp; oneDNN's
  // post-op would turn NaN into a bound), on each piece while it is in cache.
  const float lo = g.act.kind == Activation::Relu ? 0.0f : g.act.kind == Activation::Clip ? g.act.lo : -INFINITY;
  const float hi = g.act.kind == Activation::Relu ? INFINITY : g.act.kind == Activation::Clip ? g.act.hi : INFINITY;
  const bool act = g.act.kind != Activation::None;
  const Residual& res = g.res;
  if (res.data && d != BP_DTYPE_F32) return false;
  // The shortcut laid out like y (the channels-last view of another
  // variant's output): one contiguous run per piece.
  const bool res_like_y = res.data && res.s[1] == 1 && (g.OW == 1 || res.s[3] == g.O) &&
                          (g.OH == 1 || res.s[2] == g.OW * g.O) && (g.N == 1 || res.s[0] == yplane);
  // The finish of `cnt` channels from c0 of pixel (n, h, w): src (the
  // piece's output) -> dst in y, with the shortcut and the activation.
  auto finish = [&](const float* src, float* dst, int64_t n, int64_t h, int64_t w, int64_t c0, int64_t cnt) {
    if (res.data) {
      const float* r = res.data + n * res.s[0] + c0 * res.s[1] + h * res.s[2] + w * res.s[3];
      if (res.s[1] == 1) {
        add_clip(src, r, dst, cnt, lo, hi);
      } else {
        for (int64_t k = 0; k < cnt; ++k) dst[k] = std::min(std::max(src[k] + r[k * res.s[1]], lo), hi);
      }
    } else if (act) {
      clip(src, dst, cnt, lo, hi);
    } else if (src != dst) {
      std::memcpy(dst, src, static_cast<size_t>(cnt) * sizeof(float));
    }
  };
  pfor(c, static_cast<int64_t>(pieces.size()), 1, [&](int64_t i0, int64_t i1) {
    OneThread inner;
    for (int64_t i = i0; i < i1; ++i) {
      const NhwcPiece& q = pieces[static_cast<size_t>(i)];
      const NhwcPrim& p = *plan->prim(q);
      const bool whole = q.u == g.O;  // else a scratch, copied into y's columns
      char* yq = y + (q.n0 * yplane + q.r0 * g.OW * g.O + q.u0) * static_cast<int64_t>(es);
      std::optional<Scratch> ys;
      if (!whole) ys.emplace(p.pd.dst_desc().get_size());
      std::unordered_map<int, dnnl::memory> args{
          {DNNL_ARG_SRC,
           dnnl::memory(p.pd.src_desc(), *g_engine, x + (q.n0 * plane + q.ih0 * g.W * g.C) * static_cast<int64_t>(es))},
          {DNNL_ARG_WEIGHTS, dnnl::memory(p.pd.weights_desc(), *g_engine, plan->weights(q.u0, p.pd.weights_desc()))},
          {DNNL_ARG_DST, dnnl::memory(p.pd.dst_desc(), *g_engine, whole ? yq : ys->get())}};
      if (has_bias)
        args.insert({DNNL_ARG_BIAS, dnnl::memory(dnnl::memory::desc({q.u}, dt::f32, dnnl::memory::format_tag::x),
                                                 *g_engine, bias.data() + q.u0)});
      run(p.prim, p.pd.scratchpad_desc(), std::move(args));
      float* yf = reinterpret_cast<float*>(yq);
      if (whole && (res_like_y || (!res.data && act))) {  // one run over the piece
        finish(yf, yf, q.n0, q.r0, 0, 0, q.n * q.oh * g.OW * g.O);
      } else if (!whole || res.data) {  // pixel by pixel
        const int64_t pixels = q.n * q.oh * g.OW;
        for (int64_t px = 0; px < pixels; ++px) {
          const int64_t n = q.n0 + px / (q.oh * g.OW), h = q.r0 + (px / g.OW) % q.oh, w = px % g.OW;
          const float* src = whole ? yf + px * g.O : static_cast<const float*>(ys->get()) + px * q.u;
          if (d == BP_DTYPE_F32 || res.data || act)
            finish(src, yf + px * g.O, n, h, w, q.u0, q.u);
          else  // bf16 slices without an activation: bytes
            std::memcpy(yq + px * g.O * static_cast<int64_t>(es),
                        static_cast<const char*>(ys->get()) + px * q.u * static_cast<int64_t>(es),
                        static_cast<size_t>(q.u) * es);
        }
      }
    }
  });
  return true;
}

#endif

}  // namespace backplane::cpu::onednn
