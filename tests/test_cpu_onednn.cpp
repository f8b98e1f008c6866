// The CPU plugin's matmul and conv2d at sizes where it hands them to oneDNN
// (when built with it and the processor has the ISA: bf16 on AVX512-BF16/AMX,
// f32 on AVX-512), and where it keeps them: strided, transposed, sliced and
// batched operands, broadcast batches, grouped/strided/dilated convolutions,
// bias, and an output bound to application memory; and at batch 1 on two
// threads, where convolutions split by output channels or groups and
// batched matmuls against one b run as one product. Every result is checked
// against an f64 reference computed here, within docs/ops.md's tolerances
// (f32: 1e-4 relative or 1e-6 absolute for matmul/conv2d; f16: 1e-2; bf16: 2e-2), so
// the tests hold on every path the plugin may take.
#include <catch2/catch.hpp>

#include <backplane/backplane.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using backplane::Graph;
using backplane::HostTensor;
using backplane::Json;
using backplane::Shape;

namespace {

backplane::Runtime& cpu_runtime() {
  // One runtime for this file (leaked on purpose: closed by process exit
  // only after the plugin's users are gone would need an event listener;
  // a Runtime owns no process-wide state the other tests see).
  static backplane::Runtime* rt = backplane::Runtime::create().release();
  return *rt;
}

HostTensor random_tensor(bp_dtype d, Shape shape, uint32_t seed) {
  HostTensor t(d, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
  return t;
}

double tol_rel(bp_dtype d) { return d == BP_DTYPE_BF16 ? 2e-2 : d == BP_DTYPE_F16 ? 1e-2 : 1e-4; }
double tol_abs(bp_dtype d) { return d == BP_DTYPE_BF16 ? 2e-2 : d == BP_DTYPE_F16 ? 1e-2 : 1e-6; }

// Element-wise check within docs/ops.md's bound (relative or absolute) plus
// what f32 accumulation may add: unit roundoff (2^-24) times `magnitude`,
// the number of terms times the sum of their magnitudes. A dropped term
// (about sum / count) is far outside it; the old bound, a multiple of the
// sum (half of it in bf16), let one through.
void check_close(const HostTensor& got, const std::vector<double>& want, const std::vector<double>& magnitude, bp_dtype d) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want[static_cast<size_t>(i)], m = magnitude[static_cast<size_t>(i)];
    const double err = std::abs(g - w);
    if (err <= std::max(tol_abs(d), tol_rel(d) * std::abs(w)) + std::ldexp(m, -24)) continue;
    if (bad++ == 0) first = "at " + std::to_string(i) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
  }
  INFO(first);
  CHECK(bad == 0);
}

// Reference matmul over dense row-major [batch, M, K] x [batch?, K, N] in f64
// of the values the operands hold (bf16 values exactly).
struct Ref {
  std::vector<double> y, mag;
};

Ref ref_matmul(const std::vector<double>& a, const std::vector<double>& b, int64_t batch, int64_t M, int64_t K,
               int64_t N, bool b_batched) {
  Ref r{std::vector<double>(static_cast<size_t>(batch * M * N)), std::vector<double>(static_cast<size_t>(batch * M * N))};
  for (int64_t t = 0; t < batch; ++t)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0, m = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = a[static_cast<size_t>((t * M + i) * K + k)] *
                           b[static_cast<size_t>(((b_batched ? t : 0) * K + k) * N + j)];
          s += p;
          m += std::abs(p);
        }
        r.y[static_cast<size_t>((t * M + i) * N + j)] = s;
        r.mag[static_cast<size_t>((t * M + i) * N + j)] = static_cast<double>(K) * m;
      }
  return r;
}

std::vector<double> values(const HostTensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.get(i);
  return v;
}

// Values of a [rows, cols] tensor read transposed: element (i, j) of x.T.
std::vector<double> transposed(const HostTensor& t, int64_t rows, int64_t cols) {
  std::vector<double> v(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v[static_cast<size_t>(j * rows + i)] = t.get(i * cols + j);
  return v;
}

}  // namespace

TEST_CASE("cpu matmul: dense, transposed, sliced and batched operands", "[cpu][onednn]") {
  auto& rt = cpu_runtime();
  auto& dev = rt.device("cpu");
  for (bp_dtype d : {BP_DTYPE_F32, BP_DTYPE_BF16}) {
    DYNAMIC_SECTION("dtype " << (d == BP_DTYPE_F32 ? "f32" : "bf16")) {
      const int64_t M = 96, K = 160, N = 112;
      SECTION("dense, and again with the output bound to application memory") {
        const HostTensor a = random_tensor(d, {M, K}, 1), b = random_tensor(d, {K, N}, 2);
        Graph g;
        g.input("a", d, {M, K});
        g.input("b", d, {K, N});
        g.node("y", "matmul", {"a", "b"});
        g.output("y");
        auto plan = rt.compile(g, dev);
        const Ref r = ref_matmul(values(a), values(b), 1, M, K, N, false);
        check_close(plan.run({{"a", a}, {"b", b}}).at("y"), r.y, r.mag, d);
        HostTensor out(d, {M, N});
        plan.bind_output("y", out.data(), out.nbytes());
        plan.set_input("a", a);
        plan.set_input("b", b);
        plan.execute();
        check_close(out, r.y, r.mag, d);
      }
      SECTION("a and b transposed views") {
        const HostTensor at = random_tensor(d, {K, M}, 3), bt = random_tensor(d, {N, K}, 4);
        Graph g;
        g.input("at", d, {K, M});
        g.input("bt", d, {N, K});
        g.node("a", "transpose", {"at"}, {{"dim0", 0}, {"dim1", 1}});
        g.node("b", "transpose", {"bt"}, {{"dim0", 0}, {"dim1", 1}});
        g.node("y", "matmul", {"a", "b"});
        g.output("y");
        auto plan = rt.compile(g, dev);
        const Ref r = ref_matmul(transposed(at, K, M), transposed(bt, N, K), 1, M, K, N, false);
        check_close(plan.run({{"at", at}, {"bt", bt}}).at("y"), r.y, r.mag, d);
      }
      SECTION("a sliced (rows apart by more than K), b with a negative step") {
        const int64_t Kw = K + 40;
        const HostTensor aw = random_tensor(d, {M, Kw}, 5), bw = random_tensor(d, {K, N}, 6);
        Graph g;
        g.input("aw", d, {M, Kw});
        g.input("bw", d, {K, N});
        g.node("a", "slice", {"aw"}, {{"dim", 1}, {"start", 7}, {"end", 7 + K}});
        g.node("b", "slice", {"bw"}, {{"dim", 0}, {"step", -1}});
        g.node("y", "matmul", {"a", "b"});
        g.output("y");
        auto plan = rt.compile(g, dev);
        std::vector<double> av(static_cast<size_t>(M * K)), bv(static_cast<size_t>(K * N));
        for (int64_t i = 0; i < M; ++i)
          for (int64_t k = 0; k < K; ++k) av[static_cast<size_t>(i * K + k)] = aw.get(i * Kw + 7 + k);
        for (int64_t k = 0; k < K; ++k)
          for (int64_t j = 0; j < N; ++j) bv[static_cast<size_t>(k * N + j)] = bw.get((K - 1 - k) * N + j);
        const Ref r = ref_matmul(av, bv, 1, M, K, N, false);
        check_close(plan.run({{"aw", aw}, {"bw", bw}}).at("y"), r.y, r.mag, d);
      }
      SECTION("batched a against one b (broadcast), and batched b") {
        const int64_t B = 3;
        const HostTensor a = random_tensor(d, {B, M, K}, 7), b = random_tensor(d, {K, N}, 8),
                         b3 = random_tensor(d, {B, K, N}, 9);
        Graph g;
        g.input("a", d, {B, M, K});
        g.input("b", d, {K, N});
        g.input("b3", d, {B, K, N});
        g.node("y", "matmul", {"a", "b"});
        g.node("z", "matmul", {"a", "b3"});
        g.output("y");
        g.output("z");
        auto plan = rt.compile(g, dev);
        const auto out = plan.run({{"a", a}, {"b", b}, {"b3", b3}});
        const Ref ry = ref_matmul(values(a), values(b), B, M, K, N, false);
        const Ref rz = ref_matmul(values(a), values(b3), B, M, K, N, true);
        check_close(out.at("y"), ry.y, ry.mag, d);
        check_close(out.at("z"), rz.y, rz.mag, d);
      }
    }
  }
}

namespace {

struct ConvCase {
  Shape x, w;
  bool bias;
  int64_t stride, pad, dil, groups;
};

// f64 direct convolution of the values x and w hold (dense NCHW, OIHW).
Ref ref_conv(const HostTensor& x, const HostTensor& w, const HostTensor* bias, const ConvCase& c, int64_t OH, int64_t OW) {
  const int64_t N = c.x[0], C = c.x[1], H = c.x[2], W = c.x[3], O = c.w[0], Cg = c.w[1], kH = c.w[2], kW = c.w[3];
  const int64_t Og = O / c.groups;
  (void)C;
  Ref r{std::vector<double>(static_cast<size_t>(N * O * OH * OW)), std::vector<double>(static_cast<size_t>(N * O * OH * OW))};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t g = o / Og;
          double s = bias ? bias->get(o) : 0.0, m = std::abs(s);
          int64_t terms = bias ? 1 : 0;
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t kh = 0; kh < kH; ++kh)
              for (int64_t kw = 0; kw < kW; ++kw) {
                const int64_t ih = oh * c.stride - c.pad + kh * c.dil, iw = ow * c.stride - c.pad + kw * c.dil;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const double p = x.get(((n * c.x[1] + g * Cg + ci) * H + ih) * W + iw) * w.get(((o * Cg + ci) * kH + kh) * kW + kw);
                s += p;
                m += std::abs(p);
                ++terms;
              }
          const size_t i = static_cast<size_t>(((n * O + o) * OH + oh) * OW + ow);
          r.y[i] = s;
          r.mag[i] = static_cast<double>(terms) * m;
        }
  return r;
}

}  // namespace

TEST_CASE("cpu conv2d: padding, stride, dilation, groups, bias, a strided input", "[cpu][onednn]") {
  auto& rt = cpu_runtime();
  auto& dev = rt.device("cpu");
  const std::vector<ConvCase> cases = {
      {{2, 32, 20, 20}, {48, 32, 3, 3}, true, 1, 1, 1, 1},
      {{3, 16, 17, 15}, {24, 16, 3, 3}, false, 2, 1, 1, 1},
      {{1, 32, 19, 19}, {32, 8, 3, 3}, true, 1, 2, 2, 4},
      {{4, 24, 14, 14}, {40, 24, 1, 1}, true, 1, 0, 1, 1},
  };
  for (bp_dtype d : {BP_DTYPE_F32, BP_DTYPE_BF16}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const ConvCase& c = cases[ci];
      for (bool strided_x : {false, true}) {
        DYNAMIC_SECTION((d == BP_DTYPE_F32 ? "f32" : "bf16") << " case " << ci << (strided_x ? " strided x" : "")) {
          const int64_t OH = (c.x[2] + 2 * c.pad - c.dil * (c.w[2] - 1) - 1) / c.stride + 1;
          const int64_t OW = (c.x[3] + 2 * c.pad - c.dil * (c.w[3] - 1) - 1) / c.stride + 1;
          const HostTensor x = random_tensor(d, c.x, 11 + static_cast<uint32_t>(ci));
          const HostTensor w = random_tensor(d, c.w, 21 + static_cast<uint32_t>(ci));
          const HostTensor bias = random_tensor(d, {c.w[0]}, 31 + static_cast<uint32_t>(ci));
          Graph g;
          Json params = {{"stride", c.stride}, {"padding", c.pad}, {"dilation", c.dil}, {"groups", c.groups}};
          std::map<std::string, HostTensor> inputs;
          if (strided_x) {
            // x as NHWC memory seen through a permute: channels innermost.
            const Shape nhwc{c.x[0], c.x[2], c.x[3], c.x[1]};
            HostTensor xs(d, nhwc);
            for (int64_t n = 0; n < c.x[0]; ++n)
              for (int64_t ch = 0; ch < c.x[1]; ++ch)
                for (int64_t h = 0; h < c.x[2]; ++h)
                  for (int64_t ww = 0; ww < c.x[3]; ++ww)
                    xs.set(((n * c.x[2] + h) * c.x[3] + ww) * c.x[1] + ch, x.get(((n * c.x[1] + ch) * c.x[2] + h) * c.x[3] + ww));
            g.input("xs", d, nhwc);
            g.node("x", "permute", {"xs"}, {{"dims", {0, 3, 1, 2}}});
            inputs["xs"] = xs;
          } else {
            g.input("x", d, c.x);
            inputs["x"] = x;
          }
          g.input("w", d, c.w);
          inputs["w"] = w;
          if (c.bias) {
            g.input("bias", d, {c.w[0]});
            inputs["bias"] = bias;
            g.node("y", "conv2d", {"x", "w", "bias"}, params);
          } else {
            g.node("y", "conv2d", {"x", "w", ""}, params);
          }
          g.output("y");
          auto plan = rt.compile(g, dev);
          const Ref r = ref_conv(x, w, c.bias ? &bias : nullptr, c, OH, OW);
          check_close(plan.run(inputs).at("y"), r.y, r.mag, d);
        }
      }
    }
  }
}

namespace {

// A runtime of exactly two threads: the batch-1 splits are what it checks.
backplane::Runtime& two_thread_runtime() {
  static backplane::Runtime* rt = [] {
    backplane::RuntimeOptions o;
    o.num_threads = 2;
    return backplane::Runtime::create(o).release();
  }();
  return *rt;
}

const char* dtype_name(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F32: return "f32";
    case BP_DTYPE_BF16: return "bf16";
    case BP_DTYPE_F16: return "f16";
    default: return "f64";
  }
}

}  // namespace

// Batch 1 on two threads: oneDNN (f32 on AVX-512, bf16 on AVX512-BF16) splits
// each convolution by output channels, or by groups, 16 channels at a time
// (f32 3x3 stride-1 convolutions take the plugin's Winograd instead);
// depthwise convolutions take the plugin's direct kernel on every path, and
// its own kernels (f16, f64, and everything without oneDNN) take 1x1 ones as
// a plain GEMM over the image and small groups one per thread. tests/onednn_split_ran.sh checks from
// oneDNN's log that the split primitives are the ones that ran.
TEST_CASE("cpu conv2d at batch 1 on two threads: channel and group splits, depthwise, pointwise", "[cpu][onednn]") {
  auto& rt = two_thread_runtime();
  REQUIRE(rt.num_threads() == 2);
  auto& dev = rt.device("cpu");
  const std::vector<ConvCase> cases = {
      {{1, 64, 56, 56}, {64, 64, 3, 3}, true, 2, 1, 1, 1},       // ResNet 3x3 at stride 2: split by output channels
      {{1, 64, 28, 28}, {64, 64, 3, 3}, true, 1, 1, 1, 1},       // 3x3 at stride 1: Winograd for f32 (tile blocks)
      {{1, 3, 64, 64}, {32, 3, 7, 7}, true, 2, 3, 1, 1},         // the stem: 7x7 at stride 2 over 3 channels
      {{1, 144, 56, 56}, {144, 1, 3, 3}, true, 1, 1, 1, 144},    // depthwise
      {{1, 96, 57, 57}, {96, 1, 3, 3}, false, 2, 1, 1, 96},      // depthwise at stride 2, odd size
      {{1, 32, 8, 8}, {64, 1, 3, 3}, true, 1, 1, 2, 32},         // depthwise with two filters per channel, dilated
      {{1, 64, 40, 40}, {96, 64, 1, 1}, true, 1, 0, 1, 1},       // pointwise
      {{1, 64, 28, 28}, {64, 8, 3, 3}, true, 1, 1, 1, 8},        // eight groups of eight channels
      {{1, 128, 56, 56}, {128, 8, 3, 3}, false, 1, 1, 1, 16},    // sixteen groups: split by groups
  };
  for (bp_dtype d : {BP_DTYPE_F32, BP_DTYPE_BF16, BP_DTYPE_F16, BP_DTYPE_F64}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const ConvCase& c = cases[ci];
      for (bool strided_x : {false, true}) {
        if (strided_x && (d == BP_DTYPE_F16 || d == BP_DTYPE_F64)) continue;
        DYNAMIC_SECTION(dtype_name(d) << " case " << ci << (strided_x ? " strided x" : "")) {
          const int64_t OH = (c.x[2] + 2 * c.pad - c.dil * (c.w[2] - 1) - 1) / c.stride + 1;
          const int64_t OW = (c.x[3] + 2 * c.pad - c.dil * (c.w[3] - 1) - 1) / c.stride + 1;
          const HostTensor x = random_tensor(d, c.x, 41 + static_cast<uint32_t>(ci));
          const HostTensor w = random_tensor(d, c.w, 51 + static_cast<uint32_t>(ci));
          const HostTensor bias = random_tensor(d, {c.w[0]}, 61 + static_cast<uint32_t>(ci));
          Graph g;
          std::map<std::string, HostTensor> inputs;
          if (strided_x) {
            // x as NHWC memory seen through a permute: channels innermost
            // (a channel slice of it is no dense block).
            const Shape nhwc{1, c.x[2], c.x[3], c.x[1]};
            HostTensor xs(d, nhwc);
            for (int64_t ch = 0; ch < c.x[1]; ++ch)
              for (int64_t h = 0; h < c.x[2]; ++h)
                for (int64_t ww = 0; ww < c.x[3]; ++ww)
                  xs.set((h * c.x[3] + ww) * c.x[1] + ch, x.get((ch * c.x[2] + h) * c.x[3] + ww));
            g.input("xs", d, nhwc);
            g.node("x", "permute", {"xs"}, {{"dims", {0, 3, 1, 2}}});
            inputs["xs"] = xs;
          } else {
            g.input("x", d, c.x);
            inputs["x"] = x;
          }
          g.input("w", d, c.w);
          inputs["w"] = w;
          const Json params = {{"stride", c.stride}, {"padding", c.pad}, {"dilation", c.dil}, {"groups", c.groups}};
          if (c.bias) {
            g.input("bias", d, {c.w[0]});
            inputs["bias"] = bias;
            g.node("y", "conv2d", {"x", "w", "bias"}, params);
          } else {
            g.node("y", "conv2d", {"x", "w", ""}, params);
          }
          g.output("y");
          auto plan = rt.compile(g, dev);
          const Ref r = ref_conv(x, w, c.bias ? &bias : nullptr, c, OH, OW);
          check_close(plan.run(inputs).at("y"), r.y, r.mag, d);
        }
      }
    }
  }
}

// Batched a against one b (2-D, or its batch dims of size 1) whose batch
// dims and rows flatten into one run of rows: one [B * M, K] x [K, N]
// product, for M = 1 (attention's [S, 1, K] rows) and M > 1; and an a whose
// batches cannot be flattened (a permuted view), which takes the product
// per batch.
TEST_CASE("cpu matmul on two threads: batches against one b flattened into one product", "[cpu][onednn]") {
  auto& rt = two_thread_runtime();
  auto& dev = rt.device("cpu");
  struct MmCase {
    Shape a, b;
    bool permuted_a;
  };
  const std::vector<MmCase> cases = {
      {{64, 1, 256}, {256, 192}, false},
      {{1, 48, 256}, {256, 192}, false},
      {{2, 3, 5, 64}, {64, 40}, false},
      {{6, 5, 64}, {1, 64, 40}, false},
      {{6, 5, 64}, {64, 40}, true},
      {{4, 16, 64}, {4, 64, 16}, false},
  };
  for (bp_dtype d : {BP_DTYPE_F32, BP_DTYPE_BF16, BP_DTYPE_F16, BP_DTYPE_F64}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const MmCase& c = cases[ci];
      DYNAMIC_SECTION(dtype_name(d) << " case " << ci) {
        const int64_t r = static_cast<int64_t>(c.a.size());
        const int64_t M = c.a[r - 2], K = c.a[r - 1], N = c.b.back();
        int64_t batch = 1;
        for (int64_t i = 0; i + 2 < r; ++i) batch *= c.a[i];
        const bool b_batched = c.b.size() == c.a.size() && c.b[0] > 1;
        const HostTensor a = random_tensor(d, c.a, 71 + static_cast<uint32_t>(ci));
        const HostTensor b = random_tensor(d, c.b, 81 + static_cast<uint32_t>(ci));
        Graph g;
        std::map<std::string, HostTensor> inputs;
        if (c.permuted_a) {
          // a [B, M, K] held as [M, B, K] memory: rows of a batch are B * K apart.
          const Shape mbk{M, batch, K};
          HostTensor am(d, mbk);
          for (int64_t t = 0; t < batch; ++t)
            for (int64_t i = 0; i < M; ++i)
              for (int64_t k = 0; k < K; ++k) am.set((i * batch + t) * K + k, a.get((t * M + i) * K + k));
          g.input("am", d, mbk);
          g.node("a", "permute", {"am"}, {{"dims", {1, 0, 2}}});
          inputs["am"] = am;
        } else {
          g.input("a", d, c.a);
          inputs["a"] = a;
        }
        g.input("b", d, c.b);
        inputs["b"] = b;
        g.node("y", "matmul", {"a", "b"});
        g.output("y");
        auto plan = rt.compile(g, dev);
        const Ref ref = ref_matmul(values(a), values(b), batch, M, K, N, b_batched);
        check_close(plan.run(inputs).at("y"), ref.y, ref.mag, d);
      }
    }
  }
}

// Constant weights (BP_INPUT_CONSTANT): the plugin packs them at a plan's
// first run (oneDNN's blocked format, Winograd's transformed filters) and
// keeps the packed form until the weights' buffer is freed. Wrong answers
// this catches: a packed form reused for other weights (plans made one
// after another get their constants at recycled addresses, and a pack kept
// past buffer_free, or keyed without the buffer, would serve the old
// weights), and a packed run that differs from the unpacked one.
TEST_CASE("cpu conv2d with constant weights: packed once, dropped with the buffer", "[cpu][onednn][packed]") {
  auto& rt = two_thread_runtime();
  auto& dev = rt.device("cpu");
  const std::vector<ConvCase> cases = {
      {{1, 256, 14, 14}, {256, 256, 3, 3}, true, 1, 1, 1, 1},  // oneDNN (AVX-512), else the plugin's GEMM
      {{1, 64, 28, 28}, {64, 64, 3, 3}, true, 1, 1, 1, 1},     // Winograd
      {{1, 64, 56, 56}, {128, 64, 1, 1}, false, 2, 0, 1, 1},   // pointwise at stride 2
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const ConvCase& c = cases[ci];
    const int64_t OH = (c.x[2] + 2 * c.pad - c.dil * (c.w[2] - 1) - 1) / c.stride + 1;
    const int64_t OW = (c.x[3] + 2 * c.pad - c.dil * (c.w[3] - 1) - 1) / c.stride + 1;
    const HostTensor x = random_tensor(BP_DTYPE_F32, c.x, 71 + static_cast<uint32_t>(ci));
    const HostTensor bias = random_tensor(BP_DTYPE_F32, {c.w[0]}, 81 + static_cast<uint32_t>(ci));
    HostTensor first_y;
    for (uint32_t version = 0; version < 3; ++version) {
      DYNAMIC_SECTION("case " << ci << " weights " << version) {
        const HostTensor w = random_tensor(BP_DTYPE_F32, c.w, 91 + 7 * version + static_cast<uint32_t>(ci));
        Graph g;
        g.input("x", BP_DTYPE_F32, c.x);
        g.constant("w", w);
        g.constant("bias", bias);
        const Json params = {{"stride", c.stride}, {"padding", c.pad}, {"dilation", c.dil}, {"groups", c.groups}};
        g.node("y", "conv2d", {"x", "w", c.bias ? "bias" : ""}, params);
        g.output("y");
        const Ref r = ref_conv(x, w, c.bias ? &bias : nullptr, c, OH, OW);
        auto plan = rt.compile(g, dev);
        const HostTensor y1 = plan.run({{"x", x}}).at("y");
        check_close(y1, r.y, r.mag, BP_DTYPE_F32);
        // The second run takes the packed form: the same bits.
        const HostTensor y2 = plan.run({{"x", x}}).at("y");
        CHECK(std::memcmp(y1.data(), y2.data(), y1.nbytes()) == 0);
      }
    }
  }
}

// A one-row product with a constant [K, N] weight (rows contiguous): the
// plugin reads a transposed copy, made at the plan's first run and kept
// with the weight (plugins/cpu/linalg.cpp). Wrong answers this catches: the
// copy transposed wrongly or with a tail dropped (K and N are no multiples
// of 4 or 16), a copy served for other weights (three plans, one after
// another, get their constants at recycled addresses), and a second run
// that differs from the first.
TEST_CASE("cpu one-row matmul with a constant [K, N] weight: transposed once, per weight", "[cpu][packed]") {
  auto& rt = two_thread_runtime();
  auto& dev = rt.device("cpu");
  const int64_t K = 515, N = 301;
  const HostTensor a = random_tensor(BP_DTYPE_F32, {1, K}, 5);
  for (uint32_t version = 0; version < 3; ++version) {
    DYNAMIC_SECTION("weights " << version) {
      const HostTensor w = random_tensor(BP_DTYPE_F32, {K, N}, 17 + version);
      Graph g;
      g.input("a", BP_DTYPE_F32, {1, K});
      g.constant("w", w);
      g.node("y", "matmul", {"a", "w"});
      g.output("y");
      const Ref r = ref_matmul(values(a), values(w), 1, 1, K, N, false);
      auto plan = rt.compile(g, dev);
      const HostTensor y1 = plan.run({{"a", a}}).at("y");
      check_close(y1, r.y, r.mag, BP_DTYPE_F32);
      const HostTensor y2 = plan.run({{"a", a}}).at("y");
      CHECK(std::memcmp(y1.data(), y2.data(), y1.nbytes()) == 0);
    }
  }
}

// A bf16 matmul of one row runs as the plugin's GEMV (b read as bf16 and
// widened in registers; with b's columns contiguous, 32 elements at a time
// as 16 pairs against a split into its even and odd elements), not through
// oneDNN. K around the 32-element blocks and N around the 4-column groups,
// on two threads; a sliced a. Would catch pairs matched to the wrong half
// of a, a lost tail of K or of N, or a result not rounded to bf16.
TEST_CASE("cpu one-row bf16 matmul: b's columns or rows contiguous, K and N around the blocks", "[cpu][gemv]") {
  auto& rt = two_thread_runtime();
  auto& dev = rt.device("cpu");
  const bp_dtype d = BP_DTYPE_BF16;
  uint32_t seed = 40;
  for (const int64_t K : {1, 31, 32, 33, 95, 1024})
    for (const int64_t N : {1, 3, 4, 5, 67, 300})
      for (const bool columns : {true, false}) {
        INFO("K " << K << ", N " << N << (columns ? ", b = transpose of [N, K]" : ", b dense [K, N]"));
        const HostTensor aw = random_tensor(d, {1, K + 3}, ++seed);
        const HostTensor bsrc = columns ? random_tensor(d, {N, K}, ++seed) : random_tensor(d, {K, N}, ++seed);
        Graph g;
        g.input("aw", d, {1, K + 3});
        g.input("bsrc", d, bsrc.shape);
        g.node("a", "slice", {"aw"}, {{"dim", 1}, {"start", 3}, {"end", 3 + K}});
        if (columns) g.node("b", "transpose", {"bsrc"}, {{"dim0", 0}, {"dim1", 1}});
        g.node("y", "matmul", {"a", columns ? "b" : "bsrc"});
        g.output("y");
        std::vector<double> av(static_cast<size_t>(K));
        for (int64_t k = 0; k < K; ++k) av[static_cast<size_t>(k)] = aw.get(3 + k);
        const Ref r = ref_matmul(av, columns ? transposed(bsrc, N, K) : values(bsrc), 1, 1, K, N, false);
        const HostTensor y = rt.compile(g, dev).run({{"aw", aw}, {"bsrc", bsrc}}).at("y");
        check_close(y, r.y, r.mag, d);
        // Rounded once from the f32 sum: within half a bf16 unit (2^-9
        // relative) of the exact sum, plus the f32 accumulation's share.
        for (int64_t j = 0; j < N; ++j) {
          const double w = r.y[static_cast<size_t>(j)];
          CHECK(std::abs(y.get(j) - w) <= std::ldexp(std::abs(w), -8) + std::ldexp(r.mag[static_cast<size_t>(j)], -24));
        }
      }
}
