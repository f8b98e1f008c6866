// Shared declarations of the CPU plugin's kernel files: the per-call view of
// a kernel's arguments, dtype storage/compute types, registration helpers and
// one registration function per op family.
#pragma once

#include <backplane/sdk/params.hpp>

#include <backplane/abi.h>
#include <backplane/sdk/dtype.hpp>
#include <backplane/sdk/plugin.hpp>

#include <cmath>
#include <cstdint>
#include <array>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>


namespace backplane::cpu {

namespace sdk = backplane::sdk;

// The vector ISA the kernels use, chosen once at initialize (the
// BACKPLANE_CPU_ISA environment variable can force baseline|avx2|avx512).
enum class Isa { baseline = 0, avx2 = 1, avx512 = 2 };
Isa isa();

void register_elementwise(sdk::KernelTable& t);
void register_reduce(sdk::KernelTable& t);
void register_linalg(sdk::KernelTable& t);  // matmul, then register_conv
void register_conv(sdk::KernelTable& t);    // conv2d and the fused convolutions (conv.cpp)
void register_pool(sdk::KernelTable& t);
void register_index(sdk::KernelTable& t);
void register_scan(sdk::KernelTable& t);
void register_quant(sdk::KernelTable& t);
void register_attention(sdk::KernelTable& t);  // scaled_dot_product_attention (attention.cpp)
void register_fused(sdk::KernelTable& t);      // fused_elementwise (fused.cpp)
// Rows registered in the middle of register_reduce's, so the table keeps its
// order (the manifest lists it): softmax and log_softmax, then cumsum, then
// layer_norm.
namespace norm {
void register_rows(sdk::KernelTable& t);
void register_layer_norm(sdk::KernelTable& t);
}  // namespace norm
namespace scan {
void register_cumsum(sdk::KernelTable& t);
}  // namespace scan

// ---------------------------------------------------------------------------
// DTypes: storage type per dtype (bool is one byte, kept as uint8_t so a
// stray byte value is never undefined behaviour) and the type arithmetic
// happens in (float for the half types).

template <bp_dtype D> struct storage {
  using type = dtype_t<D>;
};
template <> struct storage<BP_DTYPE_BOOL> {
  using type = uint8_t;
};
template <bp_dtype D> using st_t = typename storage<D>::type;

template <class T> struct Num {
  using C = T;
  static C ld(T v) { return v; }
  static T st(C v) { return v; }
};
template <> struct Num<f16> {
  using C = float;
  static float ld(f16 v) { return f16_to_float(v.bits); }
  static f16 st(float v) { return f16{float_to_f16(v)}; }
};
template <> struct Num<bf16> {
  using C = float;
  static float ld(bf16 v) { return bf16_to_float(v.bits); }
  static bf16 st(float v) { return bf16{float_to_bf16(v)}; }
};

// gelu's erf form, 0.5x(1 + erf(x/sqrt2)) == 0.5x * erfc(-x/sqrt2), accurate
// for x << 0: the gelu kernel's scalar form, and the fused ops' (linalg.cpp).
template <class C> inline C gelu_erf_one(C x) { return C(0.5) * x * std::erfc(-x * C(0.7071067811865476)); }

template <class T> using comp_t = typename Num<T>::C;
template <class T> inline comp_t<T> ld(T v) { return Num<T>::ld(v); }
template <class T> inline T st(comp_t<T> v) { return Num<T>::st(v); }

// Two's-complement wrapping arithmetic without signed overflow.
template <class T> using wide_u = std::conditional_t<(sizeof(T) > 4), uint64_t, uint32_t>;
template <class T> inline T wadd(T a, T b) { return static_cast<T>(static_cast<wide_u<T>>(a) + static_cast<wide_u<T>>(b)); }
template <class T> inline T wsub(T a, T b) { return static_cast<T>(static_cast<wide_u<T>>(a) - static_cast<wide_u<T>>(b)); }
template <class T> inline T wmul(T a, T b) { return static_cast<T>(static_cast<wide_u<T>>(a) * static_cast<wide_u<T>>(b)); }
template <class T> inline T wneg(T a) { return static_cast<T>(wide_u<T>{0} - static_cast<wide_u<T>>(a)); }

#define BP_CPU_FLOAT_DTYPES BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64
#define BP_CPU_INT_DTYPES BP_DTYPE_I8, BP_DTYPE_I16, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8
#define BP_CPU_ALL_DTYPES BP_CPU_FLOAT_DTYPES, BP_CPU_INT_DTYPES, BP_DTYPE_BOOL

inline constexpr uint8_t kStrided = BP_LAYOUT_STRIDED;
inline constexpr uint8_t kContiguous = BP_LAYOUT_CONTIGUOUS;

// ---------------------------------------------------------------------------
// One kernel call's arguments.

struct Call {
  const bp_kernel_context* ctx;
  const bp_storage* in;
  size_t n_in;
  const bp_storage* out;
  size_t n_out;
  const bp_layout* lay;
  const bp_op_params* params;
  const char* op;

  const bp_host_api* host() const { return ctx ? ctx->host : nullptr; }
  const bp_layout& in_layout(size_t i) const { return lay[i]; }
  const bp_layout& out_layout(size_t i = 0) const { return lay[n_in + i]; }
  template <class T> const T* in_data(size_t i) const { return static_cast<const T*>(in[i].data); }
  template <class T> T* out_data(size_t i = 0) const { return static_cast<T*>(out[i].data); }
  bool has_input(size_t i) const { return i < n_in && in[i].buffer_handle != 0 && in[i].data != nullptr; }

  // Argument checks every kernel makes: a wrong count or params variant is a
  // host bug, reported rather than followed into a crash.
  void expect(size_t inputs, bp_params_kind kind) const {
    BP_SDK_CHECK(in != nullptr && out != nullptr && lay != nullptr, BP_ERR_INVALID_ARGUMENT,
               std::string(op) + ": NULL inputs, outputs or layouts");
    BP_SDK_CHECK(n_in == inputs || (inputs == 0 && n_in >= 1), BP_ERR_INVALID_ARGUMENT,
               std::string(op) + ": expected " + std::to_string(inputs) + " inputs, got " + std::to_string(n_in));
    BP_SDK_CHECK(n_out == 1, BP_ERR_INVALID_ARGUMENT, std::string(op) + ": expected 1 output, got " + std::to_string(n_out));
    for (size_t i = 0; i < n_in + n_out; ++i)
      BP_SDK_CHECK(lay[i].rank <= BP_MAX_RANK, BP_ERR_INVALID_ARGUMENT,
                 std::string(op) + ": layout " + std::to_string(i) + " has rank " + std::to_string(lay[i].rank));
    for (uint32_t i = 0; i < out[0].n_slots; ++i)
      BP_SDK_CHECK(out[0].slots != nullptr && out[0].slots[i].layout.rank <= BP_MAX_RANK, BP_ERR_INVALID_ARGUMENT,
                 std::string(op) + ": bad bundle slot " + std::to_string(i));
    if (kind != BP_PARAMS_NONE)
      BP_SDK_CHECK(params != nullptr && params->kind == kind && params->struct_size >= sizeof(bp_op_params),
                 BP_ERR_INVALID_ARGUMENT, std::string(op) + ": wrong params variant");
    // Every layout inside its storage, before any byte is touched (debug and
    // release): a wrong layout is an error, never a stray read or write.
    for (size_t i = 0; i < n_in; ++i)
      if (has_input(i))
        BP_SDK_CHECK(sdk::layout_fits(lay[i], backplane::dtype_size(in[i].dtype), 0, in[i].byte_size), BP_ERR_OUT_OF_RANGE,
                   std::string(op) + ": the layout of input " + std::to_string(i) + " reaches outside its storage of " +
                       std::to_string(in[i].byte_size) + " bytes");
    if (out[0].n_slots == 0) {
      BP_SDK_CHECK(sdk::layout_fits(lay[n_in], backplane::dtype_size(out[0].dtype), 0, out[0].byte_size) &&
                     (sdk::numel(lay[n_in]) == 0 || out[0].data != nullptr),
                 BP_ERR_OUT_OF_RANGE,
                 std::string(op) + ": the output layout reaches outside its storage of " +
                     std::to_string(out[0].byte_size) + " bytes");
    } else {
      for (uint32_t s = 0; s < out[0].n_slots; ++s)
        BP_SDK_CHECK(sdk::layout_fits(out[0].slots[s].layout, backplane::dtype_size(out[0].slots[s].dtype),
                                    out[0].slots[s].byte_offset, out[0].byte_size),
                   BP_ERR_OUT_OF_RANGE,
                   std::string(op) + ": bundle slot " + std::to_string(s) + " reaches outside its storage of " +
                       std::to_string(out[0].byte_size) + " bytes");
    }
  }
  // A bundled output's slot i.
  const bp_bundle_slot& slot(size_t i) const {
    BP_SDK_CHECK(out[0].n_slots > i && out[0].slots != nullptr, BP_ERR_INVALID_ARGUMENT,
               std::string(op) + ": output bundle lacks slot " + std::to_string(i));
    return out[0].slots[i];
  }
  template <class T> T* slot_data(size_t i) const {
    return reinterpret_cast<T*>(static_cast<char*>(out[0].data) + slot(i).byte_offset);
  }
};

template <class F> void pfor(const Call& c, int64_t n, int64_t grain, F&& f) {
  sdk::parallel_for(c.host(), n, grain < 1 ? 1 : grain, std::forward<F>(f));
}

inline uint32_t num_threads(const Call& c) {
  const bp_host_api* h = c.host();
  if (h == nullptr || h->num_threads == nullptr || h->parallel_for == nullptr) return 1;
  const uint32_t n = h->num_threads(h->host_ctx);
  return n < 1 ? 1 : n;
}

// Elements a thread should get at least: below ~32K elements one thread.
inline constexpr int64_t kGrain = 32768;

// The op name of kernel-table row `index` ("?" when out of range), for
// error messages.
const char* op_name(uint32_t index) noexcept;

// The bp_kernel_fn for a kernel class K with `static void impl(const Call&)`.
template <class K>
bp_error* entry(const bp_kernel_context* ctx, const bp_storage* inputs, size_t n_inputs, const bp_storage* outputs,
                size_t n_outputs, const bp_layout* layouts, const bp_op_params* params) noexcept {
  return sdk::guard([&] {
    K::impl(Call{ctx, inputs, n_inputs, outputs, n_outputs, layouts, params, op_name(ctx ? ctx->kernel_index : ~0u)});
  });
}

// Adds one table row per dtype D in Ds for the kernel class template K:
// key(D) gives the dtype key, layouts the per-input capabilities.
template <template <bp_dtype> class K, bp_dtype... Ds, class KeyFn>
void add_rows(sdk::KernelTable& t, std::string_view op, KeyFn key, const std::vector<uint8_t>& layouts,
              uint32_t bundle_slots = 0, uint32_t flags = 0) {
  (t.add(op, key(Ds), layouts, &entry<K<Ds>>, bundle_slots, flags), ...);
}

// Visits every "row" along `dim`: each position of `shape` with dim `dim`
// held at 0, giving the element offset of the row start in each of the N
// layouts (all of rank `rank`). Rows are split over threads; per chunk of
// rows, make_row() is called once and the callable it returns is invoked
// with the offsets of each row, so it can own scratch memory.
template <size_t N, class MakeRow>
void for_rows(const Call& c, uint32_t rank, const int64_t* shape, int dim, const std::array<const bp_layout*, N>& lays,
              int64_t row_cost, MakeRow&& make_row) {
  int64_t sh[BP_MAX_RANK] = {};
  for (uint32_t i = 0; i < rank; ++i) sh[i] = shape[i];
  sh[dim] = 1;
  const sdk::StridedWalker<N> w(rank, sh, lays);
  pfor(c, w.numel(), kGrain / (row_cost < 1 ? 1 : row_cost), [&](int64_t b, int64_t e) {
    auto row = make_row();
    w.run(b, e, [&](const int64_t* off, int64_t n, const int64_t* st) {
      std::array<int64_t, N> o;
      for (int64_t i = 0; i < n; ++i) {
        for (size_t k = 0; k < N; ++k) o[k] = off[k] + i * st[k];
        row(o.data());
      }
    });
  });
}

// Throws unless the output (or bundle slot) holds exactly n elements: a
// shape the host got wrong must not turn into a write outside the output.
inline void expect_numel(const Call& c, const bp_layout& l, int64_t n, const char* what = "output") {
  BP_SDK_CHECK(sdk::numel(l) == n, BP_ERR_INVALID_ARGUMENT,
             std::string(c.op) + ": " + what + " has " + std::to_string(sdk::numel(l)) + " elements, expected " +
                 std::to_string(n));
}

inline std::string dims_str(const bp_layout& l) {
  std::string s = "[";
  for (uint32_t i = 0; i < l.rank; ++i) s += (i ? ", " : "") + std::to_string(l.shape[i]);
  return s + "]";
}

// A vendor op's int param given as one value, a pair or (n == 4) four:
// dst[0..n) with one value repeated, a pair alternating (conv2d's and
// pooling's stride, padding and dilation forms); absent or null: dflt.
inline void vendor_ints(const sdk::VendorParams& p, const char* op, const char* name, int64_t dflt, int64_t* dst,
                        size_t n) {
  std::vector<int64_t> v;
  const auto* raw = p.find(name);
  if (!raw || raw->kind == sdk::VendorParams::Kind::Null)
    v = {dflt};
  else if (raw->kind == sdk::VendorParams::Kind::Number)
    v = {p.integer(name)};
  else
    v = p.integers(name);
  BP_SDK_CHECK(v.size() == 1 || v.size() == 2 || (n == 4 && v.size() == 4), BP_ERR_INVALID_ARGUMENT,
               std::string(op) + ": param '" + name + "' has " + std::to_string(v.size()) + " values");
  for (size_t i = 0; i < n; ++i) dst[i] = v.size() == 1 ? v[0] : v.size() == 2 ? v[i % 2] : v[i];
}

}  // namespace backplane::cpu
