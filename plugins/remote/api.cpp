// The remote plugin's ABI entries: devices, buffers, runs (kernels only
// enqueue; synchronize() sends the run's calls as one batch), instances, and
// the entry symbol.
#include "remote_impl.hpp"

namespace bp_remote {

// ---- the API functions --------------------------------------------------------------------------

bp_error* device_info(void*, bp_device* device, bp_device_info* out) {
  return sdk::guard([&] {
    auto* d = dev_of(device);
    out->name = sdk::to_bp(d->name);
    out->kind = sdk::to_bp(d->kind);
    out->description = sdk::to_bp(d->description);
    out->memory_kind = d->shm_buffers ? BP_MEMORY_MAPPED : BP_MEMORY_DEVICE;
    out->buffer_alignment = d->alignment;
    out->max_buffer_size = d->max_buffer;
  });
}

bp_error* device_supports_kernel(void*, bp_device* device, uint32_t k, bool* out) {
  auto* d = dev_of(device);
  *out = k < d->kernel_map.size() && d->kernel_map[k] != UINT32_MAX;
  return nullptr;
}

bp_error* buffer_allocate(void*, bp_device* device, uint64_t size, bp_buffer* out) {
  return sdk::guard([&] {
    auto* d = dev_of(device);
    Server& s = *d->server;
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.broken && s.owner->isolated()) s.owner->connect(s);  // the next use starts a fresh child
    Request req;
    req.mutable_allocate()->set_device(d->index);
    req.mutable_allocate()->set_size(size);
    uint64_t at = UINT64_MAX;
    if (d->shm_buffers && s.use_shm && size > 0) {
      at = s.arena_take(size, std::max<uint64_t>(d->alignment, 64));
      if (at == UINT64_MAX)
        throw sdk::Error(BP_ERR_OUT_OF_MEMORY, s.owner->who() + ": its shared memory is full (" +
                                                   std::to_string(size) + " bytes asked; the arena holds " +
                                                   std::to_string(s.child.shm_size - kShmBytes) +
                                                   " bytes, less under an address-space limit)");
      req.mutable_allocate()->set_in_shm(true);
      req.mutable_allocate()->set_shm_offset(at);
    }
    Response r;
    try {
      r = s.owner->exchange(s, req);
    } catch (...) {
      if (at != UINT64_MAX && s.child.shm) s.arena_give(at, size);
      throw;
    }
    if (r.has_failure() || !r.has_allocate() || r.allocate().buffer() == 0 || r.allocate().buffer() >= (uint64_t{1} << 48)) {
      if (at != UINT64_MAX) s.arena_give(at, size);
      if (r.has_failure()) throw sdk::Error(static_cast<bp_status_code>(r.failure().code()), r.failure().message());
      throw sdk::Error(BP_ERR_INTERNAL, "remote: a malformed allocation reply");
    }
    out->handle = make_handle(s.generation, r.allocate().buffer());
    out->host_ptr = nullptr;
    out->size = size;
    if (at != UINT64_MAX) {
      out->host_ptr = s.child.shm + at;
      s.shm_buffers[out->handle] = Server::ShmBuffer{s.child.shm, at, size};
    }
  });
}

void buffer_free(void*, bp_device* device, uint64_t handle) {
  auto* d = dev_of(device);
  Server& s = *d->server;
  std::lock_guard<std::mutex> lk(s.mu);
  // A buffer in the shared arena: its pages go back now, its range once the
  // server let go of it.
  auto shm = s.shm_buffers.find(handle);
  if (shm != s.shm_buffers.end()) {
    const auto b = shm->second;
    s.shm_buffers.erase(shm);
    const bool current = b.base == s.child.shm;
    // Up to kRetainBytes of freed pages stay: the next buffer of that size
    // reuses them without a page fault per 4 KiB (a plan run again, an
    // upload repeated). Beyond that they go back to the system.
    if (current && s.retained + b.size <= kRetainBytes) {
      s.retained += b.size;
    } else {
      ::madvise(b.base + b.offset, b.size, MADV_REMOVE);
    }
    if (!current) {
      // A dead child's mapping: unmapped with its last buffer.
      bool held = false;
      for (const auto& [h, o] : s.shm_buffers) held |= o.base == b.base;
      if (!held)
        for (auto it = s.retired.begin(); it != s.retired.end(); ++it)
          if (it->first == b.base) {
            ::munmap(it->first, it->second);
            s.retired.erase(it);
            break;
          }
    }
    if (current && !s.broken && handle_generation(handle) == s.generation) {
      try {
        Request req;
        req.mutable_free()->set_buffer(handle_id(handle));
        s.sequences.clear();
        s.owner->exchange(s, req);
      } catch (...) {
      }
    }
    if (current && s.child.shm) s.arena_give(b.offset, b.size);
    return;
  }
  if (s.broken || handle_generation(handle) != s.generation) return;  // gone with its session
  try {
    const uint64_t id = handle_id(handle);
    // Queued writes into it are moot; recorded sequences may use it.
    std::vector<Write> keep;
    for (auto& w : s.pending_writes)
      if (w.buffer() != id) keep.push_back(std::move(w));
    s.pending_writes = std::move(keep);
    s.sequences.clear();
    Request req;
    req.mutable_free()->set_buffer(id);
    s.owner->exchange(s, req);
  } catch (...) {
  }
}

// Bytes [offset, offset + size) of a buffer in the shared arena (the host
// reads and writes those in place), or nullptr for any other buffer.
char* shm_span(Server& s, uint64_t handle, uint64_t offset, uint64_t size) {
  auto it = s.shm_buffers.find(handle);
  if (it == s.shm_buffers.end()) return nullptr;
  if (offset > it->second.size || size > it->second.size - offset)
    throw sdk::Error(BP_ERR_INVALID_ARGUMENT, "remote: bytes outside their buffer");
  return it->second.base + it->second.offset + offset;
}

bp_error* buffer_write(void*, bp_device* device, uint64_t handle, uint64_t offset, const void* src, uint64_t size) {
  return sdk::guard([&] {
    auto* d = dev_of(device);
    Server& s = *d->server;
    std::lock_guard<std::mutex> lk(s.mu);
    if (char* at = shm_span(s, handle, offset, size)) {
      std::memcpy(at, src, size);  // in place
      return;
    }
    const uint64_t id = live_id(s, handle);
    const char* p = static_cast<const char*>(src);
    if (s.use_shm && size >= kShmThreshold) {
      // Staged in the shared memory; the message carries only where.
      for (uint64_t done = 0; done < size;) {
        const uint64_t n = std::min<uint64_t>(size - done, kMaxChunkBytes);
        if (s.shm_used + n > kShmBytes) {
          Response r = flush(s);
          if (r.has_failure()) throw sdk::Error(static_cast<bp_status_code>(r.failure().code()), r.failure().message());
        }
        std::memcpy(s.child.shm + s.shm_used, p + done, n);
        Write w;
        w.set_buffer(id);
        w.set_offset(offset + done);
        w.set_from_shm(true);
        w.set_shm_offset(s.shm_used);
        w.set_size(n);
        s.pending_writes.push_back(std::move(w));
        s.shm_used += n;
        done += n;
      }
      return;
    }
    for (uint64_t done = 0; done < size || (size == 0 && done == 0);) {
      const uint64_t n = std::min<uint64_t>(size - done, kWireChunkBytes);
      if (n >= kBulkWriteBytes) {
        // A bulk piece: queued writes first (order), then the piece as one
        // request in wire form, its bytes copied once.
        if (!s.pending_writes.empty()) {
          Request req;
          for (auto& w : s.pending_writes) *req.mutable_batch()->add_writes() = std::move(w);
          s.pending_writes.clear();
          s.pending_bytes = 0;
          s.owner->post(s, req);
        }
        s.owner->post_encoded(s, encode_bulk_write(id, offset + done, p + done, n));
        done += n;
        continue;
      }
      if (s.pending_bytes + n > kWireChunkBytes) {
        // Sent now, its reply read later: the next piece is copied while
        // the server takes this one.
        Request req;
        for (auto& w : s.pending_writes) *req.mutable_batch()->add_writes() = std::move(w);
        s.pending_writes.clear();
        s.pending_bytes = 0;
        s.owner->post(s, req);
      }
      Write w;
      w.set_buffer(id);
      w.set_offset(offset + done);
      w.set_data(p + done, n);
      s.pending_writes.push_back(std::move(w));
      s.pending_bytes += n;
      done += n;
      if (size == 0) break;
    }
  });
}

namespace {

void check_read_reply(const Response& r, uint64_t n) {
  if (r.batch().reads_size() != 1 || r.batch().reads(0).size() != n)
    throw sdk::Error(BP_ERR_INTERNAL, "remote: a read reply of the wrong size");
}

// Reads [offset, offset + size) of buffer `id` over the wire in pieces of
// kWireChunkBytes, kReadsInFlight requests ahead of the replies: the server
// reads and sends the next pieces while this side takes in the last.
constexpr int kReadsInFlight = 8;
void read_over_wire(Server& s, uint64_t id, uint64_t offset, char* p, uint64_t size) {
  if (size == 0) return;
  // Queued writes go first, in the first request.
  Request first;
  for (auto& w : s.pending_writes) *first.mutable_batch()->add_writes() = std::move(w);
  s.pending_writes.clear();
  s.pending_bytes = 0;
  int earlier = s.outstanding;  // replies of requests posted before these
  std::string failed;
  bp_status_code code = BP_ERR_INTERNAL;
  uint64_t asked = 0, taken = 0;
  auto ask = [&](Request& req) {
    const uint64_t n = std::min<uint64_t>(size - asked, kWireChunkBytes);
    auto* rd = req.mutable_batch()->add_reads();
    rd->set_buffer(id);
    rd->set_offset(offset + asked);
    rd->set_size(n);
    s.owner->post(s, req);
    asked += n;
  };
  ask(first);
  for (;;) {
    while (asked < size && s.outstanding - earlier < kReadsInFlight && failed.empty()) {
      Request req;
      ask(req);
    }
    if (s.outstanding == 0) break;
    Response r = s.owner->receive(s);
    if (earlier > 0) {
      // An earlier request's failure (a queued write) is this read's.
      --earlier;
      if (r.has_failure() && failed.empty()) code = static_cast<bp_status_code>(r.failure().code()), failed = r.failure().message();
      continue;
    }
    if (r.has_failure()) {
      if (failed.empty()) code = static_cast<bp_status_code>(r.failure().code()), failed = r.failure().message();
      continue;  // the rest of the replies are still read
    }
    if (!failed.empty()) continue;
    const uint64_t n = std::min<uint64_t>(size - taken, kWireChunkBytes);
    check_read_reply(r, n);
    std::memcpy(p + taken, r.batch().reads(0).data(), n);
    taken += n;
  }
  if (!failed.empty()) throw sdk::Error(code, failed);
}

}  // namespace

bp_error* buffer_read(void*, bp_device* device, uint64_t handle, uint64_t offset, void* dst, uint64_t size) {
  return sdk::guard([&] {
    auto* d = dev_of(device);
    Server& s = *d->server;
    std::lock_guard<std::mutex> lk(s.mu);
    if (const char* at = shm_span(s, handle, offset, size)) {
      std::memcpy(dst, at, size);  // in place
      return;
    }
    const uint64_t id = live_id(s, handle);
    char* p = static_cast<char*>(dst);
    if (!s.use_shm) return read_over_wire(s, id, offset, p, size);
    for (uint64_t done = 0; done < size;) {
      const uint64_t n = std::min<uint64_t>(size - done, kMaxChunkBytes);
      const bool staged = n >= kShmThreshold;
      if (staged && s.shm_used + n > kShmBytes) {
        Response r = flush(s);  // the queued writes' staged bytes first
        if (r.has_failure()) throw sdk::Error(static_cast<bp_status_code>(r.failure().code()), r.failure().message());
      }
      const uint64_t at = s.shm_used;
      Batch b;
      auto* rd = b.add_reads();
      rd->set_buffer(id);
      rd->set_offset(offset + done);
      rd->set_size(n);
      if (staged) {
        rd->set_to_shm(true);
        rd->set_shm_offset(at);
      }
      Response r = flush(s, &b);
      if (r.has_failure()) throw sdk::Error(static_cast<bp_status_code>(r.failure().code()), r.failure().message());
      if (staged) {
        if (r.batch().reads_size() != 0) throw sdk::Error(BP_ERR_INTERNAL, "remote: a read reply of the wrong form");
        std::memcpy(p + done, s.child.shm + at, n);
      } else {
        check_read_reply(r, n);
        std::memcpy(p + done, r.batch().reads(0).data(), n);
      }
      done += n;
    }
  });
}

// A run: its calls collect on the host until synchronize(), which sends
// them as one batch (a timed run's reply carries each call's device time).
bp_error* begin(void*, bp_device* device, uint32_t flags, bp_run** out_run) {
  return sdk::guard([&] {
    BP_SDK_CHECK(out_run != nullptr, BP_ERR_INVALID_ARGUMENT, "remote: begin without out_run");
    auto run = std::make_unique<Run>();
    run->device = dev_of(device);
    run->timed = (flags & BP_RUN_TIMED) != 0;
    *out_run = reinterpret_cast<bp_run*>(run.release());
  });
}

bp_error* remote_kernel(const bp_kernel_context* ctx, const bp_storage* inputs, size_t n_inputs, const bp_storage* outputs,
                        size_t n_outputs, const bp_layout* layouts, const bp_op_params* params) {
  return sdk::guard([&] {
    auto* d = dev_of(ctx->device);
    Server& s = *d->server;
    std::lock_guard<std::mutex> lk(s.mu);
    if (ctx->kernel_index >= d->kernel_map.size() || d->kernel_map[ctx->kernel_index] == UINT32_MAX)
      throw sdk::Error(BP_ERR_UNIMPLEMENTED, "remote: " + d->name + " has no such kernel");
    Call c;
    c.set_device(d->index);
    c.set_kernel(d->kernel_map[ctx->kernel_index]);
    for (size_t i = 0; i < n_inputs; ++i)
      encode_storage(inputs[i], inputs[i].buffer_handle ? live_id(s, inputs[i].buffer_handle) : 0, c.add_inputs());
    for (size_t i = 0; i < n_outputs; ++i) encode_storage(outputs[i], live_id(s, outputs[i].buffer_handle), c.add_outputs());
    for (size_t i = 0; i < n_inputs + n_outputs; ++i) encode_layout(layouts[i], c.add_layouts());
    encode_params(*params, c.mutable_params());
    auto* run = reinterpret_cast<Run*>(ctx->run);
    BP_SDK_CHECK(run != nullptr && run->device == d, BP_ERR_INVALID_ARGUMENT,
                 "remote: a kernel call outside a run of " + d->name + " (no begin(), or another device's run)");
    run->calls.push_back(std::move(c));
  });
}

bp_error* synchronize(void*, bp_device* device, bp_run* handle, uint64_t* out_ns, size_t n_out) {
  // The run ends here whatever happens.
  std::unique_ptr<Run> run(reinterpret_cast<Run*>(handle));
  if (!run) return make_error(BP_ERR_INVALID_ARGUMENT, "remote: synchronize without a run");
  auto* d = dev_of(device);
  if (run->device != d) return make_error(BP_ERR_INVALID_ARGUMENT, "remote: synchronize of another device's run");
  Server& s = *d->server;
  std::lock_guard<std::mutex> lk(s.mu);
  std::vector<Call> calls = std::move(run->calls);
  const size_t n_calls = calls.size();
  const bool timed = run->timed;
  if (timed && out_ns && n_out != n_calls)
    return make_error(BP_ERR_INVALID_ARGUMENT, "remote: synchronize: the run made " + std::to_string(n_calls) +
                                                   " calls, not " + std::to_string(n_out));
  const bool was_broken = s.broken;
  try {
    Batch b;
    if (!calls.empty()) {
      // A batch seen before is replayed by id: only its writes travel.
      Batch body;
      for (auto& c : calls) *body.add_calls() = std::move(c);
      std::string text;
      body.SerializeToString(&text);
      auto it = s.sequences.find(text);
      if (it != s.sequences.end()) {
        b.set_replay(it->second);
      } else {
        if (s.sequences.size() >= 64) s.sequences.clear();
        // Ids cycle through 64: recording under a used id replaces the
        // server's old sequence, so the server holds at most 64 (ids since
        // the last clear are at most 64 consecutive ones, never equal mod 64).
        const uint64_t id = 1 + (s.next_sequence++ % 64);
        s.sequences.emplace(std::move(text), id);
        b.set_record(id);
        b.mutable_calls()->Swap(body.mutable_calls());
      }
    }
    if (timed) b.set_timed(true);
    Response r = flush(s, &b);
    if (r.has_failure())
      return call_error(static_cast<bp_status_code>(r.failure().code()), r.failure().message(), r.failure().call_index());
    if (timed && out_ns) {
      const auto& got = r.batch().call_ns();
      for (size_t i = 0; i < n_calls; ++i) out_ns[i] = static_cast<int>(i) < got.size() ? got[static_cast<int>(i)] : UINT64_MAX;
    }
    return nullptr;
  } catch (const sdk::Error& e) {
    // A child that died in the middle names the call it was running.
    return call_error(e.code(), e.what(), !was_broken && s.broken ? s.lost_call : -1);
  } catch (const std::exception& e) {
    return make_error(BP_ERR_INTERNAL, e.what());
  }
}

// ---- instances ---------------------------------------------------------------------------------

// Each instance owns its API table; the plugin context is the Instance.
// An instance the host took but never initialized (it rejected the plugin
// first) is reclaimed only when kMaxInstances are live.
constexpr size_t kMaxInstances = 64;
// Never destroyed: a host that keeps its Runtime in a static shuts the
// plugin down after this library's static destructors have run (a vector
// destroyed at exit was then read by shutdown: ASan, heap-use-after-free).
std::mutex& g_instances_mu = *new std::mutex;
std::vector<std::unique_ptr<Instance>>& g_instances = *new std::vector<std::unique_ptr<Instance>>;

Instance* instance(void* plugin) { return static_cast<Instance*>(plugin); }

bp_error* initialize(const bp_plugin_api* self, const bp_host_api* host, void** out_plugin) {
  Instance* inst = nullptr;
  {
    std::lock_guard<std::mutex> lk(g_instances_mu);
    for (auto& i : g_instances)
      if (&i->api == self) inst = i.get();
  }
  if (!inst) return make_error(BP_ERR_INVALID_ARGUMENT, "remote: initialize of a table this library did not return");
  *out_plugin = inst;
  return inst->initialize(host);
}
void shutdown(void* plugin) {
  instance(plugin)->shutdown();
  std::lock_guard<std::mutex> lk(g_instances_mu);
  g_instances.erase(std::remove_if(g_instances.begin(), g_instances.end(),
                                   [&](const auto& i) { return i.get() == plugin; }),
                    g_instances.end());
}
uint32_t device_count(void* plugin) { return instance(plugin)->device_count(); }
bp_error* device_get(void* plugin, uint32_t i, bp_device** out) {
  *out = instance(plugin)->device(i);
  return *out ? nullptr : make_error(BP_ERR_INVALID_ARGUMENT, "remote: no such device");
}

void fill(bp_plugin_api& a) {
  a = sdk::api_table(kPluginName, kPluginVersion, std::vector<bp_kernel_desc>{});
  a.error_destroy = remote_error_destroy;
  a.error_call_index = remote_error_call_index;
  a.initialize = initialize;
  a.shutdown = shutdown;
  a.device_count = device_count;
  a.device_get = device_get;
  a.device_info = device_info;
  a.device_supports_kernel = device_supports_kernel;
  a.buffer_allocate = buffer_allocate;
  a.buffer_free = buffer_free;
  a.buffer_write = buffer_write;
  a.buffer_read = buffer_read;
  a.begin = begin;
  a.synchronize = synchronize;
  a.run_flags = BP_RUN_TIMED;
}

}  // namespace bp_remote

using namespace bp_remote;


extern "C" BP_EXPORT bp_status_code backplane_plugin_entry(const bp_plugin_query* query, const bp_plugin_api** out_api) {
  static bp_plugin_api probe{};  // for negotiate's checks only
  probe.struct_size = sizeof probe;
  if (auto rc = sdk::negotiate(query, &probe, out_api); rc != BP_OK) return rc;
  *out_api = nullptr;
  std::string config;
  if (query->struct_size >= offsetof(bp_plugin_query, instance) + sizeof(bp_string) && query->instance.data)
    config.assign(query->instance.data, query->instance.len);
  try {
    std::lock_guard<std::mutex> lk(g_instances_mu);
    if (g_instances.size() >= kMaxInstances) {
      auto it = std::find_if(g_instances.begin(), g_instances.end(), [](const auto& i) { return !i->initialized; });
      if (it != g_instances.end()) g_instances.erase(it);
    }
    if (g_instances.size() < kMaxInstances) {
      auto inst = std::make_unique<Instance>(config);
      if (!config.empty()) {
        // The names the host checks before initialize(): the isolated plugin's.
        const auto j = nlohmann::json::parse(config, nullptr, false);
        if (j.is_object()) {
          inst->name = j.value("isolate", std::string(kPluginName));
          inst->version = j.value("version", std::string(kPluginVersion));
        }
      }
      auto& a = inst->api;
      fill(a);
      a.name = sdk::to_bp(inst->name);
      a.version = sdk::to_bp(inst->version);
      g_instances.push_back(std::move(inst));
      *out_api = &g_instances.back()->api;
      return BP_OK;
    }
  } catch (...) {
  }
  if (query->error_buffer && query->error_buffer_size)
    std::snprintf(query->error_buffer, query->error_buffer_size, "remote: more than %zu instances at once", kMaxInstances);
  return BP_ERR_UNAVAILABLE;
}
