// fused_elementwise on vulkan0 (plugins/vulkan/fused.cpp): the optimizer
// fuses an elementwise chain into one node when vulkan0 is the first device,
// the generated shader's values match an f64 loop on the fast form (dense
// and broadcast-scalar operands) and on the general form (a row broadcast
// and a transposed input), and a program with more inputs than the plugin's
// operand limit is refused with a message naming the count. The disk cache
// of the generated SPIR-V is checked across processes by the ctest
// vulkan_fused_cache (tests/vulkan_fused_cache.sh).
#include "vulkan_test_support.hpp"

#include <backplane/backplane.hpp>

#include <cmath>

using namespace backplane;
using namespace backplane::vktest;

namespace {

// The chain, in f64 then rounded per op as the kernels do (each op's
// result is an f32): y = max(|-(min(relu(0.5 (a + b)) - 0.25, b))|, a) *
// sigmoid(a).
double chain_ref(float a, float b) {
  const auto r = [](double v) { return static_cast<double>(static_cast<float>(v)); };
  double t = r(double(a) + double(b));
  t = r(0.5 * t + 0.0);
  t = t < 0 ? 0 : t;
  t = r(t - 0.25);
  t = std::min(t, double(b));
  t = std::fabs(-t);
  t = std::max(t, double(a));
  const double s = r(1.0 / (1.0 + std::exp(-double(a))));
  return r(t * s);
}

Graph chain_graph(const Shape& a_shape, const Shape& b_shape, bool transpose_a) {
  Graph g;
  g.input("a_in", BP_DTYPE_F32, transpose_a ? Shape{a_shape[1], a_shape[0]} : a_shape);
  g.input("b", BP_DTYPE_F32, b_shape);
  // a: the input itself, or a transposed view of it (a strided operand).
  if (transpose_a) g.node("a", "transpose", {"a_in"}, {{"dim0", 0}, {"dim1", 1}});
  const std::string a = transpose_a ? "a" : "a_in";
  g.node("t0", "add", {a, "b"});
  g.node("t1", "affine", {"t0"}, {{"mul", 0.5}, {"add", 0.0}});
  g.node("t2", "relu", {"t1"});
  g.node("t3", "affine", {"t2"}, {{"mul", 1.0}, {"add", -0.25}});
  g.node("t4", "minimum", {"t3", "b"});
  g.node("t5", "neg", {"t4"});
  g.node("t6", "abs", {"t5"});
  g.node("t7", "maximum", {"t6", a});
  g.node("s", "sigmoid", {a});
  g.node("y", "mul", {"t7", "s"});
  g.output("y");
  return g;
}

}  // namespace

TEST_CASE("vulkan fused_elementwise: a chain runs as one fused node on vulkan0 and matches f64", "[vulkan][fused]") {
  Devices dv;
  if (!dv.ready()) return;
  if (!has_kernel(*dv.vk, "fused_elementwise", BP_DTYPE_F32)) FAIL("vulkan0 does not claim fused_elementwise f32");
  struct Shape2 {
    const char* what;
    Shape a, b;
    bool transpose;
  };
  const Shape2 cases[] = {
      {"dense, same shape (fast form)", {4099}, {4099}, false},
      {"a scalar b (fast form, broadcast scalar)", {1027}, {}, false},
      {"row broadcast (general form)", {37, 129}, {129}, false},
      {"transposed a (general form)", {33, 65}, {33, 65}, true},
  };
  for (const Shape2& sc : cases) {
    DYNAMIC_SECTION(sc.what) {
      const Graph g = chain_graph(sc.a, sc.b, sc.transpose);
      Plan p = dv.rt->compile(g, *dv.vk);
      const std::string ex = p.explain();
      INFO(ex);
      CHECK(ex.find("fused_elementwise") != std::string::npos);
      CHECK(ex.find("vulkan0") != std::string::npos);
      const HostTensor a_in = reals(BP_DTYPE_F32, sc.transpose ? Shape{sc.a[1], sc.a[0]} : sc.a, 11, 3);
      const HostTensor b = reals(BP_DTYPE_F32, sc.b, 12, 3);
      const HostTensor y = p.run({{"a_in", a_in}, {"b", b}}).at("y");
      REQUIRE(y.shape == sc.a);
      const int64_t rows = sc.a.size() == 2 ? sc.a[0] : 1, cols = sc.a.back();
      const auto want = [&](int64_t i) {
        const int64_t r = i / cols, c = i % cols;
        const double av = sc.transpose ? a_in.get(c * rows + r) : a_in.get(i);
        double bv = 0;
        if (sc.b.empty()) bv = b.get(0);
        else if (sc.b.size() == 1 && sc.a.size() == 2) bv = b.get(c);
        else bv = b.get(i);
        return chain_ref(static_cast<float>(av), static_cast<float>(bv));
      };
      check_elements(
          y, y.numel(),
          [&](int64_t i) {
            const double w = want(i);
            return std::fabs(y.get(i) - w) <= 1e-6 + 1e-5 * std::fabs(w);
          },
          want);
    }
  }
}

TEST_CASE("vulkan fused_elementwise: more inputs than the plugin's operands is refused, naming the count",
          "[vulkan][fused]") {
  Devices dv;
  if (!dv.ready()) return;
  // 8 inputs summed: 9 operands with the output, one more than kMaxOperands.
  Graph g;
  Json prog = Json::array();
  std::vector<std::string> ins;
  for (int k = 0; k < 8; ++k) {
    ins.push_back("x" + std::to_string(k));
    g.input(ins.back(), BP_DTYPE_F32, {16});
  }
  int acc = 0;
  for (int k = 1; k < 8; ++k) {
    prog.push_back(Json::array({"add", acc, k}));
    acc = 8 + k - 1;
  }
  g.node("y", "fused_elementwise", ins, {{"program", prog}});
  g.output("y");
  std::map<std::string, HostTensor> in;
  for (const auto& n : ins) in[n] = reals(BP_DTYPE_F32, {16}, 3, 2);
  std::string msg;
  try {
    Plan p = dv.rt->compile(g, *dv.vk);
    p.run(in);
  } catch (const Error& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("8 inputs") != std::string::npos);
  CHECK(msg.find("at most 7") != std::string::npos);
}
