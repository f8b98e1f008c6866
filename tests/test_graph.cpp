// Shape inference and graph-file parsing: bad graphs get one clear error
// naming the node, the op and the shapes.
#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <fstream>

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

TEST_CASE("shape inference follows docs/ops.md", "[graph]") {
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

TEST_CASE("pool2d output sizes follow PyTorch and ONNX", "[graph]") {
  auto pool = [](const char* op, Shape x, Json p) { return type_of(one(op, {{BP_DTYPE_F32, std::move(x)}}, p)).second; };
  CHECK(pool("max_pool2d", {1, 64, 112, 112}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}) == Shape{1, 64, 56, 56});
  CHECK(pool("avg_pool2d", {2, 3, 8, 9}, {{"kernel_size", 2}}) == Shape{2, 3, 4, 4});  // stride: the kernel size
  CHECK(pool("max_pool2d", {1, 1, 6, 6}, {{"kernel_size", 3}, {"stride", 2}}) == Shape{1, 1, 2, 2});
  CHECK(pool("max_pool2d", {1, 1, 6, 6}, {{"kernel_size", 3}, {"stride", 2}, {"ceil_mode", true}}) == Shape{1, 1, 3, 3});
  // ceil_mode's extra window would start in the bottom/right padding: dropped.
  CHECK(pool("avg_pool2d", {1, 1, 5, 5}, {{"kernel_size", 2}, {"stride", 2}, {"padding", 1}, {"ceil_mode", true}}) ==
        Shape{1, 1, 3, 3});
  CHECK(pool("max_pool2d", {1, 1, 9, 8}, {{"kernel_size", 3}, {"stride", 2}, {"padding", {0, 1, 2, 1}}}) == Shape{1, 1, 5, 4});
  CHECK(pool("max_pool2d", {1, 1, 9, 10}, {{"kernel_size", {2, 3}}, {"stride", 1}, {"dilation", {2, 1}}}) == Shape{1, 1, 7, 8});
  CHECK_THAT(error_of(one("max_pool2d", {{BP_DTYPE_F32, {1, 1, 4, 4}}}, {{"kernel_size", int64_t{1} << 31}})),
             Catch::Contains("node 'n' (max_pool2d)") && Catch::Contains("does not fit int32"));
  CHECK_THAT(error_of(one("avg_pool2d", {{BP_DTYPE_F32, {1, 1, 4, 4}}}, {{"kernel_size", 3}, {"dilation", 2}})),
             Catch::Contains("spans more than the padded input"));
  CHECK_THAT(error_of(one("max_pool2d", {{BP_DTYPE_F32, {1, 1, 4, 4}}}, {{"kernel_size", 2}, {"count_include_pad", false}})),
             Catch::Contains("unknown param 'count_include_pad'"));
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

TEST_CASE("params are read against the op table: names, kinds, ranges", "[graph]") {
  const std::pair<bp_dtype, Shape> f23{BP_DTYPE_F32, {2, 3}};
  // Unknown: the node, the op, the param and what the op takes.
  CHECK_THAT(error_of(one("sum", {f23}, {{"dimz", 1}})),
             Catch::Contains("node 'n' (sum): unknown param 'dimz' (takes dims, keepdim)"));
  CHECK_THAT(error_of(one("softmax", {f23}, {{"dim", "last"}})), Catch::Contains("param 'dim' must be an integer"));
  CHECK_THAT(error_of(one("softmax", {f23}, {{"dim", 2}})), Catch::Contains("dim 2 out of range for rank 2"));
  CHECK_THAT(error_of(one("sum", {f23}, {{"keepdim", 1}})), Catch::Contains("param 'keepdim' must be true or false"));
  CHECK_THAT(error_of(one("sum", {f23}, {{"dims", {1, -1}}})), Catch::Contains("dim -1 repeated"));
  CHECK_THAT(error_of(one("gelu", {f23}, {{"approximate", "fast"}})),
             Catch::Contains("param 'approximate' must be \"none\" or \"tanh\""));
  CHECK_THAT(error_of(one("cast", {f23})), Catch::Contains("param 'dtype' is required"));
  CHECK_THAT(error_of(one("cast", {f23}, {{"dtype", "f128"}})), Catch::Contains("unknown dtype 'f128'"));
  CHECK_THAT(error_of(one("topk", {f23}, {{"k", -1}})), Catch::Contains("param 'k' must be >= 0, got -1"));
  CHECK_THAT(error_of(one("topk", {f23}, {{"k", Json(18446744073709551615ull)}})),
             Catch::Contains("param 'k'") && Catch::Contains("out of range"));
  CHECK_THAT(error_of(one("slice", {f23}, {{"dim", 0}, {"step", 0}})), Catch::Contains("param 'step' must not be 0"));
  CHECK_THAT(error_of(one("conv2d", {{BP_DTYPE_F32, {1, 1, 4, 4}}, {BP_DTYPE_F32, {1, 1, 3, 3}}}, {{"stride", 0}})),
             Catch::Contains("param 'stride' entries must be >= 1"));
  CHECK_THAT(error_of(one("conv2d", {{BP_DTYPE_F32, {1, 1, 4, 4}}, {BP_DTYPE_F32, {1, 1, 3, 3}}}, {{"padding", {1, 1, 1}}})),
             Catch::Contains("param 'padding' takes an int, 2 or 4 values"));
  CHECK_THAT(error_of(one("clamp", {{BP_DTYPE_I8, {3}}}, {{"max", 300}})),
             Catch::Contains("param 'max' = 300 is out of range for i8"));
  CHECK_THAT(error_of(one("clamp", {{BP_DTYPE_I32, {3}}}, {{"min", 0.5}})),
             Catch::Contains("param 'min' must be an integer for an integer input"));
  CHECK_THAT(error_of(one("affine", {f23}, {{"mul", std::numeric_limits<double>::infinity()}})),
             Catch::Contains("param 'mul' must be a finite number"));
  // Inputs: arity, dtypes and ranks, naming the input.
  CHECK_THAT(error_of(one("add", {f23})), Catch::Contains("node 'n' (add): takes 2 inputs (a, b), got 1"));
  CHECK_THAT(error_of(one("where", {f23, f23, f23})), Catch::Contains("input 0 (cond) has dtype f32, not bool"));
  CHECK_THAT(error_of(one("gather", {f23, f23}, {{"dim", 0}})), Catch::Contains("input 1 (index) has dtype f32, not i64"));
  CHECK_THAT(error_of(one("concat", {f23, {BP_DTYPE_I32, {2, 3}}}, {{"dim", 0}})),
             Catch::Contains("input 1 (x1) has dtype i32, input 0 (x0) f32; insert a cast"));
  CHECK_THAT(error_of(one("conv2d", {f23, f23})), Catch::Contains("input 0 (x) has shape [2, 3]; expected rank 4"));
  CHECK_THAT(error_of(one("matmul", {{BP_DTYPE_F32, {}}, f23})), Catch::Contains("input 0 (a) has rank 0"));
  // Defaults reach the kernel's params.
  Graph g;
  g.input("x", BP_DTYPE_F32, {2, 5});
  g.node("t", "topk", {"x"}, {{"k", 2}});
  g.node("i", "view", {"t"}, {{"slot", 1}});
  g.output("i");
  CHECK(infer_graph(g).at("i") == std::pair<bp_dtype, Shape>{BP_DTYPE_I64, {2, 2}});  // dim -1 by default
}

TEST_CASE("element counts in shape inference are checked, never wrapped", "[graph]") {
  // 8 * (2^61 + 1) wraps to 8 in int64_t: these were accepted as 8 elements.
  CHECK_THAT(error_of(one("reshape", {{BP_DTYPE_F32, {2, 4}}}, {{"shape", {8, int64_t{2305843009213693953}}}})),
             Catch::Contains("node 'n' (reshape)") && Catch::Contains("overflows"));
  CHECK_THAT(error_of(one("broadcast_to", {{BP_DTYPE_F32, {2, 4}}}, {{"shape", {int64_t{2305843009213693953}, 2, 4}}})),
             Catch::Contains("node 'n' (broadcast_to)") && Catch::Contains("overflows"));
  // A size-0 dim does not hide the others (the dense strides would wrap).
  CHECK_THAT(error_of(one("reshape", {{BP_DTYPE_F32, {0}}}, {{"shape", {0, int64_t{2305843009213693953}, 4}}})),
             Catch::Contains("node 'n' (reshape)") && Catch::Contains("overflows"));
  // Results built from sane inputs: a broadcast, a concat, a conv2d geometry.
  CHECK_THAT(error_of(one("add", {{BP_DTYPE_F32, {int64_t{1} << 32, 1}}, {BP_DTYPE_F32, {1, int64_t{1} << 32}}})),
             Catch::Contains("node 'n' (add)") && Catch::Contains("overflows"));
  const std::pair<bp_dtype, Shape> big{BP_DTYPE_F32, {int64_t{1} << 61}};
  CHECK_THAT(error_of(one("concat", {big, big, big}, {{"dim", 0}})),
             Catch::Contains("node 'n' (concat)") && Catch::Contains("overflows"));
  CHECK_THAT(error_of(one("conv2d", {{BP_DTYPE_F32, {1, 1, 4, 4}}, {BP_DTYPE_F32, {1, 1, 3, 3}}},
                          {{"padding", INT64_MAX}})),
             Catch::Contains("node 'n' (conv2d)") && Catch::Contains("overflows"));
  CHECK_THAT(error_of(one("conv2d", {{BP_DTYPE_F32, {1, 1, 4, 4}}, {BP_DTYPE_F32, {1, 1, 3, 3}}},
                          {{"dilation", INT64_MAX}})),
             Catch::Contains("node 'n' (conv2d)") && Catch::Contains("overflows"));
  // Near the limit is fine.
  CHECK(type_of(one("reshape", {{BP_DTYPE_F32, {2, 4}}}, {{"shape", {8, 1}}})).second == Shape{8, 1});
  // A step far beyond the dim takes one element.
  CHECK(type_of(one("slice", {{BP_DTYPE_F32, {2, 4}}}, {{"dim", 1}, {"step", INT64_MAX}})).second == Shape{2, 1});
  CHECK(type_of(one("slice", {{BP_DTYPE_F32, {2, 4}}}, {{"dim", 1}, {"step", INT64_MIN}})).second == Shape{2, 1});
}

TEST_CASE("matmul batch dims broadcast as NumPy's: 0 against 1 is 0", "[graph]") {
  CHECK(type_of(one("matmul", {{BP_DTYPE_F32, {0, 7, 3}}, {BP_DTYPE_F32, {1, 3, 1}}})).second == Shape{0, 7, 1});
  CHECK(type_of(one("matmul", {{BP_DTYPE_F32, {1, 7, 3}}, {BP_DTYPE_F32, {0, 3, 1}}})).second == Shape{0, 7, 1});
  CHECK_THAT(error_of(one("matmul", {{BP_DTYPE_F32, {2, 7, 3}}, {BP_DTYPE_F32, {0, 3, 1}}})),
             Catch::Contains("[2] and [0] do not broadcast"));
}

TEST_CASE("the op reference is the table inference reads", "[graph]") {
  const auto ops = op_reference();
  std::map<std::string, int> names;
  for (const auto& op : ops) ++names[op.name];
  CHECK(names.size() == ops.size());
  for (const char* op : {"add", "matmul", "conv2d", "topk", "var_mean", "selective_scan", "view", "concat"})
    CHECK(names.count(op) == 1);
  const std::string md = op_reference_markdown();
  for (const auto& op : ops) CHECK_THAT(md, Catch::Contains("| `" + op.name + "` |"));
  for (const auto& op : ops) {
    if (op.name != "topk") continue;
    REQUIRE(op.outputs.size() == 2);
    CHECK(op.outputs[0].name == "values");
    CHECK(op.outputs[1].name == "indices");
    REQUIRE(op.params.size() == 4);
    CHECK(op.params[0].name == "k");
    CHECK(op.params[0].required);
    CHECK(op.params[1].default_value == -1);
  }
  CHECK(op_reference_json()["ops"].size() == ops.size());
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

namespace {
std::string graph_error(const std::string& text) {
  try {
    parse_graph_json(Json::parse(text), ".");
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}
// A graph whose one input 'c' is the inline constant `spec`.
std::string constant_error(const std::string& spec) {
  return graph_error(R"({"inputs": {"c": )" + spec + R"(}, "nodes": [], "outputs": ["c"]})");
}
HostTensor constant_of(const std::string& spec) {
  GraphFile gf = parse_graph_json(Json::parse(R"({"inputs": {"c": )" + spec + R"(}, "nodes": [], "outputs": ["c"]})"), ".");
  REQUIRE(gf.graph.inputs().size() == 1);
  REQUIRE(gf.graph.inputs()[0].constant);
  return *gf.graph.inputs()[0].constant;
}
std::filesystem::path graph_temp(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "backplane_graph_tests";
  std::filesystem::create_directories(dir);
  return dir / name;
}
std::string file_error(const std::filesystem::path& path) {
  try {
    load_graph_file(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}
}  // namespace

TEST_CASE("graph JSON: an inline integer that does not fit its dtype is an error", "[graph]") {
  // Stored as [44, 24] and -1 before, silently.
  CHECK_THAT(constant_error(R"({"value": [300, -1000], "dtype": "i8"})"),
             Catch::Contains("graph input 'c'") && Catch::Contains("300") && Catch::Contains("i8"));
  CHECK_THAT(constant_error(R"({"value": [1, -1000], "dtype": "i8"})"), Catch::Contains("-1000") && Catch::Contains("i8"));
  CHECK_THAT(constant_error(R"({"value": 18446744073709551615, "dtype": "i64"})"),
             Catch::Contains("graph input 'c'") && Catch::Contains("18446744073709551615") && Catch::Contains("i64"));
  CHECK_THAT(constant_error(R"({"value": [-1], "dtype": "u8"})"), Catch::Contains("-1") && Catch::Contains("u8"));
  CHECK_THAT(constant_error(R"({"value": [256], "dtype": "u8"})"), Catch::Contains("256") && Catch::Contains("u8"));
  CHECK_THAT(constant_error(R"({"value": [2147483648], "dtype": "i32"})"), Catch::Contains("2147483648"));
  CHECK_THAT(constant_error(R"({"value": [-32769], "dtype": "i16"})"), Catch::Contains("-32769"));
  // bool: true/false/0/1 only.
  CHECK_THAT(constant_error(R"({"value": [0, 2], "dtype": "bool"})"), Catch::Contains("2") && Catch::Contains("bool"));
  CHECK_THAT(constant_error(R"({"value": [-1], "dtype": "bool"})"), Catch::Contains("bool"));
  CHECK_THAT(constant_error(R"({"value": [0.5], "dtype": "bool"})"), Catch::Contains("bool"));
  // A float for an integer dtype stays an error.
  CHECK_THAT(constant_error(R"({"value": [3.5], "dtype": "i32"})"), Catch::Contains("not an integer"));
  // A float beyond the dtype's range (it became inf).
  CHECK_THAT(constant_error(R"({"value": [1e300], "dtype": "f32"})"), Catch::Contains("graph input 'c'") && Catch::Contains("f32"));
  CHECK_THAT(constant_error(R"({"value": [-1e39]})"), Catch::Contains("f32"));
  CHECK_THAT(constant_error(R"({"value": [70000], "dtype": "f16"})"), Catch::Contains("70000") && Catch::Contains("f16"));
  CHECK_THAT(constant_error(R"({"value": [1e39], "dtype": "bf16"})"), Catch::Contains("bf16"));

  // The edges of each range are exact.
  auto i64 = constant_of(R"({"value": [-9223372036854775808, 9223372036854775807], "dtype": "i64"})");
  CHECK(i64.get_int(0) == INT64_MIN);
  CHECK(i64.get_int(1) == INT64_MAX);
  auto i8 = constant_of(R"({"value": [-128, 127], "dtype": "i8"})");
  CHECK(i8.get_int(0) == -128);
  CHECK(i8.get_int(1) == 127);
  CHECK(constant_of(R"({"value": [255], "dtype": "u8"})").get_int(0) == 255);
  auto b = constant_of(R"({"value": [true, false, 0, 1], "dtype": "bool"})");
  CHECK(b.get_int(0) == 1);
  CHECK(b.get_int(1) == 0);
  CHECK(b.get_int(3) == 1);
  CHECK(constant_of(R"({"value": [65504], "dtype": "f16"})").get(0) == 65504.0);
  CHECK(constant_of(R"({"value": [1e300], "dtype": "f64"})").get(0) == 1e300);
  CHECK(constant_of(R"({"value": [18446744073709551615], "dtype": "f32"})").get(0) == Approx(1.8446744e19));
}

TEST_CASE("graph JSON: inline shapes whose element count overflows are errors", "[graph]") {
  // 2^32 x 2^32 x 4 wrapped to 0 elements: an empty constant, silently.
  CHECK_THAT(constant_error(R"({"value": 1, "shape": [4294967296, 4294967296, 4]})"),
             Catch::Contains("graph input 'c'") && Catch::Contains("overflows"));
  CHECK_THAT(constant_error(R"({"value": 1, "shape": [4611686018427387904, 2]})"), Catch::Contains("overflows"));
  CHECK_THAT(constant_error(R"({"value": 1, "shape": [18446744073709551615]})"),
             Catch::Contains("graph input 'c'") && Catch::Contains("'shape'"));
  CHECK_THAT(constant_error(R"({"value": 1, "shape": [-1]})"), Catch::Contains("'shape'"));
  // A scalar repeated over a sane shape still works.
  auto t = constant_of(R"({"value": 7, "dtype": "i16", "shape": [3, 2]})");
  CHECK(t.shape == Shape{3, 2});
  CHECK(t.get_int(5) == 7);
}

TEST_CASE("graph JSON: an empty outputs list is an error", "[graph]") {
  // It ran nothing and exited 0.
  CHECK_THAT(graph_error(R"({"inputs": {"x": {"value": [1]}}, "nodes": [{"name": "y", "op": "relu", "inputs": ["x"]}],
                            "outputs": []})"),
             Catch::Contains("'outputs' is empty"));
}

TEST_CASE("graph files: FIFOs and oversized or deeply nested files are refused", "[graph]") {
  const auto fifo = graph_temp("fifo.json");
  std::filesystem::remove(fifo);
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  // Opening it blocked `backplane run` for ever.
  CHECK_THAT(file_error(fifo), Catch::Contains("fifo.json") && Catch::Contains("is not a regular file"));
  // A FIFO named as an .npy input.
  const auto npy_fifo = graph_temp("x_fifo.npy");
  std::filesystem::remove(npy_fifo);
  REQUIRE(mkfifo(npy_fifo.c_str(), 0600) == 0);
  const auto g = graph_temp("reads_fifo.json");
  std::ofstream(g) << R"({"inputs": {"x": "x_fifo.npy"}, "nodes": [], "outputs": ["x"]})";
  CHECK_THAT(file_error(g), Catch::Contains("graph input 'x'") && Catch::Contains("is not a regular file"));
  std::filesystem::remove(fifo);
  std::filesystem::remove(npy_fifo);
  // Over the size cap (a sparse file: nothing is written or read).
  const auto big = graph_temp("big.json");
  std::ofstream(big).close();
  std::filesystem::resize_file(big, (uint64_t{256} << 20) + 1);
  CHECK_THAT(file_error(big), Catch::Contains("big.json") && Catch::Contains("256 MiB"));
  std::filesystem::remove(big);
  // Nesting 200000 deep overflowed the stack in the JSON parser.
  const auto deep = graph_temp("deep.json");
  std::ofstream(deep) << R"({"nodes": [], "outputs": ["x"], "inputs": {"x": {"value": )" << std::string(200000, '[')
                      << std::string(200000, ']') << "}}}";
  CHECK_THAT(file_error(deep), Catch::Contains("deep.json") && Catch::Contains("nested"));
}

TEST_CASE("graph JSON: ragged nested lists and oversized inline constants are refused", "[graph]") {
  auto err = [](const std::string& value) {
    try {
      parse_graph_json(Json::parse(R"({"inputs": {"x": )" + value + R"(}, "nodes": [], "outputs": ["x"]})"), ".");
      return std::string("accepted");
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  // Found by the fuzzers: a number before a deeper list, a list after numbers.
  CHECK_THAT(err(R"({"value": [1, 2, 3, []]})"), Catch::Contains("ragged"));
  CHECK_THAT(err(R"({"value": [[1, 2, 3], [[5], [6], [7]]]})"), Catch::Contains("ragged"));
  CHECK_THAT(err(R"({"value": [[[1]], [2]]})"), Catch::Contains("ragged"));
  CHECK(err(R"({"value": [[], []]})") == "accepted");  // a [2, 0] tensor
  // 90 bytes of JSON asking for 40 GB.
  CHECK_THAT(err(R"({"value": 0, "shape": [100000, 100000]})"), Catch::Contains("the limit is 64 MiB"));
}
