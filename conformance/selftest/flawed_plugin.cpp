// A plugin with known flaws, so the conformance suite can prove it catches
// them (tests/test_ops.cpp, "the suite catches a flawed plugin"):
//   add   f32  leaves the last output element unwritten (poison shows it)
//   neg   f32  declares strided input but ignores strides and offset
//   relu  f32  turns NaN into 0
//   round f32  rounds halves away from zero
//   div   i32  returns 0 for a division by zero instead of an error
//   topk  f32  breaks ties toward the higher index
// and kernels without flaws, which must pass on every layout:
//   selftest.twice f32  a vendor op (y = 2x) with its own shape inference;
//                       its cases come from the test (register_op_cases)
//   exp   f32  contiguous-only input (the planner contiguizes for it)
//   contiguous f32, i32, i64  the strided copy
#include <backplane/abi.h>
#include <backplane/sdk/api.hpp>
#include <backplane/sdk/plugin.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

namespace sdk = backplane::sdk;

namespace {

template <typename T, typename F>
void unary(const bp_storage* in, const bp_storage* out, const bp_layout* layouts, F&& f) {
  const sdk::View<const T> x(in[0], layouts[0]);
  T* o = static_cast<T*>(out[0].data);
  int64_t i = 0;
  sdk::StridedWalker<1> walk(layouts[1].rank, layouts[1].shape, {&layouts[0]});
  walk.run_all([&](const int64_t* off, int64_t count, const int64_t* st) {
    for (int64_t k = 0; k < count; ++k) o[i++] = f(x.base[off[0] + k * st[0]]);
  });
}

bp_error* contiguous_f32(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                         const bp_layout* layouts, const bp_op_params*) {
  return sdk::guard([&] { unary<float>(in, out, layouts, [](float v) { return v; }); });
}
bp_error* contiguous_i32(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                         const bp_layout* layouts, const bp_op_params*) {
  return sdk::guard([&] { unary<int32_t>(in, out, layouts, [](int32_t v) { return v; }); });
}
bp_error* contiguous_i64(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                         const bp_layout* layouts, const bp_op_params*) {
  return sdk::guard([&] { unary<int64_t>(in, out, layouts, [](int64_t v) { return v; }); });
}
bp_error* exp_f32(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                  const bp_layout* layouts, const bp_op_params*) {
  return sdk::guard([&] { unary<float>(in, out, layouts, [](float v) { return std::exp(v); }); });
}
bp_error* twice_f32(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                    const bp_layout* layouts, const bp_op_params*) {
  return sdk::guard([&] { unary<float>(in, out, layouts, [](float v) { return 2.0f * v; }); });
}
bp_error* infer_custom_op(void*, bp_string op, const bp_dtype* in_dtypes, const bp_layout* in_layouts, size_t n_inputs,
                          const bp_op_params*, bp_dtype* out_dtype, bp_layout* out_layout) {
  return sdk::guard([&] {
    sdk::check(sdk::to_sv(op) == "selftest.twice", BP_ERR_INVALID_ARGUMENT, "unknown vendor op");
    sdk::check(n_inputs == 1, BP_ERR_INVALID_ARGUMENT, "selftest.twice takes one input");
    *out_dtype = in_dtypes[0];
    *out_layout = sdk::contiguous_layout(in_layouts[0].shape, in_layouts[0].rank);
  });
}
bp_error* relu_f32(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                   const bp_layout* layouts, const bp_op_params*) {
  return sdk::guard([&] { unary<float>(in, out, layouts, [](float v) { return v > 0 ? v : 0.0f; }); });
}
bp_error* round_f32(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                    const bp_layout* layouts, const bp_op_params*) {
  return sdk::guard([&] { unary<float>(in, out, layouts, [](float v) { return std::round(v); }); });
}
bp_error* neg_f32(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                  const bp_layout* layouts, const bp_op_params*) {
  return sdk::guard([&] {
    const float* x = static_cast<const float*>(in[0].data);
    float* o = static_cast<float*>(out[0].data);
    // As if dense from the storage start (reads stay inside the storage).
    const auto avail = static_cast<int64_t>(in[0].byte_size / sizeof(float));
    for (int64_t i = 0; i < sdk::numel(layouts[1]); ++i) o[i] = -x[std::min(i, avail - 1)];
  });
}

template <typename T, typename F>
void binary(const bp_storage* in, const bp_storage* out, const bp_layout* layouts, int64_t skip_last, F&& f) {
  const sdk::View<const T> a(in[0], layouts[0]), b(in[1], layouts[1]);
  T* o = static_cast<T*>(out[0].data);
  const int64_t n = sdk::numel(layouts[2]) - skip_last;
  int64_t i = 0;
  sdk::StridedWalker<2> walk(layouts[2].rank, layouts[2].shape, {&layouts[0], &layouts[1]});
  walk.run_all([&](const int64_t* off, int64_t count, const int64_t* st) {
    for (int64_t k = 0; k < count; ++k, ++i)
      if (i < n) o[i] = f(a.base[off[0] + k * st[0]], b.base[off[1] + k * st[1]]);
  });
}

bp_error* add_f32(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                  const bp_layout* layouts, const bp_op_params*) {
  return sdk::guard([&] { binary<float>(in, out, layouts, 1, [](float x, float y) { return x + y; }); });
}
bp_error* div_i32(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                  const bp_layout* layouts, const bp_op_params*) {
  return sdk::guard([&] {
    binary<int32_t>(in, out, layouts, 0, [](int32_t x, int32_t y) {
      if (y == 0) return int32_t{0};
      if (y == -1) return static_cast<int32_t>(0u - static_cast<uint32_t>(x));
      return static_cast<int32_t>(x / y);
    });
  });
}

bp_error* topk_f32(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                   const bp_layout* layouts, const bp_op_params* params) {
  return sdk::guard([&] {
    sdk::check(params && params->kind == BP_PARAMS_TOPK && out[0].n_slots == 2, BP_ERR_INTERNAL, "topk: bad call");
    const bp_layout& xl = layouts[0];
    const int32_t dim = params->u.topk.dim;
    const int64_t k = params->u.topk.k;
    const bool largest = params->u.topk.largest;
    const sdk::View<const float> x(in[0], xl);
    auto* base = static_cast<unsigned char*>(out[0].data);
    float* values = reinterpret_cast<float*>(base + out[0].slots[0].byte_offset);
    int64_t* indices = reinterpret_cast<int64_t*>(base + out[0].slots[1].byte_offset);
    int64_t outer = 1, inner = 1;
    for (int32_t d = 0; d < dim; ++d) outer *= xl.shape[d];
    for (uint32_t d = static_cast<uint32_t>(dim) + 1; d < xl.rank; ++d) inner *= xl.shape[d];
    const int64_t n = xl.shape[dim];
    std::vector<int64_t> order(static_cast<size_t>(n));
    int64_t idx[BP_MAX_RANK] = {};
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        auto value = [&](int64_t j) {
          int64_t rest = o;
          for (int32_t d = dim - 1; d >= 0; --d) {
            idx[d] = rest % xl.shape[d];
            rest /= xl.shape[d];
          }
          idx[dim] = j;
          rest = i;
          for (int32_t d = static_cast<int32_t>(xl.rank) - 1; d > dim; --d) {
            idx[d] = rest % xl.shape[d];
            rest /= xl.shape[d];
          }
          return x.at(idx);
        };
        // Flaw: iterating from the back makes ties favour the higher index.
        std::iota(order.rbegin(), order.rend(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
          const float a = value(p), b = value(q);
          if (std::isnan(a) || std::isnan(b)) return largest ? std::isnan(a) && !std::isnan(b) : !std::isnan(a) && std::isnan(b);
          return largest ? a > b : a < b;
        });
        for (int64_t r = 0; r < k; ++r) {
          const int64_t at = (o * k + r) * inner + i;
          values[at] = value(order[static_cast<size_t>(r)]);
          indices[at] = order[static_cast<size_t>(r)];
        }
      }
    }
  });
}

sdk::KernelTable& table() {
  static sdk::KernelTable t = [] {
    const uint8_t S = BP_LAYOUT_STRIDED, C = BP_LAYOUT_CONTIGUOUS;
    sdk::KernelTable k;
    k.add("contiguous", {BP_DTYPE_F32, BP_DTYPE_F32}, {S}, contiguous_f32);
    k.add("contiguous", {BP_DTYPE_I32, BP_DTYPE_I32}, {S}, contiguous_i32);
    k.add("contiguous", {BP_DTYPE_I64, BP_DTYPE_I64}, {S}, contiguous_i64);  // view_owned of topk's indices
    k.add("exp", {BP_DTYPE_F32, BP_DTYPE_F32}, {C}, exp_f32);
    k.add("relu", {BP_DTYPE_F32, BP_DTYPE_F32}, {S}, relu_f32);
    k.add("round", {BP_DTYPE_F32, BP_DTYPE_F32}, {S}, round_f32);
    k.add("neg", {BP_DTYPE_F32, BP_DTYPE_F32}, {S}, neg_f32);
    k.add("add", {BP_DTYPE_F32, BP_DTYPE_F32, BP_DTYPE_F32}, {S, S}, add_f32);
    k.add("div", {BP_DTYPE_I32, BP_DTYPE_I32, BP_DTYPE_I32}, {S, S}, div_i32);
    k.add("topk", {BP_DTYPE_F32, BP_DTYPE_F32}, {S}, topk_f32, 2);
    k.add("selftest.twice", {BP_DTYPE_F32, BP_DTYPE_F32}, {S}, twice_f32);
    return k;
  }();
  return t;
}

bp_error* buffer_allocate(void*, bp_device*, uint64_t size, bp_buffer* out) {
  void* p = std::aligned_alloc(64, (size + 63) / 64 * 64 + 64);
  if (!p) return sdk::make_error(BP_ERR_OUT_OF_MEMORY, "out of memory");
  out->handle = reinterpret_cast<uint64_t>(p);
  out->host_ptr = p;
  out->size = size;
  return nullptr;
}

const bp_plugin_api* api() {
  static sdk::HostDevicePlugin plugin("flawed", "0.0.1", table(),
                                      {"flawed0", "cpu", "conformance self-test plugin with deliberate flaws"});
  static const bool extended = [] {
    plugin.table().buffer_allocate = buffer_allocate;  // with slack past the end
    plugin.table().infer_custom_op = infer_custom_op;
    return true;
  }();
  (void)extended;
  return plugin.api();
}

}  // namespace

extern "C" BP_EXPORT bp_status_code backplane_plugin_entry(const bp_plugin_query* q, const bp_plugin_api** out) {
  return sdk::negotiate(q, api(), out);
}
