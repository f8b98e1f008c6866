#include "kernels.hpp"

#include "fused.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>

namespace backplane::vulkan {

const char* Call::op() const { return row.op.c_str(); }

const bp_op_params& Call::params_of(bp_params_kind kind) const {
  BP_SDK_CHECK(params != nullptr && params->kind == kind, BP_ERR_INVALID_ARGUMENT,
             std::string(op()) + ": params of the wrong kind (resolver bug)");
  return *params;
}

void Registry::add(const std::string& op, std::vector<bp_dtype> dtypes, std::vector<uint8_t> layouts,
                   KernelImpl impl, int code, uint32_t bundle_slots, bool variadic, uint32_t index_mask) {
  Row r;
  r.op = op;
  r.dtypes = dtypes;
  r.impl = impl;
  r.code = code;
  r.bundle_slots = bundle_slots;
  r.variadic = variadic;
  r.index_mask = index_mask;
  r.own_input_dtypes = op == "fused_elementwise";
  rows_.push_back(std::move(r));
  table_.add(op, std::move(dtypes), std::move(layouts), &kernel_entry, bundle_slots,
             variadic ? static_cast<uint32_t>(BP_KERNEL_FLAG_VARIADIC) : 0u);
}

const Registry& registry() {
  static const Registry r = [] {
    Registry reg;
    register_eltwise(reg);
    register_reduce(reg);
    register_scan(reg);
    register_linalg(reg);
    register_index(reg);
    register_fused(reg);
    return reg;
  }();
  return r;
}

bp_error* kernel_entry(const bp_kernel_context* ctx, const bp_storage* inputs, size_t n_inputs,
                       const bp_storage* outputs, size_t n_outputs, const bp_layout* layouts,
                       const bp_op_params* params) {
  return sdk::guard([&] {
    BP_SDK_CHECK(ctx != nullptr && ctx->device != nullptr, BP_ERR_INVALID_ARGUMENT,
               "vulkan: kernel called without a device");
    const auto& rows = registry().rows();
    BP_SDK_CHECK(ctx->kernel_index < rows.size(), BP_ERR_INVALID_ARGUMENT, "vulkan: bad kernel index");
    const Row& row = rows[ctx->kernel_index];
    const size_t want = row.dtypes.size() - 1;
    BP_SDK_CHECK(
        n_outputs == 1 && outputs != nullptr && layouts != nullptr && (n_inputs == 0 || inputs != nullptr),
        BP_ERR_INVALID_ARGUMENT, row.op + ": expected one output");
    BP_SDK_CHECK(row.variadic ? n_inputs >= want : n_inputs == want, BP_ERR_INVALID_ARGUMENT,
               row.op + ": got " + std::to_string(n_inputs) + " inputs, expected " + std::to_string(want));
    for (size_t i = 0; i < n_inputs; ++i) {
      const bp_dtype expect = row.dtypes[std::min(i, want - 1)];
      BP_SDK_CHECK(inputs[i].buffer_handle == 0 || inputs[i].dtype == expect || row.own_input_dtypes, BP_ERR_INVALID_ARGUMENT,
                 row.op + ": input " + std::to_string(i) + " is " + dt(inputs[i].dtype) +
                     ", kernel expects " + dt(expect));
      const bp_layout& l = layouts[i];
      BP_SDK_CHECK(l.rank <= BP_MAX_RANK, BP_ERR_INVALID_ARGUMENT, row.op + ": rank > 8");
    }
    BP_SDK_CHECK(outputs[0].buffer_handle != 0, BP_ERR_INVALID_ARGUMENT, row.op + ": output has no buffer");
    BP_SDK_CHECK(outputs[0].dtype == row.dtypes.back(), BP_ERR_INVALID_ARGUMENT,
               row.op + ": output is " + dt(outputs[0].dtype) + ", kernel writes " + dt(row.dtypes.back()));
    BP_SDK_CHECK(
        row.bundle_slots == 0 || (outputs[0].n_slots == row.bundle_slots && outputs[0].slots != nullptr),
        BP_ERR_INVALID_ARGUMENT,
        row.op + ": expected a bundle of " + std::to_string(row.bundle_slots) + " slots");
    Device& dev = Device::from(ctx->device);
    std::lock_guard<std::mutex> lock(dev.mu);
    Stream& stream = dev.exec.stream(ctx->run, row.op.c_str());
    dev.exec.begin_call(stream);
    Call c{dev, stream, row, inputs, n_inputs, outputs, layouts, params};
    row.impl(c);
  });
}

// ---------------------------------------------------------------------------

std::string dt(bp_dtype d) { return std::string(dtype_name(d)); }
std::string shader(const std::string& family, bp_dtype d) { return family + "_" + dt(d); }
std::string shader(const std::string& family, bp_dtype a, bp_dtype b) { return family + "_" + dt(a) + "_" + dt(b); }

int64_t numel(const bp_layout& l) {
  int64_t n = 1;
  for (uint32_t i = 0; i < l.rank; ++i) n *= l.shape[i];
  return n;
}

std::array<int64_t, BP_MAX_RANK> dense_strides(uint32_t rank, const int64_t* shape) {
  std::array<int64_t, BP_MAX_RANK> s{};
  int64_t acc = 1;
  for (int i = static_cast<int>(rank) - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

namespace {

// Operand windows start at multiples of this: 64, so that 4-vectors of
// 64-bit elements are naturally aligned (the shaders declare their buffer
// references 16-byte aligned), or the device's descriptor offset alignment
// if larger (operands may be bound as storage-buffer descriptors).
uint64_t bind_alignment(const Device& d) {
  return std::max<uint64_t>(64, d.props.limits.minStorageBufferOffsetAlignment);
}

Operand window(Call& c, const bp_storage& s, int64_t lo_el, int64_t hi_el, int64_t origin_el, bp_dtype dtype,
               bool write, uint64_t extra_bytes) {
  const auto& a = c.dev.memory.get(s.buffer_handle);
  const int64_t es = static_cast<int64_t>(dtype_size(dtype));
  BP_SDK_CHECK(es > 0, BP_ERR_INVALID_ARGUMENT, std::string(c.op()) + ": bad dtype");
  // Everything must lie inside the storage, and the storage inside its buffer.
  BP_SDK_CHECK(s.byte_offset <= a.size && s.byte_size <= a.size - s.byte_offset, BP_ERR_INVALID_ARGUMENT,
             std::string(c.op()) + ": storage outside its buffer");
  const int64_t lo_b = static_cast<int64_t>(extra_bytes) + lo_el * es;
  const int64_t hi_b = static_cast<int64_t>(extra_bytes) + (hi_el + 1) * es;
  BP_SDK_CHECK(lo_b >= 0 && hi_b <= static_cast<int64_t>(s.byte_size), BP_ERR_INVALID_ARGUMENT,
             std::string(c.op()) + ": layout reaches outside its storage (bytes " + std::to_string(lo_b) +
                 ".." + std::to_string(hi_b) + " of " + std::to_string(s.byte_size) + ")");
  const uint64_t start = a.offset + s.byte_offset + static_cast<uint64_t>(lo_b);
  const uint64_t end = a.offset + s.byte_offset + static_cast<uint64_t>(hi_b);
  const uint64_t align = bind_alignment(c.dev);
  const uint64_t base = start / align * align;
  const uint64_t range = end - base;
  // No maxStorageBufferRange limit: a window past it is passed by device
  // address (Exec::dispatch).
  BP_SDK_CHECK((start - base) % static_cast<uint64_t>(es) == 0, BP_ERR_INVALID_ARGUMENT,
             std::string(c.op()) + ": storage not aligned to its element size");
  BP_SDK_CHECK(range / static_cast<uint64_t>(es) < (1ull << 31), BP_ERR_UNIMPLEMENTED,
             std::string(c.op()) + ": more than 2^31 elements in one view (vulkan plugin limit)");
  Operand o;
  o.binding.buffer = c.dev.memory.vk_buffer(a);
  o.binding.address = c.dev.memory.block_address(a);
  o.binding.offset = base;
  // Whole 4-vectors where the buffer allows, for the shaders' aliased
  // 4-vector views of a descriptor operand.
  o.binding.range = (range + 15) / 16 * 16;
  // Keep the padded range inside the VkBuffer.
  if (o.binding.offset + o.binding.range > a.offset + a.reserved) o.binding.range = range;
  o.binding.handle = s.buffer_handle;
  o.binding.write = write;
  o.offset = static_cast<int64_t>((start - base) / static_cast<uint64_t>(es)) + (origin_el - lo_el);
  return o;
}

}  // namespace

Operand bind(Call& c, const bp_storage& s, const bp_layout& l, bp_dtype dtype, bool write, uint64_t extra_bytes) {
  BP_SDK_CHECK(s.buffer_handle != 0, BP_ERR_INVALID_ARGUMENT,
             std::string(c.op()) + ": operand without a buffer");
  int64_t lo = l.offset, hi = l.offset;
  for (uint32_t i = 0; i < l.rank; ++i) {
    if (l.shape[i] == 0) return bind_dense(c, s, 0, dtype, write, extra_bytes);
    const int64_t span = (l.shape[i] - 1) * l.strides[i];
    (span < 0 ? lo : hi) += span;
  }
  return window(c, s, lo, hi, l.offset, dtype, write, extra_bytes);
}

Operand bind_dense(Call& c, const bp_storage& s, int64_t count, bp_dtype dtype, bool write, uint64_t extra_bytes) {
  if (count == 0) {
    // Nothing is touched: bind the smallest legal window at the storage start.
    const auto& a = c.dev.memory.get(s.buffer_handle);
    const uint64_t align = bind_alignment(c.dev);
    Operand o;
    o.binding.buffer = c.dev.memory.vk_buffer(a);
    o.binding.address = c.dev.memory.block_address(a);
    o.binding.offset = (a.offset + s.byte_offset) / align * align;
    o.binding.range = 4;
    o.binding.handle = s.buffer_handle;
    o.binding.write = write;
    return o;
  }
  return window(c, s, 0, count - 1, 0, dtype, write, extra_bytes);
}

Operand bind_dummy(Call& c) {
  // Any valid buffer works: the error words' neighbour is never read.
  // Use the first operand-free binding: the output's buffer window start.
  Operand o = bind_dense(c, c.out[0], 0, c.out[0].dtype, false);
  o.binding.handle = 0;
  return o;
}

void Args::i32(int64_t v) {
  BP_SDK_CHECK(v >= INT32_MIN && v <= INT32_MAX, BP_ERR_UNIMPLEMENTED,
             "vulkan: value " + std::to_string(v) + " exceeds the 32-bit index range of the shaders");
  w.push_back(static_cast<int32_t>(v));
}
void Args::u32(uint64_t v) {
  BP_SDK_CHECK(v <= UINT32_MAX, BP_ERR_UNIMPLEMENTED, "vulkan: value exceeds 32 bits");
  w.push_back(static_cast<int32_t>(static_cast<uint32_t>(v)));
}
void Args::f32(double v) {
  const float f = static_cast<float>(v);
  int32_t bits;
  std::memcpy(&bits, &f, 4);
  w.push_back(bits);
}
void Args::f64(double v) {
  int32_t bits[2];
  std::memcpy(bits, &v, 8);
  w.push_back(bits[0]);
  w.push_back(bits[1]);
}
void Args::i64(int64_t v) {
  int32_t bits[2];
  std::memcpy(bits, &v, 8);
  w.push_back(bits[0]);
  w.push_back(bits[1]);
}

Coalesced coalesce(uint32_t rank, const int64_t* shape, const std::vector<const int64_t*>& strides) {
  Coalesced c;
  const size_t k = strides.size();
  c.strides.assign(k, {});
  for (uint32_t i = 0; i < rank; ++i) {
    if (shape[i] == 1) continue;
    if (c.rank > 0) {
      bool merge = true;
      for (size_t j = 0; j < k; ++j)
        if (c.strides[j][c.rank - 1] != strides[j][i] * shape[i]) merge = false;
      if (merge) {
        c.shape[c.rank - 1] *= shape[i];
        for (size_t j = 0; j < k; ++j) c.strides[j][c.rank - 1] = strides[j][i];
        continue;
      }
    }
    c.shape[c.rank] = shape[i];
    for (size_t j = 0; j < k; ++j) c.strides[j][c.rank] = strides[j][i];
    ++c.rank;
  }
  return c;
}

void elementwise_header(Args& a, const Coalesced& c, const std::vector<int64_t>& offsets, bool fast) {
  a.i32(c.rank);
  a.i32(fast ? 1 : 0);
  for (int d = 0; d < BP_MAX_RANK; ++d) a.i32(d < c.rank ? c.shape[d] : 1);
  for (size_t k = 0; k < offsets.size(); ++k) {
    a.i32(offsets[k]);
    for (int d = 0; d < BP_MAX_RANK; ++d) a.i32(d < c.rank ? c.strides[k][d] : 0);
  }
}

// inner_mask: bit d set when input dim d belongs to a row. out_strides: the
// output stride of each input dim (0 where a reduction collapses it).
RowPlan row_header(Args& a, const bp_layout& in, const int64_t* out_strides, uint32_t inner_mask, int64_t in_off,
                   int64_t out_off, bool allow_per_thread, bool cpu_rows) {
  RowPlan p;
  bool inner_contiguous = false;
  for (int part = 0; part < 2; ++part) {
    const bool inner = part == 1;
    int64_t shape[BP_MAX_RANK], ist[BP_MAX_RANK], ost[BP_MAX_RANK];
    uint32_t r = 0;
    for (uint32_t d = 0; d < in.rank; ++d) {
      if (((inner_mask >> d) & 1u) != static_cast<uint32_t>(inner)) continue;
      shape[r] = in.shape[d];
      ist[r] = in.strides[d];
      ost[r] = out_strides[d];
      ++r;
    }
    int64_t n = 1;
    for (uint32_t i = 0; i < r; ++i) n *= shape[i];
    (inner ? p.inner_n : p.outer_n) = n;
    Coalesced c = coalesce(r, shape, {ist, ost});
    if (n == 0) c.rank = 0;
    if (inner) inner_contiguous = c.rank == 1 && c.strides[0][0] == 1;
    (inner ? p.inner_rank : p.outer_rank) = c.rank;
    for (int i = 0; i < c.rank; ++i) {
      (inner ? p.inner_in : p.outer_in)[i] = c.strides[0][i];
      (inner ? p.inner_out : p.outer_out)[i] = c.strides[1][i];
    }
    a.i32(c.rank);
    for (int i = 0; i < BP_MAX_RANK; ++i) a.i32(i < c.rank ? c.shape[i] : 1);
    for (int i = 0; i < BP_MAX_RANK; ++i) a.i32(i < c.rank ? c.strides[0][i] : 0);
    for (int i = 0; i < BP_MAX_RANK; ++i) a.i32(i < c.rank ? c.strides[1][i] : 0);
  }
  a.i32(in_off);
  a.i32(out_off);
  a.i32(p.inner_n);
  a.i32(p.outer_n);
  // On a CPU device (lavapipe) many contiguous rows go one per invocation
  // even when long: each lane streams its own row with no barriers, 2-3x
  // faster than a workgroup per row there (a GPU wants the workgroup).
  const bool per_thread =
      allow_per_thread && (p.inner_n <= 32 || (p.inner_n < 256 && p.outer_n >= 2048) ||
                           (cpu_rows && inner_contiguous && p.outer_n >= 2048));
  p.mode = per_thread ? 1 : 0;
  p.groups = per_thread ? ceil_div(p.outer_n, 256) : p.outer_n;
  BP_SDK_CHECK(p.groups < (1ull << 32), BP_ERR_UNIMPLEMENTED, "vulkan: too many rows");
  return p;
}

// Output strides per input dim for a reduction over `mask` whose output is
// dense over the kept dims.
std::array<int64_t, BP_MAX_RANK> reduced_out_strides(const bp_layout& in, uint32_t mask) {
  std::array<int64_t, BP_MAX_RANK> s{};
  int64_t acc = 1;
  for (int d = static_cast<int>(in.rank) - 1; d >= 0; --d) {
    if ((mask >> d) & 1u) continue;
    s[d] = acc;
    acc *= in.shape[d];
  }
  return s;
}

std::vector<int32_t> row_spec(std::vector<int32_t> spec, uint32_t mode) {
  spec.resize(2, 0);
  spec[1] = static_cast<int32_t>(mode);
  return spec;
}

void dispatch_rows(Call& c, const std::string& shader_name, const std::vector<int32_t>& spec,
                   std::vector<Binding> bindings, const Args& a, const RowPlan& p) {
  if (p.outer_n == 0) return;
  std::vector<int32_t> s = row_spec(spec, p.mode);
  if (p.vec != 0) s.push_back(static_cast<int32_t>(p.vec));
  const Pipeline& pl = c.dev.pipelines.get(shader_name, s, static_cast<uint32_t>(bindings.size()));
  c.dev.exec.dispatch(c.stream, pl, bindings, a.w, static_cast<uint32_t>(p.outer_n), p.mode, p.groups, c.op(), p.pwords);
}

}  // namespace backplane::vulkan
