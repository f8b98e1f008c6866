// Shape inference and graph-file parsing: bad graphs get one clear error
// naming the node, the op and the shapes.
#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

using namespace backplane;

namespace {
std::string error_of(const Graph& g) {
  try {
    infer_graph(g);
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}
Graph one(const std::string& op, std::vector<std::pair<bp_dtype, Shape>> ins, Json params = Json::object()) {
  Graph g;
  std::vector<std::string> names;
  for (size_t i = 0; i < ins.size(); ++i) {
    names.push_back("in" + std::to_string(i));
    g.input(names.back(), ins[i].first, ins[i].second);
  }
  g.node("n", op, names, params);
  g.output("n");
  return g;
}
std::pair<bp_dtype, Shape> type_of(const Graph& g) { return infer_graph(g).at("n"); }
}  // namespace

TEST_CASE("shape inference follows OPS.md", "[graph]") {
  CHECK(type_of(one("add", {{BP_DTYPE_F32, {4, 1, 3}}, {BP_DTYPE_F32, {5, 1}}})).second == Shape{4, 5, 3});
  CHECK(type_of(one("lt", {{BP_DTYPE_I32, {2}}, {BP_DTYPE_I32, {2}}})).first == BP_DTYPE_BOOL);
  CHECK(type_of(one("matmul", {{BP_DTYPE_F32, {3}}, {BP_DTYPE_F32, {7, 3, 2}}})).second == Shape{7, 2});
  CHECK(type_of(one("matmul", {{BP_DTYPE_F32, {2, 1, 4, 3}}, {BP_DTYPE_F32, {5, 3, 6}}})).second == Shape{2, 5, 4, 6});
  CHECK(type_of(one("sum", {{BP_DTYPE_F32, {2, 3, 4}}}, {{"dims", {-1, 0}}, {"keepdim", true}})).second == Shape{1, 3, 1});
  CHECK(type_of(one("sum", {{BP_DTYPE_F32, {2, 3, 4}}})).second == Shape{});
  CHECK(type_of(one("argmax", {{BP_DTYPE_F32, {2, 3}}}, {{"dim", 1}})).first == BP_DTYPE_I64);
  CHECK(type_of(one("index_select", {{BP_DTYPE_F32, {5, 6, 7}}, {BP_DTYPE_I64, {2, 3}}}, {{"dim", 1}})).second ==
        Shape{5, 2, 3, 7});
  CHECK(type_of(one("conv2d", {{BP_DTYPE_F32, {1, 4, 9, 9}}, {BP_DTYPE_F32, {6, 2, 3, 3}}},
                    {{"stride", 2}, {"padding", {1, 0}}, {"groups", 2}}))
            .second == Shape{1, 6, 5, 4});
  CHECK(type_of(one("concat", {{BP_DTYPE_F32, {2, 3}}, {BP_DTYPE_F32, {2, 5}}}, {{"dim", -1}})).second == Shape{2, 8});
  CHECK(type_of(one("reshape", {{BP_DTYPE_F32, {2, 3, 4}}}, {{"shape", {4, -1}}})).second == Shape{4, 6});
  CHECK(type_of(one("slice", {{BP_DTYPE_F32, {10}}}, {{"dim", 0}, {"start", 8}, {"end", 1}, {"step", -3}})).second ==
        Shape{3});
}

TEST_CASE("bad graphs are rejected with messages that name the node", "[graph]") {
  CHECK_THAT(error_of(one("add", {{BP_DTYPE_F32, {3}}, {BP_DTYPE_F32, {4}}})),
             Catch::Contains("node 'n' (add)") && Catch::Contains("[3] and [4] do not broadcast"));
  CHECK_THAT(error_of(one("add", {{BP_DTYPE_F32, {3}}, {BP_DTYPE_I32, {3}}})), Catch::Contains("insert a cast"));
  CHECK_THAT(error_of(one("frobnicate", {{BP_DTYPE_F32, {3}}})), Catch::Contains("unknown op 'frobnicate'"));
  CHECK_THAT(error_of(one("relu", {{BP_DTYPE_F32, {3}}}, {{"alpha", 1}})), Catch::Contains("unknown param 'alpha'"));
  CHECK_THAT(error_of(one("sum", {{BP_DTYPE_F32, {3}}}, {{"dims", Json::array()}})), Catch::Contains("ambiguous"));
  CHECK_THAT(error_of(one("softmax", {{BP_DTYPE_F32, {3}}})), Catch::Contains("'dim' is required"));
  CHECK_THAT(error_of(one("sqrt", {{BP_DTYPE_I32, {3}}})), Catch::Contains("takes float dtypes"));
  CHECK_THAT(error_of(one("squeeze", {{BP_DTYPE_F32, {2, 3}}}, {{"dims", {0}}})), Catch::Contains("not 1"));
  CHECK_THAT(error_of(one("matmul", {{BP_DTYPE_F32, {2, 3}}, {BP_DTYPE_F32, {4, 5}}})),
             Catch::Contains("[2, 3] and [4, 5] do not match"));
  CHECK_THAT(error_of(one("max", {{BP_DTYPE_F32, {0, 3}}}, {{"dims", {0}}})), Catch::Contains("empty dim"));
  CHECK_THAT(error_of(one("topk", {{BP_DTYPE_F32, {4}}}, {{"k", 5}})), Catch::Contains("k=5 out of range"));
  CHECK_THAT(error_of(one("reshape", {{BP_DTYPE_F32, {2, 3}}}, {{"shape", {4, 2}}})), Catch::Contains("cannot reshape"));
  Graph g = one("topk", {{BP_DTYPE_F32, {4}}}, {{"k", 2}});
  CHECK_THAT(error_of(g), Catch::Contains("bundle"));  // a bundle cannot be an output
  Graph g2;
  g2.input("x", BP_DTYPE_F32, {4});
  g2.node("t", "topk", {"x"}, {{"k", 2}});
  g2.node("r", "relu", {"t"});
  CHECK_THAT(error_of(g2), Catch::Contains("node 'r' (relu)") && Catch::Contains("'view'"));
  Graph g3;
  g3.input("x", BP_DTYPE_F32, {4});
  g3.node("r", "relu", {"y"});
  CHECK_THAT(error_of(g3), Catch::Contains("input 'y' is not defined"));
}

TEST_CASE("graph JSON: inline constants, npy inputs and defects", "[graph]") {
  const Json j = Json::parse(R"({
    "inputs": {"c": {"value": [[1, 2], [3, 4]], "dtype": "i32"}, "s": {"value": 0.5, "shape": [2, 3]}},
    "nodes": [{"name": "t", "op": "transpose", "inputs": ["c"], "params": {"dim0": 0, "dim1": 1}}],
    "outputs": ["t"]})");
  GraphFile gf = parse_graph_json(j, ".");
  REQUIRE(gf.graph.inputs().size() == 2);
  const auto& c = gf.graph.inputs()[0];
  REQUIRE(c.constant);
  CHECK(c.constant->dtype == BP_DTYPE_I32);
  CHECK(c.constant->get_int(2) == 3);
  const auto& s = gf.graph.inputs()[1];
  CHECK(s.shape == Shape{2, 3});
  CHECK(s.constant->get(5) == 0.5);

  auto err = [](const char* text) {
    try {
      parse_graph_json(Json::parse(text), ".");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(err(R"({"nodes": [{"name": "a", "op": "bogus"}], "outputs": []})"), Catch::Contains("node 'a': unknown op 'bogus'"));
  CHECK_THAT(err(R"({"nodes": [{"op": "relu"}], "outputs": []})"), Catch::Contains("graph node #0: 'name'"));
  CHECK_THAT(err(R"({"inputs": {"x": "nope.npy"}, "nodes": [], "outputs": []})"),
             Catch::Contains("graph input 'x'") && Catch::Contains("cannot open"));
  CHECK_THAT(err(R"({"inputs": {"x": {"value": [[1], [2, 3]]}}, "nodes": [], "outputs": []})"), Catch::Contains("ragged"));
  CHECK_THAT(err(R"({"nodes": [], "outputs": [], "extra": 1})"), Catch::Contains("unknown key 'extra'"));
}
