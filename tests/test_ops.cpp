// Op tests: the conformance suite on every device of every loaded plugin
// (one section per op, so a failure names device, op, dtype and layout), and
// hand-derived values for semantics that are easy to get wrong.
//
// Devices come from BACKPLANE_PLUGIN_PATH (the test environment points it at
// the built plugins). A plugin without a usable device (no Vulkan driver) has
// no device here, so its cases are skipped, not failed.
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // event listeners (CloseRuntime)
#include <catch2/catch.hpp>

#include "conformance/conformance.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <set>

#include <unistd.h>

namespace bc = backplane::conformance;
using backplane::Device;
using backplane::Graph;
using backplane::HostTensor;
using backplane::Json;
using backplane::Shape;

namespace {

// One runtime for every test here (plugins load once), closed when the test
// run ends rather than by exit handlers: a plugin's own statics may already be
// gone by then.
std::unique_ptr<backplane::Runtime>& runtime_slot() {
  static std::unique_ptr<backplane::Runtime> rt;
  return rt;
}

backplane::Runtime& runtime() {
  auto& rt = runtime_slot();
  if (!rt) rt = backplane::Runtime::create();
  return *rt;
}

const std::vector<Device*>& devices() {
  static std::vector<Device*> d;
  static backplane::Runtime* for_runtime = nullptr;
  if (for_runtime != &runtime()) {
    for_runtime = &runtime();
    d = runtime().all_devices();
  }
  return d;
}

struct CloseRuntime : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunEnded(const Catch::TestRunStats&) override { runtime_slot().reset(); }
};

std::vector<std::string> ops_of(const Device& d) {
  std::vector<std::string> ops;
  std::set<std::string> seen;
  for (const auto& k : d.kernels())
    if (seen.insert(k.op).second) ops.push_back(k.op);
  return ops;
}

bool claims(const Device& d, const std::string& op, const std::vector<bp_dtype>& dtypes) {
  for (const auto& k : d.kernels())
    if (k.op == op && k.dtypes == dtypes) return true;
  return false;
}

// Quick mode leaves out the ~64K-element cases: BACKPLANE_TEST_QUICK=1, and
// by default under AddressSanitizer, where they cost ~5x (the normal build
// runs them). BACKPLANE_TEST_QUICK=0 forces them.
bool quick() {
  const char* q = std::getenv("BACKPLANE_TEST_QUICK");
  if (q && *q) return std::string(q) != "0";
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#endif
#endif
  return false;
}

HostTensor T(bp_dtype d, Shape shape, const std::vector<double>& v) {
  HostTensor t = bc::make_tensor(d, std::move(shape));
  for (size_t k = 0; k < v.size(); ++k) {
    if (backplane::is_float(d)) {
      bc::store_f64(t, static_cast<int64_t>(k), v[k]);
    } else {
      bc::store_i64(t, static_cast<int64_t>(k), static_cast<int64_t>(v[k]));
    }
  }
  return t;
}

HostTensor I64(Shape shape, const std::vector<int64_t>& v) {
  HostTensor t = bc::make_tensor(BP_DTYPE_I64, std::move(shape));
  for (size_t k = 0; k < v.size(); ++k) bc::store_i64(t, static_cast<int64_t>(k), v[k]);
  return t;
}

std::vector<double> values(const HostTensor& t) {
  std::vector<double> v;
  for (int64_t k = 0; k < bc::shape_numel(t.shape); ++k) v.push_back(bc::load_f64(t, k));
  return v;
}

std::vector<int64_t> ints(const HostTensor& t) {
  std::vector<int64_t> v;
  for (int64_t k = 0; k < bc::shape_numel(t.shape); ++k) v.push_back(bc::load_i64(t, k));
  return v;
}

// Runs one op (its inputs named in order) with poisoned outputs. A bundled
// op's slots come back as "view<i>" and "owned<i>".
std::map<std::string, HostTensor> run_op(Device& dev, const std::string& op,
                                         const std::vector<std::pair<std::string, HostTensor>>& inputs,
                                         const Json& params = Json::object(), int slots = 0) {
  Graph g;
  std::vector<std::string> names;
  std::map<std::string, HostTensor> feed;
  for (const auto& [name, t] : inputs) {
    g.input(name, t.dtype, t.shape);
    names.push_back(name);
    feed[name] = t;
  }
  g.node("y", op, names, params);
  if (slots == 0) {
    g.output("y");
  } else {
    for (int s = 0; s < slots; ++s) {
      g.node("view" + std::to_string(s), "view", {"y"}, {{"slot", s}});
      g.node("owned" + std::to_string(s), "view_owned", {"y"}, {{"slot", s}});
      g.output("view" + std::to_string(s));
      g.output("owned" + std::to_string(s));
    }
  }
  backplane::CompileOptions co;
  co.poison_outputs = true;
  return runtime().compile(g, dev, co).run(feed);
}

// Calls f on every device that claims (op, dtypes); at least one must.
template <typename F> void on_devices(const std::string& op, const std::vector<bp_dtype>& dtypes, F&& f) {
  int ran = 0;
  for (Device* dev : devices()) {
    if (!claims(*dev, op, dtypes)) continue;
    ++ran;
    INFO("device " << dev->name() << ", " << op << " " << bc::dtype_key(dtypes, false));
    f(*dev);
  }
  INFO("no device implements " << op << " " << bc::dtype_key(dtypes, false));
  CHECK(ran > 0);
}

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// Exact equality, NaN equal to NaN.
void check_exact(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    INFO("element " << k << ": got " << got[k] << ", want " << want[k]);
    if (std::isnan(want[k])) {
      CHECK(std::isnan(got[k]));
    } else {
      CHECK(got[k] == want[k]);
    }
  }
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel = 1e-5) {
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    INFO("element " << k << ": got " << got[k] << ", want " << want[k]);
    CHECK(std::fabs(got[k] - want[k]) <= rel * std::max(1.0, std::fabs(want[k])));
  }
}

}  // namespace

CATCH_REGISTER_LISTENER(CloseRuntime)

// ---------------------------------------------------------------------------
// The conformance suite

TEST_CASE("conformance suite on every device, per op", "[ops][conformance]") {
  const auto& devs = devices();
  for (const auto& p : runtime().plugins()) {
    if (p.state == backplane::PluginState::Rejected) WARN("plugin " << p.name << " rejected: " << p.rejection);
  }
  REQUIRE_FALSE(devs.empty());
  bool has_cpu = false;
  for (Device* d : devs) has_cpu = has_cpu || d->kind() == "cpu";
  CHECK(has_cpu);

  for (Device* dev : devs) {
    for (const std::string& op : ops_of(*dev)) {
      DYNAMIC_SECTION(dev->name() << ": " << op) {
        bc::Options o;
        o.ops = {op};
        o.large = !quick();
        o.concurrency = false;
        const bc::Report rep = bc::run_conformance(runtime(), *dev, o);
        CHECK_FALSE(rep.rows.empty());
        for (const auto& row : rep.rows) {
          INFO(dev->name() << " " << row.op << " " << row.dtype_key << " " << row.layout << ": " << row.passed << "/"
                           << row.cases << " passed; " << row.first_failure);
          CHECK(row.ok());
        }
      }
    }
    DYNAMIC_SECTION(dev->name() << ": concurrent plans") {
      bc::Options o;
      o.kernel_cases = false;
      o.error_cases = false;
      o.concurrency = true;
      const bc::Report rep = bc::run_conformance(runtime(), *dev, o);
      REQUIRE_FALSE(rep.rows.empty());
      for (const auto& row : rep.rows) {
        INFO(dev->name() << " " << row.op << ": " << row.passed << "/" << row.cases << "; " << row.first_failure);
        CHECK(row.ok());
      }
    }
  }
}

TEST_CASE("conformance report serialises to JSON", "[ops][conformance]") {
  REQUIRE_FALSE(devices().empty());
  Device& dev = *devices().front();
  bc::Options o;
  o.filter = "relu";
  o.large = false;
  o.concurrency = false;
  std::vector<std::string> seen;
  o.progress = [&](const bc::Progress& p) { seen.push_back(p.op); };
  const bc::Report rep = bc::run_conformance(runtime(), dev, o);
  const Json j = rep.to_json();
  CHECK(j["plugin"] == dev.plugin_name());
  CHECK(j["device"] == dev.name());
  CHECK(j["date"].get<std::string>().size() == 20);
  CHECK(j["results"].is_array());
  CHECK(j["results"].size() == rep.rows.size());
  if (claims(dev, "relu", {BP_DTYPE_F32, BP_DTYPE_F32})) {
    CHECK_FALSE(seen.empty());
    CHECK(rep.total_cases() > 0);
  }
  CHECK_FALSE(rep.table().empty());
}

TEST_CASE("every op of the reference has registered cases", "[ops][conformance]") {
  const auto registered = bc::registered_ops();
  const std::set<std::string> reg(registered.begin(), registered.end());
  // View ops have no kernel: their cases run under `contiguous`.
  const std::set<std::string> views = {"reshape", "permute", "transpose", "broadcast_to", "slice", "squeeze",
                                       "unsqueeze"};
  for (const auto& op : bc::reference_ops()) {
    if (views.count(op)) continue;
    INFO(op);
    CHECK(reg.count(op) == 1);
  }
  // And every kernel any loaded device claims has a generator, or, for a
  // vendor op (cpu.conv2d_relu), a decomposition and shapes to check it on.
  for (Device* dev : devices()) {
    for (const auto& op : ops_of(*dev)) {
      INFO(dev->name() << " claims " << op);
      if (op.find('.') != std::string::npos && !bc::find_op_cases(op)) {
        const auto* decl = runtime().vendor_op(op);
        CHECK((decl && decl->has_decomposition() && !decl->test_shapes.empty()));
        continue;
      }
      CHECK(bc::find_op_cases(op) != nullptr);
    }
  }
}

#ifdef BACKPLANE_CONFORMANCE_FLAWED_DIR
// A runtime that sees only the flawed self-test plugin.
static std::unique_ptr<backplane::Runtime> flawed_runtime() {
  backplane::RuntimeOptions ro;
  ro.plugin_paths = {BACKPLANE_CONFORMANCE_FLAWED_DIR};
  ro.use_default_path = false;
  ro.use_environment = false;
  return backplane::Runtime::create(ro);
}
#endif

TEST_CASE("the suite catches a flawed plugin", "[ops][conformance][selftest]") {
#ifndef BACKPLANE_CONFORMANCE_FLAWED_DIR
  WARN("the flawed self-test plugin is not built; skipped");
#else
  auto rt = flawed_runtime();
  Device& dev = rt->device("flawed0");
  bc::Options o;
  o.large = false;
  o.concurrency = false;
  const bc::Report rep = bc::run_conformance(*rt, dev, o);
  auto rows = [&](const std::string& op, const std::string& layout) {
    std::vector<const bc::ResultRow*> out;
    for (const auto& r : rep.rows)
      if (r.op == op && r.layout == layout) out.push_back(&r);
    return out;
  };
  auto ok = [&](const std::string& op, const std::string& layout) {
    const auto rs = rows(op, layout);
    INFO(op << " " << layout << " has rows");
    REQUIRE_FALSE(rs.empty());
    bool all = true;
    for (const auto* r : rs) all = all && r->ok();
    return all;
  };
  INFO(rep.table());
  // Flaws are caught, each where it shows.
  CHECK_FALSE(ok("add", "contiguous"));  // last element left unwritten
  CHECK(ok("neg", "contiguous"));        // strides ignored: dense input is fine...
  for (const char* layout : {"transposed", "sliced", "negstep", "broadcast"}) CHECK_FALSE(ok("neg", layout));
  CHECK_FALSE(ok("relu", "contiguous"));   // NaN -> 0
  CHECK_FALSE(ok("round", "contiguous"));  // halves away from zero
  CHECK_FALSE(ok("topk", "contiguous"));   // ties to the higher index
  CHECK_FALSE(ok("div", "errors"));        // no error for a division by zero
  // Correct kernels pass on every layout, a contiguous-only one included.
  for (const char* layout : {"contiguous", "transposed", "sliced", "negstep", "broadcast"}) {
    CHECK(ok("exp", layout));
    CHECK(ok("contiguous", layout));
  }
  CHECK(ok("contiguous", "views"));
  CHECK(ok("exp", "errors"));
  CHECK_FALSE(rep.all_passed());
  // Every kernel got cases but the vendor op, whose cases nobody registered.
  for (const auto& r : rep.rows) {
    INFO(r.op << " " << r.first_failure);
    CHECK((r.layout != "-") == (r.op != "selftest.twice"));
  }
  // A vendor op brings its own cases and reference.
  bc::register_op_cases("selftest.twice", [](bc::CaseContext& ctx) {
    for (const Shape& shape : bc::elementwise_shapes(ctx.large)) {
      bc::OpSpec spec;
      spec.op = "selftest.twice";
      spec.inputs = {{"x", ctx.kernel.in(0), shape, bc::fill_uniform(-10, 10)}};
      spec.reference = [](const std::vector<const HostTensor*>& in, const Json&) {
        bc::RefTensor y = bc::RefTensor::from_host(*in[0]);
        for (double& v : y.f) v *= 2;
        return std::vector<bc::RefTensor>{y};
      };
      ctx.add(spec);
    }
  });
  o.ops = {"selftest.twice"};
  const bc::Report vendor = bc::run_conformance(*rt, dev, o);
  INFO(vendor.table());
  CHECK(vendor.all_passed());
  CHECK(vendor.total_cases() > 10);
#endif
}

TEST_CASE("expected failures: listed flaws do not fail the run, a listed pass or a stale entry does",
          "[ops][conformance][selftest]") {
#ifndef BACKPLANE_CONFORMANCE_FLAWED_DIR
  WARN("the flawed self-test plugin is not built; skipped");
#else
  auto rt = flawed_runtime();
  Device& dev = rt->device("flawed0");
  // The list the build placed beside the manifest, found the way the tool finds it.
  const auto manifest = std::filesystem::path(BACKPLANE_CONFORMANCE_FLAWED_DIR) / "flawed.json";
  const auto list_path = bc::expected_failures_path(manifest);
  CHECK(list_path.filename() == "flawed.xfail");
  bc::Options o;
  o.large = false;
  o.concurrency = false;
  o.expected_failures = bc::load_expected_failures(list_path);
  REQUIRE(o.expected_failures.size() == 10);
  CHECK(o.expected_failures[0].op == "add");
  CHECK(o.expected_failures[0].reason == "the last output element is left unwritten");
  CHECK(o.expected_failures[0].where.find("flawed.xfail:") == 0);

  const bc::Report rep = bc::run_conformance(*rt, dev, o);
  INFO(rep.table());
  CHECK(rep.all_passed());
  int64_t xfails = 0;
  for (const auto& r : rep.rows) {
    INFO(r.op << " " << r.dtype_key << " " << r.layout);
    CHECK_FALSE(r.xpass());
    xfails += r.xfail();
    // The flaws still show as failed cases: listing a row hides nothing.
    if (r.xfail()) CHECK(r.passed < r.cases);
  }
  CHECK(xfails == rep.expected_failures());
  CHECK(xfails >= 9);  // a row per entry at least (concurrency is off here); the globbed ones name several
  CHECK(rep.table().find("xfail (flawed.xfail:") != std::string::npos);

  // A listed row that passes beside a failing one is fine ("add * *" names
  // add's "errors" row too, which passes)...
  for (const auto& r : rep.rows)
    if (r.op == "add" && r.layout == "errors") CHECK((r.ok() && !r.xfail() && !r.xpass()));
  // ...but an entry whose rows all pass fails the run (exp is correct).
  bc::Options wrong = o;
  wrong.expected_failures.push_back({"exp", "*", "contiguous", "not really broken", "test:1"});
  const bc::Report xpass = bc::run_conformance(*rt, dev, wrong);
  CHECK_FALSE(xpass.all_passed());
  int64_t xpasses = 0;
  for (const auto& r : xpass.rows) xpasses += r.xpass();
  CHECK(xpasses == 1);
  CHECK(xpass.table().find("XPASS") != std::string::npos);

  // With the whole suite run, an entry naming nothing the plugin claims is stale.
  bc::Options stale = o;
  stale.concurrency = true;
  stale.threads = 2;
  stale.expected_failures.push_back({"sqrt", "*", "*", "never claimed", "test:2"});
  const bc::Report st = bc::run_conformance(*rt, dev, stale);
  bool found = false;
  for (const auto& r : st.rows)
    if (r.op == "sqrt") found = !r.ok() && r.first_failure.find("test:2 matches no row") != std::string::npos;
  CHECK(found);
  CHECK_FALSE(st.all_passed());
  // ...but a filtered run cannot tell, and says nothing.
  stale.filter = "exp";
  for (const auto& r : bc::run_conformance(*rt, dev, stale).rows) CHECK(r.op != "sqrt");

  // A malformed line names its file and line.
  const auto bad = std::filesystem::temp_directory_path() / ("bp_xfail_" + std::to_string(::getpid()) + ".xfail");
  {
    std::ofstream f(bad);
    f << "# comment\n\nadd f32,f32->f32 * fine\nrelu\n";
  }
  CHECK_THROWS_WITH(bc::load_expected_failures(bad),
                    Catch::Matchers::Contains(bad.string() + ":4") && Catch::Matchers::Contains("OP DTYPE-KEY LAYOUT"));
  std::filesystem::remove(bad);
  CHECK_THROWS_WITH(bc::load_expected_failures(bad), Catch::Matchers::Contains("cannot read"));
#endif
}

// ---------------------------------------------------------------------------
// Hand-derived values

TEST_CASE("round: half to even, sign of zero kept", "[ops][semantics]") {
  on_devices("round", {BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    auto y = run_op(dev, "round", {{"x", T(BP_DTYPE_F32, {8}, {2.5, -0.5, 0.5, 1.5, -2.5, 3.5, -1.5, 2.4999})}});
    const auto v = values(y["y"]);
    check_exact(v, {2, -0.0, 0, 2, -2, 4, -2, 2});
    CHECK(std::signbit(v[1]));
  });
}

TEST_CASE("integer div truncates toward zero", "[ops][semantics]") {
  on_devices("div", {BP_DTYPE_I32, BP_DTYPE_I32, BP_DTYPE_I32}, [](Device& dev) {
    auto y = run_op(dev, "div", {{"a", T(BP_DTYPE_I32, {5}, {-7, 7, -7, 7, 0})}, {"b", T(BP_DTYPE_I32, {5}, {2, 2, -2, -2, 3})}});
    CHECK(ints(y["y"]) == std::vector<int64_t>{-3, 3, 3, -3, 0});
  });
}

TEST_CASE("integer add, mul and sum wrap around", "[ops][semantics]") {
  on_devices("add", {BP_DTYPE_I8, BP_DTYPE_I8, BP_DTYPE_I8}, [](Device& dev) {
    auto y = run_op(dev, "add", {{"a", T(BP_DTYPE_I8, {3}, {127, -128, 100})}, {"b", T(BP_DTYPE_I8, {3}, {1, -1, 100})}});
    CHECK(ints(y["y"]) == std::vector<int64_t>{-128, 127, -56});
  });
  on_devices("mul", {BP_DTYPE_I8, BP_DTYPE_I8, BP_DTYPE_I8}, [](Device& dev) {
    auto y = run_op(dev, "mul", {{"a", T(BP_DTYPE_I8, {2}, {16, -128})}, {"b", T(BP_DTYPE_I8, {2}, {8, -1})}});
    CHECK(ints(y["y"]) == std::vector<int64_t>{-128, -128});
  });
  on_devices("add", {BP_DTYPE_I64, BP_DTYPE_I64, BP_DTYPE_I64}, [](Device& dev) {
    auto y = run_op(dev, "add", {{"a", I64({1}, {std::numeric_limits<int64_t>::max()})}, {"b", I64({1}, {1})}});
    CHECK(ints(y["y"]) == std::vector<int64_t>{std::numeric_limits<int64_t>::min()});
  });
  on_devices("sum", {BP_DTYPE_I8, BP_DTYPE_I8}, [](Device& dev) {
    auto y = run_op(dev, "sum", {{"x", T(BP_DTYPE_I8, {3}, {100, 100, 100})}});
    CHECK(ints(y["y"]) == std::vector<int64_t>{44});  // 300 - 256
  });
}

TEST_CASE("softmax of [0, ln 2] is [1/3, 2/3]", "[ops][semantics]") {
  on_devices("softmax", {BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    auto y = run_op(dev, "softmax", {{"x", T(BP_DTYPE_F32, {2}, {0.0, std::log(2.0)})}}, {{"dim", 0}});
    check_close(values(y["y"]), {1.0 / 3, 2.0 / 3});
  });
  on_devices("log_softmax", {BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    auto y = run_op(dev, "log_softmax", {{"x", T(BP_DTYPE_F32, {2}, {0.0, std::log(2.0)})}}, {{"dim", -1}});
    check_close(values(y["y"]), {std::log(1.0 / 3), std::log(2.0 / 3)});
  });
}

TEST_CASE("cumsum exclusive and reverse", "[ops][semantics]") {
  for (bp_dtype d : {BP_DTYPE_F32, BP_DTYPE_I32}) {
    on_devices("cumsum", {d, d}, [d](Device& dev) {
      const HostTensor x = T(d, {4}, {1, 2, 3, 4});
      check_exact(values(run_op(dev, "cumsum", {{"x", x}}, {{"dim", 0}})["y"]), {1, 3, 6, 10});
      check_exact(values(run_op(dev, "cumsum", {{"x", x}}, {{"dim", 0}, {"exclusive", true}})["y"]), {0, 1, 3, 6});
      check_exact(values(run_op(dev, "cumsum", {{"x", x}}, {{"dim", 0}, {"reverse", true}})["y"]), {10, 9, 7, 4});
      check_exact(values(run_op(dev, "cumsum", {{"x", x}}, {{"dim", 0}, {"exclusive", true}, {"reverse", true}})["y"]),
                  {9, 7, 4, 0});
    });
  }
}

TEST_CASE("gather and index_select with negative indices", "[ops][semantics]") {
  on_devices("gather", {BP_DTYPE_F32, BP_DTYPE_I64, BP_DTYPE_F32}, [](Device& dev) {
    auto y = run_op(dev, "gather",
                    {{"x", T(BP_DTYPE_F32, {2, 3}, {10, 20, 30, 40, 50, 60})}, {"index", I64({2, 2}, {-1, 0, 1, -3})}},
                    {{"dim", 1}});
    CHECK(y["y"].shape == Shape{2, 2});
    check_exact(values(y["y"]), {30, 10, 50, 40});
  });
  on_devices("index_select", {BP_DTYPE_F32, BP_DTYPE_I64, BP_DTYPE_F32}, [](Device& dev) {
    auto y = run_op(dev, "index_select",
                    {{"x", T(BP_DTYPE_F32, {2, 3}, {1, 2, 3, 4, 5, 6})}, {"index", I64({2, 2}, {2, 0, -1, 1})}},
                    {{"dim", 1}});
    CHECK(y["y"].shape == Shape{2, 2, 2});
    check_exact(values(y["y"]), {3, 1, 3, 2, 6, 4, 6, 5});
  });
}

TEST_CASE("topk: ties keep the lower index, NaN ranks highest, slots via view and view_owned", "[ops][semantics]") {
  on_devices("topk", {BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    auto y = run_op(dev, "topk", {{"x", T(BP_DTYPE_F32, {5}, {1, 3, 3, 2, 3})}}, {{"k", 2}}, 2);
    for (const char* s : {"view", "owned"}) {
      INFO(s);
      check_exact(values(y[std::string(s) + "0"]), {3, 3});
      CHECK(y[std::string(s) + "1"].dtype == BP_DTYPE_I64);
      CHECK(ints(y[std::string(s) + "1"]) == std::vector<int64_t>{1, 2});
    }
    y = run_op(dev, "topk", {{"x", T(BP_DTYPE_F32, {4}, {2, 1, 1, 0})}}, {{"k", 2}, {"largest", false}}, 2);
    check_exact(values(y["view0"]), {0, 1});
    CHECK(ints(y["view1"]) == std::vector<int64_t>{3, 1});
    y = run_op(dev, "topk", {{"x", T(BP_DTYPE_F32, {3}, {1, kNaN, 5})}}, {{"k", 2}}, 2);
    check_exact(values(y["owned0"]), {kNaN, 5});
    CHECK(ints(y["owned1"]) == std::vector<int64_t>{1, 2});
  });
}

TEST_CASE("var_mean: correction 0 and 1", "[ops][semantics]") {
  on_devices("var_mean", {BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    const HostTensor x = T(BP_DTYPE_F32, {4}, {1, 2, 3, 4});
    auto y = run_op(dev, "var_mean", {{"x", x}}, {{"correction", 0}}, 2);
    check_close(values(y["view0"]), {1.25});
    check_close(values(y["view1"]), {2.5});
    y = run_op(dev, "var_mean", {{"x", x}}, Json::object(), 2);
    check_close(values(y["owned0"]), {5.0 / 3});
    check_close(values(y["owned1"]), {2.5});
  });
}

TEST_CASE("selective_scan on a 1x2x1 example by hand", "[ops][semantics]") {
  on_devices("selective_scan",
             {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
               // B=1, L=2, D=1, N=1; a = -1.
               // t=0: d=0.5, h = 0.5*1*1 = 0.5,            y = 0.5*2 = 1
               // t=1: d=1,   h = e^-1*0.5 + 1*1*2 = 2.1839, y = 3h
               auto y = run_op(dev, "selective_scan",
                               {{"u", T(BP_DTYPE_F32, {1, 2, 1}, {1, 2})},
                                {"delta", T(BP_DTYPE_F32, {1, 2, 1}, {0.5, 1})},
                                {"a", T(BP_DTYPE_F32, {1, 1}, {-1})},
                                {"b", T(BP_DTYPE_F32, {1, 2, 1}, {1, 1})},
                                {"c", T(BP_DTYPE_F32, {1, 2, 1}, {2, 3})}},
                               Json::object(), 2);
               const double h = 2.0 + 0.5 * std::exp(-1.0);
               CHECK(y["view0"].shape == Shape{1, 2, 1});
               CHECK(y["view1"].shape == Shape{1, 1, 1});
               check_close(values(y["view0"]), {1.0, 3.0 * h});
               check_close(values(y["owned1"]), {h});
             });
}

TEST_CASE("argmax/argmin: first NaN, ties first or last", "[ops][semantics]") {
  on_devices("argmax", {BP_DTYPE_F32, BP_DTYPE_I64}, [](Device& dev) {
    CHECK(ints(run_op(dev, "argmax", {{"x", T(BP_DTYPE_F32, {4}, {1, kNaN, 3, kNaN})}}, {{"dim", 0}})["y"]) ==
          std::vector<int64_t>{1});
    const HostTensor ties = T(BP_DTYPE_F32, {3}, {3, 1, 3});
    CHECK(ints(run_op(dev, "argmax", {{"x", ties}}, {{"dim", 0}})["y"]) == std::vector<int64_t>{0});
    CHECK(ints(run_op(dev, "argmax", {{"x", ties}}, {{"dim", 0}, {"select_last_index", true}})["y"]) ==
          std::vector<int64_t>{2});
  });
  on_devices("argmin", {BP_DTYPE_F32, BP_DTYPE_I64}, [](Device& dev) {
    CHECK(ints(run_op(dev, "argmin", {{"x", T(BP_DTYPE_F32, {4}, {1, -5, kNaN, kNaN})}}, {{"dim", 0}})["y"]) ==
          std::vector<int64_t>{2});
  });
}

TEST_CASE("comparisons with NaN are false except ne", "[ops][semantics]") {
  const HostTensor a = T(BP_DTYPE_F32, {3}, {kNaN, kNaN, 1}), b = T(BP_DTYPE_F32, {3}, {1, kNaN, kNaN});
  for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    on_devices(op, {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_BOOL}, [&](Device& dev) {
      auto y = run_op(dev, op, {{"a", a}, {"b", b}});
      REQUIRE(y["y"].dtype == BP_DTYPE_BOOL);
      const int64_t want = std::string(op) == "ne" ? 1 : 0;
      CHECK(ints(y["y"]) == std::vector<int64_t>{want, want, want});
    });
  }
}

TEST_CASE("NaN propagates through maximum, relu, clamp, max; sign(NaN) is NaN", "[ops][semantics]") {
  on_devices("maximum", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    auto y = run_op(dev, "maximum", {{"a", T(BP_DTYPE_F32, {3}, {kNaN, 1, 2})}, {"b", T(BP_DTYPE_F32, {3}, {0, kNaN, 1})}});
    check_exact(values(y["y"]), {kNaN, kNaN, 2});
  });
  on_devices("relu", {BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    check_exact(values(run_op(dev, "relu", {{"x", T(BP_DTYPE_F32, {3}, {kNaN, -1, 2})}})["y"]), {kNaN, 0, 2});
  });
  on_devices("clamp", {BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    check_exact(values(run_op(dev, "clamp", {{"x", T(BP_DTYPE_F32, {3}, {kNaN, -1, 2})}}, {{"min", 0}, {"max", 1}})["y"]),
                {kNaN, 0, 1});
    check_exact(values(run_op(dev, "clamp", {{"x", T(BP_DTYPE_F32, {3}, {-3, 5, 0.5})}}, {{"min", 0}})["y"]), {0, 5, 0.5});
  });
  on_devices("max", {BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    check_exact(values(run_op(dev, "max", {{"x", T(BP_DTYPE_F32, {2, 2}, {1, kNaN, 3, 4})}}, {{"dims", {1}}})["y"]),
                {kNaN, 4});
  });
  on_devices("sign", {BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    check_exact(values(run_op(dev, "sign", {{"x", T(BP_DTYPE_F32, {4}, {kNaN, -3, 0, 2})}})["y"]), {kNaN, -1, 0, 1});
  });
}

TEST_CASE("cast: truncation, round to nearest even, overflow to kInf", "[ops][semantics]") {
  on_devices("cast", {BP_DTYPE_F32, BP_DTYPE_I32}, [](Device& dev) {
    auto y = run_op(dev, "cast", {{"x", T(BP_DTYPE_F32, {3}, {-2.7, 2.7, -0.5})}}, {{"dtype", "i32"}});
    CHECK(ints(y["y"]) == std::vector<int64_t>{-2, 2, 0});
  });
  on_devices("cast", {BP_DTYPE_F32, BP_DTYPE_F16}, [](Device& dev) {
    const double u = std::ldexp(1.0, -11);  // half an f16 ulp at 1
    auto y = run_op(dev, "cast", {{"x", T(BP_DTYPE_F32, {4}, {1 + u, 1 + 3 * u, 65520, 65519})}}, {{"dtype", "f16"}});
    check_exact(values(y["y"]), {1.0, 1 + 4 * u, kInf, 65504});
  });
  on_devices("cast", {BP_DTYPE_F32, BP_DTYPE_BF16}, [](Device& dev) {
    const double u = std::ldexp(1.0, -8);  // half a bf16 ulp at 1
    auto y = run_op(dev, "cast", {{"x", T(BP_DTYPE_F32, {2}, {1 + u, 1 + 3 * u})}}, {{"dtype", "bf16"}});
    check_exact(values(y["y"]), {1.0, 1 + 4 * u});
  });
  on_devices("cast", {BP_DTYPE_I32, BP_DTYPE_I8}, [](Device& dev) {
    auto y = run_op(dev, "cast", {{"x", T(BP_DTYPE_I32, {3}, {300, -129, 127})}}, {{"dtype", "i8"}});
    CHECK(ints(y["y"]) == std::vector<int64_t>{44, 127, 127});
  });
}

TEST_CASE("matmul promotes 1-D operands", "[ops][semantics]") {
  on_devices("matmul", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    auto y = run_op(dev, "matmul", {{"a", T(BP_DTYPE_F32, {3}, {1, 2, 3})}, {"b", T(BP_DTYPE_F32, {3, 2}, {1, 0, 0, 1, 1, 1})}});
    CHECK(y["y"].shape == Shape{2});
    check_exact(values(y["y"]), {4, 5});
  });
}

TEST_CASE("matmul of one row (a classifier's last layer) against f64 on both layouts of b", "[ops][semantics]") {
  // K and N not multiples of 16, 4 or 64, so every tail of the CPU's GEMV
  // path runs; b as given ([K, N], rows contiguous) and as x @ W.T exports
  // it (a permute of [N, K], columns contiguous). A dropped or doubled term,
  // a tail column left unwritten or a NaN lost would each show.
  const int64_t K = 1283, N = 1003;
  HostTensor a(BP_DTYPE_F32, {1, K}), w(BP_DTYPE_F32, {N, K});
  uint32_t s = 7;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return static_cast<double>(s >> 8) / 16777216.0 - 0.5;
  };
  for (int64_t i = 0; i < K; ++i) a.set(i, next());
  for (int64_t i = 0; i < N * K; ++i) w.set(i, next());
  a.set(K - 1, std::numeric_limits<double>::quiet_NaN());  // reaches every output...
  w.set(7 * K + 3, std::numeric_limits<double>::infinity());  // ...and column 7 gets inf * a[3] too
  std::vector<double> want(static_cast<size_t>(N)), mag(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K - 1; ++k) {
      want[static_cast<size_t>(n)] += a.get(k) * w.get(n * K + k);
      mag[static_cast<size_t>(n)] += std::fabs(a.get(k) * w.get(n * K + k));
    }
  HostTensor a_finite = a;
  a_finite.set(K - 1, 0.0);
  on_devices("matmul", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32}, [&](Device& dev) {
    for (const bool transposed : {true, false}) {
      INFO((transposed ? "b = permute(W)" : "b dense [K, N]"));
      Graph g;
      g.input("a", BP_DTYPE_F32, {1, K});
      if (transposed) {
        g.input("w", BP_DTYPE_F32, {N, K});
        g.node("b", "permute", {"w"}, {{"dims", {1, 0}}});
      } else {
        g.input("b", BP_DTYPE_F32, {K, N});
      }
      g.node("y", "matmul", {"a", "b"});
      g.output("y");
      HostTensor bt(BP_DTYPE_F32, {K, N});
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n) bt.set(k * N + n, w.get(n * K + k));
      backplane::Plan p = runtime().compile(g, dev);
      auto run = [&](const HostTensor& av) {
        return values(p.run({{"a", av}, {transposed ? "w" : "b", transposed ? w : bt}}).at("y"));
      };
      const auto with_nan = run(a);
      for (int64_t n = 0; n < N; ++n) CHECK(std::isnan(with_nan[static_cast<size_t>(n)]));
      a_finite.set(3, 0.0);  // inf * 0 is NaN: column 7 only
      const auto got = run(a_finite);
      a_finite.set(3, a.get(3));
      const auto got_inf = run(a_finite);
      int64_t bad = 0;
      for (int64_t n = 0; n < N; ++n) {
        const size_t i = static_cast<size_t>(n);
        if (n == 7) {
          CHECK(std::isnan(got[i]));     // inf * 0
          CHECK(std::isinf(got_inf[i]));  // inf * a[3]
          continue;
        }
        // docs/ops.md: relative 1e-4 for matmul, here of the sum of the
        // terms' magnitudes (the terms cancel: the sum itself is small).
        const double without_3 = want[i] - a.get(3) * w.get(n * K + 3);
        bad += !(std::fabs(got[i] - without_3) <= 1e-4 * mag[i] + 1e-6);
        bad += !(std::fabs(got_inf[i] - want[i]) <= 1e-4 * mag[i] + 1e-6);
      }
      CHECK(bad == 0);
    }
  });
}

TEST_CASE("conv2d and layer_norm by hand", "[ops][semantics]") {
  on_devices("conv2d", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    // A null bias and a bias left out are the same node.
    for (const std::vector<std::string>& inputs : {std::vector<std::string>{"x", "w", ""}, std::vector<std::string>{"x", "w"}}) {
      Graph g;
      g.input("x", BP_DTYPE_F32, {1, 1, 3, 3});
      g.input("w", BP_DTYPE_F32, {1, 1, 2, 2});
      g.node("y", "conv2d", inputs);
      g.output("y");
      auto y = runtime().compile(g, dev).run(
          {{"x", T(BP_DTYPE_F32, {1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9})}, {"w", T(BP_DTYPE_F32, {1, 1, 2, 2}, {1, 1, 1, 1})}});
      CHECK(y["y"].shape == Shape{1, 1, 2, 2});
      check_exact(values(y["y"]), {12, 16, 24, 28});
    }
  });
  on_devices("layer_norm", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    Graph g;
    g.input("x", BP_DTYPE_F32, {3});
    g.input("b", BP_DTYPE_F32, {3});
    g.node("y", "layer_norm", {"x", "", "b"}, {{"dims", {-1}}});
    g.output("y");
    auto y = runtime().compile(g, dev).run({{"x", T(BP_DTYPE_F32, {3}, {1, 2, 3})}, {"b", T(BP_DTYPE_F32, {3}, {0, 1, 0})}});
    const double s = 1.0 / std::sqrt(2.0 / 3 + 1e-5);
    check_close(values(y["y"]), {-s, 1, s});
  });
}

TEST_CASE("slice with a negative step feeds a kernel", "[ops][semantics]") {
  on_devices("neg", {BP_DTYPE_F32, BP_DTYPE_F32}, [](Device& dev) {
    Graph g;
    g.input("x", BP_DTYPE_F32, {6});
    g.node("s", "slice", {"x"}, {{"dim", 0}, {"step", -2}});
    g.node("y", "neg", {"s"});
    g.output("y");
    auto y = runtime().compile(g, dev).run({{"x", T(BP_DTYPE_F32, {6}, {0, 1, 2, 3, 4, 5})}});
    check_exact(values(y["y"]), {-5, -3, -1});
  });
}

// ---------------------------------------------------------------------------
// Outputs past the CPU plugin's non-temporal threshold (8 MiB): the conformance
// cases are far smaller, so the streamed-store paths of the elementwise,
// transposed and softmax kernels are checked here against double references.

namespace {

// Worst element of got against want (relative to max(1, |want|)), and where.
struct Worst {
  double err = 0;
  size_t at = 0;
};
Worst worst_error(const std::vector<double>& got, const std::vector<double>& want) {
  Worst w;
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    const double e = std::fabs(got[k] - want[k]) / std::max(1.0, std::fabs(want[k]));
    if (!(e <= w.err)) w = {std::isnan(e) ? INFINITY : e, k};
  }
  return w;
}

}  // namespace

TEST_CASE("outputs larger than the cache", "[ops][large]") {
  const int64_t M = 1536;  // 1536^2 f32 = 9 MiB per tensor
  std::vector<double> av(static_cast<size_t>(M * M)), bv(av.size()), cv(static_cast<size_t>(M));
  for (size_t k = 0; k < av.size(); ++k) {
    av[k] = std::sin(0.37 * static_cast<double>(k)) * 3.0;
    bv[k] = std::cos(0.11 * static_cast<double>(k));
  }
  for (size_t k = 0; k < cv.size(); ++k) cv[k] = 0.5 * static_cast<double>(k % 7);
  // Inputs as f32 values, so the references see exactly what the kernels see.
  for (auto* v : {&av, &bv, &cv})
    for (double& x : *v) x = static_cast<double>(static_cast<float>(x));
  const HostTensor a = T(BP_DTYPE_F32, {M, M}, av), b = T(BP_DTYPE_F32, {M, M}, bv), col = T(BP_DTYPE_F32, {M, 1}, cv);
  auto at = [&](const std::vector<double>& v, int64_t i, int64_t j) { return v[static_cast<size_t>(i * M + j)]; };

  on_devices("add", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32}, [&](Device& dev) {
    struct Form {
      const char* name;
      bool transpose;
      const HostTensor* rhs;
    };
    for (const Form& f : {Form{"contiguous", false, &b}, Form{"transposed lhs", true, &b}, Form{"broadcast column", false, &col}}) {
      INFO(f.name);
      Graph g;
      g.input("a", BP_DTYPE_F32, {M, M});
      g.input("b", BP_DTYPE_F32, f.rhs->shape);
      std::string lhs = "a";
      if (f.transpose) {
        g.node("at", "transpose", {"a"}, {{"dim0", 0}, {"dim1", 1}});
        lhs = "at";
      }
      g.node("y", "add", {lhs, "b"});
      g.output("y");
      auto y = runtime().compile(g, dev).run({{"a", a}, {"b", *f.rhs}});
      std::vector<double> want(av.size());
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < M; ++j)
          want[static_cast<size_t>(i * M + j)] = static_cast<float>(
              (f.transpose ? at(av, j, i) : at(av, i, j)) + (f.rhs == &col ? cv[static_cast<size_t>(i)] : at(bv, i, j)));
      const Worst w = worst_error(values(y["y"]), want);
      INFO("worst at element " << w.at);
      CHECK(w.err == 0);
    }
  });
  on_devices("softmax", {BP_DTYPE_F32, BP_DTYPE_F32}, [&](Device& dev) {
    auto y = run_op(dev, "softmax", {{"x", a}}, {{"dim", -1}});
    std::vector<double> want(av.size());
    for (int64_t i = 0; i < M; ++i) {
      double m = -INFINITY, s = 0;
      for (int64_t j = 0; j < M; ++j) m = std::max(m, at(av, i, j));
      for (int64_t j = 0; j < M; ++j) s += std::exp(at(av, i, j) - m);
      for (int64_t j = 0; j < M; ++j) want[static_cast<size_t>(i * M + j)] = std::exp(at(av, i, j) - m) / s;
    }
    const Worst w = worst_error(values(y["y"]), want);
    INFO("worst at element " << w.at);
    CHECK(w.err <= 1e-6);  // probabilities: abs 1e-6 (docs/ops.md): the error is relative to max(1, |want|)
  });
}

// Catches the reference rounding an f64 result to f16/bf16 twice (through
// float), which docs/ops.md forbids: each value lies just above the halfway
// point between two 16-bit neighbours, so one rounding goes up, while the
// float in between lands exactly on the halfway point and ties to even (down).
TEST_CASE("the reference rounds f64 to f16 and bf16 once", "[ops][conformance]") {
  const double bf = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  CHECK(static_cast<double>(static_cast<float>(bf)) == 1.0 + std::ldexp(1.0, -8));  // the float is the tie
  CHECK(bc::round_to_dtype(bf, BP_DTYPE_BF16) == 1.0 + std::ldexp(1.0, -7));
  CHECK(bc::round_to_dtype(-bf, BP_DTYPE_BF16) == -(1.0 + std::ldexp(1.0, -7)));
  const double h = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30);
  CHECK(bc::round_to_dtype(h, BP_DTYPE_F16) == 1.0 + std::ldexp(1.0, -10));
  // Below the halfway point both ways agree; an exact tie still goes to even.
  CHECK(bc::round_to_dtype(1.0 + std::ldexp(1.0, -11) - std::ldexp(1.0, -30), BP_DTYPE_F16) == 1.0);
  CHECK(bc::round_to_dtype(1.0 + std::ldexp(1.0, -11), BP_DTYPE_F16) == 1.0);
  // f16 subnormals: 2^-24 is the smallest; 1.5 * 2^-24 ties to even (2^-23).
  CHECK(bc::round_to_dtype(std::ldexp(1.0, -24), BP_DTYPE_F16) == std::ldexp(1.0, -24));
  CHECK(bc::round_to_dtype(1.5 * std::ldexp(1.0, -24), BP_DTYPE_F16) == std::ldexp(1.0, -23));
  CHECK(bc::round_to_dtype(std::ldexp(1.0, -26), BP_DTYPE_F16) == 0.0);
}

// Catches a check that lets a copy lose the sign of zero, and one that
// compares it for a max whose zero sign is unspecified.
TEST_CASE("exact copies compare the sign of zero; selections do not", "[ops][conformance]") {
  bc::RefTensor want(BP_DTYPE_F32, {2});
  want.f = {-0.0, 1.0};
  bc::RefTensor got = want;
  got.f[0] = 0.0;
  const auto exact = bc::tolerance_for(BP_DTYPE_F32, bc::TolClass::Exact);
  CHECK_FALSE(bc::compare(got, want, exact).ok);
  CHECK(bc::compare(got, want, exact).message.find("sign of zero") != std::string::npos);
  CHECK(bc::compare(got, want, bc::tolerance_for(BP_DTYPE_F32, bc::TolClass::Selection)).ok);
  for (bp_dtype d : {BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64}) {
    bc::RefTensor w(d, {1}), g(d, {1});
    w.f = {0.5};
    g.f = {0.5 + 1e-3};
    CHECK_FALSE(bc::compare(g, w, bc::tolerance_for(d, bc::TolClass::Exact)).ok);  // 1e-2 used to pass it
  }
}

// Catches a softmax of zeros passing: a row of 1000 probabilities of 1e-3
// is within the f16/bf16 absolute floor (1e-2) of zero, not within the
// probability bounds.
TEST_CASE("softmax results are held to bounds that see small probabilities", "[ops][conformance]") {
  for (bp_dtype d : {BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F32}) {
    bc::RefTensor want(d, {1000}), zeros(d, {1000}), close(d, {1000});
    for (int64_t k = 0; k < 1000; ++k) {
      want.f[static_cast<size_t>(k)] = 1e-3;
      close.f[static_cast<size_t>(k)] = 1e-3 * (1 + 5e-5);
    }
    INFO(backplane::dtype_name(d));
    if (d != BP_DTYPE_F32) CHECK(bc::compare(zeros, want, bc::tolerance_for(d, bc::TolClass::Compound)).ok);
    CHECK_FALSE(bc::compare(zeros, want, bc::tolerance_for(d, bc::TolClass::Probability)).ok);
    CHECK(bc::compare(close, want, bc::tolerance_for(d, bc::TolClass::Probability)).ok);
  }
}
