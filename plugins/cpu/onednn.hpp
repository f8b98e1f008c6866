// matmul and conv2d through oneDNN (Debian's libdnnl, 2.x), where it beats
// the plugin's own GEMM: bf16 on AVX512-BF16 and AMX, f32 where measured to
// win. Built only when CMake finds oneDNN (BACKPLANE_CPU_ONEDNN); without it
// every function here says "not taken" and the plugin's kernels run.
//
// Threads: oneDNN 2.x in Debian uses the OpenMP runtime. The plugin never
// lets it start a team: every oneDNN call runs single-threaded on the thread
// that makes it (the OpenMP thread count of that thread is set to 1 around
// the call, then restored), and the work is split over the host's
// parallel_for like the plugin's own kernels. So oneDNN uses exactly the
// host pool's threads, never more, and no OpenMP thread spins after it.
#pragma once

#include "kernels.hpp"

namespace backplane::cpu::onednn {

// Which oneDNN ISA cap the plugin asked for at initialize.
enum class Cap {
  off,          // oneDNN not used (not built, BACKPLANE_CPU_ONEDNN=0, or a forced baseline/avx2/avx512 ISA)
  avx512_bf16,  // oneDNN capped at AVX512-BF16 (no AMX): BACKPLANE_CPU_ISA=avx512_bf16
  native,       // whatever oneDNN finds (AMX, AVX512-BF16, ...): the default and BACKPLANE_CPU_ISA=amx
};

// Called from initialize: records the cap and, the first time in the
// process, tells oneDNN its highest ISA. Writes a short description of what
// oneDNN will use ("oneDNN 2.6.3 avx512_core_bf16") into `desc`, or "" when
// off. `always` takes every product oneDNN runs fast, however small (the
// conformance suite's shapes are small; BACKPLANE_CPU_ONEDNN=always). Never
// throws.
void configure(Cap cap, bool always, char* desc, size_t desc_size) noexcept;
void release() noexcept;

// True when compiled in and configured on.
bool enabled() noexcept;

// matmul of one dtype through oneDNN. `offs` holds per batch the element
// offsets of a, b and y; the 2-D operands have strides (rsa, csa), (rsb,
// csb), and y is dense [M, N]. Returns false (having written nothing) when
// oneDNN is off, the dtype or layout is not one it runs fast, or the
// product is too small to pay for it.
bool matmul(const Call& c, bp_dtype dt, const std::vector<std::array<int64_t, 3>>& offs, int64_t M, int64_t N,
            int64_t K, int64_t rsa, int64_t csa, int64_t rsb, int64_t csb);

// An activation applied to a convolution's output (the fused vendor ops
// cpu.conv2d_relu and cpu.conv2d_clamp): relu, or clip to [lo, hi].
struct Activation {
  enum Kind { None, Relu, Clip } kind = None;
  float lo = 0, hi = 0;
};

// A value added to a convolution's output before its activation
// (cpu.conv2d_add_relu: a ResNet block's shortcut), f32: element [n, c, h,
// w] of the [N, O, OH, OW] output's shape is data[n*s[0] + c*s[1] + h*s[2] +
// w*s[3]]. Empty when data is null.
struct Residual {
  const float* data = nullptr;
  int64_t s[4] = {0, 0, 0, 0};
};

// conv2d's geometry, as Conv2dK checked it, and the activation to fuse.
struct ConvGeom {
  int64_t N, C, H, W, O, Cg, kH, kW, G, sh, sw, dh, dw, pt, pl, pb, pr, OH, OW;
  Activation act;
  Residual res = {};  // conv2d_nhwc only: act(conv + res)
};

// conv2d through oneDNN (x, w and the optional bias as the kernel got them,
// y dense), with g.act as a post-op in its output pass. Returns false
// (having written nothing) when not taken.
bool conv2d(const Call& c, bp_dtype dt, const ConvGeom& g);

// The same with y dense channels-last, [N, OH, OW, O] (the kernels
// cpu.conv2d*_nhwc): x is read in place when it is channels-last, and
// batch-1 work is split into bands of output rows. g.res, when given, is
// added before g.act (both on each piece while it is in cache). Returns
// false (having written nothing) when not taken.
bool conv2d_nhwc(const Call& c, bp_dtype dt, const ConvGeom& g);

}  // namespace backplane::cpu::onednn
