// topk on vulkan0 (shaders/topk.comp): the workgroup-merge form (k <= 16
// with few rows on a CPU device, every k <= 16 on a GPU: one pass per row,
// each invocation's best k merged in shared memory) and the k-round form
// (k > 16), against a reference computed here: each row's (value, index)
// pairs stable-sorted, NaN above every number, ties to the lower index,
// -0 equal to +0. Few long rows, rows shorter than a workgroup's share,
// k from 1 to 17, ties, NaN, +-inf and -0/+0, strided rows (topk along dim
// 0, and of a transposed view), every dtype the device claims topk for.
// Indices are compared exactly, values bit for bit with the input element
// at that index.
#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>

#include "vulkan_test_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

using namespace backplane;
using namespace backplane::vktest;

namespace {

// The dense element bytes of element i of t.
const std::byte* element(const HostTensor& t, int64_t i) {
  return t.bytes.data() + static_cast<size_t>(i) * (t.nbytes() / static_cast<size_t>(t.numel()));
}

// One element of a row: as a double, and exactly for i64.
struct Elem {
  double v;
  int64_t i;
};

// Whether a ranks before b (largest or smallest first; NaN above every
// number; equal values: the caller's stable sort keeps the lower index
// first). i64 compared as integers (exact beyond 2^53).
bool ranks_before(const Elem& a, const Elem& b, bool largest, bool i64) {
  if (i64) return largest ? a.i > b.i : a.i < b.i;
  const bool na = std::isnan(a.v), nb = std::isnan(b.v);
  if (na || nb) return na != nb && (largest ? na : nb);
  return largest ? a.v > b.v : a.v < b.v;
}

// topk of x (2-D, dense) along `dim` (0 or 1) on vulkan0, or of x
// transposed along dim 1 when `transposed`; checked against the reference.
void check_topk(Devices& d, const HostTensor& x, int dim, int k, bool largest, bool transposed,
                const std::string& what) {
  INFO(what << " dim " << dim << " k " << k << (largest ? " largest" : " smallest")
            << (transposed ? " transposed" : ""));
  Graph g;
  g.input("x", x.dtype, x.shape);
  std::string src = "x";
  if (transposed) {
    g.node("xt", "transpose", {"x"}, {{"dim0", 0}, {"dim1", 1}});
    src = "xt";
  }
  g.node("t", "topk", {src}, {{"k", k}, {"dim", dim}, {"largest", largest}});
  g.node("v", "view", {"t"}, {{"slot", 0}});
  g.node("i", "view", {"t"}, {{"slot", 1}});
  g.output("v");
  g.output("i");
  const auto out = run_on(*d.rt, *d.vk, g, {{"x", x}});
  const HostTensor &v = out.at("v"), &ix = out.at("i");
  // The view's shape [R, C] and element (r, c)'s position in x.
  const int64_t R = transposed ? x.shape[1] : x.shape[0], C = transposed ? x.shape[0] : x.shape[1];
  auto at = [&](int64_t r, int64_t c) { return transposed ? c * x.shape[1] + r : r * x.shape[1] + c; };
  const int64_t rows = dim == 1 ? R : C, n = dim == 1 ? C : R;
  REQUIRE(v.dtype == x.dtype);
  REQUIRE(ix.dtype == BP_DTYPE_I64);
  REQUIRE(v.shape == (dim == 1 ? Shape{R, k} : Shape{k, C}));
  REQUIRE(ix.shape == v.shape);
  const size_t esize = x.nbytes() / static_cast<size_t>(x.numel());
  int64_t bad = 0;
  std::string first;
  const bool i64 = x.dtype == BP_DTYPE_I64;
  std::vector<int64_t> order(static_cast<size_t>(n)), pos(static_cast<size_t>(n));
  std::vector<Elem> e(static_cast<size_t>(n));
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t j = 0; j < n; ++j) {
      order[j] = j;
      pos[j] = dim == 1 ? at(row, j) : at(j, row);
      e[j] = {x.get(pos[j]), i64 ? x.get_int(pos[j]) : 0};
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return ranks_before(e[a], e[b], largest, i64); });
    for (int64_t j = 0; j < k; ++j) {
      const int64_t o = dim == 1 ? row * k + j : j * C + row;  // the output element (dense)
      const int64_t want = order[j], got = ix.get_int(o);
      const bool ok = got == want && std::memcmp(element(v, o), element(x, pos[want]), esize) == 0;
      if (!ok && bad++ == 0)
        first = "row " + std::to_string(row) + " pick " + std::to_string(j) + ": index " + std::to_string(got) +
                " value " + std::to_string(v.get(o)) + ", want index " + std::to_string(want) + " value " +
                std::to_string(x.get(pos[want]));
    }
  }
  INFO("first mismatch: " << first << " (" << bad << " bad)");
  CHECK(bad == 0);
}

// Small integers in [lo, hi] (many ties), with, in float dtypes, NaN, +-inf,
// -0 and +0 scattered (more of each than k, so they compete among
// themselves), and in i64 values apart only beyond 2^53.
HostTensor data(bp_dtype dt, Shape shape, uint64_t seed) {
  const bool u8 = dt == BP_DTYPE_U8;
  HostTensor x = ints(dt, std::move(shape), seed, u8 ? 0 : -40, 40);
  const int64_t n = x.numel();
  uint64_t s = seed + 99;
  if (is_float(dt)) {
    const double inf = std::numeric_limits<double>::infinity();
    const double specials[] = {std::nan(""), inf, -inf, -0.0, 0.0, 40.5, -40.5};
    for (int r = 0; r < 140; ++r) x.set(static_cast<int64_t>(next(s) % static_cast<uint64_t>(n)), specials[r % 7]);
  } else if (dt == BP_DTYPE_I64) {
    const int64_t big = int64_t{1} << 60;
    for (int r = 0; r < 60; ++r)
      x.set_int(static_cast<int64_t>(next(s) % static_cast<uint64_t>(n)), (r % 2 ? big : -big) + r % 5);
  } else {
    const double hi = dt == BP_DTYPE_U8 ? 255 : dt == BP_DTYPE_I8 ? 127 : dt == BP_DTYPE_I16 ? 32767 : 2147483647.0;
    const double lo = dt == BP_DTYPE_U8 ? 0 : dt == BP_DTYPE_I8 ? -128 : dt == BP_DTYPE_I16 ? -32768 : -2147483648.0;
    for (int r = 0; r < 60; ++r) x.set(static_cast<int64_t>(next(s) % static_cast<uint64_t>(n)), r % 2 ? hi : lo);
  }
  return x;
}

}  // namespace

TEST_CASE("vulkan topk: few long rows, k 1 to 16 (the workgroup merge) and 17, every dtype", "[vulkan][topk]") {
  Devices d;
  if (!d.ready()) return;
  DtypesRun ran("topk");
  for (bp_dtype dt : kNumeric) {
    if (!ran.take(*d.vk, "topk", dt)) continue;
    const std::string name(dtype_name(dt));
    const HostTensor a = data(dt, {3, 100000}, 1), b = data(dt, {1, 4097}, 2);
    for (int k : {1, 2, 7, 16, 17})
      for (bool largest : {true, false}) {
        check_topk(d, a, 1, k, largest, false, name + " [3, 100000]");
        check_topk(d, b, 1, k, largest, false, name + " [1, 4097]");
      }
  }
  ran.check();
}

TEST_CASE("vulkan topk: strided rows, short rows, k == n and n == 1", "[vulkan][topk]") {
  Devices d;
  if (!d.ready()) return;
  DtypesRun ran("topk");
  for (bp_dtype dt : kNumeric) {
    if (!ran.take(*d.vk, "topk", dt)) continue;
    const std::string name(dtype_name(dt));
    const HostTensor cols = data(dt, {5000, 3}, 3);  // topk along dim 0: 3 rows of stride 3
    const HostTensor tr = data(dt, {3000, 5}, 4);    // transposed: 5 rows of stride 5
    const HostTensor shortr = data(dt, {40, 70}, 5);  // rows shorter than 16 x 64: empty slots
    for (int k : {1, 2, 7, 16, 17})
      for (bool largest : {true, false}) {
        check_topk(d, cols, 0, k, largest, false, name + " [5000, 3]");
        check_topk(d, tr, 1, k, largest, true, name + " [3000, 5]^T");
        check_topk(d, shortr, 1, k, largest, false, name + " [40, 70]");
      }
    const HostTensor tiny = data(dt, {6, 9}, 6);
    for (bool largest : {true, false}) {
      check_topk(d, tiny, 1, 9, largest, false, name + " [6, 9] k == n");
      check_topk(d, tiny, 0, 6, largest, false, name + " [6, 9] k == n along dim 0");
      check_topk(d, data(dt, {4, 1}, 7), 1, 1, largest, false, name + " [4, 1]");
      check_topk(d, data(dt, {1, 1}, 8), 0, 1, largest, false, name + " [1, 1]");
    }
    check_topk(d, tiny, 1, 0, true, false, name + " k 0");
  }
  ran.check();
}
