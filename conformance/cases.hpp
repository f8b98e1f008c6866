// The case registry: per op, a generator that turns one claimed kernel
// (op, dtype key, layout capabilities, bundle slots, variadic) into cases.
// Adding an op to Backplane means adding its cases here
// (register_op_cases), otherwise the runner reports the kernel as "no cases".
//
// Input layouts are realised in the graph with view nodes (transpose /
// permute, broadcast_to, slice with an offset, slice with a negative step),
// so a kernel sees a strided layout, or the planner inserts a Contiguize for
// a contiguous-only kernel: either way the results must match.
#pragma once

#include "conformance/check.hpp"
#include "conformance/reference.hpp"

#include <functional>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace backplane::conformance {

using Rng = std::mt19937_64;

// One row of a device's kernel table, as the cases see it.
struct KernelSpec {
  std::string op;
  std::vector<bp_dtype> dtypes;  // inputs, then output (a bundle's primary)
  std::vector<bp_layout_capability> layouts;
  uint32_t bundle_slots = 0;
  bool variadic = false;

  static KernelSpec from(const KernelInfo& k);
  size_t declared_inputs() const { return dtypes.empty() ? 0 : dtypes.size() - 1; }
  // Dtype of input i (for a variadic kernel the last declared one repeats).
  bp_dtype in(size_t i) const;
  bp_dtype out() const { return dtypes.back(); }
  bp_layout_capability layout(size_t i) const;
  // "f32,f32->bool"; a variadic last input is written "f32...".
  std::string key() const;
};

std::string dtype_key(const std::vector<bp_dtype>& dtypes, bool variadic);

// The input layouts a case can realise.
enum class LayoutKind { Contiguous, Broadcast, Transposed, Sliced, NegStep, Views };
const char* layout_name(LayoutKind k);
inline const std::vector<LayoutKind>& standard_layouts() {
  static const std::vector<LayoutKind> all = {LayoutKind::Contiguous, LayoutKind::Broadcast, LayoutKind::Transposed,
                                              LayoutKind::Sliced, LayoutKind::NegStep};
  return all;
}

struct ExpectedOutput {
  std::string name;  // a graph output
  RefTensor value;
};

// A ready-to-run case: a graph, its inputs, the reference results.
struct Case {
  std::string op;
  std::string dtype_key;
  std::string layout;
  std::string label;  // shapes and params, for failure messages
  Graph graph;
  std::map<std::string, HostTensor> inputs;
  std::vector<ExpectedOutput> expected;
  TolClass tol = TolClass::Elementwise;
  // topk sorted=false: (values, indices) output pairs compared as sets
  // along `unordered_dim`.
  std::vector<std::pair<std::string, std::string>> unordered_pairs;
  int64_t unordered_dim = -1;
  int64_t work = 0;  // elements touched, to pick modest cases for threads
};

// Fills a tensor (already shaped) with values that suit the op.
using Fill = std::function<void(HostTensor&, Rng&)>;

// A view node on the way from a graph input to the op's input.
struct ViewStep {
  std::string op;  // permute, transpose, broadcast_to, slice, reshape, squeeze, unsqueeze
  Json params;
};

struct InputSpec {
  InputSpec() = default;
  InputSpec(std::string n, bp_dtype d, Shape s, Fill f)
      : name(std::move(n)), dtype(d), shape(std::move(s)), fill(std::move(f)) {}

  std::string name;
  bp_dtype dtype = BP_DTYPE_INVALID;
  Shape shape;  // the logical shape the op sees
  Fill fill;
  bool absent = false;       // an optional input left out ("" in the node's inputs)
  bool allow_views = true;   // false: always fed densely
  // LayoutKind::Views: an explicit chain from a source of `source_shape`.
  std::optional<Shape> source_shape;
  std::vector<ViewStep> views;
};

// One logical case, expanded into one Case per applicable layout.
struct OpSpec {
  std::string op;
  Json params = Json::object();
  std::vector<InputSpec> inputs;
  TolClass tol = TolClass::Elementwise;
  std::vector<LayoutKind> layouts = standard_layouts();
  std::string note;  // added to the label
  bool unordered = false;  // topk sorted=false
  int64_t unordered_dim = -1;
  // The reference for ops the built-in `reference` does not know (vendor
  // ops such as "acme.swiglu"): logical inputs (nullptr = absent) and params
  // to one result per output or bundle slot.
  std::function<std::vector<RefTensor>(const std::vector<const HostTensor*>&, const Json&)> reference;
};

// What a generator gets.
struct CaseContext {
  KernelSpec kernel;
  Rng* rng = nullptr;
  bool large = true;  // include ~64K-element cases
  // Whether the device claims kernel (op, dtypes): a contiguous-only input
  // gets strided layouts only when the device can contiguize its dtype.
  std::function<bool(const std::string&, const std::vector<bp_dtype>&)> device_has;
  std::vector<Case>* out = nullptr;

  // Expands `spec` over its layouts and appends the cases.
  void add(const OpSpec& spec);
  Rng& r() { return *rng; }
};

using CaseGenerator = std::function<void(CaseContext&)>;

// A generator that cannot serve a kernel (its signature is not in docs/ops.md)
// throws this; the runner reports the kernel as failed with the reason.
class NoCases : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A vendor op brings its reference with its cases, e.g.
//   register_op_cases("acme.twice", [](CaseContext& ctx) {
//     for (Shape s : elementwise_shapes(ctx.large)) {
//       OpSpec spec;
//       spec.op = "acme.twice";
//       spec.inputs = {{"x", ctx.kernel.in(0), s, fill_uniform(-10, 10)}};
//       spec.reference = [](const std::vector<const HostTensor*>& in, const Json&) {
//         RefTensor y = RefTensor::from_host(*in[0]);
//         for (auto& v : y.f) v = 2 * v;
//         return std::vector<RefTensor>{y};
//       };
//       ctx.add(spec);
//     }
//   });
void register_op_cases(const std::string& op, CaseGenerator generator);
const CaseGenerator* find_op_cases(const std::string& op);
std::vector<std::string> registered_ops();

// ---------------------------------------------------------------------------
// Fills

Fill fill_uniform(double lo, double hi);           // floats: U[lo,hi); ints: integers in [ceil lo, floor hi]
Fill fill_ints(int64_t lo, int64_t hi);            // exact integers (any dtype)
Fill fill_full_range();                            // ints: the dtype's whole range; floats: U[-100,100)
Fill fill_bools();
Fill fill_discrete(std::vector<double> values);    // picks among values (ties on purpose)
Fill fill_nonzero(double lo, double hi);           // |v| in [lo,hi), random sign; ints: nonzero
// After `base`, about `fraction` of the elements (at least one when the
// tensor has >= 4) become one of `specials` (floats only).
Fill with_specials(Fill base, std::vector<double> specials, double fraction = 0.1);

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Dtype sets of docs/ops.md.
const std::vector<bp_dtype>& float_dtypes();
const std::vector<bp_dtype>& int_dtypes();
const std::vector<bp_dtype>& all_dtypes();
bool in_set(bp_dtype d, const std::vector<bp_dtype>& set);

// Shape lists shared by generators.
std::vector<Shape> elementwise_shapes(bool large);

// Registers every built-in generator (called once by the registry).
void register_elementwise_cases();
void register_reduction_cases();
void register_linalg_cases();
void register_bundle_cases();
void register_layout_cases();

}  // namespace backplane::conformance
