// ACME's Backplane plugin: written against the SDK alone. One device
// ("acme0") whose memory is host memory; a few f32 kernels that walk any
// strides; and two vendor ops whose manifest (acme.json) gives each a
// decomposition into standard ops, so devices without them still run them
// and the conformance suite checks these kernels against it:
//   acme.swiglu      x [..., 2H] -> y [..., H],  y = silu(x[..., :H]) * x[..., H:]
//   acme.max_argmax  x [..., N]  -> bundle: max [...] (f32), argmax [...] (i64)
// A graph may use ops acme lacks: with `--device acme0,cpu` the CPU runs them.
#include <backplane/abi.h>
#include <backplane/sdk/api.hpp>
#include <backplane/sdk/plugin.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace sdk = backplane::sdk;

namespace {

// Kernels split their work over the host's threads (ctx->host).
template <typename F>
bp_error* binary(const bp_kernel_context* ctx, const bp_storage* in, const bp_storage* out, const bp_layout* l, F f) {
  return sdk::guard([&] {
    const auto* a = static_cast<const float*>(in[0].data);
    const auto* b = static_cast<const float*>(in[1].data);
    auto* o = static_cast<float*>(out[0].data);
    sdk::StridedWalker<2> walk(l[2].rank, l[2].shape, {&l[0], &l[1]});
    int64_t n = walk.numel();
#ifdef ACME_BROKEN
    n = n > 0 ? n - 1 : 0;  // the deliberate bug: the last element is never written
#endif
    sdk::parallel_for(ctx->host, n, 1 << 15, [&](int64_t begin, int64_t end) {
      int64_t i = begin;
      walk.run(begin, end, [&](const int64_t* off, int64_t count, const int64_t* st) {
        for (int64_t k = 0; k < count; ++k) o[i++] = f(a[off[0] + k * st[0]], b[off[1] + k * st[1]]);
      });
    });
  });
}

template <typename F> bp_error* unary(const bp_storage* in, const bp_storage* out, const bp_layout* l, F f) {
  return sdk::guard([&] {
    const auto* x = static_cast<const float*>(in[0].data);
    auto* o = static_cast<float*>(out[0].data);
    sdk::StridedWalker<1> walk(l[1].rank, l[1].shape, {&l[0]});
    int64_t i = 0;
    walk.run_all([&](const int64_t* off, int64_t count, const int64_t* st) {
      for (int64_t k = 0; k < count; ++k) o[i++] = f(x[off[0] + k * st[0]]);
    });
  });
}

bp_error* k_add(const bp_kernel_context* ctx, const bp_storage* in, size_t, const bp_storage* out, size_t,
                const bp_layout* l, const bp_op_params*) {
  return binary(ctx, in, out, l, [](float a, float b) { return a + b; });
}
bp_error* k_mul(const bp_kernel_context* ctx, const bp_storage* in, size_t, const bp_storage* out, size_t,
                const bp_layout* l, const bp_op_params*) {
  return binary(ctx, in, out, l, [](float a, float b) { return a * b; });
}
bp_error* k_relu(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                 const bp_layout* l, const bp_op_params*) {
  return unary(in, out, l, [](float x) { return std::isnan(x) ? x : (x > 0 ? x : 0.0f); });
}
bp_error* k_copy(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                 const bp_layout* l, const bp_op_params*) {
  return unary(in, out, l, [](float x) { return x; });
}

bp_error* k_swiglu(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                   const bp_layout* l, const bp_op_params*) {
  return sdk::guard([&] {
    const auto* x = static_cast<const float*>(in[0].data);  // contiguous (declared so)
    auto* y = static_cast<float*>(out[0].data);
    const int64_t h = l[1].rank ? l[1].shape[l[1].rank - 1] : 1;
    const int64_t rows = h ? sdk::numel(l[1]) / h : 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < h; ++j) {
        const float g = x[r * 2 * h + j], u = x[r * 2 * h + h + j];
#ifdef ACME_BROKEN
        y[r * h + j] = g * u;  // the deliberate bug: the gate's silu is left out
#else
        y[r * h + j] = g / (1.0f + std::exp(-g)) * u;
#endif
      }
  });
}

// Rows of any strides; slot 0 the max (NaN if the row holds one), slot 1 the
// index of the first max (of the first NaN), as max and argmax define them.
bp_error* k_max_argmax(const bp_kernel_context*, const bp_storage* in, size_t, const bp_storage* out, size_t,
                       const bp_layout* l, const bp_op_params*) {
  return sdk::guard([&] {
    sdk::check(out[0].n_slots == 2, BP_ERR_INVALID_ARGUMENT, "acme.max_argmax: expects a bundle of 2 slots");
    const bp_layout& x = l[0];
    sdk::check(x.rank >= 1, BP_ERR_INVALID_ARGUMENT, "acme.max_argmax: the input needs a last dim");
    const int64_t n = x.shape[x.rank - 1], sn = x.strides[x.rank - 1];
    sdk::check(n > 0, BP_ERR_OUT_OF_RANGE, "acme.max_argmax: the max of an empty row");
    auto* vals = reinterpret_cast<float*>(static_cast<char*>(out[0].data) + out[0].slots[0].byte_offset);
    auto* idx = reinterpret_cast<int64_t*>(static_cast<char*>(out[0].data) + out[0].slots[1].byte_offset);
    const auto* base = static_cast<const float*>(in[0].data);
    bp_layout rows = x;
    rows.rank -= 1;
    sdk::StridedWalker<1> walk(rows.rank, rows.shape, {&rows});
    int64_t r = 0;
    walk.run_all([&](const int64_t* off, int64_t count, const int64_t* st) {
      for (int64_t k = 0; k < count; ++k, ++r) {
        const float* row = base + off[0] + k * st[0];
        float best = row[0];
        int64_t at = 0;
        for (int64_t j = 1; j < n && !std::isnan(best); ++j) {
          const float v = row[j * sn];
          if (std::isnan(v) || v > best) best = v, at = j;
        }
        vals[r] = best;
        idx[r] = at;
      }
    });
  });
}

bp_error* infer_custom_op(void*, bp_string op, const bp_dtype* dtypes, const bp_layout* in, size_t n, const bp_op_params*,
                          bp_dtype* out_dtype, bp_layout* out_layout) {
  return sdk::guard([&] {
    // acme.max_argmax has two outputs: the host takes their shapes from the
    // decomposition in acme.json.
    sdk::check(sdk::to_sv(op) == "acme.swiglu", BP_ERR_INVALID_ARGUMENT, "acme: no shape inference for " + std::string(sdk::to_sv(op)));
    sdk::check(n == 1, BP_ERR_INVALID_ARGUMENT, "acme.swiglu takes 1 input");
    sdk::check(in[0].rank >= 1 && in[0].shape[in[0].rank - 1] % 2 == 0, BP_ERR_INVALID_ARGUMENT,
               "acme.swiglu: the last dim must be even");
    *out_dtype = dtypes[0];
    *out_layout = in[0];
    out_layout->shape[in[0].rank - 1] /= 2;
  });
}

const sdk::KernelTable& kernels() {
  static const sdk::KernelTable table = [] {
    sdk::KernelTable t;
    const bp_dtype f = BP_DTYPE_F32;
    t.add("add", {f, f, f}, {BP_LAYOUT_STRIDED, BP_LAYOUT_STRIDED}, k_add);
    t.add("mul", {f, f, f}, {BP_LAYOUT_STRIDED, BP_LAYOUT_STRIDED}, k_mul);
    t.add("relu", {f, f}, {BP_LAYOUT_STRIDED}, k_relu);
    t.add("contiguous", {f, f}, {BP_LAYOUT_STRIDED}, k_copy);
    t.add("acme.swiglu", {f, f}, {BP_LAYOUT_CONTIGUOUS}, k_swiglu);
    t.add("acme.max_argmax", {f, f}, {BP_LAYOUT_STRIDED}, k_max_argmax, 2);
    return t;
  }();
  return table;
}

}  // namespace

// One device on host memory: the SDK's HostDevicePlugin supplies the
// initialize, device and buffer entries; acme adds its vendor ops' shape
// inference.
extern "C" BP_EXPORT bp_status_code backplane_plugin_entry(const bp_plugin_query* query, const bp_plugin_api** out) {
  static sdk::HostDevicePlugin plugin("acme", "1.0.0", kernels(),  // name and version as in the manifest
                                      {"acme0", "accelerator", "ACME example accelerator (host memory)"});
  static const bool extended = [] {
    plugin.table().infer_custom_op = infer_custom_op;
    return true;
  }();
  (void)extended;
  return sdk::negotiate(query, plugin.api(), out);
}
