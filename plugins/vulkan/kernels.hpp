// What every kernel family shares: the kernel table rows, the call context,
// operand binding (storage + layout -> descriptor window + element offset),
// dim coalescing and argument blocks.
#pragma once

#include "device.hpp"

#include <array>
#include <string>
#include <vector>

namespace backplane::vulkan {

struct Row;

struct Call {
  Device& dev;
  Stream& stream;  // the run this call belongs to
  const Row& row;
  const bp_storage* in;
  size_t n_in;
  const bp_storage* out;
  const bp_layout* layouts;
  const bp_op_params* params;

  const bp_layout& lin(size_t i) const { return layouts[i]; }
  const bp_layout& lout() const { return layouts[n_in]; }
  const char* op() const;
  bool present(size_t i) const { return in[i].buffer_handle != 0; }
  // A CPU device (lavapipe): the direct, one-pass and block forms measured there.
  // Whether to take the direct forms made for CPU devices (Device::direct_forms).
  bool cpu_device() const { return dev.direct_forms; }
  // The op's params, checked to be of `kind`.
  const bp_op_params& params_of(bp_params_kind kind) const;
};

using KernelImpl = void (*)(Call&);

struct Row {
  std::string op;
  std::vector<bp_dtype> dtypes;  // inputs, then the output (slot 0 for bundles)
  KernelImpl impl = nullptr;
  int code = 0;  // family-specific op code
  uint32_t bundle_slots = 0;
  bool variadic = false;
  // Bit k: dtype key entry k is an i64 index read/written as int32 pairs
  // (needs no shaderInt64).
  uint32_t index_mask = 0;
  // The kernel checks its inputs' dtypes itself (fused_elementwise: inputs
  // after x0 may be bool).
  bool own_input_dtypes = false;
};

class Registry {
 public:
  // layouts: per input, BP_LAYOUT_STRIDED or BP_LAYOUT_CONTIGUOUS.
  void add(const std::string& op, std::vector<bp_dtype> dtypes, std::vector<uint8_t> layouts, KernelImpl impl,
           int code = 0, uint32_t bundle_slots = 0, bool variadic = false, uint32_t index_mask = 0);
  const sdk::KernelTable& table() const { return table_; }
  const std::vector<Row>& rows() const { return rows_; }

 private:
  sdk::KernelTable table_;
  std::vector<Row> rows_;
};

const Registry& registry();
bp_error* kernel_entry(const bp_kernel_context* ctx, const bp_storage* inputs, size_t n_inputs,
                       const bp_storage* outputs, size_t n_outputs, const bp_layout* layouts,
                       const bp_op_params* params);

// Family registration (kernels_*.cpp).
void register_eltwise(Registry& r);
void register_reduce(Registry& r);
void register_index(Registry& r);
void register_linalg(Registry& r);
void register_scan(Registry& r);

// ---------------------------------------------------------------------------

constexpr uint8_t S = BP_LAYOUT_STRIDED;
constexpr uint8_t C = BP_LAYOUT_CONTIGUOUS;

inline uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
std::string dt(bp_dtype d);  // dtype name
std::string shader(const std::string& family, bp_dtype d);
std::string shader(const std::string& family, bp_dtype a, bp_dtype b);

// A storage viewed through a layout, bound as a storage-buffer window.
struct Operand {
  Binding binding;
  int64_t offset = 0;  // element offset of the layout origin from the window start
};
// extra_bytes: byte offset inside the storage (bundle slots).
Operand bind(Call& c, const bp_storage& s, const bp_layout& l, bp_dtype dt, bool write, uint64_t extra_bytes = 0);
// The window of a whole dense range of `count` elements at extra_bytes.
Operand bind_dense(Call& c, const bp_storage& s, int64_t count, bp_dtype dt, bool write, uint64_t extra_bytes = 0);
// A 4-byte dummy binding for absent optional inputs.
Operand bind_dummy(Call& c);
// Copies layout `il` of `in` into layout `ol` (same shape) of `out`, dtype d.
void copy_strided(Call& c, const bp_storage& in, const bp_layout& il, const bp_storage& out, const bp_layout& ol,
                  bp_dtype d);

// The argument block of one dispatch (int32 words).
struct Args {
  std::vector<int32_t> w;
  void i32(int64_t v);  // throws when v does not fit
  void u32(uint64_t v);
  void f32(double v);
  void f64(double v);  // two words
  void i64(int64_t v);  // two words
  size_t size() const { return w.size(); }
};

// Dims of `shape` coalesced over K operands' strides: size-1 dims dropped,
// adjacent dims merged where every operand allows it (row-major order kept).
struct Coalesced {
  int rank = 0;
  std::array<int64_t, BP_MAX_RANK> shape{};
  std::vector<std::array<int64_t, BP_MAX_RANK>> strides;
};
Coalesced coalesce(uint32_t rank, const int64_t* shape, const std::vector<const int64_t*>& strides);

// Writes the elementwise argument header: rank, flags, shape, then one
// record per operand (offset + strides).
void elementwise_header(Args& a, const Coalesced& c, const std::vector<int64_t>& offsets, bool fast);

// Row kernels (shaders/rows.glsl): the input split into rows (outer dims)
// of elements (inner dims, bit d of inner_mask set).
struct RowPlan {
  int64_t outer_n = 1;
  int64_t inner_n = 1;
  uint32_t mode = 0;  // 0: a workgroup per row, 1: an invocation per row
  uint64_t groups = 0;
  // The coalesced split (for a family's own choice of mode): ranks, the
  // input and output strides of the outer and of the inner dims.
  int outer_rank = 0, inner_rank = 0;
  std::array<int64_t, BP_MAX_RANK> outer_in{}, outer_out{}, inner_in{}, inner_out{};
  uint32_t vec = 0;                 // RVEC, specialization constant 2 (rows.glsl)
  std::array<int32_t, 4> pwords{};  // pc.p of the dispatch
};
// out_strides: the output stride of each input dim (0 where a reduction
// collapses it). Writes the 54-word row header.
// cpu_rows: the device is a CPU (long contiguous rows may go one per
// invocation when there are many).
RowPlan row_header(Args& a, const bp_layout& in, const int64_t* out_strides, uint32_t inner_mask, int64_t in_off,
                   int64_t out_off, bool allow_per_thread = true, bool cpu_rows = false);
// Output strides per input dim for a reduction over `mask` whose output is
// dense over the kept dims.
std::array<int64_t, BP_MAX_RANK> reduced_out_strides(const bp_layout& in, uint32_t mask);
// spec with the row mode as specialization constant 1 (RMODE, shaders/rows.glsl).
std::vector<int32_t> row_spec(std::vector<int32_t> spec, uint32_t mode);
void dispatch_rows(Call& c, const std::string& shader_name, const std::vector<int32_t>& spec,
                   std::vector<Binding> bindings, const Args& a, const RowPlan& p);

// Dense row-major strides of a shape.
std::array<int64_t, BP_MAX_RANK> dense_strides(uint32_t rank, const int64_t* shape);
int64_t numel(const bp_layout& l);

}  // namespace backplane::vulkan
