// The Vulkan plugin's reduction-family paths on vulkan0 (shaders/rows.glsl):
// column reductions (the kept dim contiguous: 4 columns per invocation, rows
// split into chunks with a second pass when there are few columns), one
// subgroup per row (reductions, softmax, log_softmax, layer_norm, var_mean;
// 4-vector loads when rows are contiguous and aligned, scalar otherwise) and
// topk's one-pass form with its array sized by k. Shapes hit every mode:
// few and many columns, rows not a multiple of a workgroup's share, offset
// (unaligned) and transposed inputs, inf and NaN; every dtype the manifest
// claims. Results are compared with the CPU plugin within docs/ops.md's
// tolerances (exactly for integers, topk and small-integer sums).
#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>

#include "vulkan_test_support.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

using namespace backplane;
using namespace backplane::vktest;

namespace {

// Runs g on vulkan0 and on the CPU and compares every output.
void compare(Devices& d, const Graph& g, const std::map<std::string, HostTensor>& in, const std::string& what) {
  const auto gv = run_on(*d.rt, *d.vk, g, in);
  const auto gc = run_on(*d.rt, *d.cpu, g, in);
  for (auto& [name, t] : gc) check_close(gv.at(name), t, what + " output " + name);
}

// A graph on x of `shape` whose input node is "x", or its view "xs" sliced
// one element off the front of the last dim (an unaligned start and row
// stride), or "xt" transposed (dims 0 and 1).
enum class View { plain, sliced, transposed };
std::string add_view(Graph& g, View v, int64_t last) {
  if (v == View::sliced) {
    g.node("xs", "slice", {"x"}, {{"dim", -1}, {"start", 1}, {"end", last}});
    return "xs";
  }
  if (v == View::transposed) {
    g.node("xt", "transpose", {"x"}, {{"dim0", 0}, {"dim1", 1}});
    return "xt";
  }
  return "x";
}

// A reduction over `dims` of x of `shape`, seen through `view`.
struct ReduceCase {
  Shape shape;
  std::vector<int64_t> dims;
  View view;
};

// sum, mean, prod, max and min in every dtype vulkan0 claims them for, over
// each case (x from seed + the case's index), against the CPU. prod: values
// in [-1, 1] (no overflow); sums: small integers, exact.
void compare_reductions(Devices& d, const std::vector<ReduceCase>& cases, uint64_t seed) {
  const char* ops[] = {"sum", "mean", "prod", "max", "min"};
  DtypesRun ran("the reductions");
  for (bp_dtype dt : kNumeric) {
    for (const char* op : ops) {
      if (!ran.take(*d.vk, op, dt)) continue;
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        const auto& c = cases[ci];
        Graph g;
        g.input("x", dt, c.shape);
        const std::string src = add_view(g, c.view, c.shape.back());
        g.node("y", op, {src}, {{"dims", c.dims}});
        g.output("y");
        const bool prod = std::string(op) == "prod";
        const int hi = prod ? 1 : dt == BP_DTYPE_F16 || dt == BP_DTYPE_BF16 ? 2 : 3;
        const int lo = dt == BP_DTYPE_U8 ? 0 : -hi;
        compare(d, g, {{"x", ints(dt, c.shape, seed + ci, lo, hi)}},
                std::string(op) + " " + std::string(dtype_name(dt)) + " case " + std::to_string(ci));
      }
    }
  }
  ran.check();
}

}  // namespace

TEST_CASE("vulkan reduce paths: column reductions (few and many columns, split rows) match the CPU",
          "[vulkan][paths][reduce]") {
  Devices d;
  if (!d.ready()) return;
  const std::vector<ReduceCase> cases = {
      {{5, 3}, {0}, View::plain},          // few columns, not a multiple of 4
      {{300, 8}, {0}, View::plain},        // few columns, 4-vectors
      {{2000, 12}, {0}, View::plain},      // few columns: rows split, second pass
      {{520, 1028}, {0}, View::plain},     // many columns, split in two chunks
      {{3, 2, 8}, {0, 1}, View::plain},    // two reduced dims coalesce
      {{7, 2, 9}, {0}, View::plain},       // two kept dims coalesce (18 columns)
      {{300, 9}, {0}, View::sliced},       // offset and row stride not multiples of 4
      {{40, 600}, {1}, View::transposed},  // the kept dim is contiguous after a transpose
  };
  compare_reductions(d, cases, 11);
}

TEST_CASE("vulkan reduce paths: row reductions (a subgroup per row, 4-vectors or not) match the CPU",
          "[vulkan][paths][reduce]") {
  Devices d;
  if (!d.ready()) return;
  const std::vector<ReduceCase> cases = {
      {{270, 37}, {-1}, View::plain},        // rows not a multiple of 4 long; 270 rows (not a multiple of 32)
      {{300, 1024}, {-1}, View::plain},      // long contiguous rows, 4-vectors
      {{260, 65}, {-1}, View::sliced},       // unaligned start and row stride
      {{300, 260}, {-1}, View::transposed},  // strided rows
      {{33, 4096}, {-1}, View::plain}        // few rows (a workgroup each)
  };
  compare_reductions(d, cases, 31);
}

TEST_CASE("vulkan reduce paths: inf and NaN in rows and columns", "[vulkan][paths][reduce]") {
  Devices d;
  if (!d.ready()) return;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  DtypesRun ran("sum");
  for (bp_dtype dt : kFloats) {
    if (!ran.take(*d.vk, "sum", dt)) continue;
    for (Shape shape : {Shape{40, 64}, Shape{300, 64}, Shape{600, 16}, Shape{37, 4096}}) {
      HostTensor x = reals(dt, shape, 5, 2);
      const int64_t w = shape[1];
      x.set(3 * w + 5, inf);                       // row 3 and column 5: +inf
      x.set(7 * w + 1, inf), x.set(7 * w + 9, -inf);  // row 7: inf - inf = NaN
      x.set(9 * w + 2, nan);                       // row 9, column 2: NaN
      x.set(20 * w + 5, 1e18);                     // a big finite value (its square fits f32)
      for (const char* op : {"sum", "mean", "max", "min"})
        for (int dim : {0, 1}) {
          Graph g;
          g.input("x", dt, shape);
          g.node("y", op, {"x"}, {{"dims", {dim}}});
          g.output("y");
          compare(d, g, {{"x", x}},
                  std::string(op) + " " + std::string(dtype_name(dt)) + " dim " + std::to_string(dim) + " of [" +
                      std::to_string(shape[0]) + ", " + std::to_string(w) + "]");
        }
      for (const char* op : {"softmax", "log_softmax"}) {
        Graph g;
        g.input("x", dt, shape);
        g.node("y", op, {"x"}, {{"dim", -1}});
        g.output("y");
        compare(d, g, {{"x", x}}, std::string(op) + " " + std::string(dtype_name(dt)));
      }
      Graph g;
      g.input("x", dt, shape);
      g.node("t", "var_mean", {"x"}, {{"dims", {-1}}});
      g.node("v", "view", {"t"}, {{"slot", 0}});
      g.node("m", "view", {"t"}, {{"slot", 1}});
      g.node("ln", "layer_norm", {"x"}, {{"dims", {-1}}});
      g.output("v");
      g.output("m");
      g.output("ln");
      compare(d, g, {{"x", x}}, "var_mean/layer_norm " + std::string(dtype_name(dt)));
    }
  }
  ran.check();
}

TEST_CASE("vulkan reduce paths: softmax, log_softmax, layer_norm, var_mean per row match the CPU",
          "[vulkan][paths][reduce]") {
  Devices d;
  if (!d.ready()) return;
  struct Case {
    Shape shape;
    View view;
  };
  const std::vector<Case> cases = {
      {{270, 64}, View::plain},      // 4-vectors
      {{263, 50}, View::plain},      // rows not a multiple of 4
      {{260, 1028}, View::plain},    // long rows
      {{5, 4096}, View::plain},      // few rows (a workgroup each)
      {{300, 65}, View::sliced},     // unaligned start
      {{48, 300}, View::transposed}  // strided rows
  };
  DtypesRun ran("softmax");
  for (bp_dtype dt : kFloats) {
    if (!ran.take(*d.vk, "softmax", dt)) continue;
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const auto& c = cases[ci];
      const int64_t n = c.view == View::sliced ? c.shape[1] - 1 : c.view == View::transposed ? c.shape[0] : c.shape[1];
      Graph g;
      g.input("x", dt, c.shape);
      g.input("w", dt, {n});
      g.input("b", dt, {n});
      const std::string src = add_view(g, c.view, c.shape.back());
      g.node("sm", "softmax", {src}, {{"dim", -1}});
      g.node("lsm", "log_softmax", {src}, {{"dim", -1}});
      g.node("ln", "layer_norm", {src}, {{"dims", {-1}}, {"eps", 1e-3}});
      g.node("lnw", "layer_norm", {src, "w", "b"}, {{"dims", {-1}}});
      g.node("lnb", "layer_norm", {src, "", "b"}, {{"dims", {-1}}});
      g.node("t", "var_mean", {src}, {{"dims", {-1}}});
      g.node("v", "view", {"t"}, {{"slot", 0}});
      g.node("m", "view", {"t"}, {{"slot", 1}});
      g.node("t0", "var_mean", {src}, {{"dims", {-1}}, {"correction", 0.0}});
      g.node("v0", "view", {"t0"}, {{"slot", 0}});
      for (const char* o : {"sm", "lsm", "ln", "lnw", "lnb", "v", "m", "v0"}) g.output(o);
      compare(d, g, {{"x", reals(dt, c.shape, 41 + ci, 2)}, {"w", reals(dt, {n}, 2, 2)}, {"b", reals(dt, {n}, 3, 2)}},
              std::string(dtype_name(dt)) + " case " + std::to_string(ci));
    }
  }
  ran.check();
}

TEST_CASE("vulkan reduce paths: topk's one-pass form for k from 1 to 16, ties and NaN, every dtype",
          "[vulkan][paths][topk]") {
  Devices d;
  if (!d.ready()) return;
  const Shape shape{1100, 40};  // >= 1024 rows: the one-pass form on CPU devices
  DtypesRun ran("topk");
  for (bp_dtype dt : kNumeric) {
    if (!ran.take(*d.vk, "topk", dt)) continue;
    // Small integers: many ties (the lower index first).
    HostTensor x = ints(dt, shape, 77, dt == BP_DTYPE_U8 ? 0 : -9, 9);
    if (is_float(dt))
      for (int64_t r = 0; r < shape[0]; r += 7) x.set(r * shape[1] + (r % 40), std::nan(""));
    for (int k : {1, 5, 8, 16})
      for (bool largest : {true, false}) {
        Graph g;
        g.input("x", dt, shape);
        g.node("t", "topk", {"x"}, {{"k", k}, {"largest", largest}});
        g.node("v", "view", {"t"}, {{"slot", 0}});
        g.node("i", "view", {"t"}, {{"slot", 1}});
        g.output("v");
        g.output("i");
        compare(d, g, {{"x", x}}, "topk " + std::string(dtype_name(dt)) + " k=" + std::to_string(k) +
                                      (largest ? " largest" : " smallest"));
      }
  }
  ran.check();
}
