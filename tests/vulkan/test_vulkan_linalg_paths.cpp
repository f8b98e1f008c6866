// The Vulkan plugin's data-movement and compute paths on vulkan0
// (plugins/vulkan/README.md): the 2-D block path of binary ops (a transposed
// operand read by 4-vectors down its columns), matmul's direct form (a TM x TN
// block of C per invocation, 4-vector loads of dense B rows) and conv2d's
// direct form (TO channels x TW columns per invocation). Shapes hit edge
// blocks and tiles (sizes not multiples of the block), batch broadcast,
// transposed and offset operands, in every dtype the manifest claims.
// Binary ops are compared with the CPU plugin (small integers: exact in every
// dtype); matmul and conv2d with f64 references computed here from the
// stored inputs, within docs/ops.md's tolerances scaled by the sum of the
// terms' magnitudes.
#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>

#include "vulkan_test_support.hpp"

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

using namespace backplane;
using namespace backplane::vktest;

TEST_CASE("vulkan paths: binary ops with a transposed operand (the 2-D block path) match the CPU",
          "[vulkan][paths]") {
  Devices dv;
  if (!dv.ready()) return;
  // {rows, cols} of the output; a is stored [cols, rows] and transposed.
  // 128x64 and 100x36: whole and partial 64x64 tiles; 100x37 and 102x40:
  // rows or a's stride not a multiple of 4 (the other paths).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{128, 64}, {100, 36}, {4, 4}, {100, 37}, {102, 40}};
  DtypesRun ran("add");
  for (bp_dtype d : kNumeric) {
    if (!ran.take(*dv.vk, "add", d)) continue;
    const int lo = d == BP_DTYPE_U8 ? 0 : -50, hi = 50;
    for (auto [R, C] : shapes) {
      INFO(dtype_name(d) << " " << R << "x" << C);
      Graph g;
      g.input("a", d, {C, R});
      g.input("b", d, {R, C});
      g.input("bt", d, {C, R});
      g.input("col", d, {R, 1});
      g.input("row", d, {C});
      g.node("at", "transpose", {"a"}, {{"dim0", 0}, {"dim1", 1}});
      g.node("btt", "transpose", {"bt"}, {{"dim0", 0}, {"dim1", 1}});
      g.node("y0", "add", {"at", "b"});     // transposed first input
      g.node("y1", "sub", {"b", "at"});     // transposed second input
      g.node("y2", "mul", {"at", "btt"});   // both transposed
      g.node("y3", "add", {"at", "col"});   // with a column broadcast
      g.node("y4", "maximum", {"row", "at"});  // with a row broadcast
      g.node("y5", "lt", {"at", "b"});      // a comparison (bool out)
      for (const char* y : {"y0", "y1", "y2", "y3", "y4", "y5"}) g.output(y);
      const std::map<std::string, HostTensor> in = {{"a", ints(d, {C, R}, 1, lo, hi)},
                                                    {"b", ints(d, {R, C}, 2, lo, hi)},
                                                    {"bt", ints(d, {C, R}, 3, d == BP_DTYPE_U8 ? 0 : -2, 2)},
                                                    {"col", ints(d, {R, 1}, 4, lo, hi)},
                                                    {"row", ints(d, {C}, 5, lo, hi)}};
      // bt in [-2, 2]: products fit i8 and are exact in bf16.
      const auto want = run_on(*dv.rt, *dv.cpu, g, in);
      const auto got = run_on(*dv.rt, *dv.vk, g, in);
      for (const auto& [name, t] : want) {
        INFO("output " << name);
        REQUIRE(got.count(name) == 1);
        check_equal(got.at(name), t);
      }
    }
  }
  ran.check();
}

TEST_CASE("vulkan paths: a transposed operand with an offset, and in a batch", "[vulkan][paths]") {
  Devices dv;
  if (!dv.ready()) return;
  Graph g;
  g.input("a", BP_DTYPE_F32, {70, 68});
  g.input("b", BP_DTYPE_F32, {68, 64});
  g.input("c", BP_DTYPE_F32, {3, 20, 12});
  g.input("d", BP_DTYPE_F32, {3, 12, 20});
  // Starting 4 rows in (an aligned offset) and 1 row in (not aligned).
  g.node("s4", "slice", {"a"}, {{"dim", 0}, {"start", 4}, {"end", 68}});
  g.node("s1", "slice", {"a"}, {{"dim", 0}, {"start", 1}, {"end", 65}});
  g.node("t4", "transpose", {"s4"}, {{"dim0", 0}, {"dim1", 1}});
  g.node("t1", "transpose", {"s1"}, {{"dim0", 0}, {"dim1", 1}});
  g.node("y0", "add", {"t4", "b"});
  g.node("y1", "add", {"t1", "b"});
  g.node("ct", "transpose", {"c"}, {{"dim0", 1}, {"dim1", 2}});
  g.node("y2", "div", {"ct", "d"});
  for (const char* y : {"y0", "y1", "y2"}) g.output(y);
  const std::map<std::string, HostTensor> in = {{"a", ints(BP_DTYPE_F32, {70, 68}, 6, -50, 50)},
                                                {"b", ints(BP_DTYPE_F32, {68, 64}, 7, -50, 50)},
                                                {"c", ints(BP_DTYPE_F32, {3, 20, 12}, 8, -50, 50)},
                                                {"d", ints(BP_DTYPE_F32, {3, 12, 20}, 9, 1, 8)}};
  const auto want = run_on(*dv.rt, *dv.cpu, g, in);
  const auto got = run_on(*dv.rt, *dv.vk, g, in);
  for (const auto& [name, t] : want) {
    INFO("output " << name);
    check_equal(got.at(name), t);
  }
}

namespace {

// C[b, m, n] = sum_k A[b, m, k] B[b, k, n] in f64 from the stored values, with
// NumPy batch broadcasting of a's and b's batch dims (rank 3 here).
void matmul_ref(const HostTensor& a, const HostTensor& b, bool a_t, bool b_t, int64_t M, int64_t K, int64_t N,
                int64_t ba, int64_t bb, std::vector<double>& ref, std::vector<double>& scale) {
  const int64_t batch = std::max(ba, bb);
  ref.assign(batch * M * N, 0.0);
  scale.assign(batch * M * N, 0.0);
  for (int64_t t = 0; t < batch; ++t)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0, sa = 0;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t ia = (ba == 1 ? 0 : t) * M * K + (a_t ? k * M + m : m * K + k);
          const int64_t ib = (bb == 1 ? 0 : t) * K * N + (b_t ? n * K + k : k * N + n);
          const double p = a.get(ia) * b.get(ib);
          s += p;
          sa += std::abs(p);
        }
        ref[(t * M + m) * N + n] = s;
        scale[(t * M + m) * N + n] = static_cast<double>(K) * sa;
      }
}

}  // namespace

TEST_CASE("vulkan paths: matmul's blocks at edges, batch broadcast and transposed operands", "[vulkan][paths]") {
  Devices dv;
  if (!dv.ready()) return;
  struct S {
    int64_t M, K, N, ba, bb;
    bool a_t, b_t;
  };
  // N % 4 == 0 with dense B: 4-vector loads of B; otherwise scalar loads.
  // M, N not multiples of the block; K = 1; batch 1 against 3 both ways.
  // Products up to 2^21 multiply-adds take the 4x4 block, bigger ones the
  // 16x16 block (the last three shapes), each at edges.
  const std::vector<S> shapes = {{1, 1, 1, 1, 1, false, false},   {5, 7, 3, 1, 1, false, false},
                                 {33, 17, 70, 1, 1, false, false}, {37, 29, 12, 1, 1, false, false},
                                 {64, 64, 64, 1, 1, false, false}, {9, 1, 20, 1, 1, false, false},
                                 {13, 21, 8, 1, 3, false, false},  {11, 6, 9, 3, 1, false, false},
                                 {19, 23, 16, 2, 2, true, false},  {18, 10, 24, 1, 1, false, true},
                                 {7, 5, 13, 3, 3, true, true},     {130, 70, 68, 1, 1, false, false},
                                 {150, 130, 122, 1, 1, false, false}, {136, 128, 132, 1, 1, false, false},
                                 {90, 100, 120, 2, 2, true, false}};
  DtypesRun ran("matmul");
  for (bp_dtype d : kFloats) {
    if (!ran.take(*dv.vk, "matmul", d)) continue;
    for (const S& s : shapes) {
      INFO(dtype_name(d) << " M=" << s.M << " K=" << s.K << " N=" << s.N << " batch " << s.ba << "/" << s.bb
                      << (s.a_t ? " a^T" : "") << (s.b_t ? " b^T" : ""));
      const Shape as = s.a_t ? Shape{s.ba, s.K, s.M} : Shape{s.ba, s.M, s.K};
      const Shape bs = s.b_t ? Shape{s.bb, s.N, s.K} : Shape{s.bb, s.K, s.N};
      Graph g;
      g.input("a", d, as);
      g.input("b", d, bs);
      std::string an = "a", bn = "b";
      if (s.a_t) {
        g.node("at", "transpose", {"a"}, {{"dim0", 1}, {"dim1", 2}});
        an = "at";
      }
      if (s.b_t) {
        g.node("bt", "transpose", {"b"}, {{"dim0", 1}, {"dim1", 2}});
        bn = "bt";
      }
      g.node("y", "matmul", {an, bn});
      g.output("y");
      const HostTensor a = reals(d, as, 11, 1), b = reals(d, bs, 12, 1);
      std::vector<double> ref, scale;
      matmul_ref(a, b, s.a_t, s.b_t, s.M, s.K, s.N, s.ba, s.bb, ref, scale);
      const auto got = run_on(*dv.rt, *dv.vk, g, {{"a", a}, {"b", b}});
      check_close(got.at("y"), ref, scale, d);
    }
  }
  ran.check();
}

TEST_CASE("vulkan paths: conv2d's direct form at edges, with padding, stride, dilation, groups, bias",
          "[vulkan][paths]") {
  Devices dv;
  if (!dv.ready()) return;
  struct S {
    int64_t N, C, H, W, O, KH, KW, sh, sw, pt, pl, pb, pr, dh, dw, groups;
    bool bias;
  };
  const std::vector<S> shapes = {
      {2, 3, 9, 11, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, true},    // O and OW not multiples of the block
      {1, 4, 8, 8, 16, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1, false},   // no padding
      {2, 6, 10, 13, 9, 3, 2, 2, 3, 2, 1, 0, 2, 1, 1, 3, true},   // stride, asymmetric padding, groups
      {1, 2, 12, 12, 4, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 2, false},  // dilation, groups
      {3, 8, 5, 7, 12, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, true},    // 1x1
      {1, 1, 3, 3, 1, 5, 5, 1, 1, 2, 2, 2, 2, 1, 1, 1, false},    // kernel larger than the input
  };
  DtypesRun ran("conv2d");
  for (bp_dtype d : kFloats) {
    if (!ran.take(*dv.vk, "conv2d", d)) continue;
    for (const S& s : shapes) {
      INFO(dtype_name(d) << " N=" << s.N << " C=" << s.C << " H=" << s.H << " W=" << s.W << " O=" << s.O << " k="
                      << s.KH << "x" << s.KW << " groups " << s.groups);
      const int64_t cg = s.C / s.groups, og = s.O / s.groups;
      const int64_t OH = (s.H + s.pt + s.pb - s.dh * (s.KH - 1) - 1) / s.sh + 1;
      const int64_t OW = (s.W + s.pl + s.pr - s.dw * (s.KW - 1) - 1) / s.sw + 1;
      Graph g;
      g.input("x", d, {s.N, s.C, s.H, s.W});
      g.input("w", d, {s.O, cg, s.KH, s.KW});
      std::vector<std::string> ins = {"x", "w"};
      if (s.bias) {
        g.input("bias", d, {s.O});
        ins.push_back("bias");
      }
      g.node("y", "conv2d", ins,
             {{"stride", {s.sh, s.sw}},
              {"padding", {s.pt, s.pl, s.pb, s.pr}},
              {"dilation", {s.dh, s.dw}},
              {"groups", s.groups}});
      g.output("y");
      std::map<std::string, HostTensor> in = {{"x", reals(d, {s.N, s.C, s.H, s.W}, 21, 1)},
                                              {"w", reals(d, {s.O, cg, s.KH, s.KW}, 22, 1)}};
      if (s.bias) in["bias"] = reals(d, {s.O}, 23, 1);
      const HostTensor &x = in.at("x"), &w = in.at("w");
      std::vector<double> ref(s.N * s.O * OH * OW), scale(ref.size());
      for (int64_t n = 0; n < s.N; ++n)
        for (int64_t o = 0; o < s.O; ++o)
          for (int64_t oh = 0; oh < OH; ++oh)
            for (int64_t ow = 0; ow < OW; ++ow) {
              double acc = s.bias ? in.at("bias").get(o) : 0.0, sa = std::abs(acc);
              int64_t terms = s.bias ? 1 : 0;
              const int64_t grp = o / og;
              for (int64_t c = 0; c < cg; ++c)
                for (int64_t kh = 0; kh < s.KH; ++kh)
                  for (int64_t kw = 0; kw < s.KW; ++kw) {
                    const int64_t ih = oh * s.sh - s.pt + kh * s.dh, iw = ow * s.sw - s.pl + kw * s.dw;
                    if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                    const double p = x.get(((n * s.C + grp * cg + c) * s.H + ih) * s.W + iw) *
                                     w.get(((o * cg + c) * s.KH + kh) * s.KW + kw);
                    acc += p;
                    sa += std::abs(p);
                    ++terms;
                  }
              const int64_t i = ((n * s.O + o) * OH + oh) * OW + ow;
              ref[i] = acc;
              scale[i] = static_cast<double>(terms) * sa;
            }
      const auto got = run_on(*dv.rt, *dv.vk, g, in);
      REQUIRE(got.at("y").shape == Shape({s.N, s.O, OH, OW}));
      check_close(got.at("y"), ref, scale, d);
    }
  }
  ran.check();
}
