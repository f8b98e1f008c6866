// The ONNX importer keeping named dynamic dims (ImportOptions::keep_dynamic,
// dynamic_dims): shape arithmetic (Shape -> Gather -> Unsqueeze -> Concat ->
// Reshape, Slice to the end) imported once and run at several sizes by one
// plan, against values derived by hand; what falls back (a dim fixed, with
// a note naming the node) and what is an error. The models are written with
// ONNX's own protobuf classes. A PyTorch export of an attention block with
// dynamic_axes is checked against PyTorch by tests/onnx_dynamic_torch.py,
// which runs the hidden case at the end.
#ifdef BACKPLANE_HAVE_ONNX
#include <backplane/onnx.hpp>
#include <catch2/catch.hpp>
#include <onnx/onnx_pb.h>

#include "onnx_model_builder.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>

using namespace backplane;
namespace bpx = backplane::onnx;
using backplane::test::ModelBuilder;
using backplane::test::error_of;

namespace {

std::string all_notes(const bpx::ImportedModel& m) {
  std::string s;
  for (const auto& n : m.notes) s += n + "\n";
  return s;
}

// x [1, seq, 8] (times w [8]) reshaped by a target computed from its shape,
// as torch.onnx writes x.view(x.size(0), x.size(1), 2, 4):
//   y = Transpose(Reshape(x·w, [1, seq, 2, 4]), [0, 2, 1, 3])   [1, 2, seq, 4]
//   z = Reshape(x, [1, seq·8])                                    [1, seq·8]
//   t = x[:, 1:]  (Slice with end INT64_MAX)                      [1, seq - 1, 8]
std::string seq_model() {
  ModelBuilder b;
  b.input("x", {"1", "seq", "8"}).output("y").output("z").output("t");
  std::vector<float> w;
  for (int i = 0; i < 8; ++i) w.push_back(static_cast<float>(i + 1) * 0.5f);
  b.init_f("w", {8}, w);
  b.init_i("one", {1}, {1});
  b.init_i("two", {1}, {2});
  b.init_i("four", {1}, {4});
  b.init_i("eight", {1}, {8});
  b.init_i("idx1", {}, {1});
  b.init_i("ax0", {1}, {0});
  b.init_i("s_start", {1}, {1});
  b.init_i("s_end", {1}, {INT64_MAX});
  b.init_i("s_axes", {1}, {1});
  b.node("Mul", {"x", "w"}, {"xw"});
  b.node("Shape", {"x"}, {"shape"});
  b.node("Gather", {"shape", "idx1"}, {"seq_s"});
  b.node("Unsqueeze", {"seq_s", "ax0"}, {"seq_1"});
  b.node("Concat", {"one", "seq_1", "two", "four"}, {"target"})->add_attribute()->CopyFrom([] {
    ::onnx::AttributeProto a;
    a.set_name("axis");
    a.set_type(::onnx::AttributeProto::INT);
    a.set_i(0);
    return a;
  }());
  b.node("Reshape", {"xw", "target"}, {"r"});
  ModelBuilder::attr_ints(b.node("Transpose", {"r"}, {"y"}), "perm", {0, 2, 1, 3});
  b.node("Mul", {"seq_1", "eight"}, {"flat"});
  auto* c2 = b.node("Concat", {"one", "flat"}, {"target2"});
  auto* a = c2->add_attribute();
  a->set_name("axis");
  a->set_type(::onnx::AttributeProto::INT);
  a->set_i(0);
  b.node("Reshape", {"x", "target2"}, {"z"});
  b.node("Slice", {"x", "s_start", "s_end", "s_axes"}, {"t"});
  return b.bytes();
}

HostTensor seq_input(int64_t seq) {
  std::vector<double> v;
  for (int64_t i = 0; i < seq * 8; ++i) v.push_back(static_cast<double>((i * 7) % 11) - 5.0 + 0.25 * static_cast<double>(seq));
  return HostTensor::from_doubles(BP_DTYPE_F32, {1, seq, 8}, v);
}

}  // namespace

TEST_CASE("onnx dynamic: Shape/Gather/Concat/Reshape and Slice run at every seq from one import and one plan",
          "[onnx][dynamic]") {
  bpx::ImportOptions opt;
  opt.keep_dynamic = true;
  opt.dims["seq"] = 3;  // the trial size
  auto m = bpx::import_bytes(seq_model(), opt, "seq.onnx");
  INFO(all_notes(m));
  REQUIRE(m.dynamic_dims == std::vector<std::string>{"seq"});
  REQUIRE(m.dims == std::map<std::string, int64_t>{{"seq", 3}});
  const auto& in = m.graph.inputs();
  auto x = std::find_if(in.begin(), in.end(), [](const Graph::Input& i) { return i.name == "x"; });
  REQUIRE(x != in.end());
  // A graph with the dim fixed would name no dim here.
  CHECK(x->dim_names == std::vector<std::string>{"", "seq", ""});
  CHECK(all_notes(m).find("dynamic dims kept: seq=3") != std::string::npos);
  // The reshapes' targets hold -1 where seq was (not 3, not 24), and the
  // slice runs to the end (no `end` of 3).
  for (const auto& n : m.graph.nodes()) {
    INFO(n.name << " " << n.params.dump());
    if (n.op == "reshape") CHECK(std::count(n.params["shape"].begin(), n.params["shape"].end(), Json(-1)) == 1);
    if (n.op == "slice") CHECK(!n.params.contains("end"));
  }

  auto rt = Runtime::create();
  CompileOptions co;
  co.dims = m.dims;
  Plan plan = rt->compile(m.graph, rt->device("cpu"), co);
  for (int64_t seq : {3, 5, 2, 5}) {
    INFO("seq = " << seq);
    const HostTensor xin = seq_input(seq);
    auto out = plan.run({{"x", xin}});
    // By hand: y[0][h][s][d] = x[0][s][4h + d] · 0.5·(4h + d + 1).
    const HostTensor& y = out.at("y");
    REQUIRE(y.shape == Shape{1, 2, seq, 4});
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t d = 0; d < 4; ++d) {
          const int64_t c = 4 * h + d;
          CHECK(y.get((h * seq + s) * 4 + d) == Approx(xin.get(s * 8 + c) * 0.5 * static_cast<double>(c + 1)));
        }
    const HostTensor& z = out.at("z");
    REQUIRE(z.shape == Shape{1, seq * 8});
    for (int64_t i = 0; i < seq * 8; ++i) CHECK(z.get(i) == xin.get(i));
    const HostTensor& t = out.at("t");
    REQUIRE(t.shape == Shape{1, seq - 1, 8});
    for (int64_t i = 0; i < (seq - 1) * 8; ++i) CHECK(t.get(i) == xin.get(i + 8));
  }
  // Three sizes seen, each compiled once: the plan specialized, nothing re-imported.
  CHECK(plan.specializations() == 3);

  // The graph file names the dim; read back, it runs at yet another size.
  const auto dir = std::filesystem::temp_directory_path() / ("bp_onnx_dyn_" + std::to_string(::getpid()));
  const auto path = bpx::write_graph_dir(m.graph, dir);
  std::ifstream f(path);
  const Json j = Json::parse(f);
  CHECK(j["inputs"]["x"]["shape"] == Json::parse(R"([1, "seq", 8])"));
  auto gf = load_graph_file(path);
  CompileOptions co7;
  co7.dims = {{"seq", 7}};
  auto out7 = rt->compile(gf.graph, rt->device("cpu"), co7).run({{"x", seq_input(7)}});
  CHECK(out7.at("t").shape == Shape{1, 6, 8});
  std::filesystem::remove_all(dir);
}

// Would catch: an Expand whose target follows seq left as a broadcast_to of
// the trial size (wrong shape at other lengths), or the dim fixed instead.
TEST_CASE("onnx dynamic: an Expand to x's own seq becomes a broadcast that follows it", "[onnx][dynamic]") {
  // y = Expand(x, Shape(x) * [1, 1, 4]): x [1, seq, 1] -> [1, seq, 4].
  ModelBuilder b;
  b.input("x", {"1", "seq", "1"}).output("y");
  b.init_i("k", {3}, {1, 1, 4});
  b.node("Shape", {"x"}, {"s"});
  b.node("Mul", {"s", "k"}, {"t"});
  b.node("Expand", {"x", "t"}, {"y"});
  bpx::ImportOptions opt;
  opt.keep_dynamic = true;
  opt.dims["seq"] = 3;
  auto m = bpx::import_bytes(b.bytes(), opt, "expand.onnx");
  INFO(all_notes(m));
  REQUIRE(m.dynamic_dims == std::vector<std::string>{"seq"});
  bool rewritten = false;
  for (const auto& n : m.graph.nodes()) {
    CHECK(n.op != "broadcast_to");
    rewritten = rewritten || n.op == "where";
  }
  CHECK(rewritten);
  auto rt = Runtime::create();
  CompileOptions co;
  co.dims = m.dims;
  Plan plan = rt->compile(m.graph, rt->device("cpu"), co);
  for (int64_t seq : {3, 6, 1}) {
    INFO("seq = " << seq);
    std::vector<double> v;
    for (int64_t i = 0; i < seq; ++i) v.push_back(0.25 * static_cast<double>(i) - 1.0);
    const HostTensor xin = HostTensor::from_doubles(BP_DTYPE_F32, {1, seq, 1}, v);
    const HostTensor y = plan.run({{"x", xin}}).at("y");
    REQUIRE(y.shape == Shape{1, seq, 4});
    for (int64_t i = 0; i < seq; ++i)
      for (int64_t j = 0; j < 4; ++j) CHECK(y.get(i * 4 + j) == v[static_cast<size_t>(i)]);
  }
}

TEST_CASE("onnx dynamic: without keep_dynamic every dim is fixed as before", "[onnx][dynamic]") {
  bpx::ImportOptions opt;
  opt.dims["seq"] = 3;
  auto m = bpx::import_bytes(seq_model(), opt, "seq.onnx");
  CHECK(m.dynamic_dims.empty());
  CHECK(m.dims.empty());
  CHECK(m.fixed_dims == std::map<std::string, int64_t>{{"seq", 3}});
  for (const auto& i : m.graph.inputs()) CHECK(i.dim_names.empty());
}

namespace {

// x [seq] + Cast(Range(0, seq, 1)): the range is a constant of seq
// elements, which no param can replace.
std::string range_model() {
  ModelBuilder b;
  b.input("x", {"seq"}).output("y");
  b.init_i("zero", {}, {0});
  b.init_i("step", {}, {1});
  b.init_i("idx0", {}, {0});
  b.node("Shape", {"x"}, {"shape"});
  b.node("Gather", {"shape", "idx0"}, {"n"});
  b.node("Range", {"zero", "n", "step"}, {"pos"});
  auto* c = b.node("Cast", {"pos"}, {"posf"});
  auto* a = c->add_attribute();
  a->set_name("to");
  a->set_type(::onnx::AttributeProto::INT);
  a->set_i(::onnx::TensorProto::FLOAT);
  b.node("Add", {"x", "posf"}, {"y"});
  return b.bytes();
}

// x [b, seq, 4] reshaped to [b, seq, 2, 2] by a target from its shape: two
// entries follow dims, and a reshape infers one.
std::string two_dims_model() {
  ModelBuilder b;
  b.input("x", {"b", "seq", "4"}).output("y");
  b.init_i("two", {1}, {2});
  b.init_i("s0", {1}, {0});
  b.init_i("s2", {1}, {2});
  b.node("Shape", {"x"}, {"shape"});
  b.node("Slice", {"shape", "s0", "s2"}, {"bs"});
  auto* c = b.node("Concat", {"bs", "two", "two"}, {"target"});
  auto* a = c->add_attribute();
  a->set_name("axis");
  a->set_type(::onnx::AttributeProto::INT);
  a->set_i(0);
  b.node("Reshape", {"x", "target"}, {"y"});
  return b.bytes();
}

}  // namespace

TEST_CASE("onnx dynamic: a dim a constant depends on is fixed with a note, or is an error when required",
          "[onnx][dynamic]") {
  bpx::ImportOptions opt;
  opt.keep_dynamic = true;
  opt.dims["seq"] = 4;
  auto m = bpx::import_bytes(range_model(), opt, "range.onnx");
  INFO(all_notes(m));
  // Kept dynamic, the graph would add a constant of 4 elements at every seq.
  CHECK(m.dynamic_dims.empty());
  for (const auto& i : m.graph.inputs()) CHECK(i.dim_names.empty());
  REQUIRE(!m.notes.empty());
  CHECK(m.notes[0].rfind("dim 'seq' fixed at 4: node 'posf_node' (Cast) makes a constant that depends on it", 0) == 0);
  // Fixed, it still runs right at 4: y = x + [0, 1, 2, 3].
  auto rt = Runtime::create();
  auto out = rt->compile(m.graph, rt->device("cpu")).run({{"x", HostTensor::from_doubles(BP_DTYPE_F32, {4}, {1, 1, 1, 1})}});
  CHECK(out.at("y").get(3) == 4.0);

  bpx::ImportOptions req;
  req.dynamic_dims = {"seq"};
  req.dims["seq"] = 4;
  CHECK(error_of([&] { bpx::import_bytes(range_model(), req, "range.onnx"); })
            .rfind("range.onnx: dynamic dim 'seq' cannot stay dynamic: node 'posf_node' (Cast) makes a constant that depends "
                   "on it ('posf' [4] at seq=4, [8] at seq=8)",
                   0) == 0);

  bpx::ImportOptions bad;
  bad.dynamic_dims = {"sequence"};
  bad.dims["seq"] = 4;
  CHECK(error_of([&] { bpx::import_bytes(range_model(), bad, "range.onnx"); }) ==
        "range.onnx: dynamic_dims names 'sequence', which is not a named dim of the model's inputs (they have 'seq')");
}

TEST_CASE("onnx dynamic: a reshape that follows two dims keeps one (the required one first) and fixes the other",
          "[onnx][dynamic]") {
  bpx::ImportOptions opt;
  opt.keep_dynamic = true;
  opt.dims = {{"b", 2}, {"seq", 3}};
  auto m = bpx::import_bytes(two_dims_model(), opt, "two.onnx");
  INFO(all_notes(m));
  // Both kept would be wrong: reshape can infer only one entry.
  CHECK(m.dynamic_dims == std::vector<std::string>{"seq"});
  CHECK(m.dims == std::map<std::string, int64_t>{{"seq", 3}});
  CHECK(m.fixed_dims == std::map<std::string, int64_t>{{"b", 2}});
  REQUIRE(!m.notes.empty());
  CHECK(m.notes[0] == "dim 'b' fixed at 2: node 'y_node' (Reshape) needs it in a param (reshape 'shape' [2,3,2,2] at b=2, "
                      "[4,3,2,2] at b=4)");
  auto rt = Runtime::create();
  CompileOptions co;
  co.dims = m.dims;
  Plan plan = rt->compile(m.graph, rt->device("cpu"), co);
  for (int64_t seq : {3, 6}) {
    std::vector<double> v;
    for (int64_t i = 0; i < 2 * seq * 4; ++i) v.push_back(static_cast<double>(i));
    auto out = plan.run({{"x", HostTensor::from_doubles(BP_DTYPE_F32, {2, seq, 4}, v)}});
    REQUIRE(out.at("y").shape == Shape{2, seq, 2, 2});
    CHECK(out.at("y").get(2 * seq * 4 - 1) == static_cast<double>(2 * seq * 4 - 1));
  }

  // Naming b keeps b instead.
  bpx::ImportOptions keep_b = opt;
  keep_b.dynamic_dims = {"b"};
  auto mb = bpx::import_bytes(two_dims_model(), keep_b, "two.onnx");
  CHECK(mb.dynamic_dims == std::vector<std::string>{"b"});
  CHECK(all_notes(mb).find("dim 'seq' fixed at 3: node 'y_node' (Reshape) needs it in a param") != std::string::npos);

  bpx::ImportOptions both;
  both.dynamic_dims = {"b", "seq"};
  both.dims = opt.dims;
  CHECK(error_of([&] { bpx::import_bytes(two_dims_model(), both, "two.onnx"); })
            .find("cannot stay dynamic: node 'y_node' (Reshape) needs it in a param (reshape 'shape'") != std::string::npos);
}

// Run by tests/onnx_dynamic_torch.py (ctest onnx_dynamic_torch), which
// exports an attention block from PyTorch with dynamic_axes into
// BACKPLANE_TORCH_DYN_DIR together with inputs and PyTorch's outputs at
// several lengths: model.onnx, x_<seq>.npy, y_<seq>.npy, lengths.txt.
TEST_CASE("onnx dynamic: a PyTorch attention block exported with dynamic_axes matches PyTorch at every length",
          "[.onnx_dynamic_torch]") {
  const char* dir_env = std::getenv("BACKPLANE_TORCH_DYN_DIR");
  REQUIRE(dir_env != nullptr);
  const std::filesystem::path dir(dir_env);
  std::vector<int64_t> lengths;
  std::ifstream lf(dir / "lengths.txt");
  for (int64_t s; lf >> s;) lengths.push_back(s);
  REQUIRE(lengths.size() >= 3);
  bpx::ImportOptions opt;
  opt.dynamic_dims = {"seq"};  // must stay dynamic: an error otherwise
  opt.dims["seq"] = lengths[0];
  auto m = bpx::import_file(dir / "model.onnx", opt);
  INFO(all_notes(m));
  REQUIRE(m.dynamic_dims == std::vector<std::string>{"seq"});
  auto rt = Runtime::create();
  CompileOptions co;
  co.dims = m.dims;
  Plan plan = rt->compile(m.graph, rt->device("cpu"), co);
  for (int64_t seq : lengths) {
    INFO("seq = " << seq);
    const auto x = read_npy(dir / ("x_" + std::to_string(seq) + ".npy"));
    const auto want = read_npy(dir / ("y_" + std::to_string(seq) + ".npy"));
    auto out = plan.run({{m.inputs.at(0), x}});
    const HostTensor& y = out.at(m.outputs.at(0));
    REQUIRE(y.shape == want.shape);
    double scale = 0, err = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      scale = std::max(scale, std::abs(want.get(i)));
      err = std::max(err, std::abs(y.get(i) - want.get(i)));
    }
    INFO("max |error| " << err << " of max |y| " << scale);
    CHECK(err <= 1e-4 * scale);
  }
  std::set<int64_t> distinct(lengths.begin(), lengths.end());
  CHECK(plan.specializations() == distinct.size());
}

#endif  // BACKPLANE_HAVE_ONNX
