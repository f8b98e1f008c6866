// The ABI 1.x shim: see abi_v1.hpp.
#include "abi_v1.hpp"

#include <backplane/backplane.hpp>

#include <cstddef>

namespace backplane::v1 {

namespace {

// Whether the 1.x table's struct_size covers `member` (a minor's addition).
template <typename T> bool has(const PluginApi* a, T PluginApi::*member) {
  const auto offset = reinterpret_cast<size_t>(&(static_cast<PluginApi*>(nullptr)->*member));
  return a->struct_size >= offset + sizeof(T);
}

}  // namespace

struct Shim::State {
  bp_plugin_api api{};  // first member: initialize() finds the State from `self`
  const PluginApi* v1 = nullptr;
  bp_error* (*import_host)(bp_device*, void*, uint64_t, bp_buffer*) = nullptr;
  int64_t (*call_index)(const bp_error*) = nullptr;
  bp_error* (*begin_timed)(bp_device*) = nullptr;
  bp_error* (*call_times)(bp_device*, uint64_t*, size_t) = nullptr;
  bp_error* (*begin_prepare)(bp_device*) = nullptr;
};

namespace {

using State = Shim::State;
const PluginApi* v1(void* p) { return static_cast<State*>(p)->v1; }

bp_status_code error_code(void* p, const bp_error* e) { return v1(p)->error_code(e); }
bp_string error_message(void* p, const bp_error* e) { return v1(p)->error_message(e); }
void error_destroy(void* p, bp_error* e) { v1(p)->error_destroy(e); }
int64_t error_call_index(void* p, const bp_error* e) { return static_cast<State*>(p)->call_index(e); }

bp_error* initialize(const bp_plugin_api* self, const bp_host_api* host, void** out_plugin) {
  // `self` is the State's first member. The context is set before the call
  // so an error of initialize can be read through it.
  auto* st = reinterpret_cast<State*>(const_cast<bp_plugin_api*>(self));
  *out_plugin = st;
  return st->v1->initialize(host);
}
void shutdown(void* p) {
  if (v1(p)->shutdown) v1(p)->shutdown();
}
uint32_t device_count(void* p) { return v1(p)->device_count(); }
bp_error* device_get(void* p, uint32_t i, bp_device** out) { return v1(p)->device_get(i, out); }
bp_error* device_info(void* p, bp_device* d, bp_device_info* out) { return v1(p)->device_info(d, out); }
bp_error* device_supports_kernel(void* p, bp_device* d, uint32_t k, bool* out) {
  return v1(p)->device_supports_kernel(d, k, out);
}
bp_error* buffer_allocate(void* p, bp_device* d, uint64_t size, bp_buffer* out) {
  return v1(p)->buffer_allocate(d, size, out);
}
void buffer_free(void* p, bp_device* d, uint64_t h) { v1(p)->buffer_free(d, h); }
bp_error* buffer_write(void* p, bp_device* d, uint64_t h, uint64_t off, const void* src, uint64_t n) {
  return v1(p)->buffer_write(d, h, off, src, n);
}
bp_error* buffer_read(void* p, bp_device* d, uint64_t h, uint64_t off, void* dst, uint64_t n) {
  return v1(p)->buffer_read(d, h, off, dst, n);
}
bp_error* buffer_import_host(void* p, bp_device* d, void* ptr, uint64_t n, bp_buffer* out) {
  return static_cast<State*>(p)->import_host(d, ptr, n, out);
}
// A 1.x run: begin(), begin_timed() or begin_prepare(), as the flags say
// (the host asks only for what run_flags offers).
bp_error* begin(void* p, bp_device* d, uint32_t flags, bp_run** out_run) {
  auto* st = static_cast<State*>(p);
  *out_run = nullptr;
  if (flags & BP_RUN_PREPARE) return st->begin_prepare(d);
  if (flags & BP_RUN_TIMED) return st->begin_timed(d);
  return st->v1->begin ? st->v1->begin(d) : nullptr;
}
bp_error* synchronize(void* p, bp_device* d, bp_run*, uint64_t* out_ns, size_t n_calls) {
  auto* st = static_cast<State*>(p);
  if (st->v1->synchronize)
    if (bp_error* e = st->v1->synchronize(d)) return e;
  if (out_ns && n_calls && st->call_times) return st->call_times(d, out_ns, n_calls);
  return nullptr;
}
bp_error* infer_custom_op(void* p, bp_string op, const bp_dtype* dts, const bp_layout* ls, size_t n,
                          const bp_op_params* params, bp_dtype* out_dtype, bp_layout* out_layout) {
  return v1(p)->infer_custom_op(op, dts, ls, n, params, out_dtype, out_layout);
}

}  // namespace

Shim::Shim(const PluginApi* a, const std::string& who) : state_(std::make_unique<State>()) {
  if (a->struct_size < offsetof(PluginApi, buffer_import_host))
    throw Error(who + ": ABI 1.x API table too small (struct_size " + std::to_string(a->struct_size) + ")");
  for (const void* fn : {reinterpret_cast<const void*>(a->error_code), reinterpret_cast<const void*>(a->error_message),
                         reinterpret_cast<const void*>(a->error_destroy), reinterpret_cast<const void*>(a->initialize)})
    if (fn == nullptr) throw Error(who + ": API table lacks a required function");
  State& s = *state_;
  s.v1 = a;
  bp_plugin_api& t = s.api;
  t.struct_size = sizeof t;
  t.abi_major = a->abi_major;
  t.abi_minor = a->abi_minor;
  t.name = a->name;
  t.version = a->version;
  t.kernels = a->kernels;
  t.n_kernels = a->n_kernels;
  t.error_code = error_code;
  t.error_message = error_message;
  t.error_destroy = error_destroy;
  t.initialize = initialize;
  t.shutdown = shutdown;
  // A required entry the 1.x table lacks stays NULL here, so the host's
  // check of the adapted table names it.
  if (a->device_count) t.device_count = device_count;
  if (a->device_get) t.device_get = device_get;
  if (a->device_info) t.device_info = device_info;
  if (a->device_supports_kernel) t.device_supports_kernel = device_supports_kernel;
  if (a->buffer_allocate) t.buffer_allocate = buffer_allocate;
  if (a->buffer_free) t.buffer_free = buffer_free;
  if (a->buffer_write) t.buffer_write = buffer_write;
  if (a->buffer_read) t.buffer_read = buffer_read;
  if (a->infer_custom_op) t.infer_custom_op = infer_custom_op;
  if (has(a, &PluginApi::buffer_import_host) && a->buffer_import_host) {
    s.import_host = a->buffer_import_host;
    t.buffer_import_host = buffer_import_host;
  }
  if (has(a, &PluginApi::error_call_index) && a->error_call_index) {
    s.call_index = a->error_call_index;
    t.error_call_index = error_call_index;
  }
  if (a->begin || a->synchronize) {
    t.begin = begin;
    t.synchronize = synchronize;
    if (has(a, &PluginApi::call_device_times) && a->begin_timed && a->call_device_times && a->synchronize) {
      s.begin_timed = a->begin_timed;
      s.call_times = a->call_device_times;
      t.run_flags |= BP_RUN_TIMED;
    }
    if (has(a, &PluginApi::begin_prepare) && a->begin_prepare && a->synchronize) {
      s.begin_prepare = a->begin_prepare;
      t.run_flags |= BP_RUN_PREPARE;
    }
  }
}

Shim::~Shim() = default;

const bp_plugin_api* Shim::api() const { return &state_->api; }

}  // namespace backplane::v1
