// The optimizer's pattern pass (core/src/pass_patterns.cpp) on the real CPU
// plugin, whose manifest declares cpu.conv2d_relu and cpu.conv2d_clamp with
// their decompositions: what it replaces, what it refuses and why, and that
// the fused kernels give the unfused answer (an f64 loop here) on every path
// of the CPU's convolution (own GEMM, depthwise, Winograd, oneDNN).
#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>

using namespace backplane;
using Catch::Matchers::Contains;

namespace {

std::unique_ptr<Runtime> cpu_runtime() {
  RuntimeOptions opts;
  opts.use_environment = false;
  return Runtime::create(opts);
}

HostTensor random_tensor(Shape shape, uint32_t seed, double lo = -1, double hi = 1) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<float>(u(rng)));
  return t;
}

// Runs g and its reference ref, both unoptimized, on one input and
// compares output "y": NaN exactly where the reference has NaN, every other
// value within tol (0: bit for bit). Returns {reference NaNs, mismatches}.
std::pair<int64_t, int64_t> compare_unoptimized(Runtime& rt, Device& dev, const Graph& g, const Graph& ref,
                                                const std::string& input, const HostTensor& x, double tol) {
  CompileOptions plain;
  plain.optimize = false;  // the reference stays the standard ops it is written in
  const HostTensor got = rt.compile(g, dev, plain).run({{input, x}}).at("y");
  const HostTensor want = rt.compile(ref, dev, plain).run({{input, x}}).at("y");
  REQUIRE(got.shape == want.shape);
  int64_t nans = 0, bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.get(i), e = want.get(i);
    nans += std::isnan(e);
    bad += std::isnan(e) ? !std::isnan(a) : !(std::fabs(a - e) <= tol);
  }
  return {nans, bad};
}

// The graph compiled as the optimizer leaves it, and as written.
std::pair<Plan, Plan> optimized_and_plain(Runtime& rt, const Graph& g, Device& dev) {
  CompileOptions plain;
  plain.optimize = false;
  return {rt.compile(g, dev), rt.compile(g, dev, plain)};
}

// g compiled with `keep`, as the optimizer leaves it and as written.
std::pair<Plan, Plan> optimized_and_plain_keeping(Runtime& rt, const Graph& g, Device& dev,
                                                  std::vector<std::string> keep) {
  CompileOptions co;
  co.keep = std::move(keep);
  CompileOptions plain = co;
  plain.optimize = false;
  return {rt.compile(g, dev, co), rt.compile(g, dev, plain)};
}

// Outputs `names` of two runs are the same bytes.
void same_bits(const std::map<std::string, HostTensor>& got, const std::map<std::string, HostTensor>& want,
               std::initializer_list<const char*> names) {
  for (const char* name : names) {
    INFO(name);
    REQUIRE(got.at(name).nbytes() == want.at(name).nbytes());
    CHECK(std::memcmp(got.at(name).data(), want.at(name).data(), got.at(name).nbytes()) == 0);
  }
}

struct ConvCase {
  const char* label;
  Shape x, w;
  int64_t stride, pad, groups;
};

// clamp(conv2d(x, w, b), lo, hi) in f64, NaN kept.
std::vector<double> reference(const ConvCase& c, const HostTensor& x, const HostTensor& w, const HostTensor& b,
                              double lo, double hi) {
  const int64_t N = c.x[0], C = c.x[1], H = c.x[2], W = c.x[3], O = c.w[0], Cg = c.w[1], kH = c.w[2], kW = c.w[3];
  const int64_t OH = (H + 2 * c.pad - kH) / c.stride + 1, OW = (W + 2 * c.pad - kW) / c.stride + 1, Og = O / c.groups;
  (void)C;
  std::vector<double> y;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = b.get(o);
          const int64_t g = o / Og;
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t i = 0; i < kH; ++i)
              for (int64_t j = 0; j < kW; ++j) {
                const int64_t ih = oh * c.stride - c.pad + i, iw = ow * c.stride - c.pad + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const int64_t cin = g * Cg + ci;
                s += x.get(((n * C + cin) * H + ih) * W + iw) * w.get(((o * Cg + ci) * kH + i) * kW + j);
              }
          y.push_back(std::isnan(s) ? s : std::min(std::max(s, lo), hi));
        }
  return y;
}

Graph conv_act_graph(const ConvCase& c, const HostTensor& w, const HostTensor& b, const std::string& act, Json act_params) {
  Graph g;
  g.input("x", BP_DTYPE_F32, c.x);
  g.constant("w", w);
  g.constant("b", b);
  g.node("c", "conv2d", {"x", "w", "b"}, {{"stride", c.stride}, {"padding", c.pad}, {"groups", c.groups}});
  g.node("y", act, {"c"}, std::move(act_params));
  g.output("y");
  return g;
}

bool explains(const Plan& p, const std::string& text) { return p.explain().find(text) != std::string::npos; }

}  // namespace

TEST_CASE("optimizer: conv2d -> relu/clamp run as the CPU's fused ops and match f64 on every conv path",
          "[optimize][cpu]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  const ConvCase cases[] = {
      {"small 3x3 (own GEMM)", {1, 3, 9, 9}, {4, 3, 3, 3}, 1, 1, 1},
      {"depthwise 3x3 stride 2", {1, 32, 28, 28}, {32, 1, 3, 3}, 2, 1, 32},
      {"3x3 stride 1, wide (Winograd)", {1, 32, 28, 28}, {32, 32, 3, 3}, 1, 1, 1},
      {"1x1, large (oneDNN where built)", {1, 64, 28, 28}, {96, 64, 1, 1}, 1, 0, 1},
  };
  for (const auto& c : cases) {
    for (const bool relu : {true, false}) {
      INFO(c.label << (relu ? " + relu" : " + clamp(-0.25, 0.5)"));
      HostTensor x = random_tensor(c.x, 1);
      // NaN in, NaN out, as relu and clamp say: the fused activation must not
      // turn it into a bound.
      x.set(5, std::numeric_limits<double>::quiet_NaN());
      const HostTensor w = random_tensor(c.w, 2, -0.5, 0.5), b = random_tensor({c.w[0]}, 3);
      const Graph g = relu ? conv_act_graph(c, w, b, "relu", Json::object())
                           : conv_act_graph(c, w, b, "clamp", {{"min", -0.25}, {"max", 0.5}});
      Plan fused = rt->compile(g, cpu);
      CompileOptions plain;
      plain.optimize = false;
      Plan unfused = rt->compile(g, cpu, plain);
      const std::string op = relu ? "cpu.conv2d_relu" : "cpu.conv2d_clamp";
      CHECK(explains(fused, "node 'y' (" + std::string(relu ? "relu" : "clamp") + ") with 'c': replaced by " + op));
      CHECK(explains(fused, "y (" + op + ") -> cpu"));
      CHECK_FALSE(explains(unfused, op));
      const auto got = fused.run({{"x", x}}).at("y");
      const auto base = unfused.run({{"x", x}}).at("y");
      const auto want = reference(c, x, w, b, relu ? 0.0 : -0.25, relu ? INFINITY : 0.5);
      REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
      int64_t nans = 0, clipped = 0, bad = 0;
      for (int64_t i = 0; i < got.numel(); ++i) {
        const double v = got.get(i), r = want[static_cast<size_t>(i)];
        if (std::isnan(r)) {
          ++nans;
          if (!std::isnan(v) || !std::isnan(base.get(i))) {
            ++bad;
            UNSCOPED_INFO("at " << i << ": want NaN, fused " << v << ", unfused " << base.get(i));
          }
          continue;
        }
        clipped += r == (relu ? 0.0 : 0.5);
        // docs/ops.md's conv bound: f32 relative 1e-4 of the sum of |terms|,
        // here at most a few units: 1e-5 absolute is well inside it.
        bad += !(std::fabs(v - r) <= 1e-5 + 1e-4 * std::fabs(r)) || !(std::fabs(base.get(i) - r) <= 1e-5 + 1e-4 * std::fabs(r));
      }
      CHECK(bad == 0);
      CHECK(nans > 0);     // the NaN reached some outputs...
      CHECK(clipped > 0);  // ...and the activation bound others
    }
  }
}

TEST_CASE("optimizer: near misses are left alone and explained", "[optimize]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  const ConvCase c{"", {1, 3, 9, 9}, {4, 3, 3, 3}, 1, 1, 1};
  const HostTensor w = random_tensor(c.w, 2), b = random_tensor({4}, 3);

  SECTION("the convolution's output is also a graph output") {
    Graph g = conv_act_graph(c, w, b, "relu", Json::object());
    g.output("c");
    Plan p = rt->compile(g, cpu);
    CHECK(explains(p, "not replaced by cpu.conv2d_relu (conv2d -> relu): node 'c' is also used outside the pattern"));
    CHECK(explains(p, "\n  y (relu) "));
  }
  SECTION("a kept value counts as a use") {
    const Graph g = conv_act_graph(c, w, b, "relu", Json::object());
    CompileOptions co;
    co.keep = {"c"};
    CHECK(explains(rt->compile(g, cpu, co), "node 'c' is also used outside the pattern"));
  }
  SECTION("a pinned node stays as written") {
    Graph g = conv_act_graph(c, w, b, "relu", Json::object());
    g.pin("y", "cpu");
    CHECK(explains(rt->compile(g, cpu), "node 'y' is pinned"));
  }
  SECTION("no bias: the pattern's three inputs are not there") {
    Graph g;
    g.input("x", BP_DTYPE_F32, c.x);
    g.constant("w", w);
    g.node("c", "conv2d", {"x", "w"}, {{"padding", 1}});
    g.node("y", "relu", {"c"});
    g.output("y");
    Plan p = rt->compile(g, cpu);
    CHECK_FALSE(explains(p, "replaced by"));
    CHECK(explains(p, "\n  y (relu) "));
  }
  SECTION("dtypes the fused kernel lacks (f64)") {
    Graph g;
    g.input("x", BP_DTYPE_F64, c.x);
    g.input("w", BP_DTYPE_F64, c.w);
    g.input("b", BP_DTYPE_F64, {4});
    g.node("c", "conv2d", {"x", "w", "b"}, {{"padding", 1}});
    g.node("y", "relu", {"c"});
    g.output("y");
    CHECK(explains(rt->compile(g, cpu), "device 'cpu' has no cpu.conv2d_relu kernel for these dtypes"));
  }
  SECTION("--optimize none: nothing replaced, nothing noted") {
    CompileOptions co;
    co.optimize = false;
    const Plan p = rt->compile(conv_act_graph(c, w, b, "relu", Json::object()), cpu, co);
    CHECK_FALSE(explains(p, "cpu.conv2d_relu"));
  }
  SECTION("clamp with one bound binds it; the other stays absent") {
    const Graph g = conv_act_graph(c, w, b, "clamp", {{"max", 0.25}});
    Plan p = rt->compile(g, cpu);
    CHECK(explains(p, "replaced by cpu.conv2d_clamp"));
    const HostTensor x = random_tensor(c.x, 1);
    const auto got = p.run({{"x", x}}).at("y");
    const auto want = reference(c, x, w, b, -INFINITY, 0.25);
    bool below_zero = false;
    for (int64_t i = 0; i < got.numel(); ++i) {
      CHECK(std::fabs(got.get(i) - want[static_cast<size_t>(i)]) <= 1e-5);
      below_zero = below_zero || got.get(i) < -0.1;  // no lower bound was made up
    }
    CHECK(below_zero);
  }
}

TEST_CASE("optimizer: a fused vendor op in a graph runs as written; vendor_kernels off runs its decomposition",
          "[optimize]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  Graph g;
  g.input("x", BP_DTYPE_F32, {1, 2, 5, 5});
  g.constant("w", random_tensor({3, 2, 3, 3}, 4));
  g.constant("b", random_tensor({3}, 5));
  g.node("y", "cpu.conv2d_clamp", {"x", "w", "b"}, {{"padding", 1}, {"min", 0}, {"max", 0.5}});
  g.output("y");
  const HostTensor x = random_tensor({1, 2, 5, 5}, 6);
  Plan own = rt->compile(g, cpu);
  CHECK(explains(own, "y (cpu.conv2d_clamp) -> cpu"));
  CompileOptions co;
  co.vendor_kernels = false;
  Plan decomposed = rt->compile(g, cpu, co);
  CHECK(explains(decomposed, "y/c (conv2d)"));
  CHECK(explains(decomposed, "y/y (clamp)"));
  const auto a = own.run({{"x", x}}).at("y"), d = decomposed.run({{"x", x}}).at("y");
  for (int64_t i = 0; i < a.numel(); ++i) CHECK(std::fabs(a.get(i) - d.get(i)) <= 1e-6);
  // A misspelt param reaches the kernel's SDK reader only if the host let it
  // through: the manifest's declaration refuses it first, naming it.
  g.node("z", "cpu.conv2d_relu", {"x", "w", "b"}, {{"paddding", 1}});
  CHECK_THROWS_WITH(rt->compile(g, cpu), Contains("paddding"));
}

namespace {

// A small ResNet-like chain: stem conv -> relu -> max_pool2d, a residual
// block (conv -> relu -> conv, add, relu), a fire module (1x1 and 3x3
// convs concatenated along channels) squared, then a weight-heavy 3x3 on a
// small image (more weights than pixels: the CPU splits it by output
// channels) whose output is the graph's.
Graph chain_graph(uint32_t seed) {
  Graph g;
  g.input("x", BP_DTYPE_F32, {1, 8, 24, 24});
  auto conv = [&](const std::string& name, const std::string& in, int64_t cin, int64_t cout, int64_t k, int64_t stride) {
    g.constant(name + ".w", random_tensor({cout, cin, k, k}, seed++, -0.3, 0.3));
    g.constant(name + ".b", random_tensor({cout}, seed++));
    g.node(name, "conv2d", {in, name + ".w", name + ".b"}, {{"stride", stride}, {"padding", k / 2}});
  };
  conv("stem", "x", 8, 32, 3, 1);
  g.node("stem_relu", "relu", {"stem"});
  g.node("pool", "max_pool2d", {"stem_relu"}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}});
  conv("a", "pool", 32, 32, 3, 1);
  g.node("a_relu", "relu", {"a"});
  conv("b", "a_relu", 32, 32, 3, 1);
  g.node("sum", "add", {"b", "pool"});
  g.node("sum_relu", "relu", {"sum"});
  conv("e1", "sum_relu", 32, 16, 1, 1);  // a fire module's two expands, joined along channels
  conv("e3", "sum_relu", 32, 16, 3, 1);
  g.node("cat", "concat", {"e1", "e3"}, {{"dim", 1}});
  g.node("sq", "mul", {"cat", "cat"});  // an elementwise node between convolutions
  conv("down", "sq", 32, 64, 3, 2);
  g.node("down_relu", "relu", {"down"});
  conv("heavy", "down_relu", 64, 256, 3, 1);
  g.output("heavy");
  return g;
}

}  // namespace

TEST_CASE("optimizer: a chain of convolutions stays channels-last and gives the unoptimized answer", "[optimize][cpu]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  const Graph g = chain_graph(11);
  Plan opt = rt->compile(g, cpu);
  CompileOptions plain;
  plain.optimize = false;
  Plan base = rt->compile(g, cpu, plain);
  // What the pass did: every convolution (its relu folded by the patterns
  // first) and the pool in the CPU's channels-last variants, the residual
  // add and its relu following them, the graph's output given back as a view.
  const std::string e = opt.explain();
  INFO(e);
  CHECK_THAT(e, Contains("layouts: "));
  CHECK_THAT(e, Contains("3 as cpu.conv2d_relu_nhwc"));
  CHECK_THAT(e, Contains("3 as cpu.conv2d_nhwc"));  // e1, e3, heavy
  CHECK_THAT(e, Contains("1 as cpu.max_pool2d_nhwc"));
  // b -> add(b, pool) -> relu: the block's last conv with its shortcut.
  CHECK_THAT(e, Contains("1 as cpu.conv2d_add_relu_nhwc"));
  CHECK_THAT(e, Contains("sum_relu/channels_last (cpu.conv2d_add_relu_nhwc)"));
  CHECK_THAT(e, Contains("heavy/channels_last (cpu.conv2d_nhwc)"));
  CHECK_THAT(e, Contains("cat/channels_last (concat)"));
  CHECK_THAT(e, Contains("sq/channels_last (mul)"));
  CHECK_THAT(e, Contains("2 elementwise or concat nodes follow"));
  CHECK_FALSE(explains(base, "channels_last"));

  HostTensor x = random_tensor({1, 8, 24, 24}, 3);
  // NaN in: it must reach the output where the unoptimized plan has it (the
  // channels-last kernels apply relu with NaN kept, like relu itself).
  x.set(4 * 24 + 7, std::numeric_limits<double>::quiet_NaN());
  const auto got = opt.run({{"x", x}}).at("heavy");
  const auto want = base.run({{"x", x}}).at("heavy");
  REQUIRE(got.shape == Shape{1, 256, 6, 6});
  REQUIRE(want.shape == got.shape);
  int64_t nans = 0, bad = 0;
  double scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i)
    if (!std::isnan(want.get(i))) scale = std::max(scale, std::fabs(want.get(i)));
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.get(i), b = want.get(i);
    if (std::isnan(b)) {
      ++nans;
      bad += !std::isnan(a);
      continue;
    }
    // Both plans sum the same terms in different orders (oneDNN or the
    // fallback in one, the CPU's own paths in the other): docs/ops.md's f32
    // reduction bound, relative to the output's scale.
    bad += !(std::fabs(a - b) <= 1e-4 * scale);
  }
  CHECK(bad == 0);
  CHECK(nans > 0);
  CHECK(nans < got.numel());
  // The same answer with the activations swapped in (a plan run twice).
  const HostTensor x2 = random_tensor({1, 8, 24, 24}, 4);
  const auto got2 = opt.run({{"x", x2}}).at("heavy"), want2 = base.run({{"x", x2}}).at("heavy");
  for (int64_t i = 0; i < got2.numel(); ++i) CHECK(std::fabs(got2.get(i) - want2.get(i)) <= 1e-4 * scale + 1e-5);
}

TEST_CASE("cpu.max_pool2d_nhwc on channels-last data: every channel block, NaN, clipped windows, exactly",
          "[optimize][cpu]") {
  // 91 channels: four vectors of 16 at once, one of 16, one of 8 and 3 left
  // (the AVX-512 path's blocks; AVX2 takes 8s). NaN in a channel of each
  // block must reach exactly the outputs whose window holds it; a max is
  // exact, so every other value must equal max_pool2d's bit for bit.
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  const int64_t C = 91, H = 13, W = 12;
  HostTensor xl = random_tensor({1, H, W, C}, 21);
  const int64_t nan_at[][3] = {{0, 0, 5}, {6, 7, 70}, {12, 11, 85}, {3, 4, 90}, {9, 2, 40}, {5, 5, 55}};
  for (const auto& p : nan_at) xl.set((p[0] * W + p[1]) * C + p[2], std::numeric_limits<double>::quiet_NaN());
  const Json params_list[] = {{{"kernel_size", 3}, {"stride", 2}, {"padding", 1}},
                              {{"kernel_size", {3, 2}}, {"stride", {1, 2}}, {"dilation", 2}, {"ceil_mode", true}}};
  for (const Json& params : params_list) {
    INFO(params.dump());
    Graph g;
    g.input("xl", BP_DTYPE_F32, {1, H, W, C});
    g.node("x", "permute", {"xl"}, {{"dims", {0, 3, 1, 2}}});  // NCHW shape, channels contiguous
    g.node("y", "cpu.max_pool2d_nhwc", {"x"}, params);
    g.output("y");
    Graph ref;
    ref.input("xl", BP_DTYPE_F32, {1, H, W, C});
    ref.node("x", "permute", {"xl"}, {{"dims", {0, 3, 1, 2}}});
    ref.node("p", "max_pool2d", {"x"}, params);
    ref.node("y", "permute", {"p"}, {{"dims", {0, 2, 3, 1}}});
    ref.output("y");
    const auto [nans, bad] = compare_unoptimized(*rt, cpu, g, ref, "xl", xl, 0.0);
    CHECK(bad == 0);
    CHECK(nans >= 6);  // each NaN reached at least one output
  }
}

TEST_CASE("cpu stem kernel (3 input channels, channels-last out) against conv2d: partial vectors, edges, NaN",
          "[optimize][cpu]") {
  // plugins/cpu/stem.cpp takes cpu.conv2d*_nhwc with C <= 4 and a window of
  // at most 3x3 (tests/onednn_stem_skipped.sh shows oneDNN does not run
  // it). 24 and 40 output channels leave a partial last vector; stride 2
  // with padding, dilation and an odd width put pixels on both edges and
  // in the blocked middle; a NaN on the first column must reach exactly the
  // outputs whose window holds it. A dropped tap, a tap counted twice at an
  // edge or a channel of the partial vector unwritten would each show.
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  struct Case {
    int64_t C, O, H, W;
    Json params;
    const char* act;
  };
  const Case cases[] = {{3, 24, 37, 45, {{"stride", 2}, {"padding", 1}}, "relu"},
                        {3, 40, 20, 33, {{"padding", 2}, {"dilation", 2}}, "none"},
                        {4, 16, 9, 70, {{"stride", {1, 2}}, {"padding", {0, 1, 1, 0}}}, "clamp"},
                        {1, 64, 12, 12, {{"stride", 1}}, "relu"}};
  uint32_t seed = 40;
  for (const Case& k : cases) {
    INFO("C " << k.C << " O " << k.O << " " << k.params.dump() << " " << k.act);
    const HostTensor w = random_tensor({k.O, k.C, 3, 3}, seed++, -0.5, 0.5), b = random_tensor({k.O}, seed++);
    HostTensor x = random_tensor({2, k.C, k.H, k.W}, seed++);
    x.set((1 * k.C + k.C - 1) * k.H * k.W + 5 * k.W, std::numeric_limits<double>::quiet_NaN());  // image 1, row 5, col 0
    Json params = k.params;
    std::string op = "cpu.conv2d_nhwc";
    if (std::string(k.act) == "relu") op = "cpu.conv2d_relu_nhwc";
    if (std::string(k.act) == "clamp") {
      op = "cpu.conv2d_clamp_nhwc";
      params["min"] = -0.25;
      params["max"] = 0.5;
    }
    Graph g;
    g.input("x", BP_DTYPE_F32, x.shape);
    g.constant("w", w);
    g.constant("b", b);
    g.node("y", op, {"x", "w", "b"}, params);
    g.output("y");
    Graph ref;
    ref.input("x", BP_DTYPE_F32, x.shape);
    ref.constant("w", w);
    ref.constant("b", b);
    ref.node("c", "conv2d", {"x", "w", "b"}, k.params);
    std::string last = "c";
    if (std::string(k.act) == "relu") ref.node(last = "a", "relu", {"c"});
    if (std::string(k.act) == "clamp") ref.node(last = "a", "clamp", {"c"}, {{"min", -0.25}, {"max", 0.5}});
    ref.node("y", "permute", {last}, {{"dims", {0, 2, 3, 1}}});
    ref.output("y");
    // docs/ops.md's f32 reduction bound: at most 36 terms of magnitude <= 0.5.
    const auto [nans, bad] = compare_unoptimized(*rt, cpu, g, ref, "x", x, 1e-5);
    CHECK(bad == 0);
    CHECK(nans > 0);
  }
}

TEST_CASE("compile_stats: buffer bytes per device, and the unoptimized graph's when asked", "[optimize][cpu]") {
  // conv -> relu -> conv -> relu over 64x48x48 (576 KiB per activation):
  // as written, each relu reads a convolution's output while writing its
  // own, so two activations live at once besides the input; fused
  // (cpu.conv2d_relu*), the relus' buffers are gone. Wrong answers caught:
  // figures not per device or not the plan's (they must add up to
  // buffer_bytes()), a baseline that is the optimized plan again, and one
  // given when nobody asked.
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  Graph g;
  g.input("x", BP_DTYPE_F32, {1, 64, 48, 48});
  uint32_t seed = 60;
  for (const char* n : {"a", "b"}) {
    g.constant(std::string(n) + ".w", random_tensor({64, 64, 3, 3}, seed++, -0.1, 0.1));
    g.constant(std::string(n) + ".b", random_tensor({64}, seed++));
  }
  g.node("a", "conv2d", {"x", "a.w", "a.b"}, {{"padding", 1}});
  g.node("ar", "relu", {"a"});
  g.node("b", "conv2d", {"ar", "b.w", "b.b"}, {{"padding", 1}});
  g.node("br", "relu", {"b"});
  g.output("br");
  CompileOptions with;
  with.memory_baseline = true;
  Plan opt = rt->compile(g, cpu, with);
  const auto s = opt.compile_stats();
  REQUIRE(s.buffer_bytes.size() == 1);
  REQUIRE(s.buffer_bytes.count("cpu") == 1);
  CHECK(s.buffer_bytes.at("cpu") == opt.buffer_bytes());
  REQUIRE(s.unoptimized_buffer_bytes.count("cpu") == 1);
  const uint64_t act = 64 * 48 * 48 * 4;
  INFO("optimized " << s.buffer_bytes.at("cpu") << ", as written " << s.unoptimized_buffer_bytes.at("cpu"));
  CHECK(s.unoptimized_buffer_bytes.at("cpu") >= s.buffer_bytes.at("cpu") + act);
  // The baseline is what a plan compiled unoptimized holds.
  CompileOptions plain;
  plain.optimize = false;
  plain.memory_baseline = true;
  Plan base = rt->compile(g, cpu, plain);
  CHECK(base.buffer_bytes() == s.unoptimized_buffer_bytes.at("cpu"));
  CHECK(base.compile_stats().unoptimized_buffer_bytes == base.compile_stats().buffer_bytes);
  // Not asked: no baseline.
  CHECK(rt->compile(g, cpu).compile_stats().unoptimized_buffer_bytes.empty());
}

TEST_CASE("optimizer: a lone convolution, a pinned one and a graph without the variants keep their layout",
          "[optimize]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  SECTION("a lone convolution: its variant would only add a reorder") {
    const ConvCase c{"", {1, 3, 9, 9}, {4, 3, 3, 3}, 1, 1, 1};
    const Plan p = rt->compile(conv_act_graph(c, random_tensor(c.w, 2), random_tensor({4}, 3), "relu", Json::object()), cpu);
    CHECK(explains(p, "replaced by cpu.conv2d_relu "));
    CHECK_FALSE(explains(p, "layouts:"));
  }
  SECTION("a pinned convolution stays as written; the chain around it is not broken into variants") {
    Graph g = chain_graph(11);
    g.pin("a", "cpu");
    const std::string e = rt->compile(g, cpu).explain();
    INFO(e);
    CHECK_THAT(e, Contains("a (conv2d)"));
    CHECK_THAT(e, Contains("layouts: "));
  }
}

TEST_CASE("optimizer: repeated nodes merge, dead nodes go, and the outputs stay bit-identical", "[optimize]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  Graph g;
  g.input("x", BP_DTYPE_F32, {64});
  g.node("a", "exp", {"x"});
  g.node("b", "exp", {"x"});         // repeats a
  g.node("a2", "sin", {"a"});
  g.node("b2", "sin", {"b"});        // repeats a2 once b is a
  g.node("y", "mul", {"a2", "b2"});
  g.node("unused", "cos", {"x"});    // feeds nothing
  g.node("unused2", "neg", {"unused"});
  g.node("z", "exp", {"x"});         // repeats a, but is a graph output: stays
  g.node("k", "sin", {"a"});         // repeats a2, but is kept: stays
  g.output("y");
  g.output("z");
  auto [p, base] = optimized_and_plain_keeping(*rt, g, cpu, {"k"});
  const std::string e = p.explain();
  INFO(e);
  CHECK_THAT(e, Contains("simplify: 2 nodes ('b', 'b2') repeat an earlier node's op, inputs and params"));
  CHECK_THAT(e, Contains("simplify: 2 nodes ('unused', 'unused2') feed no output: removed"));
  CHECK_FALSE(explains(p, "  b (exp)"));
  CHECK(explains(p, "  z (exp)"));
  CHECK(explains(p, "  k (sin)"));
  CHECK_FALSE(explains(base, "simplify"));
  CHECK(explains(base, "  unused (cos)"));
  const HostTensor x = random_tensor({64}, 9);
  const auto got = p.run({{"x", x}}), want = base.run({{"x", x}});
  same_bits(got, want, {"y", "z"});
  CHECK(p.output("k").get(3) == base.output("k").get(3));
  SECTION("different pins or params do not merge") {
    Graph h;
    h.input("x", BP_DTYPE_F32, {4});
    h.node("c1", "clamp", {"x"}, {{"min", 0}});
    h.node("c2", "clamp", {"x"}, {{"min", 1}});
    h.node("s", "add", {"c1", "c2"});
    h.output("s");
    CHECK_FALSE(explains(rt->compile(h, cpu), "simplify"));
  }
}

// A transformer MLP as exporters write it: MatMul -> Add(bias) -> GELU, then
// MatMul -> Add(bias). The pattern pass must take the longer chain for the
// first (cpu.matmul_add_gelu anchored at the gelu, not cpu.matmul_add at the
// add) and cpu.matmul_add for the second; the optimized plan gives the
// unoptimized one's bits, and both are within f32 bounds of an f64 loop.
// Would catch: the shorter pattern taking the chain, a bias added in another
// order or rounding, gelu's vector form not used for the fused output.
TEST_CASE("optimizer: matmul -> add (-> gelu) run as cpu.matmul_add(_gelu), bit for bit", "[optimize][cpu]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  const int64_t B = 2, S = 5, D = 16, H = 40;
  const HostTensor w1 = random_tensor({D, H}, 11, -0.5, 0.5), b1 = random_tensor({H}, 12);
  const HostTensor w2 = random_tensor({H, D}, 13, -0.5, 0.5), b2 = random_tensor({D}, 14);
  Graph g;
  g.input("x", BP_DTYPE_F32, {B, S, D});
  g.constant("w1", w1);
  g.constant("b1", b1);
  g.constant("w2", w2);
  g.constant("b2", b2);
  g.node("m1", "matmul", {"x", "w1"});
  g.node("a1", "add", {"b1", "m1"});  // the bias first, as torch.onnx writes it
  g.node("h", "gelu", {"a1"});
  g.node("m2", "matmul", {"h", "w2"});
  g.node("y", "add", {"m2", "b2"});
  g.output("y");
  auto [fused, unfused] = optimized_and_plain(*rt, g, cpu);
  const std::string ex = fused.explain();
  CHECK_THAT(ex, Contains("(cpu.matmul_add_gelu)"));
  CHECK_THAT(ex, Contains("(cpu.matmul_add)"));
  CHECK_THAT(ex, Contains("node 'h' (gelu) with 'm1', 'a1': replaced by cpu.matmul_add_gelu"));
  const HostTensor x = random_tensor({B, S, D}, 15);
  const HostTensor got = fused.run({{"x", x}}).at("y"), want = unfused.run({{"x", x}}).at("y");
  REQUIRE(got.nbytes() == want.nbytes());
  CHECK(std::memcmp(got.data(), want.data(), got.nbytes()) == 0);
  for (int64_t r = 0; r < B * S; ++r) {
    std::vector<double> h(static_cast<size_t>(H));
    for (int64_t j = 0; j < H; ++j) {
      double s = b1.get(j);
      for (int64_t k = 0; k < D; ++k) s += x.get(r * D + k) * w1.get(k * H + j);
      h[static_cast<size_t>(j)] = 0.5 * s * std::erfc(-s / std::sqrt(2.0));
    }
    for (int64_t j = 0; j < D; ++j) {
      double s = b2.get(j), mag = std::fabs(b2.get(j));
      for (int64_t k = 0; k < H; ++k) {
        s += h[static_cast<size_t>(k)] * w2.get(k * D + j);
        mag += std::fabs(h[static_cast<size_t>(k)] * w2.get(k * D + j));
      }
      CHECK(std::fabs(got.get(r * D + j) - s) <= 1e-5 * mag + 1e-6);
    }
  }
}

// Constant folding: a chain whose inputs are all constants (an integer add,
// a comparison, a cast and a where, as masks are written) becomes
// constants at compile time; views of constants (the transposes) stay
// views; float arithmetic on constants, a graph output and a node over a
// graph input stay nodes. Would catch: folding a float op (its rounding may
// differ per device), folding an output away, a folded value that differs
// from the node's (the plans are compared bit for bit), or constants only
// folded nodes read kept in device memory.
TEST_CASE("optimizer: nodes over constants only are folded, exact ops only, bit for bit", "[optimize][fold]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  const HostTensor w = random_tensor({6, 4}, 21);
  HostTensor steps(BP_DTYPE_I32, {4});
  for (int64_t i = 0; i < 4; ++i) steps.set(i, static_cast<double>(i * 3 - 4));
  HostTensor two(BP_DTYPE_I32, {1});
  two.set(0, 2.0);
  Graph g;
  g.input("x", BP_DTYPE_F32, {3, 6});
  g.constant("w", w);
  g.constant("steps", steps);
  g.constant("two", two);
  g.constant("zero", HostTensor(BP_DTYPE_F32, {1}));
  g.node("wt", "transpose", {"w"}, {{"dim0", 0}, {"dim1", 1}});  // [4, 6]
  g.node("wtt", "transpose", {"wt"}, {{"dim0", 0}, {"dim1", 1}});
  g.node("shift", "add", {"steps", "two"});               // i32: exact
  g.node("pos", "gt", {"shift", "two"});                  // bool
  g.node("wf", "cast", {"shift"}, {{"dtype", "f32"}});
  g.node("scaled", "mul", {"wf", "wf"});                   // f32 arithmetic: stays a node
  g.node("bias", "where", {"pos", "wf", "zero"});          // [4]
  g.node("m", "matmul", {"x", "wtt"});                     // reads x: a node
  g.node("y", "add", {"m", "bias"});
  g.node("z", "add", {"y", "scaled"});
  g.node("minus_two", "neg", {"two"});  // an output: stays a node though its input is a constant
  g.output("z");
  g.output("minus_two");
  auto [folded, unfolded] = optimized_and_plain(*rt, g, cpu);
  const std::string ex = folded.explain();
  CHECK_THAT(ex, Contains("folded 4 node(s)"));
  std::set<std::string> nodes;
  for (const auto& pl : folded.placement()) nodes.insert(pl.node);
  for (const char* name : {"shift", "pos", "wf", "bias"}) CHECK(nodes.count(name) == 0);
  for (const char* name : {"scaled", "minus_two", "y"}) CHECK(nodes.count(name) == 1);  // y: m fused in (cpu.matmul_add)
  // The transposes stay views of w (no dense copy made); steps was read
  // only by a folded node: no longer a value of the plan.
  CHECK_NOTHROW(folded.value_type("w"));
  CHECK_NOTHROW(folded.value_type("wtt"));
  CHECK_THROWS(folded.value_type("steps"));
  CHECK_NOTHROW(unfolded.value_type("steps"));
  const HostTensor x = random_tensor({3, 6}, 22);
  const auto a = folded.run({{"x", x}}), b = unfolded.run({{"x", x}});
  for (const char* out : {"z", "minus_two"}) {
    INFO(out);
    REQUIRE(a.at(out).nbytes() == b.at(out).nbytes());
    CHECK(std::memcmp(a.at(out).data(), b.at(out).data(), a.at(out).nbytes()) == 0);
  }
  // By hand: bias = max(steps + 2, ...) where steps + 2 > 2, else 0.
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t j = 0; j < 4; ++j) {
      const double s = steps.get(j) + 2;
      double v = (s > 2 ? s : 0) + s * s;
      for (int64_t k = 0; k < 6; ++k) v += x.get(r * 6 + k) * w.get(k * 4 + j);
      CHECK(std::fabs(a.at("z").get(r * 4 + j) - v) <= 1e-5 * (std::fabs(v) + 1));
    }
}

// scaled_dot_product_attention, the built-in fused op (core/src/pass_attention.cpp).
namespace {

// y = softmax(q kᵀ scale + mask (+ causal -inf)) v in f64 over [BH, S, D]
// tensors, and per output Σ p |v|, the scale of its rounding.
void attention_f64(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor* mask, int64_t BH,
                   int64_t Sq, int64_t Sk, int64_t D, int64_t Dv, double scale, bool causal, std::vector<double>& y,
                   std::vector<double>& mag) {
  y.assign(static_cast<size_t>(BH * Sq * Dv), 0.0);
  mag = y;
  std::vector<double> s(static_cast<size_t>(Sk));
  for (int64_t b = 0; b < BH; ++b)
    for (int64_t i = 0; i < Sq; ++i) {
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < Sk; ++j) {
        double d = 0;
        for (int64_t c = 0; c < D; ++c) d += q.get((b * Sq + i) * D + c) * k.get((b * Sk + j) * D + c);
        d = d * scale + (mask ? mask->get(i * Sk + j) : 0.0);
        if (causal && j > i + Sk - Sq) d = -INFINITY;
        s[static_cast<size_t>(j)] = d;
        mx = std::max(mx, d);
      }
      for (auto& e : s) sum += (e = std::exp(e - mx));
      for (int64_t c = 0; c < Dv; ++c)
        for (int64_t j = 0; j < Sk; ++j) {
          const double p = s[static_cast<size_t>(j)] / sum, x = v.get((b * Sk + j) * Dv + c);
          y[static_cast<size_t>((b * Sq + i) * Dv + c)] += p * x;
          mag[static_cast<size_t>((b * Sq + i) * Dv + c)] += std::fabs(p * x);
        }
    }
}

// Mismatches of got against the f64 reference: 1e-5 of Σ p|v| plus 1e-6
// (docs/ops.md's f32 bound for compound ops, on the sum's own scale).
int64_t attention_mismatches(const HostTensor& got, const std::vector<double>& want, const std::vector<double>& mag) {
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i)
    bad += !(std::fabs(got.get(i) - want[static_cast<size_t>(i)]) <= 1e-5 * mag[static_cast<size_t>(i)] + 1e-6);
  return bad;
}

std::string op_of(const Plan& p, const std::string& node) {
  for (const auto& pl : p.placement())
    if (pl.node == node) return pl.op;
  return "";
}

// Attention as torch.onnx exports it: q·kᵀ through a transposed view, a
// Mul by a constant scale, an Add of a mask, Softmax over the keys, MatMul.
Graph exported_attention(int64_t BH, int64_t S, int64_t D, const HostTensor& mask, bool softmax_out) {
  Graph g;
  for (const char* n : {"q", "k", "v"}) g.input(n, BP_DTYPE_F32, {BH, S, D});
  HostTensor c(BP_DTYPE_F32, {});
  c.set(0, 0.25);
  g.constant("c", c);
  g.constant("mask", mask);
  g.node("kt", "transpose", {"k"}, {{"dim0", -2}, {"dim1", -1}});
  g.node("s", "matmul", {"q", "kt"});
  g.node("scaled", "mul", {"s", "c"});
  g.node("masked", "add", {"mask", "scaled"});
  g.node("p", "softmax", {"masked"}, {{"dim", -1}});
  g.node("y", "matmul", {"p", "v"});
  g.output("y");
  if (softmax_out) g.output("p");
  return g;
}

}  // namespace

// Would catch: the mask left out or added twice, the scale applied twice or
// not at all, the softmax over another dim, a row block (64 rows: S = 384
// crosses it) or key block handled wrongly, the -inf entries turning a row
// NaN (each row keeps its diagonal), and a fusion that takes a softmax
// another node still reads.
TEST_CASE("optimizer: exported attention runs as scaled_dot_product_attention and matches f64", "[optimize][attention]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  // 8 x 384 x 384 f32 scores: above the 4 MiB from which a CPU fuses.
  const int64_t BH = 8, S = 384, D = 16;
  HostTensor mask = random_tensor({S, S}, 21, -1, 0);
  for (int64_t i = 0; i < S; ++i)
    for (int64_t j = i + 1; j < S; ++j) mask.set(i * S + j, -INFINITY);
  const HostTensor q = random_tensor({BH, S, D}, 22), k = random_tensor({BH, S, D}, 23),
                   v = random_tensor({BH, S, D}, 24, -0.25, 1);
  std::vector<double> want, mag;
  attention_f64(q, k, v, &mask, BH, S, S, D, D, 0.25, false, want, mag);

  auto [fused, plain] = optimized_and_plain(*rt, exported_attention(BH, S, D, mask, false), cpu);
  CHECK_THAT(fused.explain(), Contains("node 'y' (matmul) with 's', 'scaled', 'masked', 'p': replaced by "
                                       "scaled_dot_product_attention on cpu"));
  CHECK(op_of(fused, "y") == "scaled_dot_product_attention");
  CHECK(op_of(plain, "y") == "matmul");
  const std::map<std::string, HostTensor> in = {{"q", q}, {"k", k}, {"v", v}};
  CHECK(attention_mismatches(fused.run(in).at("y"), want, mag) == 0);
  CHECK(attention_mismatches(plain.run(in).at("y"), want, mag) == 0);

  // The softmax is an output too: the composed ops stay, and say why.
  Plan kept = rt->compile(exported_attention(BH, S, D, mask, true), cpu);
  CHECK(op_of(kept, "y") == "matmul");
  CHECK_THAT(kept.explain(), Contains("not replaced by scaled_dot_product_attention: node 'p' is also used outside"));
  // Small scores stay composed on a cpu, and say why (4 x 64 x 64: 64 KiB).
  HostTensor small_mask = random_tensor({64, 64}, 25, -1, 0);
  Plan small = rt->compile(exported_attention(4, 64, D, small_mask, false), cpu);
  CHECK(op_of(small, "y") == "matmul");
  CHECK_THAT(small.explain(), Contains("its scores (64 KiB) are below 4096 KiB"));
}

// kᵀ given as a value of its own ([BH, D, S], not a transposed view): the
// fusion makes a transpose view named "<node>/k", or another name when the
// graph already has that one. Would catch: a duplicate name failing the
// compile of a valid graph.
TEST_CASE("optimizer: attention over a pre-transposed k fuses with a view named apart from the graph's own",
          "[optimize][attention]") {
  auto rt = cpu_runtime();
  const int64_t BH = 8, S = 384, D = 8;
  const HostTensor q = random_tensor({BH, S, D}, 51), k = random_tensor({BH, S, D}, 52),
                   v = random_tensor({BH, S, D}, 53, -0.25, 1);
  HostTensor kt(BP_DTYPE_F32, {BH, D, S});
  for (int64_t b = 0; b < BH; ++b)
    for (int64_t j = 0; j < S; ++j)
      for (int64_t c = 0; c < D; ++c) kt.set((b * D + c) * S + j, k.get((b * S + j) * D + c));
  std::vector<double> want, mag;
  attention_f64(q, k, v, nullptr, BH, S, S, D, D, 1.0, false, want, mag);
  Graph g;
  g.input("q", BP_DTYPE_F32, {BH, S, D});
  g.input("kt", BP_DTYPE_F32, {BH, D, S});
  g.input("v", BP_DTYPE_F32, {BH, S, D});
  g.node("s", "matmul", {"q", "kt"});
  g.node("p", "softmax", {"s"}, {{"dim", -1}});
  g.node("y", "matmul", {"p", "v"});
  g.node("y/k", "neg", {"v"});  // the name the fusion would give its view
  g.output("y");
  g.output("y/k");
  Plan plan = rt->compile(g, rt->device("cpu"));
  CHECK(op_of(plan, "y") == "scaled_dot_product_attention");
  const auto out = plan.run({{"q", q}, {"kt", kt}, {"v", v}});
  CHECK(attention_mismatches(out.at("y"), want, mag) == 0);
  CHECK(out.at("y/k").get(0) == -v.get(0));
}

// masked_fill as exporters write it, where(hidden, -inf, scores), with the
// condition a graph input (the fusion then builds the additive mask with a
// where of two constants) and a constant (the mask is then a constant).
// Would catch: the fill applied where the condition is false, or the
// condition's broadcast lost.
TEST_CASE("optimizer: attention masked by where(cond, -inf, scores) fuses with a fed or constant condition",
          "[optimize][attention]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  const int64_t BH = 8, S = 384, D = 8;  // 4.5 MiB of scores: fused on a cpu
  const HostTensor q = random_tensor({BH, S, D}, 41), k = random_tensor({BH, S, D}, 42),
                   v = random_tensor({BH, S, D}, 43, -0.25, 1);
  HostTensor hidden(BP_DTYPE_BOOL, {S, S}), additive(BP_DTYPE_F32, {S, S});
  for (int64_t i = 0; i < S; ++i)
    for (int64_t j = 0; j < S; ++j) {
      const bool h = (i * 7 + j * 3) % 5 == 0 && j != i;  // never a whole row
      hidden.set_int(i * S + j, h);
      additive.set(i * S + j, h ? -INFINITY : 0.0);
    }
  std::vector<double> want, mag;
  attention_f64(q, k, v, &additive, BH, S, S, D, D, 0.25, false, want, mag);
  for (const bool fed : {true, false}) {
    INFO((fed ? "fed condition" : "constant condition"));
    Graph g;
    for (const char* n : {"q", "k", "v"}) g.input(n, BP_DTYPE_F32, {BH, S, D});
    if (fed)
      g.input("hidden", BP_DTYPE_BOOL, {S, S});
    else
      g.constant("hidden", hidden);
    HostTensor c(BP_DTYPE_F32, {}), fill(BP_DTYPE_F32, {});
    c.set(0, 0.25);
    fill.set(0, -INFINITY);
    g.constant("c", c);
    g.constant("fill", fill);
    g.node("kt", "transpose", {"k"}, {{"dim0", -2}, {"dim1", -1}});
    g.node("s", "matmul", {"q", "kt"});
    g.node("scaled", "mul", {"s", "c"});
    g.node("masked", "where", {"hidden", "fill", "scaled"});
    g.node("p", "softmax", {"masked"}, {{"dim", -1}});
    g.node("y", "matmul", {"p", "v"});
    g.output("y");
    Plan plan = rt->compile(g, cpu);
    CHECK(op_of(plan, "y") == "scaled_dot_product_attention");
    std::map<std::string, HostTensor> in = {{"q", q}, {"k", k}, {"v", v}};
    if (fed) in["hidden"] = hidden;
    CHECK(attention_mismatches(plan.run(in).at("y"), want, mag) == 0);
  }
}

// The op written in a graph: causal with fewer queries than keys (the last
// Sq positions of a sequence, as a KV cache gives them), on the CPU's kernel,
// on vulkan0 (its kernel on a GPU; the composed form on lavapipe, which
// declines the op), and in f64, which no shipped device claims, so the host
// runs its composed form with a constant causal mask.
// Would catch: the causal limit aligned to the start instead of the end of
// the keys, a default scale other than 1/sqrt(D), a key tile or query block
// crossed wrongly (300 keys), and a device list without the op failing the
// compile.
TEST_CASE("scaled_dot_product_attention: causal over a longer key set, on each kernel and composed in f64",
          "[optimize][attention]") {
  auto rt = Runtime::create();
  const int64_t BH = 3, Sq = 5, Sk = 300, D = 32, Dv = 8;
  const HostTensor q = random_tensor({BH, Sq, D}, 31), k = random_tensor({BH, Sk, D}, 32),
                   v = random_tensor({BH, Sk, Dv}, 33, -0.25, 1);
  std::vector<double> want, mag;
  attention_f64(q, k, v, nullptr, BH, Sq, Sk, D, Dv, 1.0 / std::sqrt(double(D)), true, want, mag);
  auto graph = [&](bp_dtype d) {
    Graph g;
    g.input("q", d, {BH, Sq, D});
    g.input("k", d, {BH, Sk, D});
    g.input("v", d, {BH, Sk, Dv});
    g.node("y", "scaled_dot_product_attention", {"q", "k", "v"}, {{"causal", true}});
    g.output("y");
    return g;
  };
  auto as = [](const HostTensor& t, bp_dtype d) {
    HostTensor r(d, t.shape);
    for (int64_t i = 0; i < t.numel(); ++i) r.set(i, t.get(i));
    return r;
  };
  const std::map<std::string, HostTensor> in = {{"q", q}, {"k", k}, {"v", v}};
  std::vector<std::string> devices = {"cpu"};
  for (Device* d : rt->all_devices())
    if (d->name() == "vulkan0") devices.push_back("vulkan0");
  if (devices.size() == 1) WARN("SKIPPED: no Vulkan device for its kernel");
  for (const auto& name : devices) {
    INFO(name);
    // lavapipe (a CPU device) declines the op; the host then runs the
    // composed form there (BACKPLANE_VULKAN_FORMS=gpu makes it claim it).
    bool claims = false;
    for (const auto& k : rt->device(name).kernels())
      claims = claims || (k.op == "scaled_dot_product_attention" && k.dtypes[0] == BP_DTYPE_F32);
    Plan p = rt->compile(graph(BP_DTYPE_F32), rt->device(name));
    CHECK(op_of(p, "y") == (claims ? "scaled_dot_product_attention" : "matmul"));
    if (!claims) CHECK_THAT(p.explain(), Contains("runs its composed form"));
    CHECK(attention_mismatches(p.run(in).at("y"), want, mag) == 0);
  }
  Plan composed = rt->compile(graph(BP_DTYPE_F64), rt->select_devices(devices.size() > 1 ? "vulkan0,cpu" : "cpu"));
  CHECK_THAT(composed.explain(), Contains("node 'y' (scaled_dot_product_attention): no device of the list has its "
                                          "kernel for f64; runs its composed form"));
  CHECK(op_of(composed, "y") == "matmul");
  const HostTensor got = composed
                             .run({{"q", as(q, BP_DTYPE_F64)}, {"k", as(k, BP_DTYPE_F64)}, {"v", as(v, BP_DTYPE_F64)}})
                             .at("y");
  CHECK(attention_mismatches(got, want, mag) == 0);
}

// Elementwise chains as one fused_elementwise node (core/src/pass_fuse.cpp),
// run by the CPU's fused kernel (plugins/cpu/fused.cpp). Would catch: an
// intermediate that a graph output or another node reads folded away, a
// group that recomputes a smaller value per output element, registers
// wired to the wrong input, a condition read as a value, a value that differs
// by a bit from the unfused kernels, and the path not taken at all.
TEST_CASE("optimizer: elementwise chains run as one fused_elementwise node, bit for bit", "[optimize][fuse]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  Graph g;
  g.input("x", BP_DTYPE_F32, {33, 1030});
  g.input("b", BP_DTYPE_F32, {1030});
  g.input("m", BP_DTYPE_BOOL, {33, 1});
  g.node("t", "add", {"x", "b"});
  g.node("r", "relu", {"t"});
  g.node("e", "exp", {"b"});  // [1030]: smaller than the chain, stays its own node
  g.node("s", "mul", {"r", "e"});
  g.node("c", "gt", {"s", "x"});
  g.node("w", "where", {"c", "s", "x"});
  g.node("w2", "where", {"m", "w", "b"});
  g.node("a", "affine", {"w2"}, {{"mul", 0.5}, {"add", -0.25}});
  g.node("z", "sigmoid", {"t"});  // t's second reader: t joins once both are in the group
  g.node("y", "sub", {"a", "z"});
  g.node("y2", "tanh", {"y"});
  g.output("y");   // read by y2 and an output: a group ends at y
  g.output("y2");
  auto [p, base] = optimized_and_plain(*rt, g, cpu);
  const std::string e = p.explain();
  INFO(e);
  CHECK_THAT(e, Contains("fuse: 9 elementwise nodes ('t', 'r', 's', 'c' and 5 more) run as one fused_elementwise node 'y' "
                             "(4 inputs: r4 = add(r0, r1); r5 = relu(r4)"));
  CHECK_FALSE(explains(p, "  e (fused_elementwise)"));
  CHECK(explains(p, "  e (exp)"));
  CHECK(explains(p, "  y (fused_elementwise)"));
  CHECK(explains(p, "  y2 (tanh)"));  // a group of one is left as it is
  CHECK_FALSE(explains(base, "fused_elementwise"));
  HostTensor x = random_tensor({33, 1030}, 21, -2, 2), b = random_tensor({1030}, 22, -2, 2);
  HostTensor m(BP_DTYPE_BOOL, {33, 1});
  for (int64_t i = 0; i < 33; ++i) m.set(i, i % 3 != 0);
  x.set(5, std::numeric_limits<float>::quiet_NaN());
  const auto got = p.run({{"x", x}, {"b", b}, {"m", m}}), want = base.run({{"x", x}, {"b", b}, {"m", m}});
  same_bits(got, want, {"y", "y2"});
  // An f64 spot check of the fused value (the unfused chain could share a bug).
  for (int64_t i : {0L, 1029L, 3L * 1030 + 7, 32L * 1030 + 1029}) {
    const int64_t row = i / 1030, col = i % 1030;
    const double xv = x.get(i), bv = b.get(col), t = xv + bv;
    const double s = static_cast<double>(static_cast<float>(std::max(t, 0.0)) * static_cast<float>(std::exp(bv)));
    const double w = s > xv ? s : xv;
    const double w2 = row % 3 != 0 ? w : bv;
    const double want_y = (0.5 * static_cast<float>(w2) - 0.25) - 1.0 / (1.0 + std::exp(-t));
    CHECK(got.at("y").get(i) == Approx(want_y).epsilon(1e-5).margin(1e-6));
  }
  SECTION("a kept value, a graph output and a pinned node stop a group") {
    CompileOptions co;
    co.keep = {"r"};
    CHECK_THAT(rt->compile(g, cpu, co).explain(), Contains("fuse: 7 elementwise nodes ('s', 'c', 'w', 'w2' and 3 more)"));
    Graph h = g;
    h.node("q", "neg", {"y2"});
    h.node("q2", "abs", {"q"}, Json::object(), "cpu");
    h.output("q2");
    CHECK_FALSE(explains(rt->compile(h, cpu), "'q', 'q2'"));
  }
}

// A program the host cannot run is refused by name before any device sees
// it. Would catch: a register read before it is written, a condition used as
// a value (or the reverse), a bad op or param taken silently.
TEST_CASE("fused_elementwise: malformed programs are refused with the instruction named", "[optimize][fuse]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  auto refused = [&](Json program, std::vector<bp_dtype> in, const std::string& why) {
    Graph g;
    std::vector<std::string> names;
    for (size_t i = 0; i < in.size(); ++i) {
      names.push_back("x" + std::to_string(i));
      g.input(names.back(), in[i], {4});
    }
    g.node("y", "fused_elementwise", names, {{"program", std::move(program)}});
    g.output("y");
    INFO(why);
    CHECK_THROWS_WITH(rt->compile(g, cpu), Contains(why));
  };
  const auto f = BP_DTYPE_F32, b = BP_DTYPE_BOOL;
  refused(Json::array({Json::array({"add", 0, 2})}), {f, f}, "operand 1 = 2 is not a register defined before it");
  refused(Json::array({Json::array({"where", 0, 0, 1})}), {f, b}, "register 0 is a value; operand 0 must be a condition");
  refused(Json::array({Json::array({"exp", 1})}), {f, b}, "register 1 is a condition (bool)");
  refused(Json::array({Json::array({"lt", 0, 1})}), {f, f}, "the program's last instruction gives a condition");
  refused(Json::array({Json::array({"matmul", 0, 1})}), {f, f}, "'matmul' is not an elementwise op a program takes");
  refused(Json::array({Json::array({"clamp", 0, {{"low", 1}}})}), {f}, "unknown param 'low'");
  refused(Json::array(), {f}, "param 'program' must be a non-empty list");
  refused(Json::array({Json::array({"neg", 0})}), {b, f}, "input 0 (x0) must have the compute dtype");
  refused(Json::array({Json::array({"neg", 0})}), {f, BP_DTYPE_F16}, "fused_elementwise takes f32 (x0's) or bool");
  refused(Json::array({Json::array({"neg", 0})}), {f, BP_DTYPE_I32}, "input 1 (x1) has dtype i32; this op takes");
  Json long_program = Json::array();
  for (int i = 0; i < 65; ++i) long_program.push_back(Json::array({"neg", i}));
  refused(long_program, {f}, "the limit is 64");
}

// A graph may name fused_elementwise itself: where no device of the list has
// its kernel (the CPU's and Vulkan's are f32 only), the host runs its
// instructions as standard nodes. Would catch: a register wired to the wrong
// value, a program's params dropped, the output left at the last register's
// smaller shape instead of the inputs' broadcast.
TEST_CASE("fused_elementwise: without a kernel for its dtype it runs as its instructions", "[optimize][fuse]") {
  auto rt = cpu_runtime();
  std::vector<std::string> lists = {"cpu"};
  for (Device* d : rt->all_devices())
    if (d->name() == "vulkan0") lists.push_back("vulkan0");
  const Json program = Json::array({Json::array({"exp", 0}), Json::array({"clamp", 2, {{"max", 2.0}}}),
                                    Json::array({"mul", 3, 0})});
  for (bp_dtype d : {BP_DTYPE_F64, BP_DTYPE_F32}) {
    Graph g;
    g.input("x", d, {3});
    g.input("b", d, {2, 3});  // read by no instruction: y still has its shape
    g.node("y", "fused_elementwise", {"x", "b"}, {{"program", program}});
    g.output("y");
    HostTensor x(d, {3}), b(d, {2, 3});
    x.set(0, -1.0);
    x.set(1, 0.5);
    x.set(2, 1.5);
    for (const auto& list : lists) {
      INFO(list << " " << dtype_name(d));
      Plan p = rt->compile(g, rt->select_devices(list));
      const bool kernel = d == BP_DTYPE_F32;
      CHECK(explains(p, "runs its 3 instructions as standard nodes") == !kernel);
      const HostTensor y = p.run({{"x", x}, {"b", b}}).at("y");
      REQUIRE(y.shape == Shape{2, 3});
      for (int64_t i = 0; i < 6; ++i) {
        const double xv = x.get(i % 3);
        CHECK(y.get(i) == Approx(std::min(std::exp(xv), 2.0) * xv).epsilon(1e-6));
      }
    }
  }
}

// The LayerNorm and GELU chains exporters write (opset < 17) run as
// layer_norm and gelu when optimizing (core/src/pass_compositions.cpp; the
// importer no longer maps them, so --optimize none runs them as exported).
// Would catch: a kept intermediate or a pinned node swallowed by the
// mapping, the mapping made without optimize, values off the chain's.
TEST_CASE("optimizer: exported LayerNorm and GELU chains run as layer_norm and gelu", "[optimize][compositions]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  auto scalar = [](double v) {
    HostTensor t(BP_DTYPE_F32, {});
    t.set(0, v);
    return t;
  };
  Graph g;
  g.input("x", BP_DTYPE_F32, {6, 32});
  g.constant("eps", scalar(1e-5));
  g.constant("w", random_tensor({32}, 3));
  g.constant("b", random_tensor({32}, 4));
  g.constant("sqrt2", scalar(std::sqrt(2.0)));
  g.constant("one", scalar(1.0));
  g.constant("half", scalar(0.5));
  g.node("m1", "mean", {"x"}, {{"dims", {-1}}, {"keepdim", true}});
  g.node("d", "sub", {"x", "m1"});
  g.node("sq", "sqr", {"d"});
  g.node("m2", "mean", {"sq"}, {{"dims", {-1}}, {"keepdim", true}});
  g.node("ve", "add", {"m2", "eps"});
  g.node("sd", "sqrt", {"ve"});
  g.node("n", "div", {"d", "sd"});
  g.node("nw", "mul", {"n", "w"});
  g.node("ln", "add", {"nw", "b"});
  g.node("g1", "div", {"ln", "sqrt2"});
  g.node("g2", "erf", {"g1"});
  g.node("g3", "add", {"g2", "one"});
  g.node("g4", "mul", {"ln", "g3"});
  g.node("y", "mul", {"g4", "half"});
  g.output("y");
  auto [p, base] = optimized_and_plain(*rt, g, cpu);
  INFO(p.explain());
  CHECK(explains(p, "1 exported LayerNorm chain"));
  CHECK(explains(p, "1 exported GELU chain"));
  CHECK(explains(p, "  ln (layer_norm)"));
  CHECK(explains(p, "  y (gelu)"));
  CHECK_FALSE(explains(base, "exported LayerNorm"));
  const HostTensor x = random_tensor({6, 32}, 5, -3, 3);
  const HostTensor got = p.run({{"x", x}}).at("y"), want = base.run({{"x", x}}).at("y");
  for (int64_t i = 0; i < want.numel(); ++i) CHECK(got.get(i) == Approx(want.get(i)).epsilon(1e-5).margin(1e-6));
  SECTION("a kept intermediate or a pin leaves the chain as written") {
    CompileOptions co;
    co.keep = {"sd"};
    CHECK_FALSE(explains(rt->compile(g, cpu, co), "exported LayerNorm"));
    Graph h = g;
    h.pin("g3", "cpu");
    Plan q = rt->compile(h, cpu);
    CHECK(explains(q, "exported LayerNorm"));
    CHECK_FALSE(explains(q, "exported GELU"));
  }
}

// The simplify pass's identities and view chains (core/src/pass_simplify.cpp).
// Would catch: add of +0 dropped (it turns -0 into +0), a constant that
// grows the shape taken as an identity, a permute pair composed in the wrong
// order, a kept or output name lost, any bit changed.
TEST_CASE("optimizer: identities and view chains are skipped, bit for bit", "[optimize]") {
  auto rt = cpu_runtime();
  Device& cpu = rt->device("cpu");
  auto filled = [](Shape s, double v) {
    HostTensor t(BP_DTYPE_F32, std::move(s));
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v);
    return t;
  };
  Graph g;
  g.input("x", BP_DTYPE_F32, {4, 6});
  g.constant("one", filled({6}, 1.0));
  g.constant("ones_big", filled({3, 4, 6}, 1.0));
  g.constant("pz", filled({}, 0.0));
  g.constant("nz", filled({1}, -0.0));
  g.node("c", "cast", {"x"}, {{"dtype", "f32"}});
  g.node("m", "mul", {"one", "c"});
  g.node("d", "div", {"m", "one"});
  g.node("s", "sub", {"d", "pz"});
  g.node("a", "add", {"s", "nz"});
  g.node("a0", "add", {"a", "pz"});       // stays: -0 + +0 is +0
  g.node("grow", "mul", {"a0", "ones_big"});  // stays: [3, 4, 6], not x's shape
  g.node("r1", "reshape", {"grow"}, {{"shape", {12, 6}}});
  g.node("r2", "reshape", {"r1"}, {{"shape", {72}}});
  g.node("p1", "permute", {"a0"}, {{"dims", {1, 0}}});
  g.node("p2", "permute", {"p1"}, {{"dims", {1, 0}}});  // cancels p1
  g.node("y", "neg", {"p2"});
  g.output("y");
  g.output("r2");
  auto [p, base] = optimized_and_plain_keeping(*rt, g, cpu, {"d"});
  const std::string e = p.explain();
  INFO(e);
  CHECK_THAT(e, Contains("simplify: 4 nodes ('c', 'm', 's', 'a') pass their input through"));
  CHECK_THAT(e, Contains("simplify: 2 views ('r2', 'p2') of a view of the same kind"));
  CHECK(explains(p, "  a0 ("));
  CHECK(explains(p, "  d ("));  // kept
  HostTensor x = random_tensor({4, 6}, 31);
  x.set(0, -0.0);
  const auto got = p.run({{"x", x}}), want = base.run({{"x", x}});
  same_bits(got, want, {"y", "r2"});
  CHECK(std::signbit(got.at("y").get(0)));  // -(-0 + +0) = -0: the add of +0 ran
  CHECK(p.output("d").get(1) == x.get(1));
}
