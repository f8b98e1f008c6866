// Independent f64 reference implementations of every docs/ops.md op.
//
// They work on dense row-major HostTensors and are written to be obviously
// correct, not fast: plain loops over multi-indices, f64 arithmetic for
// floats, exact int64 arithmetic (with explicit two's-complement wrap) for
// integers. Nothing here shares code with a plugin or with the core's
// planner; only the SDK's f16/bf16 conversions and the HostTensor struct
// (its public fields) are used.
#pragma once

#include <backplane/backplane.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace backplane::conformance {

// ---------------------------------------------------------------------------
// Dense row-major helpers

int64_t shape_numel(const Shape& shape);
std::vector<int64_t> dense_strides(const Shape& shape);

// Row-major odometer over a shape. An empty shape (rank 0) yields one index;
// a shape with a 0 dim yields none.
//   for (MultiIndex m(shape); m; ++m) use(m.idx(), m.flat());
class MultiIndex {
 public:
  explicit MultiIndex(Shape shape);
  explicit operator bool() const { return !done_; }
  MultiIndex& operator++();
  const std::vector<int64_t>& idx() const { return idx_; }
  int64_t operator[](size_t k) const { return idx_[k]; }
  int64_t flat() const { return flat_; }

 private:
  Shape shape_;
  std::vector<int64_t> idx_;
  int64_t flat_ = 0;
  bool done_ = false;
};

// Element access that does not go through the core (the reference must not
// inherit a core bug). Floats are read exactly; integers exactly as int64
// (u8 as 0..255, bool as 0/1).
HostTensor make_tensor(bp_dtype dtype, Shape shape);  // zero-filled
double load_f64(const HostTensor& t, int64_t i);
int64_t load_i64(const HostTensor& t, int64_t i);
// Stores round to nearest even (halves via f32) and integers wrap.
void store_f64(HostTensor& t, int64_t i, double v);
void store_i64(HostTensor& t, int64_t i, int64_t v);

// v rounded to what a value of float dtype `d` can hold (overflow -> inf).
double round_to_dtype(double v, bp_dtype d);
// v wrapped (two's complement) into integer dtype `d`; bool: v != 0.
int64_t wrap_to_dtype(int64_t v, bp_dtype d);
// Smallest / largest value of an integer dtype.
int64_t int_min(bp_dtype d);
int64_t int_max(bp_dtype d);

// ---------------------------------------------------------------------------
// Reference results

// A reference result: float dtypes keep f64 values already rounded to the
// dtype (so overflow shows as inf, as it does on a device); integer and bool
// dtypes keep exact int64 values.
struct RefTensor {
  bp_dtype dtype = BP_DTYPE_INVALID;
  Shape shape;
  std::vector<double> f;   // float dtypes
  std::vector<int64_t> i;  // integer and bool dtypes

  RefTensor() = default;
  RefTensor(bp_dtype dtype, Shape shape);  // zero-filled
  bool is_float_dtype() const;
  int64_t numel() const;
  double get(int64_t k) const;  // as double (ints converted)
  int64_t get_int(int64_t k) const;
  void set(int64_t k, double v);       // rounds to dtype
  void set_int(int64_t k, int64_t v);  // wraps to dtype
  HostTensor to_host() const;
  static RefTensor from_host(const HostTensor& t);
};

// A data-dependent error that docs/ops.md defines (index out of range, integer
// division by zero, float->int cast of NaN/inf/out-of-range, max of an empty
// axis). Case generators avoid them; error cases expect them.
class ReferenceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Evaluates `op` on dense inputs. `inputs[k] == nullptr` is an absent
// optional input. Returns the op's output, or one tensor per slot for the
// bundled ops (topk: values, indices; var_mean: var, mean; selective_scan:
// y, last_state). Throws ReferenceError as above, std::invalid_argument for
// an op it does not know or params it cannot use.
// View ops (reshape, permute, transpose, broadcast_to, slice, squeeze,
// unsqueeze, contiguous) return the viewed data, densely.
std::vector<RefTensor> reference(const std::string& op, const std::vector<const HostTensor*>& inputs,
                                 const Json& params);

// The same, with the view ops returning a HostTensor (used to realise input
// layouts: logical input = views applied to a source tensor).
HostTensor reference_view(const std::string& op, const HostTensor& x, const Json& params);

// Every op `reference` knows.
const std::vector<std::string>& reference_ops();

}  // namespace backplane::conformance
