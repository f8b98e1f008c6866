// The fuzz harnesses' bodies (see harness.hpp).
#include "harness.hpp"

#include <backplane/backplane.hpp>

// The core's own bounded JSON parse (nesting <= 64, as for graph files and
// manifests): the harnesses feed the core what a file would.
#include "checked.hpp"
#include "input_files.hpp"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#ifndef BACKPLANE_FUZZ_PLUGIN_DIRS
#define BACKPLANE_FUZZ_PLUGIN_DIRS ""
#endif

namespace backplane::fuzz {

namespace {

[[noreturn]] void fail(const std::string& what) { throw HarnessFailure(what); }

thread_local std::string g_note;
int note(const std::string& what) {
  g_note = what;
  return 0;
}

// One scratch folder per process, removed at exit (left behind only when the
// process dies, as it does on a finding).
class Scratch {
 public:
  Scratch() {
    // $TMPDIR, else /dev/shm (memory: files rewritten thousands of times a
    // second never reach a disk), else /tmp.
    const char* tmp = std::getenv("TMPDIR");
    std::string base = tmp && *tmp ? tmp : "/tmp";
    if (!(tmp && *tmp) && ::access("/dev/shm", W_OK | X_OK) == 0) base = "/dev/shm";
    std::string pattern = base + "/backplane-fuzz-XXXXXX";
    if (!mkdtemp(pattern.data())) fail("cannot create a scratch folder under " + pattern);
    dir_ = pattern;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::filesystem::path& dir() const { return dir_; }

  // Writes bytes to <dir>/name (truncating) and returns the path.
  std::filesystem::path write(const std::string& name, const uint8_t* data, size_t size) const {
    const auto path = dir_ / name;
    // A new file each time, not a truncated one: ext4 flushes a file
    // truncated and rewritten when it is closed.
    ::unlink(path.c_str());
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) fail("cannot write " + path.string());
    const bool ok = size == 0 || std::fwrite(data, 1, size, f) == size;
    if (std::fclose(f) != 0 || !ok) fail("cannot write " + path.string());
    return path;
  }

 private:
  std::filesystem::path dir_;
};

Scratch& scratch() {
  static Scratch s;
  return s;
}

std::string shape_text(const Shape& s) { return shape_str(s); }

// A dtype/shape pair the core may hand out: a valid dtype, rank <= 8, no
// negative dim, an element count within 2^62.
void check_type(const std::string& what, bp_dtype dtype, const Shape& shape) {
  if (dtype_size(dtype) == 0) fail(what + ": invalid dtype " + std::to_string(static_cast<int>(dtype)));
  if (shape.size() > BP_MAX_RANK) fail(what + ": rank " + std::to_string(shape.size()) + " above 8");
  for (auto d : shape)
    if (d < 0) fail(what + ": negative dim in " + shape_text(shape));
  try {
    detail::checked_numel(shape, what);
  } catch (const Error& e) {
    fail(what + ": shape " + shape_text(shape) + " escaped the count checks: " + e.what());
  }
}

void check_tensor(const std::string& what, const HostTensor& t) {
  check_type(what, t.dtype, t.shape);
  const auto want = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype);
  if (t.bytes.size() != want)
    fail(what + ": " + std::to_string(t.bytes.size()) + " bytes for " + std::string(dtype_name(t.dtype)) +
         shape_text(t.shape) + " (expected " + std::to_string(want) + ")");
  if (t.dtype == BP_DTYPE_BOOL)
    for (auto b : t.bytes)
      if (static_cast<unsigned char>(b) > 1) fail(what + ": a bool element is " + std::to_string(static_cast<int>(b)));
}

// Graph files may name .npy inputs; the fuzzer does not touch the file system
// through them (it could name any file on the machine).
bool names_files(const Json& j) {
  if (!j.is_object() || !j.contains("inputs") || !j["inputs"].is_object()) return false;
  for (const auto& [name, spec] : j["inputs"].items()) {
    (void)name;
    if (spec.is_string() || (spec.is_object() && spec.contains("file"))) return true;
  }
  return false;
}

// Whether nested lists are rectangular: the shape the first elements give,
// every list at depth d of length shape[d], every leaf at depth shape.size().
bool rectangular(const Json& v, const Shape& shape, size_t depth) {
  if (depth == shape.size()) return !v.is_array();
  if (!v.is_array() || static_cast<int64_t>(v.size()) != shape[depth]) return false;
  for (const auto& e : v)
    if (!rectangular(e, shape, depth + 1)) return false;
  return true;
}
bool rectangular(const Json& v) {
  Shape shape;
  for (const Json* x = &v; x->is_array(); x = &x->front()) {
    shape.push_back(static_cast<int64_t>(x->size()));
    if (x->empty()) break;
  }
  return rectangular(v, shape, 0);
}

// What parse_graph_json accepted must have been well-formed: inline values
// rectangular (a ragged list is refused, not read as some other shape).
void check_accepted(const Json& j) {
  if (!j.contains("inputs")) return;
  for (const auto& [name, spec] : j["inputs"].items())
    if (spec.is_object() && spec.contains("value") && !rectangular(spec["value"]))
      fail("parse_graph_json accepted the ragged value of input '" + name + "': " + spec["value"].dump().substr(0, 200));
}

// bytes -> a GraphFile, or nullopt when the core refuses the input (an Error).
std::optional<GraphFile> parse_graph(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return std::nullopt;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Json j;
  try {
    j = detail::parse_json_bounded(text, "fuzz: ");
  } catch (const Error& e) {
    note(std::string("refused: ") + e.what());
    return std::nullopt;
  }
  if (names_files(j)) {
    note("skipped: names .npy files");
    return std::nullopt;
  }
  std::optional<GraphFile> gf;
  try {
    gf = parse_graph_json(j, scratch().dir() / "no-such-folder");
  } catch (const Error& e) {
    note(std::string("refused: ") + e.what());
    return std::nullopt;
  }
  check_accepted(j);
  return gf;
}

bool has_custom_op(const Graph& g) {
  for (const auto& n : g.nodes())
    if (n.op.find('.') != std::string::npos) return true;
  return false;
}

}  // namespace

// ---- fuzz_graph -------------------------------------------------------------

int graph_one(const uint8_t* data, size_t size) {
  g_note = size > kMaxInput ? "skipped: too large" : "";
  auto gf = parse_graph(data, size);
  if (!gf) return 0;
  const Graph& g = gf->graph;
  for (const auto& in : g.inputs()) {
    check_type("graph input '" + in.name + "'", in.dtype, in.shape);
    if (in.constant) {
      check_tensor("constant '" + in.name + "'", *in.constant);
      if (in.constant->shape != in.shape || in.constant->dtype != in.dtype)
        fail("constant '" + in.name + "': the tensor and the declared input disagree");
    }
  }
  std::map<std::string, std::pair<bp_dtype, Shape>> types;
  try {
    types = infer_graph(g);
  } catch (const Error& e) {
    return note(std::string("refused: ") + e.what());
  }
  for (const auto& in : g.inputs())
    if (!types.count(in.name)) fail("infer_graph: no type for input '" + in.name + "'");
  for (const auto& n : g.nodes()) {
    auto it = types.find(n.name);
    if (it == types.end()) fail("infer_graph: no type for node '" + n.name + "'");
    // A bundle has no dtype of its own; every other value must be a tensor type.
    if (it->second.first != BP_DTYPE_INVALID) check_type("node '" + n.name + "' (" + n.op + ")", it->second.first, it->second.second);
  }
  for (const auto& o : g.outputs()) {
    auto it = types.find(o);
    if (it == types.end()) fail("infer_graph accepted output '" + o + "' without a type");
    check_type("output '" + o + "'", it->second.first, it->second.second);
  }
  return note("accepted: " + std::to_string(g.nodes().size()) + " nodes");
}

// ---- fuzz_npy ---------------------------------------------------------------

int npy_one(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return note("skipped: too large");
  std::string outcome;
  const auto path = scratch().write("input.npy", data, size);
  for (std::optional<bp_dtype> override : {std::optional<bp_dtype>{}, std::optional<bp_dtype>{BP_DTYPE_BF16}}) {
    HostTensor t;
    try {
      t = read_npy(path, override);
    } catch (const Error& e) {
      outcome += std::string(outcome.empty() ? "" : "; ") + "refused: " + e.what();
      continue;
    }
    const std::string what = std::string("read_npy") + (override ? " (as bf16)" : "");
    check_tensor(what, t);
    if (override && t.dtype != *override) fail(what + ": returned " + std::string(dtype_name(t.dtype)));
    // The data is the file's tail: the header cannot claim more than the file holds.
    if (t.bytes.size() > size) fail(what + ": " + std::to_string(t.bytes.size()) + " bytes from a " + std::to_string(size) + "-byte file");
    // What it read, written and read again, is the same tensor.
    const auto again = scratch().dir() / "again.npy";
    write_npy(again, t);
    HostTensor u;
    try {
      u = read_npy(again, t.dtype == BP_DTYPE_BF16 ? std::optional<bp_dtype>{BP_DTYPE_BF16} : std::nullopt);
    } catch (const Error& e) {
      fail(what + ": write_npy wrote a file read_npy refuses: " + e.what());
    }
    if (u.dtype != t.dtype || u.shape != t.shape || u.bytes != t.bytes)
      fail(what + ": " + std::string(dtype_name(t.dtype)) + shape_text(t.shape) + " changed through write_npy/read_npy into " +
           std::string(dtype_name(u.dtype)) + shape_text(u.shape));
    outcome += std::string(outcome.empty() ? "" : "; ") + "read " + std::string(dtype_name(t.dtype)) + shape_text(t.shape);
  }
  return note(outcome);
}

// ---- fuzz_manifest ----------------------------------------------------------

int manifest_one(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return note("skipped: too large");
  const auto path = scratch().write("x.json", data, size);
  PluginInfo info;
  try {
    info = parse_manifest(path);
  } catch (const Error& e) {
    return note(std::string("refused: ") + e.what());
  }
  if (info.name.empty()) fail("parse_manifest: a plugin without a name");
  if (info.device_kinds.empty() || info.device_kinds.front() != info.device_kind)
    fail("parse_manifest: device_kinds does not start with device_kind");
  for (const auto& k : info.kernels) {
    if (k.dtypes.size() != k.layouts.size() + 1) fail("parse_manifest: kernel " + k.op + " has dtypes for a different arity");
    for (auto d : k.dtypes)
      if (dtype_size(d) == 0) fail("parse_manifest: kernel " + k.op + " has an invalid dtype");
  }
  for (const auto& v : info.vendor_ops)
    for (const auto& shapes : v.test_shapes)
      for (const auto& s : shapes) check_type("parse_manifest: vendor op " + v.op + ": a test shape", BP_DTYPE_F32, s);
  // The library stays inside the manifest's folder.
  const auto dir = std::filesystem::weakly_canonical(scratch().dir());
  const auto lib = info.library_path.lexically_normal();
  auto rel = lib.lexically_relative(dir);
  if (rel.empty() || *rel.begin() == "..") fail("parse_manifest: library_path " + lib.string() + " is outside " + dir.string());
  // The kernels survive manifest_to_json (which writes the manifest of a
  // library: no vendor ops) and a second parse_manifest.
  const std::string text = manifest_to_json(info).dump(2);
  const auto second = scratch().write("y.json", reinterpret_cast<const uint8_t*>(text.data()), text.size());
  PluginInfo back;
  try {
    back = parse_manifest(second);
  } catch (const Error& e) {
    fail(std::string("manifest_to_json wrote a manifest parse_manifest refuses: ") + e.what());
  }
  if (back.name != info.name || back.version != info.version || back.abi_version != info.abi_version ||
      back.device_kind != info.device_kind || back.description != info.description || back.kernels != info.kernels)
    fail("manifest_to_json/parse_manifest changed the plugin's description or kernels");
  return note("accepted: " + std::to_string(info.kernels.size()) + " kernels, " + std::to_string(info.vendor_ops.size()) +
              " vendor ops");
}

// ---- fuzz_plan --------------------------------------------------------------

namespace {

std::mutex g_dirs_mutex;
std::string g_dirs = BACKPLANE_FUZZ_PLUGIN_DIRS;

struct PlanRig {
  std::unique_ptr<Runtime> runtime;
  std::vector<Device*> devices;
};

PlanRig make_rig() {
  RuntimeOptions o;
  o.use_default_path = false;
  o.use_environment = false;
  o.num_threads = 1;
  o.max_memory_bytes = uint64_t{64} << 20;
  {
    std::lock_guard<std::mutex> lock(g_dirs_mutex);
    std::stringstream ss(g_dirs);
    for (std::string d; std::getline(ss, d, ':');)
      if (!d.empty()) o.plugin_paths.emplace_back(d);
  }
  PlanRig rig;
  rig.runtime = Runtime::create(o);
  bool have_cpu = false;
  for (const auto& p : rig.runtime->plugins()) have_cpu = have_cpu || p.name == "cpu";
  try {
    rig.devices = rig.runtime->select_devices(have_cpu ? "partial0,cpu" : "partial0");
  } catch (const Error& e) {
    fail(std::string("fuzz_plan: no test plugin (plugin folders '") + g_dirs + "'): " + e.what());
  }
  return rig;
}

PlanRig& rig() {
  static PlanRig r = make_rig();
  return r;
}

// One run: the outputs, or the error it raised.
struct Outcome {
  std::map<std::string, HostTensor> outputs;
  std::optional<std::string> error;
};

Outcome run_once(Plan& plan) {
  Outcome o;
  try {
    o.outputs = plan.run({});
  } catch (const Error& e) {
    o.error = e.what();
  }
  return o;
}

void same_outcome(const Outcome& a, const Outcome& b, const std::string& what) {
  if (a.error.has_value() != b.error.has_value())
    fail(what + ": one run failed (" + a.error.value_or(b.error.value_or("")) + "), the other did not");
  if (a.error) return;
  if (a.outputs.size() != b.outputs.size()) fail(what + ": a different set of outputs");
  for (const auto& [name, t] : a.outputs) {
    auto it = b.outputs.find(name);
    if (it == b.outputs.end()) fail(what + ": output '" + name + "' missing");
    const HostTensor& u = it->second;
    if (u.dtype != t.dtype || u.shape != t.shape) fail(what + ": output '" + name + "' has another type");
    if (u.bytes != t.bytes)
      fail(what + ": output '" + name + "' differs (" + std::string(dtype_name(t.dtype)) + shape_text(t.shape) + ")");
  }
}

}  // namespace

const std::string& last_note() { return g_note; }
void set_note(const std::string& what) { g_note = what; }

void prepare() { scratch(); }

void set_plugin_dirs(const std::string& dirs) {
  std::lock_guard<std::mutex> lock(g_dirs_mutex);
  g_dirs = dirs;
}

std::string plugin_dirs() {
  std::lock_guard<std::mutex> lock(g_dirs_mutex);
  return g_dirs;
}

int plan_one(const uint8_t* data, size_t size) {
  g_note = size > kMaxInput ? "skipped: too large" : "";
  auto gf = parse_graph(data, size);
  if (!gf) return 0;
  const Graph& g = gf->graph;
  PlanRig& r = rig();
  std::optional<Plan> plan, poisoned;
  try {
    plan.emplace(r.runtime->compile(g, r.devices));
    CompileOptions po;
    po.poison_outputs = true;
    poisoned.emplace(r.runtime->compile(g, r.devices, po));
  } catch (const Error& e) {
    if (plan && !poisoned) fail("compile: the graph compiled without poison_outputs but not with it");
    return note(std::string("refused at compile: ") + e.what());
  }
  // Standard-op graphs: the plan's types are infer_graph's.
  if (!has_custom_op(g)) {
    std::map<std::string, std::pair<bp_dtype, Shape>> types;
    try {
      types = infer_graph(g);
    } catch (const Error& e) {
      fail(std::string("compile accepted a graph infer_graph refuses: ") + e.what());
    }
    for (const auto& o : g.outputs())
      if (plan->value_type(o) != types.at(o)) fail("output '" + o + "': the plan's type is not infer_graph's");
  }
  const Outcome first = run_once(*plan);
  if (!first.error) {
    if (first.outputs.size() != std::set<std::string>(g.outputs().begin(), g.outputs().end()).size())
      fail("run: " + std::to_string(first.outputs.size()) + " outputs for " + std::to_string(g.outputs().size()) + " names");
    for (const auto& [name, t] : first.outputs) {
      check_tensor("output '" + name + "'", t);
      const auto [dtype, shape] = plan->value_type(name);
      if (t.dtype != dtype || t.shape != shape)
        fail("output '" + name + "' is " + std::string(dtype_name(t.dtype)) + shape_text(t.shape) + ", the plan says " +
             std::string(dtype_name(dtype)) + shape_text(shape));
    }
  }
  same_outcome(first, run_once(*plan), "a second run of the same plan");
  same_outcome(first, run_once(*poisoned), "the plan compiled with poison_outputs");
  if (first.error) return note("compiled; the run failed: " + *first.error);
  std::string devices;
  for (const auto& d : plan->devices()) devices += (devices.empty() ? "" : ",") + d;
  return note("ran on " + devices + ": " + std::to_string(first.outputs.size()) + " outputs");
}

}  // namespace backplane::fuzz
