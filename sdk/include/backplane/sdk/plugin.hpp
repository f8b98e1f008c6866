// Header-only C++ sugar for plugin authors. Everything here compiles into the
// plugin itself; the host never sees these types, only the C ABI of abi.h.
//
//  - bp_error is defined here (each plugin owns its own errors) together
//    with the three error functions its bp_plugin_api must expose.
//  - guard() turns any C++ exception into a bp_error*, so nothing throws
//    across the boundary.
//  - Layout helpers, a typed strided view and a multi-operand strided walker.
//  - KernelTable: builds the static bp_kernel_desc table.
//  - negotiate(): the version handshake of the entry symbol.
#pragma once

#include <backplane/abi.h>
#include <backplane/sdk/dtype.hpp>

// Throws sdk::Error(code, message) unless cond holds. The message expression
// is evaluated only when cond fails, so it may build strings freely.
#define BP_SDK_CHECK(cond, code, message)                   \
  do {                                                      \
    if (!(cond)) ::backplane::sdk::fail((code), (message)); \
  } while (0)

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

// The concrete error type of a plugin built with this SDK.
struct bp_error {
  bp_status_code code;
  std::string message;
};

namespace backplane::sdk {

inline bp_string to_bp(std::string_view s) { return bp_string{s.data(), s.size()}; }
inline std::string_view to_sv(bp_string s) { return s.data ? std::string_view(s.data, s.len) : std::string_view(); }

// Never throws: allocation failure yields a static out-of-memory error that
// error_destroy recognises and leaves alone.
inline bp_error* out_of_memory_error() {
  static bp_error oom{BP_ERR_OUT_OF_MEMORY, "out of memory while reporting an error"};
  return &oom;
}

inline bp_error* make_error(bp_status_code code, std::string_view message) noexcept {
  try {
    return new bp_error{code, std::string(message)};
  } catch (...) {
    return out_of_memory_error();
  }
}

// Thrown inside a plugin; converted to a bp_error* by guard().
class Error : public std::runtime_error {
 public:
  Error(bp_status_code code, const std::string& message) : std::runtime_error(message), code_(code) {}
  bp_status_code code() const noexcept { return code_; }

 private:
  bp_status_code code_;
};

[[noreturn]] inline void fail(bp_status_code code, const std::string& message) { throw Error(code, message); }
// Eager: the message is built even when ok. In kernels and other hot paths
// use BP_SDK_CHECK, which builds it only on failure.

inline void check(bool ok, bp_status_code code, const std::string& message) {
  if (!ok) fail(code, message);
}

// Runs f() and returns NULL, or the error it threw. f may also return a
// bp_error* itself.
template <typename F> bp_error* guard(F&& f) noexcept {
  try {
    if constexpr (std::is_same_v<decltype(f()), bp_error*>) {
      return f();
    } else {
      f();
      return nullptr;
    }
  } catch (const Error& e) {
    return make_error(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return make_error(BP_ERR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return make_error(BP_ERR_INTERNAL, std::string("exception in plugin: ") + e.what());
  } catch (...) {
    return make_error(BP_ERR_INTERNAL, "unknown exception in plugin");
  }
}

// The error functions of bp_plugin_api (errors are plugin-independent
// objects, so the context is not needed).
inline bp_status_code error_code(void*, const bp_error* e) { return e ? e->code : BP_OK; }
inline bp_string error_message(void*, const bp_error* e) { return e ? to_bp(e->message) : bp_string{nullptr, 0}; }
inline void error_destroy(void*, bp_error* e) {
  if (e != out_of_memory_error()) delete e;
}

// ---------------------------------------------------------------------------
// Layouts

inline int64_t numel(const bp_layout& l) {
  int64_t n = 1;
  for (uint32_t i = 0; i < l.rank; ++i) n *= l.shape[i];
  return n;
}

// Whether layout `b` of storage `sb` addresses exactly the elements layout
// `a` of storage `sa` does, in the same order (the same buffer, offset and
// strides; strides of size-1 dims do not matter). A kernel that updates part
// of its input x (slice_update) skips copying x when the host made its
// output x itself.
inline bool same_place(const bp_storage& sa, const bp_layout& a, const bp_storage& sb, const bp_layout& b) {
  if (sa.buffer_handle != sb.buffer_handle || sa.byte_offset != sb.byte_offset || sa.data != sb.data ||
      a.rank != b.rank || a.offset != b.offset)
    return false;
  for (uint32_t i = 0; i < a.rank; ++i)
    if (a.shape[i] != b.shape[i] || (a.shape[i] != 1 && a.strides[i] != b.strides[i])) return false;
  return true;
}

// Whether every element `l` addresses, in elements of `elem_size` bytes
// counted from `byte_offset`, lies inside [0, byte_size) bytes of a storage.
// Overflow-safe: any shape or stride a host (or a hostile caller) passes.
// An empty layout (a dim of 0) addresses nothing and always fits.
inline bool layout_fits(const bp_layout& l, size_t elem_size, uint64_t byte_offset, uint64_t byte_size) {
  if (l.rank > BP_MAX_RANK || elem_size == 0) return false;
  int64_t lo = l.offset, hi = l.offset;
  for (uint32_t i = 0; i < l.rank; ++i) {
    if (l.shape[i] < 0) return false;
    if (l.shape[i] == 0) return true;
  }
  for (uint32_t i = 0; i < l.rank; ++i) {
    int64_t span = 0;
    if (__builtin_mul_overflow(l.shape[i] - 1, l.strides[i], &span)) return false;
    if (__builtin_add_overflow(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi)) return false;
  }
  // Bytes [byte_offset + lo*size, byte_offset + (hi+1)*size) inside [0, byte_size).
  int64_t first = 0, end = 0, past = 0, size = static_cast<int64_t>(elem_size);
  if (__builtin_add_overflow(hi, 1, &past) || __builtin_mul_overflow(lo, size, &first) ||
      __builtin_mul_overflow(past, size, &end))
    return false;
  if (byte_offset > static_cast<uint64_t>(INT64_MAX)) return false;
  const int64_t base = static_cast<int64_t>(byte_offset);
  if (__builtin_add_overflow(first, base, &first) || __builtin_add_overflow(end, base, &end)) return false;
  return first >= 0 && static_cast<uint64_t>(end) <= byte_size;
}

// Row-major dense with offset 0 (size-1 dims may have any stride).
inline bool is_contiguous(const bp_layout& l) {
  int64_t expected = 1;
  for (int i = static_cast<int>(l.rank) - 1; i >= 0; --i) {
    if (l.shape[i] == 0) return l.offset == 0;
    if (l.shape[i] != 1 && l.strides[i] != expected) return false;
    expected *= l.shape[i];
  }
  return l.offset == 0;
}

inline bp_layout contiguous_layout(const int64_t* shape, uint32_t rank) {
  bp_layout l{};
  l.rank = rank;
  int64_t s = 1;
  for (int i = static_cast<int>(rank) - 1; i >= 0; --i) {
    l.shape[i] = shape[i];
    l.strides[i] = s;
    s *= shape[i];
  }
  return l;
}

// A typed element view of one storage through one layout (host memory).
template <typename T> struct View {
  T* base = nullptr;  // storage start; element (idx) is base[offset + sum idx*stride]
  bp_layout layout{};

  View() = default;
  View(const bp_storage& s, const bp_layout& l) : base(static_cast<T*>(s.data)), layout(l) {}
  int64_t numel() const { return sdk::numel(layout); }
  uint32_t rank() const { return layout.rank; }
  int64_t dim(uint32_t i) const { return layout.shape[i]; }
  T& at(const int64_t* idx) const {
    int64_t off = layout.offset;
    for (uint32_t i = 0; i < layout.rank; ++i) off += idx[i] * layout.strides[i];
    return base[off];
  }
};

// Walks the elements of `shape` for N operands with their own strides and
// offsets, in row-major order. Dims are coalesced where every operand allows
// it, and the innermost dim is handed to the callback as a run:
//   f(const int64_t* offsets /*N*/, int64_t count, const int64_t* inner_strides /*N*/)
// Offsets are element offsets (layout.offset included).
template <size_t N> class StridedWalker {
 public:
  StridedWalker(uint32_t rank, const int64_t* shape, const std::array<const bp_layout*, N>& layouts) {
    for (size_t k = 0; k < N; ++k) base_[k] = layouts[k]->offset;
    // Drop size-1 dims, then merge adjacent dims that are contiguous for all.
    for (uint32_t i = 0; i < rank; ++i) {
      if (shape[i] == 1) continue;
      if (shape[i] == 0) {
        empty_ = true;
      }
      std::array<int64_t, N> st;
      for (size_t k = 0; k < N; ++k) st[k] = layouts[k]->strides[i];
      if (rank_ > 0) {
        bool merge = true;
        for (size_t k = 0; k < N; ++k)
          if (strides_[rank_ - 1][k] != st[k] * shape[i]) merge = false;
        if (merge) {
          shape_[rank_ - 1] *= shape[i];
          for (size_t k = 0; k < N; ++k) strides_[rank_ - 1][k] = st[k];
          continue;
        }
      }
      shape_[rank_] = shape[i];
      strides_[rank_] = st;
      ++rank_;
    }
  }

  int64_t numel() const {
    if (empty_) return 0;
    int64_t n = 1;
    for (uint32_t i = 0; i < rank_; ++i) n *= shape_[i];
    return n;
  }

  // Visits the linear element range [begin, end) of the row-major order.
  template <typename F> void run(int64_t begin, int64_t end, F&& f) const {
    if (empty_ || begin >= end) return;
    if (rank_ == 0) {
      std::array<int64_t, N> zero{};
      f(base_.data(), int64_t{1}, zero.data());
      return;
    }
    const int64_t inner = shape_[rank_ - 1];
    std::array<int64_t, N> inner_strides;
    for (size_t k = 0; k < N; ++k) inner_strides[k] = strides_[rank_ - 1][k];
    // Decompose begin into an index.
    std::array<int64_t, BP_MAX_RANK> idx{};
    int64_t rem = begin;
    for (int i = static_cast<int>(rank_) - 1; i >= 0; --i) {
      idx[i] = rem % shape_[i];
      rem /= shape_[i];
    }
    std::array<int64_t, N> off = base_;
    for (uint32_t i = 0; i < rank_; ++i)
      for (size_t k = 0; k < N; ++k) off[k] += idx[i] * strides_[i][k];
    int64_t pos = begin;
    while (pos < end) {
      const int64_t count = std::min(inner - idx[rank_ - 1], end - pos);
      f(off.data(), count, inner_strides.data());
      pos += count;
      if (pos >= end) break;
      // Advance to the start of the next inner run.
      for (size_t k = 0; k < N; ++k) off[k] += (count)*inner_strides[k];
      idx[rank_ - 1] += count;
      for (int i = static_cast<int>(rank_) - 1; i > 0 && idx[i] == shape_[i]; --i) {
        for (size_t k = 0; k < N; ++k) off[k] += strides_[i - 1][k] - shape_[i] * strides_[i][k];
        idx[i] = 0;
        ++idx[i - 1];
      }
    }
  }

  template <typename F> void run_all(F&& f) const { run(0, numel(), std::forward<F>(f)); }

 private:
  uint32_t rank_ = 0;
  bool empty_ = false;
  std::array<int64_t, BP_MAX_RANK> shape_{};
  std::array<std::array<int64_t, N>, BP_MAX_RANK> strides_{};
  std::array<int64_t, N> base_{};
};

// ---------------------------------------------------------------------------
// Threads through the host's parallel_for, with exceptions carried back.

template <typename F> void parallel_for(const bp_host_api* host, int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  if (host == nullptr || host->parallel_for == nullptr || n <= grain) {
    f(int64_t{0}, n);
    return;
  }
  struct Ctx {
    F* f;
    std::exception_ptr error;
    std::atomic_flag failed = ATOMIC_FLAG_INIT;
  } ctx{&f, nullptr};
  host->parallel_for(
      host->host_ctx, n, grain,
      [](void* user, int64_t b, int64_t e) {
        auto* c = static_cast<Ctx*>(user);
        try {
          (*c->f)(b, e);
        } catch (...) {
          if (!c->failed.test_and_set()) c->error = std::current_exception();
        }
      },
      &ctx);
  if (ctx.error) std::rethrow_exception(ctx.error);
}

// ---------------------------------------------------------------------------
// Kernel table

class KernelTable {
 public:
  // dtypes: input dtypes then output dtype. layouts: one per input.
  void add(std::string_view op, std::vector<bp_dtype> dtypes, std::vector<uint8_t> layouts, bp_kernel_fn fn,
           uint32_t bundle_slots = 0, uint32_t flags = 0) {
    keys_.push_back(std::move(dtypes));
    caps_.push_back(std::move(layouts));
    names_.emplace_back(op);
    bp_kernel_desc d{};
    d.struct_size = sizeof(bp_kernel_desc);
    d.op = to_bp(names_.back());
    d.dtypes = keys_.back().data();
    d.n_dtypes = static_cast<uint32_t>(keys_.back().size());
    d.input_layouts = caps_.back().data();
    d.n_inputs = static_cast<uint32_t>(caps_.back().size());
    d.n_outputs = 1;
    d.bundle_slots = bundle_slots;
    d.flags = flags;
    d.fn = fn;
    descs_.push_back(d);
  }
  const bp_kernel_desc* data() const { return descs_.data(); }
  size_t size() const { return descs_.size(); }

 private:
  // deques keep element addresses stable as the table grows.
  std::deque<std::vector<bp_dtype>> keys_;
  std::deque<std::vector<uint8_t>> caps_;
  std::deque<std::string> names_;
  std::vector<bp_kernel_desc> descs_;
};

// The entry symbol's handshake for a plugin built against these headers
// (ABI BP_ABI_VERSION_MAJOR.BP_ABI_VERSION_MINOR). A host of the same major
// and an older minor is answered too: it reads the table only as far as it
// knows, and this SDK sets nothing a 2.0 host would misread.
inline bp_status_code negotiate(const bp_plugin_query* query, const bp_plugin_api* api,
                                const bp_plugin_api** out_api) noexcept {
  if (out_api) *out_api = nullptr;
  if (query == nullptr || out_api == nullptr) return BP_ERR_INVALID_ARGUMENT;
  auto say = [&](const char* msg) {
    if (query->struct_size >= offsetof(bp_plugin_query, error_buffer_size) + sizeof(size_t) &&
        query->error_buffer && query->error_buffer_size > 0)
      std::snprintf(query->error_buffer, query->error_buffer_size, "%s", msg);
  };
  if (query->min_major > BP_ABI_VERSION_MAJOR || query->max_major < BP_ABI_VERSION_MAJOR) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "plugin speaks ABI %d.%d; host asks for majors %u..%u", BP_ABI_VERSION_MAJOR,
                  BP_ABI_VERSION_MINOR, query->min_major, query->max_major);
    say(buf);
    return BP_ERR_INCOMPATIBLE;
  }
  *out_api = api;
  return BP_OK;
}

}  // namespace backplane::sdk
