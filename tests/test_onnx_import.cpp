// The ONNX importer (Backplane::onnx) on models built here with ONNX's own
// protobuf classes: values against hand-derived results on the CPU device,
// the folds it claims (BatchNormalization into Conv, shape arithmetic), and
// every kind of bad model getting a message that names what is wrong.
#ifdef BACKPLANE_HAVE_ONNX
#include <backplane/onnx.hpp>
#include <catch2/catch.hpp>
#include <onnx/onnx_pb.h>

#include "onnx_model_builder.hpp"

#include <cmath>
#include <fstream>

using namespace backplane;
namespace bpx = backplane::onnx;
using backplane::test::ModelBuilder;
using backplane::test::error_of;

namespace {



std::map<std::string, HostTensor> run_cpu(const bpx::ImportedModel& im, std::map<std::string, HostTensor> in) {
  static auto rt = Runtime::create();
  Plan plan = rt->compile(im.graph, rt->device("cpu"));
  return plan.run(in);
}

HostTensor f32(Shape s, std::vector<double> v) { return HostTensor::from_doubles(BP_DTYPE_F32, std::move(s), v); }

}  // namespace

TEST_CASE("onnx: Conv + BatchNormalization folds into one conv2d with the same values", "[onnx]") {
  // x [1, 1, 3, 3], w [2, 1, 2, 2], bias [2]; BN with every statistic set.
  ModelBuilder b;
  b.input("x", {"1", "1", "3", "3"}).output("y");
  b.init_f("w", {2, 1, 2, 2}, {1, 2, 3, 4, -1, 0.5f, 0, 2});
  b.init_f("cb", {2}, {0.5f, -1});
  b.init_f("gamma", {2}, {2, 0.5f});
  b.init_f("beta", {2}, {1, -2});
  b.init_f("mean", {2}, {3, -1});
  b.init_f("var", {2}, {4, 0.25f});
  b.node("Conv", {"x", "w", "cb"}, {"c"});
  auto* bn = b.node("BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"y"});
  ModelBuilder::attr_f(bn, "epsilon", 0.0f);
  const std::vector<double> x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  // By hand: conv of each 2x2 window, then (c - mean) / sqrt(var) * gamma + beta.
  std::vector<double> want;
  const double w[2][4] = {{1, 2, 3, 4}, {-1, 0.5, 0, 2}}, cb[2] = {0.5, -1}, gamma[2] = {2, 0.5}, beta[2] = {1, -2},
               mean[2] = {3, -1}, sd[2] = {2, 0.5};
  for (int o = 0; o < 2; ++o)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const double c = w[o][0] * x[static_cast<size_t>(i * 3 + j)] + w[o][1] * x[static_cast<size_t>(i * 3 + j + 1)] +
                         w[o][2] * x[static_cast<size_t>((i + 1) * 3 + j)] + w[o][3] * x[static_cast<size_t>((i + 1) * 3 + j + 1)] + cb[o];
        want.push_back((c - mean[o]) / sd[o] * gamma[o] + beta[o]);
      }
  for (bool fold : {true, false}) {
    bpx::ImportOptions opt;
    opt.fold_batch_norm = fold;
    auto im = bpx::import_bytes(b.bytes(), opt, "bn.onnx");
    size_t convs = 0, others = 0;
    for (const auto& n : im.graph.nodes()) (n.op == "conv2d" ? convs : others) += 1;
    CHECK(convs == 1);
    CHECK(others == (fold ? 0u : 2u));  // unfolded: mul + add after the conv
    auto out = run_cpu(im, {{"x", f32({1, 1, 3, 3}, x)}});
    const auto& y = out.at("y");
    REQUIRE(y.shape == Shape{1, 2, 2, 2});
    for (int64_t k = 0; k < 8; ++k) CHECK(y.get(k) == Approx(want[static_cast<size_t>(k)]).epsilon(1e-5));
  }
}

TEST_CASE("onnx: shape arithmetic folds at import (Shape, Gather, Unsqueeze, Concat -> Reshape)", "[onnx]") {
  // y = reshape(x, [shape(x)[0], -1]) spelled the way exporters spell flatten.
  ModelBuilder b;
  b.input("x", {"batch", "2", "3"}).output("y");
  b.init_i("zero", {}, {0});
  b.init_i("minus1", {1}, {-1});
  b.init_i("axes0", {1}, {0});
  b.node("Shape", {"x"}, {"s"});
  b.node("Gather", {"s", "zero"}, {"n"});
  b.node("Unsqueeze", {"n", "axes0"}, {"n1"});
  b.node("Concat", {"n1", "minus1"}, {"shape"});
  ModelBuilder::attr_i(b.g->mutable_node(3), "axis", 0);
  b.node("Reshape", {"x", "shape"}, {"y"});
  bpx::ImportOptions opt;
  opt.dims["batch"] = 2;
  auto im = bpx::import_bytes(b.bytes(), opt);
  REQUIRE(im.graph.nodes().size() == 1);  // only the reshape is left
  CHECK(im.graph.nodes()[0].op == "reshape");
  CHECK(im.graph.nodes()[0].params["shape"] == Json({2, -1}));
  std::vector<double> v(12);
  for (int i = 0; i < 12; ++i) v[static_cast<size_t>(i)] = i;
  auto out = run_cpu(im, {{"x", f32({2, 2, 3}, v)}});
  CHECK(out.at("y").shape == Shape{2, 6});
  CHECK(out.at("y").get(7) == 7);

  // A dynamic dim without a size: the message names the input and the dim.
  const std::string e = error_of([&] { bpx::import_bytes(b.bytes()); });
  CHECK_THAT(e, Catch::Contains("input 'x'") && Catch::Contains("'batch'") && Catch::Contains("--dim batch=N"));
  // A given shape that contradicts a static dim.
  bpx::ImportOptions bad;
  bad.input_shapes["x"] = {2, 5, 3};
  CHECK_THAT(error_of([&] { bpx::import_bytes(b.bytes(), bad); }), Catch::Contains("dim 1 = 2 in the model, 5 given"));
}

TEST_CASE("onnx: Gemm with transB, alpha and beta matches the hand product", "[onnx]") {
  ModelBuilder b;
  b.input("a", {"2", "3"}).output("y");
  b.init_f("bt", {2, 3}, {1, 0, -1, 2, 1, 0});  // B transposed: B = [[1, 2], [0, 1], [-1, 0]]
  b.init_f("c", {2}, {10, 20});
  auto* n = b.node("Gemm", {"a", "bt", "c"}, {"y"});
  ModelBuilder::attr_i(n, "transB", 1);
  ModelBuilder::attr_f(n, "alpha", 2.0f);
  ModelBuilder::attr_f(n, "beta", 0.5f);
  auto im = bpx::import_bytes(b.bytes());
  auto y = run_cpu(im, {{"a", f32({2, 3}, {1, 2, 3, 4, 5, 6})}}).at("y");
  // a @ B = [[1 - 3, 2 + 2], [4 - 6, 8 + 5]] = [[-2, 4], [-2, 13]]; 2·that + 0.5·[10, 20].
  const std::vector<double> want = {1, 18, 1, 36};
  for (int k = 0; k < 4; ++k) CHECK(y.get(k) == want[static_cast<size_t>(k)]);
}

TEST_CASE("onnx: Slice with ONNX's clamping, negative steps and INT64 sentinels", "[onnx]") {
  ModelBuilder b;
  b.input("x", {"6"}).output("y").output("z");
  b.init_i("s1", {1}, {-2});
  b.init_i("e1", {1}, {INT64_MIN});
  b.init_i("st1", {1}, {-2});
  b.init_i("s2", {1}, {1});
  b.init_i("e2", {1}, {INT64_MAX});
  b.init_i("ax", {1}, {0});
  b.node("Slice", {"x", "s1", "e1", "ax", "st1"}, {"y"});  // x[4::-2] = [4, 2, 0]
  b.node("Slice", {"x", "s2", "e2"}, {"z"});               // x[1:] = [1 .. 5]
  auto im = bpx::import_bytes(b.bytes());
  auto out = run_cpu(im, {{"x", f32({6}, {0, 1, 2, 3, 4, 5})}});
  REQUIRE(out.at("y").shape == Shape{3});
  CHECK((out.at("y").get(0) == 4 && out.at("y").get(1) == 2 && out.at("y").get(2) == 0));
  REQUIRE(out.at("z").shape == Shape{5});
  CHECK(out.at("z").get(4) == 5);
}

TEST_CASE("onnx: a model with unmapped ops lists every one of them before anything is built", "[onnx]") {
  ModelBuilder b;
  b.input("x", {"4"}).output("y");
  b.node("NonZero", {"x"}, {"a"}, "nz1");
  b.node("Relu", {"x"}, {"r"});
  b.node("Hardmax", {"r"}, {"h1"}, "hm1");
  b.node("Hardmax", {"h1"}, {"h2"}, "hm2");
  b.node("Add", {"h2", "x"}, {"y0"});
  auto* c = b.node("Custom", {"y0"}, {"y"}, "vendor1");
  c->set_domain("com.example");
  auto* o = b.m.add_opset_import();
  o->set_domain("com.example");
  o->set_version(1);
  const std::string e = error_of([&] { bpx::import_bytes(b.bytes(), {}, "multi.onnx"); });
  // NonZero's output is unused (not live): it is not listed.
  CHECK_THAT(e, Catch::Contains("multi.onnx: 2 ONNX ops of opset 13 cannot be imported"));
  CHECK_THAT(e, Catch::Contains("Hardmax: 2 nodes ('hm1', 'hm2')"));
  CHECK_THAT(e, Catch::Contains("com.example.Custom: 1 node ('vendor1')"));
  CHECK_THAT(e, !Catch::Contains("NonZero"));
}

TEST_CASE("onnx: bad models get messages naming the model and what is wrong", "[onnx]") {
  CHECK_THAT(error_of([] { bpx::import_bytes("this is not a protobuf \x01\x02\xff", {}, "junk.onnx"); }),
             Catch::Contains("junk.onnx: not an ONNX model"));
  ModelBuilder good;
  good.input("x", {"2"}).output("y");
  good.node("Relu", {"x"}, {"y"});
  const std::string bytes = good.bytes();
  // Truncated anywhere: refused, never a crash.
  for (size_t cut : {size_t{1}, bytes.size() / 2, bytes.size() - 1}) {
    const std::string e = error_of([&] { bpx::import_bytes(bytes.substr(0, cut), {}, "cut.onnx"); });
    CHECK_THAT(e, Catch::StartsWith("cut.onnx: "));
  }
  // raw_data that does not fit the shape.
  ModelBuilder b;
  b.input("x", {"2"}).output("y");
  b.init_f("w", {3}, {1, 2});
  b.node("Add", {"x", "w"}, {"y"});
  CHECK_THAT(error_of([&] { bpx::import_bytes(b.bytes(), {}, "raw.onnx"); }),
             Catch::Contains("initializer 'w'") && Catch::Contains("raw_data holds 8 bytes"));
  // A shape error inside the model names the ONNX node.
  ModelBuilder s;
  s.input("x", {"2", "3"}).output("y");
  s.init_f("w", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  s.node("MatMul", {"x", "w"}, {"y"}, "proj");
  CHECK_THAT(error_of([&] { bpx::import_bytes(s.bytes(), {}, "mm.onnx"); }),
             Catch::Contains("mm.onnx: node 'proj' (MatMul, opset 13)") && Catch::Contains("do not match"));
  // An opset outside the supported range.
  ModelBuilder old(7);
  old.input("x", {"2"}).output("y");
  old.node("Relu", {"x"}, {"y"});
  CHECK_THAT(error_of([&] { bpx::import_bytes(old.bytes()); }), Catch::Contains("opset 7 is outside the supported 11-18"));
  // A file that is not there, and external data that leaves the model's folder.
  CHECK_THAT(error_of([] { bpx::import_file("/nonexistent/m.onnx"); }), Catch::Contains("/nonexistent/m.onnx: no such file"));
  ModelBuilder ext;
  ext.input("x", {"2"}).output("y");
  auto* t = ext.g->add_initializer();
  t->set_name("w");
  t->set_data_type(::onnx::TensorProto::FLOAT);
  t->add_dims(2);
  t->set_data_location(::onnx::TensorProto::EXTERNAL);
  auto* kv = t->add_external_data();
  kv->set_key("location");
  kv->set_value("../../etc/passwd");
  ext.node("Add", {"x", "w"}, {"y"});
  const auto dir = std::filesystem::temp_directory_path() / "bp_onnx_ext_test";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "m.onnx", std::ios::binary);
    f << ext.bytes();
  }
  CHECK_THAT(error_of([&] { bpx::import_file(dir / "m.onnx"); }),
             Catch::Contains("initializer 'w'") && Catch::Contains("leaves the model's folder"));
  // The same bytes in memory cannot name a file at all.
  CHECK_THAT(error_of([&] { bpx::import_bytes(ext.bytes(), {}, "mem.onnx"); }),
             Catch::Contains("mem.onnx: initializer 'w'") && Catch::Contains("an in-memory model cannot name"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("onnx: external data is read from beside the model, whatever the working folder", "[onnx]") {
  const auto dir = std::filesystem::temp_directory_path() / "bp_onnx_extdata_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "data");
  const float w[3] = {1.5f, -2.0f, 4.0f};
  {
    std::ofstream f(dir / "data" / "w.bin", std::ios::binary);
    const char pad[8] = {};
    f.write(pad, 8);  // the tensor starts at offset 8
    f.write(reinterpret_cast<const char*>(w), sizeof w);
  }
  ModelBuilder b;
  b.input("x", {"3"}).output("y");
  auto* t = b.g->add_initializer();
  t->set_name("w");
  t->set_data_type(::onnx::TensorProto::FLOAT);
  t->add_dims(3);
  t->set_data_location(::onnx::TensorProto::EXTERNAL);
  for (auto [k, v] : {std::pair<const char*, const char*>{"location", "data/w.bin"}, {"offset", "8"}, {"length", "12"}}) {
    auto* kv = t->add_external_data();
    kv->set_key(k);
    kv->set_value(v);
  }
  b.node("Mul", {"x", "w"}, {"y"});
  {
    std::ofstream f(dir / "m.onnx", std::ios::binary);
    f << b.bytes();
  }
  auto im = bpx::import_file(dir / "m.onnx");  // the tests run in the build folder, not beside the model
  auto y = run_cpu(im, {{"x", f32({3}, {2, 3, 0.5})}}).at("y");
  CHECK((y.get(0) == 3 && y.get(1) == -6 && y.get(2) == 2));
  // A file shorter than the tensor is refused before anything is allocated.
  std::filesystem::resize_file(dir / "data" / "w.bin", 16);
  CHECK_THAT(error_of([&] { bpx::import_file(dir / "m.onnx"); }), Catch::Contains("initializer 'w'") && Catch::Contains("holds 16 bytes"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("onnx: the graph directory round-trips through a graph file", "[onnx]") {
  ModelBuilder b;
  b.input("x", {"2", "2"}).output("y");
  b.init_f("w", {2, 2}, {1, 2, 3, 4});
  b.node("MatMul", {"x", "w"}, {"y"});
  auto im = bpx::import_bytes(b.bytes());
  const auto dir = std::filesystem::temp_directory_path() / "bp_onnx_dir_test";
  std::filesystem::remove_all(dir);
  const auto path = bpx::write_graph_dir(im.graph, dir);
  GraphFile gf = load_graph_file(path);
  CHECK(gf.inputs.empty());  // x is declared, its data comes with the run
  auto rt = Runtime::create();
  Plan plan = rt->compile(gf.graph, rt->device("cpu"));
  auto y = plan.run({{"x", f32({2, 2}, {1, 0, 0, 1})}}).at("y");
  CHECK((y.get(0) == 1 && y.get(1) == 2 && y.get(2) == 3 && y.get(3) == 4));
  std::filesystem::remove_all(dir);
}
#endif  // BACKPLANE_HAVE_ONNX
