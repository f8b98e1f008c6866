// Backplane's plugin conformance suite: runs every kernel a device claims
// against f64 references (and optionally against another device), feeds bad
// params and shapes, and runs plans from several threads at once.
//
//   auto rt = backplane::Runtime::create();
//   auto& dev = rt->device("cpu");
//   auto report = backplane::conformance::run_conformance(*rt, dev, {});
//   std::cout << report.table();
//   bool ok = report.all_passed();
#pragma once

#include "conformance/cases.hpp"
#include "conformance/check.hpp"
#include "conformance/reference.hpp"

#include <backplane/backplane.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace backplane::conformance {

struct Progress {
  std::string op;
  std::string dtype_key;
  size_t kernel_index = 0;  // 0-based, of kernel_count
  size_t kernel_count = 0;
  std::string phase;  // "cases", "errors", "concurrency"
};

// A row a plugin is known to fail today (its bring-up list), kept apart from
// what it never claims. Each pattern is a shell glob ("*", "f32,*"); a row
// matches when its op, dtype key and layout all match. A matched row that
// fails is reported as an expected failure and does not fail the run; an
// entry whose rows all pass fails it, so the list cannot rot.
struct ExpectedFailure {
  std::string op;
  std::string dtype_key = "*";
  std::string layout = "*";
  std::string reason;
  std::string where;  // "file:line", for messages
};

// The list a plugin may keep beside its manifest: "<manifest stem>.xfail"
// (acme.json -> acme.xfail). One entry per line, "OP DTYPE-KEY LAYOUT REASON...";
// '#' starts a comment. A malformed line is an Error naming file and line.
std::filesystem::path expected_failures_path(const std::filesystem::path& manifest);
std::vector<ExpectedFailure> load_expected_failures(const std::filesystem::path& file);

struct Options {
  std::string filter;             // run only ops whose name contains this
  std::vector<std::string> ops;   // run only these ops (exact names); empty = all
  uint64_t seed = 0x5eed5eedULL;  // cases depend on (seed, op, dtype key) only
  std::function<void(const Progress&)> progress;
  bool kernel_cases = true;    // the generated cases of every claimed kernel
  bool poison_outputs = true;  // garbage in every output before each kernel
  bool large = true;           // include the ~64K-element cases
  bool error_cases = true;     // bad params, shapes and data must give an Error
  bool concurrency = true;     // plans run from several threads at once
  int threads = 4;             // for the concurrency check
  // Differential: also compare every result with this device's (the CPU
  // plugin, say), where it claims the same kernel. nullptr = references only.
  Device* compare_device = nullptr;
  // Compile every case for the list {device, fallback}, with the op under
  // test pinned to `device`: views, copies and slots the device cannot
  // handle move to the fallback through transfers. nullptr = device alone.
  Device* fallback_device = nullptr;
  // Rows known to fail (see ExpectedFailure). With no filter and every phase
  // on, an entry that matches no row fails the run as stale.
  std::vector<ExpectedFailure> expected_failures;
};

// One row per (op, dtype key, layout); error cases use layout "errors", the
// concurrency check op "(concurrency)".
struct ResultRow {
  std::string op;
  std::string dtype_key;
  std::string layout;
  int64_t cases = 0;
  int64_t passed = 0;
  double worst_rel = 0;    // over elements where the relative bound governs
  double worst_abs = 0;
  double worst_ratio = 0;  // error as a fraction of docs/ops.md's tolerance
  std::string first_failure;
  // A vendor op ("acme.x") with neither a decomposition in its manifest nor
  // registered cases: reported as unverified, not failed (unless --strict).
  bool not_covered = false;
  // Expected failures: "file:line reason" of the entry that lists this row,
  // set when the row failed as listed (xfail), or when every row the entry
  // names passed, which fails the run (xpass: the entry is out of date).
  std::string expected_failure;
  std::string unexpected_pass;
  bool all_cases_passed() const { return cases > 0 && passed == cases; }
  bool xfail() const { return !expected_failure.empty(); }
  bool xpass() const { return !unexpected_pass.empty(); }
  bool ok() const {
    if (not_covered) return true;
    if (xpass()) return false;
    return xfail() || all_cases_passed();
  }
};

struct Report {
  std::string plugin;
  std::string plugin_version;
  std::string library;       // path of the plugin library
  std::string library_hash;  // FNV-1a 64 of its bytes, hex ("" if unreadable)
  std::string device;
  std::string device_kind;
  std::string device_description;
  std::string date;  // UTC, ISO 8601
  uint64_t seed = 0;
  double seconds = 0;
  std::vector<ResultRow> rows;

  bool all_passed() const;
  bool any_unverified() const;
  int64_t expected_failures() const;  // rows that failed as listed
  int64_t total_cases() const;
  int64_t total_passed() const;
  std::vector<const ResultRow*> failures() const;
  Json to_json() const;
  // Aligned text table: op, dtype, layout, cases, passed, worst error.
  std::string table(bool failures_only = false) const;
};

Report run_conformance(Runtime& rt, Device& device, const Options& options = {});

// Building blocks, for tests that want them one by one.

// The cases for one kernel (throws NoCases when its signature is not in
// docs/ops.md; an empty list when no generator is registered).
std::vector<Case> cases_for_kernel(const KernelSpec& kernel, Device& device, const Options& options);

struct CaseResult {
  bool ok = false;
  CheckResult check;
  std::string message;  // empty when ok
};
// Compiles (with poisoned outputs), runs and checks one case.
CaseResult run_case(Runtime& rt, Device& device, const Case& c, const Options& options);

// A bad graph or bad data that must raise backplane::Error (from compile or
// run), never crash; the message must name one of `mention`.
struct ErrorCase {
  std::string op;         // the row it belongs to
  std::string dtype_key;  // of the kernel it exercises
  std::string label;
  Graph graph;
  std::map<std::string, HostTensor> inputs;
  std::vector<std::string> mention;
  // Execute-time errors: afterwards the same plan must still run with these
  // inputs and give `recover_expected` for output "y".
  std::map<std::string, HostTensor> recover_inputs;
  std::optional<RefTensor> recover_expected;
};

// Error cases for the kernels a device claims (only those whose kernel is
// claimed, so an error comes from the check under test, not a missing
// kernel).
std::vector<ErrorCase> error_cases_for(const std::vector<KernelInfo>& kernels);
// Runs one; empty string when it behaved, else why not.
std::string run_error_case(Runtime& rt, Device& device, const ErrorCase& e, const Options& options);

}  // namespace backplane::conformance
