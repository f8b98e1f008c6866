// Comparing a device's results with a reference, with docs/ops.md's tolerances.
#pragma once

#include "conformance/reference.hpp"

#include <string>

namespace backplane::conformance {

// The op classes docs/ops.md gives different tolerances.
enum class TolClass {
  Exact,        // data movement and IEEE-exact results: bit for bit, zeros' signs too
  Selection,    // one of the inputs' elements picked by comparison (max_pool2d):
                // exact, but which zero is the larger of -0 and +0 is not specified
  Elementwise,  // single elementwise ops: f32 rel 1e-5
  Compound,     // reductions, matmul, conv, scans, norms: f32 rel 1e-4
  Probability,  // softmax: Compound's relative bounds, absolute floors far below 1/row's length
};

struct Tolerance {
  double rel = 0;
  double abs = 0;
  // Exact, and a zero must keep its sign: results that are copies of input
  // elements (layouts, gathers, concat, slice_update, max pooling, bundles).
  bool signed_zero = false;
  bool exact() const { return rel == 0 && abs == 0; }
};

// docs/ops.md: integers and bool exact; the Exact class (data movement) bit
// for bit in every float dtype, the sign of zero included (NaN payloads
// aside); f64 1e-12 otherwise; f32 1e-5 (elementwise) or 1e-4 (compound),
// abs 1e-6; f16 1e-2; bf16 2e-2 (rel and abs).
Tolerance tolerance_for(bp_dtype dtype, TolClass cls);
const char* tol_class_name(TolClass cls);

struct CheckResult {
  bool ok = true;
  int64_t mismatches = 0;
  double worst_abs = 0;    // max |got - want| over finite elements
  double worst_rel = 0;    // max |got - want| / |want| where the relative bound governs
  double worst_ratio = 0;  // max error as a fraction of the tolerance (<= 1 passes)
  std::string message;     // the first failure, empty when ok
};

// An element passes when relative OR absolute error is within bound; NaN
// must meet NaN, an infinity the same infinity; integers must be equal.
// The sign of a zero is compared only with signed_zero (the Exact class).
CheckResult compare(const RefTensor& got, const RefTensor& want, const Tolerance& tol);
CheckResult compare(const HostTensor& got, const RefTensor& want, const Tolerance& tol);

// Folds `b` into `a` (worst errors, first message, ok).
void merge(CheckResult& a, const CheckResult& b);

// topk with sorted=false may return any order: puts each row along `dim` in
// ascending index order (values follow their indices), so two results
// compare as sets.
void sort_rows_by_index(RefTensor& values, RefTensor& indices, int64_t dim);

std::string index_str(const Shape& shape, int64_t flat);
std::string value_str(double v);

}  // namespace backplane::conformance
