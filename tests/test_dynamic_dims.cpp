// Dynamic dims: a graph input with named dims, one plan that runs at every
// size, one specialization per set of sizes (docs/host-guide.md, "Dynamic
// dims"). References are computed here in double.
#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

using namespace backplane;

namespace {

std::unique_ptr<Runtime> make_runtime() {
  RuntimeOptions opts;
  opts.use_environment = false;
  opts.use_default_path = true;
  return Runtime::create(opts);
}

HostTensor ramp(Shape shape, double scale, double shift) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std::sin(scale * static_cast<double>(i) + shift));
  return t;
}

HostTensor i64(int64_t v) {
  HostTensor t(BP_DTYPE_I64, {1});
  std::memcpy(t.data(), &v, 8);
  return t;
}

bool has_line(const std::vector<std::string>& lines, const std::string& needle) {
  for (const auto& l : lines)
    if (l.find(needle) != std::string::npos) return true;
  return false;
}

// y = softmax(x @ w + b) over [seq, 3], w [4, 3] and b [3] constants.
Graph dense_graph(const HostTensor& w, const HostTensor& b) {
  Graph g;
  g.input("x", BP_DTYPE_F32, {0, 4}, {"seq", ""});
  g.constant("w", w);
  g.constant("b", b);
  g.node("m", "matmul", {"x", "w"});
  g.node("a", "add", {"m", "b"});
  g.node("y", "softmax", {"a"}, {{"dim", -1}});
  g.output("y");
  return g;
}

void check_dense(const HostTensor& y, const HostTensor& x, const HostTensor& w, const HostTensor& b) {
  const int64_t rows = x.shape[0];
  REQUIRE(y.shape == Shape{rows, 3});
  for (int64_t r = 0; r < rows; ++r) {
    double a[3], mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < 3; ++j) {
      a[j] = b.get(j);
      for (int64_t k = 0; k < 4; ++k) a[j] += x.get(r * 4 + k) * w.get(k * 3 + j);
      mx = std::max(mx, a[j]);
    }
    for (double& v : a) sum += v = std::exp(v - mx);
    for (int64_t j = 0; j < 3; ++j) CHECK(std::abs(y.get(r * 3 + j) - a[j] / sum) <= 1e-6);
  }
}

}  // namespace

// Would catch: a plan that keeps the first size (wrong shape or stale rows),
// a size seen before compiled again, constants uploaded once per size.
TEST_CASE("dynamic dims: one plan runs at every size, one specialization per size", "[dynamic]") {
  auto rt = make_runtime();
  const HostTensor w = ramp({4, 3}, 0.7, 0.1), b = ramp({3}, 1.3, 0.5);
  const Graph g = dense_graph(w, b);
  CHECK(g.dynamic_dims() == std::vector<std::string>{"seq"});
  for (const char* dev : {"cpu", "vulkan0"}) {
    Device* d = nullptr;
    for (Device* x : rt->all_devices())
      if (x->name() == dev) d = x;
    if (!d) {
      WARN("SKIPPED on " << dev << ": no such device here");
      continue;
    }
    INFO("device " << dev);
    CompileOptions o;
    o.dims = {{"seq", 2}};
    Plan p = rt->compile(g, *d, o);
    CHECK(p.dims() == std::map<std::string, int64_t>{{"seq", 2}});
    CHECK(p.value_type("y").second == Shape{2, 3});
    CHECK(p.compile_stats().shared_constant_bytes == 0);
    for (const int64_t seq : {2, 5, 1, 2, 5, 0, 7}) {
      INFO("seq " << seq);
      const HostTensor x = ramp({seq, 4}, 0.3, static_cast<double>(seq));
      const auto out = p.run({{"x", x}});
      CHECK(p.dims().at("seq") == seq);
      check_dense(out.at("y"), x, w, b);
    }
    CHECK(p.specializations() == 5);  // 2, 5, 1, 0, 7
    // Every specialization after the first took w and b from the first.
    p.set_dims({{"seq", 5}});
    CHECK(p.compile_stats().shared_constant_bytes >= w.nbytes() + b.nbytes());
    CHECK(p.specializations() == 5);
    CHECK_THAT(p.describe().front(), Catch::StartsWith("dynamic dims seq=5: specialized per size (5 compiled"));
    // set_input alone switches too, and execute runs at the new size.
    const HostTensor x3 = ramp({3, 4}, 0.2, 0.0);
    p.set_input("x", x3);
    CHECK(p.dims().at("seq") == 3);
    p.execute();
    check_dense(p.output("y"), x3, w, b);
  }
}

// Would catch: a bound Tensor dropped (or bound twice) when the plan moves to
// another size, so the cache stops being updated in place.
TEST_CASE("dynamic dims: a cache bound in place stays bound across sizes", "[dynamic][kvcache]") {
  auto rt = make_runtime();
  constexpr int64_t kRows = 8, kCols = 4;
  Graph g;
  g.input("cache", BP_DTYPE_F32, {kRows, kCols});
  g.input("rows", BP_DTYPE_F32, {0, kCols}, {"n", ""});
  g.input("pos", BP_DTYPE_I64, {1});
  g.node("cache_out", "slice_update", {"cache", "rows", "pos"}, {{"dim", 0}});
  g.node("total", "sum", {"cache_out"}, {{"dims", {0}}});
  g.output("cache_out");
  g.output("total");
  Device& cpu = rt->device("cpu");
  Plan p = rt->compile(g, cpu);
  CHECK(p.dims().at("n") == 1);  // not given: starts at 1
  Tensor cache = rt->upload(HostTensor(BP_DTYPE_F32, {kRows, kCols}), cpu);
  p.set_input("cache", cache);
  p.bind_output("cache_out", cache);
  std::vector<double> want(kRows * kCols, 0.0);
  int64_t pos = 0;
  for (const int64_t n : {3, 1, 1, 2, 1}) {
    INFO("n " << n << " at " << pos);
    const HostTensor rows = ramp({n, kCols}, 0.9, static_cast<double>(pos));
    const auto out = p.run({{"rows", rows}, {"pos", i64(pos)}});
    for (int64_t i = 0; i < n * kCols; ++i) want[static_cast<size_t>(pos * kCols + i)] = rows.get(i);
    pos += n;
    CHECK(has_line(p.describe(), "in place (x is the output's buffer"));
    const HostTensor now = cache.download();
    for (int64_t i = 0; i < kRows * kCols; ++i) CHECK(now.get(i) == static_cast<float>(want[static_cast<size_t>(i)]));
    for (int64_t c = 0; c < kCols; ++c) {
      double s = 0;
      for (int64_t r = 0; r < kRows; ++r) s += static_cast<float>(want[static_cast<size_t>(r * kCols + c)]);
      CHECK(std::abs(out.at("total").get(c) - s) <= 1e-6);
    }
  }
  CHECK(p.specializations() == 3);  // n = 1, 3, 2
}

// Would catch: sizes that do not fit the ops accepted, or errors that do not
// name the dim, the inputs or the node.
TEST_CASE("dynamic dims: wrong names and sizes are errors naming them", "[dynamic]") {
  auto rt = make_runtime();
  Device& cpu = rt->device("cpu");
  Graph g;
  g.input("a", BP_DTYPE_F32, {0, 4}, {"rows", ""});
  g.input("b", BP_DTYPE_F32, {0, 4}, {"rows", ""});
  g.input("k", BP_DTYPE_F32, {0, 2}, {"inner", ""});
  g.node("s", "add", {"a", "b"});
  g.node("m", "matmul", {"s", "k"});  // inner must be 4
  g.output("m");
  CHECK_THROWS_WITH(rt->compile(g, cpu), Catch::Contains("the graph at rows=1, inner=1") &&
                                             Catch::Contains("node 'm' (matmul)"));
  CompileOptions o;
  o.dims = {{"inner", 4}};
  Plan p = rt->compile(g, cpu, o);
  CHECK_THROWS_WITH(p.set_dims({{"cols", 3}}), Catch::Contains("'cols' is no dynamic dim"));
  CHECK_THROWS_WITH(p.set_dims({{"rows", -2}}), Catch::Contains("'rows' given the negative size -2"));
  CHECK_THROWS_WITH(p.run({{"a", HostTensor(BP_DTYPE_F32, {3, 4})},
                           {"b", HostTensor(BP_DTYPE_F32, {5, 4})},
                           {"k", HostTensor(BP_DTYPE_F32, {4, 2})}}),
                    Catch::Contains("inputs 'a' and 'b' give dynamic dim 'rows' the sizes 3 and 5"));
  // A failed size leaves the plan at the sizes it had, and working.
  CHECK_THROWS_WITH(p.set_dims({{"inner", 5}}), Catch::Contains("the graph at rows=1, inner=5"));
  CHECK(p.dims() == std::map<std::string, int64_t>{{"rows", 1}, {"inner", 4}});
  HostTensor ones(BP_DTYPE_F32, {2, 4}), k(BP_DTYPE_F32, {4, 2});
  for (int64_t i = 0; i < 8; ++i) ones.set(i, 1.0), k.set(i, 0.5);
  const auto out = p.run({{"a", ones}, {"b", ones}, {"k", k}});
  CHECK(out.at("m").shape == Shape{2, 2});
  for (int64_t i = 0; i < 4; ++i) CHECK(out.at("m").get(i) == 4.0);
  CHECK_THROWS_WITH(Graph().input("x", BP_DTYPE_F32, {1, 2}, {"a b", ""}), Catch::Contains("dim name 'a b'"));
  CHECK_THROWS_WITH(g.specialized({{"rows", 2}}), Catch::Contains("no size given for its dynamic dim 'inner'"));
}

// Would catch: specializations kept without bound (a plan fed every length
// from 1 to 40 holding 40 sets of buffers), or the current one dropped.
TEST_CASE("dynamic dims: at most 16 specializations, the least recently used dropped", "[dynamic]") {
  auto rt = make_runtime();
  const HostTensor w = ramp({4, 3}, 0.7, 0.1), b = ramp({3}, 1.3, 0.5);
  Plan p = rt->compile(dense_graph(w, b), rt->device("cpu"));
  Tensor y1;
  for (int64_t seq = 1; seq <= 40; ++seq) {
    const HostTensor x = ramp({seq, 4}, 0.3, 0.0);
    check_dense(p.run({{"x", x}}).at("y"), x, w, b);
    if (seq == 1) y1 = p.output_tensor("y");
    CHECK(p.specializations() == static_cast<size_t>(std::min<int64_t>(seq, 16)));
    if (seq % 5 == 0) {  // an old size used again stays
      const HostTensor x2 = ramp({2, 4}, 0.1, 0.0);
      check_dense(p.run({{"x", x2}}).at("y"), x2, w, b);
    }
  }
  // seq = 2 was used throughout, so it is still held: its output buffer is
  // the one a Tensor taken earlier reads (a recompiled one would be new).
  REQUIRE(p.dims().at("seq") == 2);
  const Tensor y2 = p.output_tensor("y");
  p.set_dims({{"seq", 40}});
  const HostTensor x2 = ramp({2, 4}, 0.9, 1.0);
  const HostTensor now = p.run({{"x", x2}}).at("y");
  const HostTensor seen = y2.download();
  REQUIRE(seen.nbytes() == now.nbytes());
  CHECK(std::memcmp(seen.data(), now.data(), now.nbytes()) == 0);
  CHECK(p.specializations() == 16);
  // seq = 1, used once at the start, was dropped and is compiled again: the
  // Tensor taken from its output keeps the old buffer, which the new
  // specialization no longer writes.
  const HostTensor before = y1.download();
  const HostTensor x1 = ramp({1, 4}, 0.4, 2.0);
  const HostTensor y1now = p.run({{"x", x1}}).at("y");
  check_dense(y1now, x1, w, b);
  const HostTensor after = y1.download();
  CHECK(std::memcmp(before.data(), after.data(), after.nbytes()) == 0);
  CHECK(std::memcmp(after.data(), y1now.data(), after.nbytes()) != 0);
  CHECK(p.specializations() == 16);
}

TEST_CASE("dynamic dims: a graph file names them in a shape", "[dynamic][graph]") {
  const Json j = Json::parse(R"({
    "inputs": {"x": {"dtype": "f32", "shape": ["batch", 3]}},
    "nodes": [{"name": "y", "op": "neg", "inputs": ["x"]}],
    "outputs": ["y"]})");
  const GraphFile gf = parse_graph_json(j, ".");
  REQUIRE(gf.graph.inputs().size() == 1);
  CHECK(gf.graph.inputs()[0].dim_names == std::vector<std::string>{"batch", ""});
  CHECK(gf.graph.dynamic_dims() == std::vector<std::string>{"batch"});
  auto rt = make_runtime();
  Plan p = rt->compile(gf.graph, rt->device("cpu"));
  HostTensor x(BP_DTYPE_F32, {4, 3});
  for (int64_t i = 0; i < 12; ++i) x.set(i, static_cast<double>(i));
  const auto out = p.run({{"x", x}});
  REQUIRE(out.at("y").shape == Shape{4, 3});
  for (int64_t i = 0; i < 12; ++i) CHECK(out.at("y").get(i) == -static_cast<double>(i));
}

// Would catch: a "$ctx" param left as a string (the slice refused, or
// reading the whole buffer), substituted with another dim's size, or an
// unknown name accepted.
TEST_CASE("dynamic dims: a param naming a dim follows its size", "[dynamic]") {
  auto rt = make_runtime();
  // y = sum over the first ctx rows of a [16, 3] constant, for a graph
  // input whose shape gives ctx (and seq, to check names are not mixed up).
  const HostTensor table = ramp({16, 3}, 0.37, 0.2);
  Graph g;
  g.input("ids", BP_DTYPE_F32, {0}, {"ctx"});
  g.input("q", BP_DTYPE_F32, {0}, {"seq"});
  g.constant("table", table);
  g.node("rows", "slice", {"table"}, {{"dim", 0}, {"start", 0}, {"end", "$ctx"}});
  g.node("y", "sum", {"rows"}, {{"dims", {0}}});
  g.node("shape", "reshape", {"q"}, {{"shape", {"$seq", 1}}});
  g.node("tail", "slice", {"table"}, {{"dim", 0}, {"start", "$ctx - 1"}, {"end", "$ctx"}});
  g.output("y");
  g.output("shape");
  g.output("tail");
  Plan p = rt->compile(g, rt->device("cpu"));
  for (const int64_t ctx : {3, 16, 1, 9}) {
    INFO("ctx " << ctx);
    const auto out = p.run({{"ids", HostTensor(BP_DTYPE_F32, {ctx})}, {"q", HostTensor(BP_DTYPE_F32, {2})}});
    REQUIRE(out.at("y").shape == Shape{3});
    for (int64_t j = 0; j < 3; ++j) {
      double want = 0;
      for (int64_t r = 0; r < ctx; ++r) want += table.get(r * 3 + j);
      CHECK(std::abs(out.at("y").get(j) - want) <= 1e-5);
    }
    CHECK(out.at("shape").shape == Shape{2, 1});
    // An expression of dims: the last of the ctx rows.
    REQUIRE(out.at("tail").shape == Shape{1, 3});
    for (int64_t j = 0; j < 3; ++j) CHECK(out.at("tail").get(j) == table.get((ctx - 1) * 3 + j));
  }
  Graph bad = g;
  bad.node("z", "slice", {"table"}, {{"dim", 0}, {"end", "$len"}});
  bad.output("z");
  CHECK_THROWS_WITH(rt->compile(bad, rt->device("cpu")),
                    Catch::Contains("node 'z' (slice): param 'end' names '$len', which is no dynamic dim of the graph"));
}
