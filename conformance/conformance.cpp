#include "conformance/conformance.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fnmatch.h>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace backplane::conformance {

namespace {

uint64_t fnv1a(std::string_view s, uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string file_hash_uncached(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return "";
  uint64_t h = 0xcbf29ce484222325ULL;
  char buf[1 << 16];
  while (f.read(buf, sizeof buf) || f.gcount() > 0) {
    h = fnv1a(std::string_view(buf, static_cast<size_t>(f.gcount())), h);
    if (!f) break;
  }
  return hex64(h);
}

// A report per op (as the Catch2 tests make) must not re-read the library.
std::string file_hash(const std::filesystem::path& p) {
  static std::mutex mutex;
  static std::map<std::string, std::string> cache;
  std::lock_guard lock(mutex);
  auto it = cache.find(p.string());
  if (it == cache.end()) it = cache.emplace(p.string(), file_hash_uncached(p)).first;
  return it->second;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool selected(const Options& o, const std::string& op) {
  if (!o.filter.empty() && op.find(o.filter) == std::string::npos) return false;
  if (!o.ops.empty() && std::find(o.ops.begin(), o.ops.end(), op) == o.ops.end()) return false;
  return true;
}

std::set<std::string> claimed_keys(const std::vector<KernelInfo>& ks) {
  std::set<std::string> s;
  for (const auto& k : ks) s.insert(k.op + " " + dtype_key(k.dtypes, false));
  return s;
}

bool mentions(const std::string& msg, const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (msg.find(n) != std::string::npos) return true;
  return names.empty();
}

// Rows keyed by (op, dtype key, layout), in first-seen order.
class Rows {
 public:
  ResultRow& at(const std::string& op, const std::string& key, const std::string& layout) {
    const std::string id = op + '\n' + key + '\n' + layout;
    auto it = index_.find(id);
    if (it != index_.end()) return rows_[it->second];
    index_[id] = rows_.size();
    ResultRow row;
    row.op = op;
    row.dtype_key = key;
    row.layout = layout;
    rows_.push_back(std::move(row));
    return rows_.back();
  }
  void record(ResultRow& row, bool ok, const CheckResult* check, const std::string& failure,
              const std::string& label) {
    ++row.cases;
    if (ok) ++row.passed;
    if (check) {
      row.worst_abs = std::max(row.worst_abs, check->worst_abs);
      row.worst_rel = std::max(row.worst_rel, check->worst_rel);
      row.worst_ratio = std::max(row.worst_ratio, check->worst_ratio);
    }
    if (!ok && row.first_failure.empty()) row.first_failure = label + ": " + failure;
  }
  std::vector<ResultRow> take() { return std::move(rows_); }

 private:
  std::vector<ResultRow> rows_;
  std::map<std::string, size_t> index_;
};

// Marks the rows an expected-failure entry names; with the whole suite run,
// an entry that names no row is stale and fails as a row of its own.
void apply_expected_failures(std::vector<ResultRow>& rows, const Options& o) {
  auto glob = [](const std::string& pattern, const std::string& value) {
    return ::fnmatch(pattern.c_str(), value.c_str(), 0) == 0;
  };
  const bool whole_suite =
      o.filter.empty() && o.ops.empty() && o.kernel_cases && o.error_cases && o.concurrency;
  std::vector<ResultRow> stale;
  for (const auto& e : o.expected_failures) {
    const std::string label = e.where + (e.reason.empty() ? "" : " " + e.reason);
    std::vector<ResultRow*> named;
    for (auto& r : rows)
      if (!r.not_covered && glob(e.op, r.op) && glob(e.dtype_key, r.dtype_key) && glob(e.layout, r.layout))
        named.push_back(&r);
    const bool any_failed = std::any_of(named.begin(), named.end(), [](const ResultRow* r) { return !r->all_cases_passed(); });
    for (ResultRow* r : named) {
      if (!r->all_cases_passed() && r->expected_failure.empty()) r->expected_failure = label;
      if (!any_failed) r->unexpected_pass = label;
    }
    if (!named.empty() || !whole_suite) continue;
    ResultRow row;
    row.op = e.op;
    row.dtype_key = e.dtype_key;
    row.layout = e.layout;
    row.first_failure = "the expected failure at " + e.where +
                        " matches no row of this run (the op, dtype or layout is not claimed): remove it";
    stale.push_back(std::move(row));
  }
  for (auto& r : stale) rows.push_back(std::move(r));
}

// Checks named outputs against the case's expectations (topk sorted=false
// as sets).
CheckResult check_outputs(const Case& c, const std::map<std::string, HostTensor>& outs,
                          const std::map<std::string, RefTensor>* want_override, double tol_scale) {
  CheckResult all;
  std::map<std::string, RefTensor> got, want;
  for (const auto& e : c.expected) {
    auto it = outs.find(e.name);
    if (it == outs.end()) {
      merge(all, CheckResult{false, 1, 0, 0, 0, "output " + e.name + " missing"});
      return all;
    }
    const HostTensor& h = it->second;
    if (h.dtype != e.value.dtype || h.shape != e.value.shape ||
        h.bytes.size() != static_cast<size_t>(e.value.numel()) * dtype_size(e.value.dtype)) {
      merge(all, compare(h, e.value, {}));
      return all;
    }
    got[e.name] = RefTensor::from_host(h);
    want[e.name] = want_override ? want_override->at(e.name) : e.value;
  }
  for (const auto& [v, i] : c.unordered_pairs) {
    if (got.count(v) && got.count(i)) sort_rows_by_index(got[v], got[i], c.unordered_dim);
    if (want.count(v) && want.count(i)) sort_rows_by_index(want[v], want[i], c.unordered_dim);
  }
  for (const auto& e : c.expected) {
    Tolerance tol = tolerance_for(e.value.dtype, c.tol);
    tol.rel *= tol_scale;
    tol.abs *= tol_scale;
    CheckResult r = compare(got[e.name], want[e.name], tol);
    if (!r.ok) r.message = e.name + " " + r.message;
    merge(all, r);
  }
  return all;
}

}  // namespace

// ---------------------------------------------------------------------------

namespace {

// Runs `gen` with a context for `kernel` on `device`: cases depend on (seed,
// op, dtype key) only.
std::vector<Case> generate(const KernelSpec& kernel, Device& device, const Options& options,
                           const std::function<void(CaseContext&)>& gen) {
  std::vector<Case> cases;
  const std::set<std::string> claimed = claimed_keys(device.kernels());
  Rng rng(splitmix(options.seed ^ fnv1a(kernel.op + "|" + kernel.key())));
  CaseContext ctx;
  ctx.kernel = kernel;
  ctx.rng = &rng;
  ctx.large = options.large;
  ctx.device_has = [&claimed](const std::string& op, const std::vector<bp_dtype>& dtypes) {
    return claimed.count(op + " " + dtype_key(dtypes, false)) > 0;
  };
  ctx.out = &cases;
  gen(ctx);
  return cases;
}

}  // namespace

std::vector<Case> cases_for_kernel(const KernelSpec& kernel, Device& device, const Options& options) {
  const CaseGenerator* gen = find_op_cases(kernel.op);
  if (!gen) return {};
  return generate(kernel, device, options, *gen);
}

namespace {

// Cases for a vendor op whose manifest gives a decomposition: test_shapes x
// test_params over the standard layouts, checked against the decomposition
// run on the CPU plugin.
std::vector<Case> decomposition_cases(Runtime& rt, const VendorOpInfo& decl, const KernelSpec& kernel,
                                      Device& device, const Options& options) {
  // The reference: the op's decomposition in standard ops on the CPU plugin
  // (vendor kernels off, so not the CPU's own kernel of the op, if any).
  Device* ref = nullptr;
  for (Device* d : rt.all_devices())
    if (d->plugin_name() == "cpu") ref = d;
  if (!ref) throw NoCases("the CPU plugin, which runs the decomposition as the reference, is not available");
  if (decl.test_shapes.empty()) throw NoCases("the manifest gives no test_shapes for " + decl.op);
  const std::string op = decl.op;
  const size_t n_out = decl.outputs.size();
  std::vector<Json> params = decl.test_params;
  if (params.empty()) params.push_back(Json::object());
  return generate(kernel, device, options, [&](CaseContext& ctx) {
    for (const auto& shapes : decl.test_shapes)
      for (const auto& p : params) {
        OpSpec spec;
        spec.op = op;
        spec.params = p;
        spec.tol = decl.tolerance == "elementwise" ? TolClass::Elementwise : TolClass::Compound;
        spec.note = "(reference: its decomposition on " + ref->name() + ")";
        for (size_t i = 0; i < shapes.size(); ++i)
          spec.inputs.push_back({"x" + std::to_string(i), kernel.in(i), shapes[i],
                                 decl.test_ranges.empty()
                                     ? fill_uniform(decl.test_range[0], decl.test_range[1])
                                     : fill_uniform(decl.test_ranges[i][0], decl.test_ranges[i][1])});
        spec.reference = [&rt, ref, op, n_out](const std::vector<const HostTensor*>& in, const Json& prm) {
          Graph g;
          std::map<std::string, HostTensor> feed;
          std::vector<std::string> names;
          for (size_t i = 0; i < in.size(); ++i) {
            names.push_back("x" + std::to_string(i));
            g.input(names.back(), in[i]->dtype, in[i]->shape);
            feed[names.back()] = *in[i];
          }
          g.node("y", op, names, prm);
          std::vector<std::string> outs;
          if (n_out == 1) {
            outs.push_back("y");
          } else {
            for (size_t s = 0; s < n_out; ++s) {
              outs.push_back("slot" + std::to_string(s));
              g.node(outs.back(), "view", {"y"}, {{"slot", s}});
            }
          }
          for (const auto& o : outs) g.output(o);
          CompileOptions co;
          co.vendor_kernels = false;
          Plan plan = rt.compile(g, *ref, co);
          auto got = plan.run(feed);
          std::vector<RefTensor> want;
          for (const auto& o : outs) want.push_back(RefTensor::from_host(got.at(o)));
          return want;
        };
        ctx.add(spec);
      }
  });
}

}  // namespace

CaseResult run_case(Runtime& rt, Device& device, const Case& c, const Options& options) {
  CaseResult r;
  CompileOptions co;
  co.poison_outputs = options.poison_outputs;
  std::map<std::string, HostTensor> outs;
  try {
    Plan plan;
    if (options.fallback_device && options.fallback_device != &device) {
      // The op under test stays on the device; the rest may fall back.
      Graph g = c.graph;
      g.pin("y", device.name());
      plan = rt.compile(g, std::vector<Device*>{&device, options.fallback_device}, co);
    } else {
      plan = rt.compile(c.graph, device, co);
    }
    outs = plan.run(c.inputs);
  } catch (const Error& e) {
    r.message = std::string("backplane::Error: ") + e.what();
    return r;
  } catch (const std::exception& e) {
    r.message = std::string("unexpected exception: ") + e.what();
    return r;
  }
  r.check = check_outputs(c, outs, nullptr, 1.0);
  if (!r.check.ok) {
    r.message = r.check.message;
    return r;
  }
  if (options.compare_device && options.compare_device != &device) {
    // Differential check, skipped where the other device cannot run the case
    // (its own conformance run reports that). Both within tolerance of the
    // reference means within twice the tolerance of each other.
    std::map<std::string, HostTensor> other;
    try {
      Plan plan = rt.compile(c.graph, *options.compare_device, co);
      other = plan.run(c.inputs);
    } catch (const std::exception&) {
      other.clear();
    }
    std::map<std::string, RefTensor> want;
    for (const auto& e : c.expected) {
      auto it = other.find(e.name);
      if (it == other.end() || it->second.dtype != e.value.dtype || it->second.shape != e.value.shape ||
          it->second.bytes.size() != static_cast<size_t>(e.value.numel()) * dtype_size(e.value.dtype)) {
        want.clear();
        break;
      }
      want[e.name] = RefTensor::from_host(it->second);
    }
    if (!want.empty()) {
      const CheckResult d = check_outputs(c, outs, &want, 2.0);
      if (!d.ok) {
        r.message = "differs from " + options.compare_device->name() + ": " + d.message;
        return r;
      }
    }
  }
  r.ok = true;
  return r;
}

std::string run_error_case(Runtime& rt, Device& device, const ErrorCase& e, const Options& options) {
  CompileOptions co;
  co.poison_outputs = options.poison_outputs;
  Plan plan;
  try {
    plan = rt.compile(e.graph, device, co);
  } catch (const Error& err) {
    if (!mentions(err.what(), e.mention))
      return std::string("compile error does not name the op or node: \"") + err.what() + "\"";
    return "";  // rejected before running: as good as failing the run
  } catch (const std::exception& err) {
    return std::string("compile threw a non-backplane exception: ") + err.what();
  }
  try {
    plan.run(e.inputs);
    return "no error: compile and run both succeeded";
  } catch (const Error& err) {
    if (!mentions(err.what(), e.mention))
      return std::string("run error does not name the op or node: \"") + err.what() + "\"";
  } catch (const std::exception& err) {
    return std::string("run threw a non-backplane exception: ") + err.what();
  }
  if (!e.recover_expected) return "";
  try {
    const auto outs = plan.run(e.recover_inputs);
    auto it = outs.find("y");
    if (it == outs.end()) return "after the error, the plan's rerun gave no output y";
    const CheckResult c =
        compare(it->second, *e.recover_expected, tolerance_for(e.recover_expected->dtype, TolClass::Exact));
    if (!c.ok) return "after the error, the plan's rerun on good data is wrong: " + c.message;
  } catch (const std::exception& err) {
    return std::string("after the error, the plan no longer runs: ") + err.what();
  }
  return "";
}

namespace {

void run_concurrency(Runtime& rt, Device& device, const Options& options,
                     const std::vector<KernelInfo>& kernels, Rows& rows) {
  // Several ops at once: one modest contiguous case per op, f32 preferred.
  std::vector<Case> picked;
  std::set<std::string> ops_done;
  Options small = options;
  small.large = false;
  std::vector<const KernelInfo*> order;
  for (const auto& k : kernels)
    if (k.dtypes.back() == BP_DTYPE_F32) order.push_back(&k);
  for (const auto& k : kernels)
    if (k.dtypes.back() != BP_DTYPE_F32) order.push_back(&k);
  for (const KernelInfo* k : order) {
    if (picked.size() >= 6) break;
    if (!selected(options, k->op) || ops_done.count(k->op)) continue;
    std::vector<Case> cs;
    try {
      cs = cases_for_kernel(KernelSpec::from(*k), device, small);
    } catch (const std::exception&) {
      continue;
    }
    const Case* best = nullptr;
    for (const auto& c : cs)
      if (c.layout == "contiguous" && c.work <= 20000 && (!best || c.work > best->work)) best = &c;
    if (!best) continue;
    ops_done.insert(k->op);
    picked.push_back(*best);
  }
  if (picked.empty()) return;
  if (options.progress) options.progress({"(concurrency)", "-", 0, 1, "concurrency"});
  ResultRow& row = rows.at("(concurrency)", "-", "threads");
  const int threads = std::max(2, options.threads);
  const int iterations = 10;
  std::vector<Plan> plans;
  std::vector<size_t> which;
  CompileOptions co;
  co.poison_outputs = options.poison_outputs;
  try {
    for (int t = 0; t < threads; ++t) {
      which.push_back(static_cast<size_t>(t) % picked.size());
      plans.push_back(rt.compile(picked[which.back()].graph, device, co));
    }
  } catch (const std::exception& e) {
    rows.record(row, false, nullptr, std::string("compile failed: ") + e.what(), "concurrency");
    return;
  }
  std::vector<std::string> failure(static_cast<size_t>(threads));
  std::vector<int> passed(static_cast<size_t>(threads), 0);
  std::vector<CheckResult> checks(static_cast<size_t>(threads));
  {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const auto ti = static_cast<size_t>(t);
        const Case& c = picked[which[ti]];
        for (int i = 0; i < iterations; ++i) {
          try {
            const auto outs = plans[ti].run(c.inputs);
            CheckResult r = check_outputs(c, outs, nullptr, 1.0);
            merge(checks[ti], r);
            if (r.ok) {
              ++passed[ti];
            } else if (failure[ti].empty()) {
              failure[ti] = c.label + ": " + r.message;
            }
          } catch (const std::exception& e) {
            if (failure[ti].empty()) failure[ti] = c.label + ": " + e.what();
          }
        }
      });
    }
    for (auto& th : pool) th.join();
  }
  for (int t = 0; t < threads; ++t) {
    const auto ti = static_cast<size_t>(t);
    for (int i = 0; i < iterations; ++i) {
      const bool ok = i < passed[ti];
      rows.record(row, ok, &checks[ti], failure[ti],
                  "thread " + std::to_string(t) + " (" + picked[which[ti]].op + ")");
    }
  }
}

}  // namespace

Report run_conformance(Runtime& rt, Device& device, const Options& options) {
  const auto t0 = std::chrono::steady_clock::now();
  Report rep;
  rep.device = device.name();
  rep.device_kind = device.kind();
  rep.device_description = device.description();
  rep.plugin = device.plugin_name();
  rep.date = utc_now();
  rep.seed = options.seed;
  for (const auto& p : rt.plugins()) {
    if (p.name != rep.plugin) continue;
    rep.plugin_version = p.version;
    rep.library = p.library_path.string();
    rep.library_hash = file_hash(p.library_path);
  }

  // One entry per (op, dtype key): a table may list a kernel twice.
  std::vector<KernelInfo> kernels;
  {
    std::set<std::string> seen;
    for (const auto& k : device.kernels())
      if (seen.insert(k.op + " " + dtype_key(k.dtypes, k.variadic)).second) kernels.push_back(k);
  }
  std::vector<const KernelInfo*> todo;
  for (const auto& k : kernels)
    if (selected(options, k.op)) todo.push_back(&k);

  Rows rows;
  for (size_t ki = 0; options.kernel_cases && ki < todo.size(); ++ki) {
    const KernelSpec spec = KernelSpec::from(*todo[ki]);
    if (options.progress) options.progress({spec.op, spec.key(), ki, todo.size(), "cases"});
    std::vector<Case> cases;
    const VendorOpInfo* decl = rt.vendor_op(spec.op);
    try {
      if (!find_op_cases(spec.op) && decl && decl->has_decomposition() && decl->test_shapes.empty()) {
        ResultRow& row = rows.at(spec.op, spec.key(), "-");
        row.not_covered = true;
        row.first_failure =
            "vendor op: unverified (its manifest gives a decomposition but no test_shapes to check it on)";
        continue;
      }
      if (!find_op_cases(spec.op) && decl && decl->has_decomposition())
        cases = decomposition_cases(rt, *decl, spec, device, options);
      else
        cases = cases_for_kernel(spec, device, options);
    } catch (const NoCases& e) {
      rows.at(spec.op, spec.key(), "-").first_failure = std::string("no cases: ") + e.what();
      continue;
    } catch (const std::exception& e) {
      rows.at(spec.op, spec.key(), "-").first_failure =
          std::string("no cases: case generation failed: ") + e.what();
      continue;
    }
    if (cases.empty()) {
      ResultRow& row = rows.at(spec.op, spec.key(), "-");
      if (spec.op.find('.') != std::string::npos) {
        row.not_covered = true;
        row.first_failure =
            "vendor op: unverified (its manifest gives no decomposition and no cases are registered)";
      } else {
        row.first_failure = "no cases: no generator is registered for op " + spec.op + " (register_op_cases)";
      }
      continue;
    }
    for (const Case& c : cases) {
      const CaseResult r = run_case(rt, device, c, options);
      rows.record(rows.at(c.op, c.dtype_key, c.layout), r.ok, &r.check, r.message, c.label);
    }
  }

  if (options.error_cases) {
    std::vector<ErrorCase> errors;
    try {
      errors = error_cases_for(kernels);
    } catch (const std::exception& e) {
      rows.at("(errors)", "-", "errors").first_failure =
          std::string("building the error cases failed: ") + e.what();
    }
    for (size_t i = 0; i < errors.size(); ++i) {
      const ErrorCase& e = errors[i];
      if (!selected(options, e.op)) continue;
      if (options.progress) options.progress({e.op, e.dtype_key, i, errors.size(), "errors"});
      const std::string why = run_error_case(rt, device, e, options);
      rows.record(rows.at(e.op, e.dtype_key, "errors"), why.empty(), nullptr, why, e.label);
    }
  }

  if (options.concurrency) run_concurrency(rt, device, options, kernels, rows);

  rep.rows = rows.take();
  apply_expected_failures(rep.rows, options);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

// ---------------------------------------------------------------------------
// Report

bool Report::all_passed() const {
  return std::all_of(rows.begin(), rows.end(), [](const ResultRow& r) { return r.ok(); });
}

int64_t Report::expected_failures() const {
  return std::count_if(rows.begin(), rows.end(), [](const ResultRow& r) { return r.xfail(); });
}

std::filesystem::path expected_failures_path(const std::filesystem::path& manifest) {
  auto p = manifest;
  return p.replace_extension(".xfail");
}

std::vector<ExpectedFailure> load_expected_failures(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw Error("cannot read the expected-failure list " + file.string());
  std::vector<ExpectedFailure> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    ExpectedFailure e;
    if (!(fields >> e.op)) continue;  // blank or comment
    e.where = file.filename().string() + ":" + std::to_string(n);
    if (!(fields >> e.dtype_key >> e.layout))
      throw Error(file.string() + ":" + std::to_string(n) +
                  ": an expected failure needs 'OP DTYPE-KEY LAYOUT [REASON]' (each may be a glob such as *), got '" +
                  line + "'");
    std::getline(fields >> std::ws, e.reason);
    out.push_back(std::move(e));
  }
  return out;
}

bool Report::any_unverified() const {
  return std::any_of(rows.begin(), rows.end(), [](const ResultRow& r) { return r.not_covered; });
}

int64_t Report::total_cases() const {
  int64_t n = 0;
  for (const auto& r : rows) n += r.cases;
  return n;
}

int64_t Report::total_passed() const {
  int64_t n = 0;
  for (const auto& r : rows) n += r.passed;
  return n;
}

std::vector<const ResultRow*> Report::failures() const {
  std::vector<const ResultRow*> f;
  for (const auto& r : rows)
    if (!r.ok()) f.push_back(&r);
  return f;
}

Json Report::to_json() const {
  Json results = Json::array();
  for (const auto& r : rows) {
    Json j = {{"op", r.op},
              {"dtype", r.dtype_key},
              {"layout", r.layout},
              {"cases", r.cases},
              {"passed", r.passed},
              {"ok", r.ok()},
              {"status", r.not_covered ? "not covered" : r.xfail() ? "expected failure" : r.xpass() ? "unexpected pass" : r.ok() ? "ok" : "failed"},
              {"worst_rel", r.worst_rel},
              {"worst_abs", r.worst_abs},
              {"worst_tolerance_ratio", r.worst_ratio}};
    if (!r.first_failure.empty()) j["first_failure"] = r.first_failure;
    if (r.xfail()) j["expected_failure"] = r.expected_failure;
    if (r.xpass()) j["unexpected_pass"] = r.unexpected_pass;
    results.push_back(std::move(j));
  }
  return Json{{"plugin", plugin},
              {"version", plugin_version},
              {"library", library},
              {"library_fnv1a64", library_hash},
              {"device", device},
              {"device_kind", device_kind},
              {"device_description", device_description},
              {"date", date},
              {"seed", seed},
              {"seconds", seconds},
              {"passed", all_passed()},
              {"total_cases", total_cases()},
              {"total_passed", total_passed()},
              {"expected_failures", expected_failures()},
              {"results", std::move(results)}};
}

std::string Report::table(bool failures_only) const {
  std::vector<std::vector<std::string>> cells = {
      {"op", "dtype", "layout", "cases", "passed", "worst err/tol", "result"}};
  for (const auto& r : rows) {
    if (failures_only && r.ok() && !r.xfail()) continue;
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.3g", r.worst_ratio);
    std::string result = r.not_covered ? "not covered: " + r.first_failure
                         : r.xfail()   ? "xfail (" + r.expected_failure + "): " + r.first_failure
                         : r.xpass()   ? "XPASS: listed as an expected failure at " + r.unexpected_pass +
                                           " but every row it names passed: remove the entry"
                         : r.ok()      ? "ok"
                                       : "FAIL " + r.first_failure;
    if (result.size() > 160) result = result.substr(0, 157) + "...";
    cells.push_back(
        {r.op, r.dtype_key, r.layout, std::to_string(r.cases), std::to_string(r.passed), ratio, result});
  }
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& row : cells)
    for (size_t k = 0; k + 1 < row.size(); ++k) width[k] = std::max(width[k], row[k].size());
  std::ostringstream os;
  for (const auto& row : cells) {
    for (size_t k = 0; k < row.size(); ++k) {
      os << row[k];
      if (k + 1 < row.size()) os << std::string(width[k] - row[k].size() + 2, ' ');
    }
    os << '\n';
  }
  os << plugin << " " << plugin_version << " on " << device << ": " << total_passed() << "/" << total_cases()
     << " cases passed, " << failures().size() << " failing rows";
  if (const int64_t x = expected_failures()) os << ", " << x << " expected failures";
  os << ", " << seconds << " s\n";
  return os.str();
}

}  // namespace backplane::conformance
