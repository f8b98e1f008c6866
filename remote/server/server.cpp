// `backplane serve`: one gRPC stream per client session. Every request is
// decoded and checked (remote/server/validate.cpp) before it reaches a plugin;
// buffers belong to the session that allocated them and are freed when its
// stream ends. See docs/remote.md for the threat model.
#include "server.hpp"

#include "backplane_remote.grpc.pb.h"
#include "codec.hpp"
#include "frames.hpp"
#include "plugin.hpp"  // the core's Plugin/Device internals (core/src)
#include "validate.hpp"
#include "input_files.hpp"  // parse_json_bounded (core/src)
#include "vendor_ops.hpp"   // decompositions (core/src)

#include <backplane/sdk/dtype.hpp>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstring>
#include <chrono>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/mman.h>
#include <csignal>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <unistd.h>
#include <unordered_map>

namespace backplane::remote {

namespace {

using Clock = std::chrono::steady_clock;

struct ServedDevice {
  Device* device = nullptr;
  Plugin* plugin = nullptr;
  bp_device* handle = nullptr;
  std::vector<KernelInfo> table;  // the plugin's kernel table
  std::vector<bool> supported;
  bp_device_info info{};
  std::mutex run;  // one batch at a time per device (begin..synchronize)
  // Whether the plugin imported a probe of the shared memory (-1: not tried).
  std::atomic<int> shm_import{-1};
};

std::string take(const Plugin& p, bp_error* e, int64_t* call_index = nullptr) {
  if (call_index) {
    *call_index = -1;
    const auto* api = p.api();
    if (e && api->error_call_index) *call_index = api->error_call_index(p.ctx(), e);
  }
  return p.take_error(e);
}

// Batches in flight, for the deadline watchdog.
struct Watch {
  std::mutex mu;
  std::map<uint64_t, std::pair<Clock::time_point, std::string>> running;
  uint64_t next = 1;
};

// Memory every session together holds (buffers, recorded sequences, requests
// being decoded), against --max-total-memory.
class Budget {
 public:
  explicit Budget(uint64_t cap) : cap_(cap) {}
  bool take(uint64_t n) {
    uint64_t cur = used_.load();
    do {
      if (n > cap_ || cur > cap_ - n) return false;
    } while (!used_.compare_exchange_weak(cur, cur + n));
    return true;
  }
  void give(uint64_t n) { used_.fetch_sub(n); }
  uint64_t cap() const { return cap_; }
  uint64_t used() const { return used_.load(); }

 private:
  const uint64_t cap_;
  std::atomic<uint64_t> used_{0};
};

// Bytes taken from the budget for a scope, given back when it ends.
struct Held {
  Budget& budget;
  uint64_t bytes = 0;
  explicit Held(Budget& b) : budget(b) {}
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  ~Held() { budget.give(bytes); }
  bool grow(uint64_t n) {
    if (!budget.take(n)) return false;
    bytes += n;
    return true;
  }
};

using RawStream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

class Service final : public Remote::Service {
 public:
  Service(Runtime& runtime, std::vector<std::unique_ptr<ServedDevice>>& devices, const ServerOptions& options,
          Watch& watch, std::atomic<int64_t>* progress, char* shm, uint64_t shm_size, Budget& budget)
      : runtime_(runtime), devices_(devices), options_(options), watch_(watch), progress_(progress), shm_(shm),
        shm_size_(shm_size), budget_(budget) {
    // Session's requests arrive as bytes, not as decoded messages: gRPC
    // would decode each before the server sees it, and decoding is where a
    // small message becomes a large one (measure_request bounds it first).
    MarkMethodStreamed(0, new grpc::internal::BidiStreamingHandler<Service, grpc::ByteBuffer, grpc::ByteBuffer>(
                              [](Service* service, grpc::ServerContext* context, RawStream* stream) {
                                return service->RawSession(context, stream);
                              },
                              this));
  }

  grpc::Status RawSession(grpc::ServerContext* context, RawStream* stream);
  // One session over a connected socket of the framed transport; returns
  // when it ends (the caller closes the socket).
  void FramedSession(int fd);

  // A session without a transport (InProcessSession): its state, and one
  // request's bytes through the same decoding and handling as RawSession's.
  struct Local;
  std::unique_ptr<Local> open_local();
  std::string local_request(Local& l, const std::string& bytes);
  void close_local(Local& l);

 private:
  struct Buffer {
    uint32_t device;
    uint64_t handle;
    uint64_t size;
    void* host_ptr;
    bool counted;  // device memory against --max-memory (not shared-memory imports)
    // [0, clean_to) holds zeros or what the client wrote; the rest holds
    // what the allocator left there, and is zeroed before the session can
    // see any of it (a read or a kernel call: zero_pending). An upload that
    // writes the buffer from its start never pays for zeroing it.
    uint64_t clean_to;
  };
  struct State {
    std::unordered_map<uint64_t, Buffer> buffers;
    std::vector<uint64_t> unclean;  // buffers whose clean_to may be short of their size
    uint64_t next_buffer = 1;
    uint64_t bytes = 0;  // counted buffers' bytes (in the budget)
    std::unordered_map<uint64_t, std::vector<CheckedCall>> sequences;
    size_t sequence_bytes = 0;  // what the recorded sequences hold, about (in the budget)
  };

  template <class Open>
  Response decode_and_handle_from(State& st, Open open);
  template <class Open>
  bool direct_writes_fit(State& st, Open& open);
  template <class Open>
  Response direct_writes(State& st, Open& open);
  // A session's seat among --max-sessions and its state: both given back
  // by scope on every way out (an exception from a read, a write or a
  // decode that ran out of memory included), the state's buffers first.
  struct Seat {
    Service& service;
    const bool room;
    State st;
    explicit Seat(Service& s) : service(s), room(s.sessions_.fetch_add(1) < s.options_.max_sessions) {}
    Seat(const Seat&) = delete;
    Seat& operator=(const Seat&) = delete;
    ~Seat() {
      service.release(st);
      service.sessions_.fetch_sub(1);
    }
  };
  std::string too_many_sessions() const {
    return "too many sessions (the server runs at most " + std::to_string(options_.max_sessions) + ")";
  }
  Response decode_and_handle(State& st, grpc::ByteBuffer& bytes);
  Response decode_and_handle(State& st, const std::string& bytes);
  Response handle(State& st, const Request& req);
  Response hello();
  Response allocate(State& st, const Allocate& a);
  Response batch(State& st, const Batch& b);
  std::optional<Response> batch_writes(State& st, const Batch& b);
  std::optional<Response> batch_calls(State& st, const Batch& b, std::vector<CheckedCall>& fresh,
                                      const std::vector<CheckedCall>*& calls);
  std::optional<Response> run_calls(State& st, const Batch& b, const std::vector<CheckedCall>& calls, BatchReply& reply);
  std::optional<Response> batch_reads(State& st, const Batch& b, BatchReply& reply);
  // "" when [offset, offset + size) lies in the session's buffer `id` (set in out).
  static std::string range(State& st, uint64_t id, uint64_t offset, uint64_t size, const char* what, Buffer*& out);
  // [offset, offset + size) of the memory shared with the client, or nullptr.
  char* shared(uint64_t offset, uint64_t size) const;
  void release(State& st);
  // After [offset, offset + n) of `b` was written: its clean prefix grows
  // past it, a gap before it zeroed.
  static void written(Buffer& b, uint64_t offset, uint64_t n);
  // Zeroes what no buffer of the session has had written yet: before a
  // read or a kernel call lets the session see any of it.
  static void zero_pending(State& st);
  void drop_sequence(State& st, std::unordered_map<uint64_t, std::vector<CheckedCall>>::iterator it);
  // "" when the session may hold n more bytes (--max-memory); `what` starts the message.
  std::string session_room(const State& st, uint64_t n, const std::string& what) const;
  // What a refusal by the budget says.
  std::string over_budget(uint64_t n, const std::string& what) const;

  // A vendor op's output type from its manifest's decomposition, for plugins
  // without infer_custom_op (the CPU plugin's fused ops).
  std::string infer_by_decomposition(const std::string& op, const std::vector<bp_dtype>& dts,
                                     const std::vector<bp_layout>& ls, const bp_op_params& p, bp_dtype& odt,
                                     bp_layout& ol) const;

  Runtime& runtime_;
  std::vector<std::unique_ptr<ServedDevice>>& devices_;
  const ServerOptions& options_;
  Watch& watch_;
  std::atomic<int64_t>* progress_;  // the running call, or -1 (isolated child only)
  char* shm_;                       // memory shared with the one client (isolated child only)
  uint64_t shm_size_;
  Budget& budget_;
  std::atomic<int> sessions_{0};
};

// What a checked call holds in memory, about: recorded sequences and one
// batch's checked calls are bounded by it, not by their (much smaller) wire size.
size_t call_bytes(const CheckedCall& c) {
  // What the vectors and the string allocated (their capacity, not their
  // size), and each allocation's overhead.
  constexpr size_t kAlloc = 16;
  size_t n = sizeof(CheckedCall) + c.json.capacity() + kAlloc;
  n += c.inputs.capacity() * sizeof(bp_storage) + c.outputs.capacity() * sizeof(bp_storage) + 2 * kAlloc;
  n += (c.input_buffers.capacity() + c.output_buffers.capacity()) * sizeof(uint64_t) + 2 * kAlloc;
  n += c.layouts.capacity() * sizeof(bp_layout) + kAlloc;
  n += c.output_slots.capacity() * sizeof(std::vector<bp_bundle_slot>) + kAlloc;
  for (const auto& sl : c.output_slots) n += sl.capacity() * sizeof(bp_bundle_slot) + kAlloc;
  return n;
}
size_t calls_bytes(const std::vector<CheckedCall>& calls) {
  size_t n = 0;
  for (const auto& c : calls) n += call_bytes(c);
  return n;
}

// How long a framed session polls for its host's next request before it
// sleeps: a host that runs a plan in a loop sends the next one within a few
// microseconds, and a sleeping thread's wake-up costs tens on a VM.
constexpr int kFrameSpinUs = 50;

constexpr size_t kMaxCheckedBytes = size_t{256} << 20;   // one batch's checked calls
constexpr size_t kMaxRecordedBytes = size_t{256} << 20;  // one session's recorded sequences
constexpr size_t kMaxBuffers = size_t{1} << 16;          // buffers one session holds

// Whether buffers of `d` may live in the shared memory: the plugin has the
// entry and imports a probe of that memory (the Vulkan plugin has the entry
// on every device, and imports only where the driver can).
bool can_import(ServedDevice& d, char* shm, uint64_t shm_size) {
  const auto* api = d.plugin->api();
  if (!shm || !api->buffer_import_host) return false;
  int known = d.shm_import.load();
  if (known < 0) {
    const uint64_t probe = std::max<uint64_t>(d.info.buffer_alignment, 64);
    bp_buffer b{};
    b.struct_size = sizeof b;
    known = 0;
    if (probe <= shm_size) {
      if (bp_error* e = api->buffer_import_host(d.plugin->ctx(), d.handle, shm, probe, &b))
        d.plugin->take_error(e);
      else
        known = 1;
      if (known) api->buffer_free(d.plugin->ctx(), d.handle, b.handle);
    }
    d.shm_import.store(known);
  }
  return known == 1;
}

Response failure(bp_status_code code, const std::string& message, int64_t call_index = -1) {
  Response r;
  auto* f = r.mutable_failure();
  f->set_code(static_cast<uint32_t>(code));
  f->set_message(message.size() > 4096 ? message.substr(0, 4096) + "..." : message);
  f->set_call_index(call_index);
  return r;
}

grpc::Status Service::RawSession(grpc::ServerContext* context, RawStream* stream) {
  // The token first: a client without it learns nothing but the refusal.
  const auto& md = context->client_metadata();
  const auto it = md.find(kTokenKey);
  const std::string given = it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
  if (!same_secret(given, options_.token))
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "a valid token is required");
  // The session's slot and everything it holds are given back by scope, on
  // every way out: an exception (from gRPC's read or write, or a decode
  // that ran out of memory) included.
  Seat seat(*this);
  if (!seat.room) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, too_many_sessions());
  State& st = seat.st;
  try {
    grpc::ByteBuffer in;
    while (stream->Read(&in)) {
      Response resp = decode_and_handle(st, in);
      in.Clear();
      grpc::ByteBuffer out;
      bool own = false;
      if (!grpc::SerializationTraits<Response>::Serialize(resp, &out, &own).ok()) break;
      if (!stream->Write(out)) break;
    }
  } catch (const std::bad_alloc&) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "the server ran out of memory for this session");
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string("the session failed: ") + e.what());
  }
  return grpc::Status::OK;
}

// A session over the framed transport of isolated children (frames.hpp):
// the token first, within the idle timeout; then requests until the host
// closes the socket. The same slot, budget and clean-up by scope as
// RawSession's.
void Service::FramedSession(int fd) {
  std::string bytes, scratch;
  FrameRead how;
  how.max_bytes = kMaxStringBytes;
  how.timeout_ms = static_cast<int>(std::clamp<int64_t>(options_.idle_timeout_ms, 1, INT32_MAX));
  auto refuse = [&](const std::string& why) {
    // One answer, then the socket closes: what the host's error will say.
    write_frame(fd, failure(BP_ERR_UNAVAILABLE, why), scratch);
  };
  if (read_frame(fd, bytes, how) != FrameResult::ok) return;
  if (!same_secret(bytes, options_.token)) return refuse("a valid token is required");
  Seat seat(*this);
  if (!seat.room) return refuse(too_many_sessions());
  State& st = seat.st;
  // A request's bytes are held against the budget while it is read and
  // handled, as gRPC's received messages are.
  Held frame(budget_);
  how.max_bytes = kMaxMessageBytes;
  how.timeout_ms = -1;
  how.spin_us = kFrameSpinUs;
  how.reserve = [&](uint64_t n) { return frame.grow(n); };
  try {
    for (;;) {
      const FrameResult r = read_frame(fd, bytes, how);
      if (r == FrameResult::too_large) {
        // The rest of it is not read: the session cannot go on.
        refuse(how.announced > kMaxMessageBytes ? "a request of " + std::to_string(how.announced) +
                                                      " bytes is over the message limit of " +
                                                      std::to_string(kMaxMessageBytes) + " bytes"
                                                : over_budget(how.announced, "a request"));
        return;
      }
      if (r != FrameResult::ok) return;
      Response resp = decode_and_handle(st, bytes);
      // Large requests give their memory back; small ones keep it for the next.
      if (bytes.capacity() > (size_t{1} << 20)) std::string().swap(bytes);
      budget_.give(frame.bytes);
      frame.bytes = 0;
      if (!write_frame(fd, resp, scratch)) return;
      if (scratch.capacity() > (size_t{1} << 20)) std::string().swap(scratch);
    }
  } catch (const std::exception&) {
    // bad_alloc or worse: the session ends, its memory given back by scope.
  }
}

struct Service::Local {
  State st;
};

std::unique_ptr<Service::Local> Service::open_local() { return std::make_unique<Local>(); }

std::string Service::local_request(Local& l, const std::string& bytes) {
  return decode_and_handle(l.st, bytes).SerializeAsString();
}

void Service::close_local(Local& l) { release(l.st); }

// A request that is a batch of writes alone, each Write being exactly
// `buffer`, `offset`, `data` in that order (what the remote plugin sends for
// a bulk upload), into buffers of host memory: its bytes are copied from the
// received message straight into the buffers, not into a decoded copy first.
// Two passes: direct_writes_fit() reads the structure and checks every
// range, skipping the bytes; only then does direct_writes() copy them. Any
// other request, and any write this path does not take (shared memory, a
// device buffer, a range that fails its check, an unknown field), goes the
// usual way, which reports it.
namespace direct {
namespace io = google::protobuf::io;
using Wire = google::protobuf::internal::WireFormatLite;
constexpr uint32_t kBatch = Wire::MakeTag(Request::kBatchFieldNumber, Wire::WIRETYPE_LENGTH_DELIMITED);
constexpr uint32_t kWrite = Wire::MakeTag(Batch::kWritesFieldNumber, Wire::WIRETYPE_LENGTH_DELIMITED);
constexpr uint32_t kBuffer = Wire::MakeTag(Write::kBufferFieldNumber, Wire::WIRETYPE_VARINT);
constexpr uint32_t kOffset = Wire::MakeTag(Write::kOffsetFieldNumber, Wire::WIRETYPE_VARINT);
constexpr uint32_t kData = Wire::MakeTag(Write::kDataFieldNumber, Wire::WIRETYPE_LENGTH_DELIMITED);

// Walks the writes; `each(buffer, offset, size, in)` must consume the
// size bytes (skip or copy) and say whether to go on. False when the
// request is not of this form.
template <class Each>
bool walk(io::ZeroCopyInputStream& raw, Each each) {
  io::CodedInputStream in(&raw);
  in.SetTotalBytesLimit(INT_MAX);
  uint32_t len = 0;
  // Every length must fit, and every message end exactly where its length
  // says (a length past the bytes there is left to the decoder to refuse).
  if (in.ReadTag() != kBatch || !in.ReadVarint32(&len) || len > INT_MAX) return false;
  const auto batch = in.PushLimit(static_cast<int>(len));
  size_t writes = 0;
  for (uint32_t t = in.ReadTag(); t != 0; t = in.ReadTag()) {
    if (t != kWrite || ++writes > kMaxWritesPerBatch || !in.ReadVarint32(&len) || len > INT_MAX) return false;
    const auto write = in.PushLimit(static_cast<int>(len));
    uint64_t buffer = 0, offset = 0;
    uint32_t n = 0;
    t = in.ReadTag();
    if (t == kBuffer && !in.ReadVarint64(&buffer)) return false;
    if (t == kBuffer) t = in.ReadTag();
    if (t == kOffset && !in.ReadVarint64(&offset)) return false;
    if (t == kOffset) t = in.ReadTag();
    if (t != kData || !in.ReadVarint32(&n) || n > INT_MAX || !each(buffer, offset, n, in)) return false;
    if (in.BytesUntilLimit() != 0) return false;  // fields after data, or a short message
    in.PopLimit(write);
  }
  if (in.BytesUntilLimit() != 0) return false;
  in.PopLimit(batch);
  return writes > 0 && in.ReadTag() == 0 && in.ConsumedEntireMessage();
}
}  // namespace direct

template <class Open>
bool Service::direct_writes_fit(State& st, Open& open) {
  auto raw = open();
  if (!raw) return false;
  return direct::walk(*raw, [&](uint64_t id, uint64_t offset, uint32_t n, direct::io::CodedInputStream& in) {
    Buffer* buf = nullptr;
    if (!range(st, id, offset, n, "write", buf).empty()) return false;
    if (devices_[buf->device]->info.memory_kind != BP_MEMORY_HOST || !buf->host_ptr) return false;
    return in.Skip(static_cast<int>(n));
  });
}

template <class Open>
Response Service::direct_writes(State& st, Open& open) {
  auto raw = open();
  const bool done = raw && direct::walk(*raw, [&](uint64_t id, uint64_t offset, uint32_t n, direct::io::CodedInputStream& in) {
    // Checked by direct_writes_fit over the same bytes.
    Buffer& buf = st.buffers.at(id);
    if (!in.ReadRaw(static_cast<char*>(buf.host_ptr) + offset, static_cast<int>(n))) return false;
    written(buf, offset, n);
    return true;
  });
  if (!done) return failure(BP_ERR_INTERNAL, "write: the request changed between two readings");
  Response r;
  r.mutable_batch();  // what batch() answers a batch of writes alone
  return r;
}

// Measured before it is decoded (counts, and the memory decoding would
// take, against the budget), then decoded and handled. `open` gives a fresh
// stream over the request's bytes each time it is called.
template <class Open>
Response Service::decode_and_handle_from(State& st, Open open) {
  try {
    // A batch of writes alone (a bulk upload, encode_bulk_write) goes
    // straight into host memory. Any other request leaves the first pass at
    // its first field or two (a 1-element isolated call measured the same
    // with and without a size gate in front of it: 5.2-5.4 us).
    if (direct_writes_fit(st, open)) return direct_writes(st, open);
    uint64_t need = 0;
    {
      auto in = open();
      if (!in) return failure(BP_ERR_INVALID_ARGUMENT, "request: unreadable bytes");
      if (auto e = measure_request(*in, need); !e.empty())
        return failure(need > kMaxDecodedBytes ? BP_ERR_OUT_OF_MEMORY : BP_ERR_INVALID_ARGUMENT,
                       "request refused before decoding: " + e);
    }
    Held held(budget_);
    if (!held.grow(need)) return failure(BP_ERR_OUT_OF_MEMORY, over_budget(need, "request (decoding it)"));
    Request req;
    {
      auto in = open();
      if (!in || !req.ParseFromZeroCopyStream(in.get())) return failure(BP_ERR_INVALID_ARGUMENT, "request: not a valid message");
    }
    return handle(st, req);
  } catch (const std::bad_alloc&) {
    return failure(BP_ERR_OUT_OF_MEMORY, "the server ran out of memory for this request");
  }
}

Response Service::decode_and_handle(State& st, grpc::ByteBuffer& bytes) {
  return decode_and_handle_from(st, [&]() -> std::unique_ptr<google::protobuf::io::ZeroCopyInputStream> {
    auto r = std::make_unique<grpc::ProtoBufferReader>(&bytes);
    if (!r->status().ok()) return nullptr;
    return r;
  });
}

Response Service::decode_and_handle(State& st, const std::string& bytes) {
  return decode_and_handle_from(st, [&]() -> std::unique_ptr<google::protobuf::io::ZeroCopyInputStream> {
    return std::make_unique<google::protobuf::io::ArrayInputStream>(bytes.data(), static_cast<int>(bytes.size()));
  });
}

std::string Service::session_room(const State& st, uint64_t n, const std::string& what) const {
  const uint64_t cap = options_.max_session_bytes;
  const uint64_t mine = st.bytes + st.sequence_bytes;
  if (cap && (n > cap || mine > cap - n))
    return what + ": the session would hold more than the server's limit of " + std::to_string(cap) +
           " bytes (--max-memory; it holds " + std::to_string(mine) + " in buffers and recorded sequences)";
  return {};
}

std::string Service::over_budget(uint64_t n, const std::string& what) const {
  return what + ": " + std::to_string(n) + " bytes would take the server past its memory limit of " +
         std::to_string(budget_.cap()) + " bytes for all sessions (--max-total-memory; " + std::to_string(budget_.used()) +
         " in use)";
}

void Service::drop_sequence(State& st, std::unordered_map<uint64_t, std::vector<CheckedCall>>::iterator it) {
  const size_t n = std::min(st.sequence_bytes, calls_bytes(it->second));
  st.sequence_bytes -= n;
  budget_.give(n);
  st.sequences.erase(it);
}

void Service::release(State& st) {
  for (auto& [id, b] : st.buffers) {
    auto& d = *devices_[b.device];
    d.plugin->api()->buffer_free(d.plugin->ctx(), d.handle, b.handle);
  }
  st.buffers.clear();
  st.sequences.clear();
  budget_.give(st.bytes + st.sequence_bytes);
  st.bytes = 0;
  st.sequence_bytes = 0;
}

Response Service::handle(State& st, const Request& req) {
  try {
    switch (req.body_case()) {
      case Request::kHello:
        if (req.hello().protocol() != kProtocolVersion)
          return failure(BP_ERR_INCOMPATIBLE, "this server speaks protocol " + std::to_string(kProtocolVersion) +
                                                  ", the client " + std::to_string(req.hello().protocol()));
        return hello();
      case Request::kAllocate: return allocate(st, req.allocate());
      case Request::kFree: {
        auto it = st.buffers.find(req.free().buffer());
        if (it == st.buffers.end()) return failure(BP_ERR_INVALID_ARGUMENT, "free: no such buffer");
        // Recorded sequences that use it can no longer run.
        for (auto s = st.sequences.begin(); s != st.sequences.end();) {
          bool uses = false;
          for (const auto& c : s->second)
            for (auto id : c.input_buffers) uses |= id == it->first;
          for (const auto& c : s->second) uses |= c.output_buffers[0] == it->first;
          if (uses) {
            auto dead = s++;
            drop_sequence(st, dead);
          } else {
            ++s;
          }
        }
        auto& d = *devices_[it->second.device];
        d.plugin->api()->buffer_free(d.plugin->ctx(), d.handle, it->second.handle);
        if (it->second.counted) {
          st.bytes -= it->second.size;
          budget_.give(it->second.size);
        }
        st.buffers.erase(it);
        return Response();
      }
      case Request::kBatch: return batch(st, req.batch());
      case Request::BODY_NOT_SET: break;
    }
    return failure(BP_ERR_INVALID_ARGUMENT, "an empty request");
  } catch (const std::bad_alloc&) {
    return failure(BP_ERR_OUT_OF_MEMORY, "the server ran out of memory for this request");
  } catch (const std::exception& e) {
    return failure(BP_ERR_INTERNAL, e.what());
  }
}

Response Service::hello() {
  Response r;
  auto* h = r.mutable_hello();
  h->set_protocol(kProtocolVersion);
  h->set_shared_memory(shm_ != nullptr);
  std::map<const Plugin*, int> plugin_index;
  for (auto& d : devices_) {
    if (!plugin_index.count(d->plugin)) {
      plugin_index[d->plugin] = h->plugins_size();
      auto* p = h->add_plugins();
      p->set_name(d->plugin->info().name);
      p->set_version(d->plugin->info().version);
      for (const auto& k : d->table) {
        auto* kd = p->add_kernels();
        kd->set_op(k.op);
        for (auto t : k.dtypes) kd->add_dtypes(t);
        for (auto l : k.layouts) kd->add_layouts(l);
        kd->set_n_outputs(1);
        kd->set_bundle_slots(k.bundle_slots);
        kd->set_flags(k.variadic ? BP_KERNEL_FLAG_VARIADIC : 0);
      }
    }
    auto* dd = h->add_devices();
    dd->set_name(d->device->name());
    dd->set_kind(d->device->kind());
    dd->set_description(d->device->description());
    dd->set_buffer_alignment(d->info.buffer_alignment);
    dd->set_max_buffer_size(d->info.max_buffer_size);
    dd->set_plugin(d->plugin->info().name);
    for (size_t k = 0; k < d->supported.size(); ++k)
      if (d->supported[k]) dd->add_kernels(static_cast<uint32_t>(k));
    dd->set_shm_buffers(can_import(*d, shm_, shm_size_));
  }
  return r;
}

Response Service::allocate(State& st, const Allocate& a) {
  if (a.device() >= devices_.size()) return failure(BP_ERR_INVALID_ARGUMENT, "allocate: no device " + std::to_string(a.device()));
  auto& d = *devices_[a.device()];
  if (st.buffers.size() >= kMaxBuffers)
    return failure(BP_ERR_OUT_OF_MEMORY, "allocate: a session holds at most " + std::to_string(kMaxBuffers) + " buffers");
  if (a.in_shm()) {
    // A range of the shared memory becomes a buffer of the device in place.
    uint64_t end = 0;
    if (!can_import(d, shm_, shm_size_)) return failure(BP_ERR_INVALID_ARGUMENT, "allocate: no shared-memory buffers on this device");
    if (__builtin_add_overflow(a.shm_offset(), a.size(), &end) || end > shm_size_ || a.size() == 0 ||
        (d.info.buffer_alignment && a.shm_offset() % d.info.buffer_alignment != 0))
      return failure(BP_ERR_INVALID_ARGUMENT, "allocate: not an aligned range of the shared memory");
    bp_buffer buf{};
    buf.struct_size = sizeof buf;
    if (bp_error* e = d.plugin->api()->buffer_import_host(d.plugin->ctx(), d.handle, shm_ + a.shm_offset(), a.size(), &buf))
      return failure(d.plugin->api()->error_code(d.plugin->ctx(), e), "allocate on " + d.device->name() + ": " + take(*d.plugin, e));
    const uint64_t id = st.next_buffer++;
    st.buffers[id] = Buffer{a.device(), buf.handle, a.size(), shm_ + a.shm_offset(), false, a.size()};
    Response r;
    r.mutable_allocate()->set_buffer(id);
    return r;
  }
  // No plugin sees a request for more than this machine has.
  static const uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (a.size() > physical)
    return failure(BP_ERR_OUT_OF_MEMORY, "allocate: " + std::to_string(a.size()) + " bytes exceed this machine's memory of " +
                                             std::to_string(physical));
  if (d.info.max_buffer_size && a.size() > d.info.max_buffer_size)
    return failure(BP_ERR_OUT_OF_MEMORY, "allocate: " + std::to_string(a.size()) + " bytes exceed " + d.device->name() +
                                             "'s largest buffer of " + std::to_string(d.info.max_buffer_size));
  if (auto e = session_room(st, a.size(), "allocate"); !e.empty()) return failure(BP_ERR_OUT_OF_MEMORY, e);
  // Taken from the budget before any byte is allocated (or zeroed).
  Held held(budget_);
  if (!held.grow(a.size())) return failure(BP_ERR_OUT_OF_MEMORY, over_budget(a.size(), "allocate"));
  bp_buffer buf{};
  buf.struct_size = sizeof buf;
  if (bp_error* e = d.plugin->api()->buffer_allocate(d.plugin->ctx(), d.handle, a.size(), &buf))
    return failure(d.plugin->api()->error_code(d.plugin->ctx(), e), "allocate on " + d.device->name() + ": " + take(*d.plugin, e));
  // A fresh buffer may hold what another session (or the server) left in
  // that memory: it starts as zeros. Host memory is zeroed once the session
  // could see it, less what the client wrote first (Buffer::clean_to).
  uint64_t clean_to = a.size();
  if (buf.host_ptr) {
    clean_to = 0;
  } else {
    static const std::vector<char> zeros(size_t{1} << 20, 0);
    for (uint64_t done = 0; done < a.size();) {
      const uint64_t n = std::min<uint64_t>(a.size() - done, zeros.size());
      if (bp_error* e = d.plugin->api()->buffer_write(d.plugin->ctx(), d.handle, buf.handle, done, zeros.data(), n)) {
        const std::string why = take(*d.plugin, e);
        d.plugin->api()->buffer_free(d.plugin->ctx(), d.handle, buf.handle);
        return failure(BP_ERR_INTERNAL, "allocate on " + d.device->name() + ": clearing the buffer: " + why);
      }
      done += n;
    }
  }
  const uint64_t id = st.next_buffer++;
  st.buffers[id] = Buffer{a.device(), buf.handle, a.size(), buf.host_ptr, true, clean_to};
  if (clean_to < a.size()) {
    // Ids of freed or clean buffers are dropped once they outnumber the
    // rest: allocations without a read in between cannot grow the list.
    if (st.unclean.size() > 2 * st.buffers.size() + 64)
      st.unclean.erase(std::remove_if(st.unclean.begin(), st.unclean.end(),
                                      [&](uint64_t u) {
                                        auto it = st.buffers.find(u);
                                        return it == st.buffers.end() || it->second.clean_to >= it->second.size;
                                      }),
                       st.unclean.end());
    st.unclean.push_back(id);
  }
  st.bytes += a.size();
  held.bytes = 0;  // now the session's, given back by free or at its end
  Response r;
  r.mutable_allocate()->set_buffer(id);
  return r;
}

// A batch runs in four phases, each its own function: writes, the calls
// checked (or a recorded sequence looked up, or one recorded), the calls run
// on each device's run, reads. The first failure is the reply.
Response Service::batch(State& st, const Batch& b) {
  if (static_cast<size_t>(b.writes_size()) > kMaxWritesPerBatch || static_cast<size_t>(b.calls_size()) > kMaxCallsPerBatch ||
      static_cast<size_t>(b.reads_size()) > kMaxReadsPerBatch)
    return failure(BP_ERR_INVALID_ARGUMENT, "batch: too many writes, calls or reads");
  if (auto f = batch_writes(st, b)) return *f;
  if (b.calls_size() > 0 || b.replay() != 0 || b.reads_size() > 0) zero_pending(st);
  std::vector<CheckedCall> fresh;
  const std::vector<CheckedCall>* calls = &fresh;
  if (auto f = batch_calls(st, b, fresh, calls)) return *f;
  Response r;
  if (!calls->empty())
    if (auto f = run_calls(st, b, *calls, *r.mutable_batch())) return *f;
  if (auto f = batch_reads(st, b, *r.mutable_batch())) return *f;
  return r;
}

void Service::written(Buffer& b, uint64_t offset, uint64_t n) {
  if (b.clean_to >= b.size || offset > b.size || n > b.size - offset) return;
  if (offset > b.clean_to) std::memset(static_cast<char*>(b.host_ptr) + b.clean_to, 0, offset - b.clean_to);
  if (offset + n > b.clean_to) b.clean_to = offset + n;
}

void Service::zero_pending(State& st) {
  for (uint64_t id : st.unclean) {
    auto it = st.buffers.find(id);
    if (it == st.buffers.end()) continue;  // freed
    Buffer& b = it->second;
    if (b.clean_to < b.size) std::memset(static_cast<char*>(b.host_ptr) + b.clean_to, 0, b.size - b.clean_to);
    b.clean_to = b.size;
  }
  st.unclean.clear();
}

std::string Service::range(State& st, uint64_t id, uint64_t offset, uint64_t size, const char* what, Buffer*& out) {
  auto it = st.buffers.find(id);
  if (it == st.buffers.end()) return std::string(what) + ": no such buffer";
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, size, &end) || end > it->second.size)
    return std::string(what) + ": bytes [" + std::to_string(offset) + ", +" + std::to_string(size) +
           ") outside a buffer of " + std::to_string(it->second.size);
  if (size > kMaxChunkBytes) return std::string(what) + ": more than 32 MiB in one piece";
  out = &it->second;
  return {};
}

char* Service::shared(uint64_t offset, uint64_t size) const {
  uint64_t end = 0;
  if (!shm_ || __builtin_add_overflow(offset, size, &end) || end > shm_size_) return nullptr;
  return shm_ + offset;
}

std::string Service::infer_by_decomposition(const std::string& op, const std::vector<bp_dtype>& dts,
                                            const std::vector<bp_layout>& ls, const bp_op_params& p, bp_dtype& odt,
                                            bp_layout& ol) const {
  const VendorOpInfo* decl = runtime_.vendor_op(op);
  if (!decl || !decl->has_decomposition() || decl->outputs.size() != 1)
    return "its plugin gives no shape inference and no manifest gives a one-output decomposition";
  try {
    Node node;
    node.name = "call";
    node.op = op;
    node.params = detail::parse_json_bounded(std::string(p.u.custom.json.data ? p.u.custom.json.data : "",
                                                         p.u.custom.json.len),
                                             "");
    std::vector<std::pair<bp_dtype, Shape>> in;
    for (size_t i = 0; i < dts.size(); ++i) {
      node.inputs.push_back("in" + std::to_string(i));
      in.emplace_back(dts[i], Shape(ls[i].shape, ls[i].shape + std::min<uint32_t>(ls[i].rank, BP_MAX_RANK)));
    }
    const auto out = detail::decomposition_output_types(*decl, node, in);
    const Shape& s = out.at(0).second;
    if (s.size() > BP_MAX_RANK) return "its decomposition gives a rank above 8";
    odt = out[0].first;
    ol = bp_layout{};
    ol.rank = static_cast<uint32_t>(s.size());
    int64_t stride = 1;
    for (size_t k = s.size(); k-- > 0;) {
      ol.shape[k] = s[k];
      ol.strides[k] = stride;
      stride *= std::max<int64_t>(s[k], 1);
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

std::optional<Response> Service::batch_writes(State& st, const Batch& b) {
  for (const auto& w : b.writes()) {
    const void* src = w.data().data();
    uint64_t size = w.data().size();
    if (w.from_shm()) {
      if (!w.data().empty()) return failure(BP_ERR_INVALID_ARGUMENT, "write: both bytes and shared memory");
      size = w.size();
      src = shared(w.shm_offset(), size);
      if (!src) return failure(BP_ERR_INVALID_ARGUMENT, "write: not inside the memory shared with this server");
    }
    Buffer* buf = nullptr;
    if (auto e = range(st, w.buffer(), w.offset(), size, "write", buf); !e.empty())
      return failure(BP_ERR_INVALID_ARGUMENT, e);
    auto& d = *devices_[buf->device];
    if (bp_error* e = d.plugin->api()->buffer_write(d.plugin->ctx(), d.handle, buf->handle, w.offset(), src, size))
      return failure(d.plugin->api()->error_code(d.plugin->ctx(), e), "write on " + d.device->name() + ": " + take(*d.plugin, e));
    written(*buf, w.offset(), size);
  }
  return std::nullopt;
}

std::optional<Response> Service::batch_calls(State& st, const Batch& b, std::vector<CheckedCall>& fresh,
                                             const std::vector<CheckedCall>*& calls) {
  if (b.replay()) {
    if (b.calls_size() || b.record()) return failure(BP_ERR_INVALID_ARGUMENT, "batch: a replay carries no calls");
    auto it = st.sequences.find(b.replay());
    if (it == st.sequences.end()) return failure(BP_ERR_INVALID_ARGUMENT, "batch: no recorded sequence " + std::to_string(b.replay()));
    calls = &it->second;
    return std::nullopt;
  }
  size_t checked_bytes = 0;
  // The checked calls are counted against the budget as they grow, a MiB at
  // a time; a recorded sequence keeps its part.
  Held held(budget_);
  constexpr uint64_t kStep = uint64_t{1} << 20;
  for (int i = 0; i < b.calls_size(); ++i) {
    const Call& c = b.calls(i);
    if (c.device() >= devices_.size()) return failure(BP_ERR_INVALID_ARGUMENT, "call: no device " + std::to_string(c.device()), i);
    auto& d = *devices_[c.device()];
    if (c.kernel() >= d.table.size() || !d.supported[c.kernel()])
      return failure(BP_ERR_INVALID_ARGUMENT, "call: " + d.device->name() + " has no kernel #" + std::to_string(c.kernel()), i);
    CallContext ctx;
    ctx.kernel = &d.table[c.kernel()];
    ctx.alignment = d.info.buffer_alignment;
    const uint32_t dev = c.device();
    ctx.buffer_size = [&st, dev](uint64_t id) -> std::optional<uint64_t> {
      auto it = st.buffers.find(id);
      if (it == st.buffers.end() || it->second.device != dev) return std::nullopt;
      return it->second.size;
    };
    const auto* api = d.plugin->api();
    if (api->infer_custom_op)
      ctx.infer_custom = [api, &d](const std::string& op, const std::vector<bp_dtype>& dts, const std::vector<bp_layout>& ls,
                                   const bp_op_params& p, bp_dtype& odt, bp_layout& ol) -> std::string {
        if (bp_error* e = api->infer_custom_op(d.plugin->ctx(), bp_string{op.data(), op.size()}, dts.data(), ls.data(),
                                               ls.size(), &p, &odt, &ol))
          return take(*d.plugin, e);
        return {};
      };
    else
      ctx.infer_custom = [this](const std::string& op, const std::vector<bp_dtype>& dts, const std::vector<bp_layout>& ls,
                                const bp_op_params& p, bp_dtype& odt, bp_layout& ol) {
        return infer_by_decomposition(op, dts, ls, p, odt, ol);
      };
    CheckedCall cc;
    if (auto e = check_call(c, ctx, cc); !e.empty())
      return failure(BP_ERR_INVALID_ARGUMENT, "call " + std::to_string(i) + " on " + d.device->name() + ": " + e, i);
    fresh.push_back(std::move(cc));
    checked_bytes += call_bytes(fresh.back());
    if (checked_bytes > kMaxCheckedBytes)
      return failure(BP_ERR_OUT_OF_MEMORY, "batch: its calls need more than 256 MiB of the server's memory", i);
    if (checked_bytes > held.bytes && !held.grow(kStep))
      return failure(BP_ERR_OUT_OF_MEMORY, over_budget(checked_bytes, "batch (its checked calls)"), i);
  }
  if (!b.record()) return std::nullopt;
  if (auto old = st.sequences.find(b.record()); old != st.sequences.end()) drop_sequence(st, old);
  if (st.sequences.size() >= 256 || st.sequence_bytes + checked_bytes > kMaxRecordedBytes)
    return failure(BP_ERR_OUT_OF_MEMORY, "batch: too many recorded sequences (a session keeps at most 256, " +
                                             std::to_string(kMaxRecordedBytes >> 20) + " MiB)");
  if (auto e = session_room(st, checked_bytes, "batch: recording its calls"); !e.empty())
    return failure(BP_ERR_OUT_OF_MEMORY, e);
  // The sequence keeps checked_bytes of what `held` took; the rest goes back.
  if (held.bytes < checked_bytes && !held.grow(checked_bytes - held.bytes))
    return failure(BP_ERR_OUT_OF_MEMORY, over_budget(checked_bytes, "batch (recording its calls)"));
  held.bytes -= checked_bytes;
  st.sequence_bytes += checked_bytes;
  auto& seq = st.sequences[b.record()];
  seq.swap(fresh);
  calls = &seq;
  return std::nullopt;
}

std::optional<Response> Service::run_calls(State& st, const Batch& b, const std::vector<CheckedCall>& calls,
                                           BatchReply& reply) {
  std::set<uint32_t> used;
  for (const auto& c : calls) used.insert(c.device);
  std::vector<std::unique_lock<std::mutex>> locks;
  for (auto dev : used) locks.emplace_back(devices_[dev]->run);  // in index order: no deadlock
  uint64_t watch_id = 0;
  if (options_.deadline_ms > 0) {
    std::lock_guard<std::mutex> lk(watch_.mu);
    watch_id = watch_.next++;
    watch_.running[watch_id] = {Clock::now(), std::to_string(calls.size()) + " kernel calls"};
  }
  struct Unwatch {
    Watch& w;
    uint64_t id;
    ~Unwatch() {
      if (!id) return;
      std::lock_guard<std::mutex> lk(w.mu);
      w.running.erase(id);
    }
  } unwatch{watch_, watch_id};
  // A timed batch: each device that can times its calls (BP_RUN_TIMED).
  auto timed = [&](const ServedDevice& d) { return b.timed() && times_calls(d.plugin->api()); };
  // Each device's run, begun in `used` order; its calls counted from begin(),
  // to map error_call_index back to the batch.
  struct DeviceRun {
    bp_run* run = nullptr;
    std::vector<int64_t> calls;
    std::vector<uint64_t> ns;
  };
  std::map<uint32_t, DeviceRun> runs;
  std::string error;
  bp_status_code code = BP_OK;
  int64_t failed_call = -1;
  for (auto dev : used) {
    auto& d = *devices_[dev];
    const auto* api = d.plugin->api();
    bp_run* run = nullptr;
    if (api->begin)
      if (bp_error* e = api->begin(d.plugin->ctx(), d.handle, timed(d) ? uint32_t{BP_RUN_TIMED} : 0u, &run)) {
        code = api->error_code(d.plugin->ctx(), e);
        error = "begin on " + d.device->name() + ": " + take(*d.plugin, e);
        break;
      }
    runs[dev].run = run;
  }
  std::vector<bp_storage> in_st, out_st;
  for (size_t i = 0; error.empty() && i < calls.size(); ++i) {
    const CheckedCall& c = calls[i];
    auto& d = *devices_[c.device];
    // This run's handles and pointers go into scratch copies of the storages.
    in_st.assign(c.inputs.begin(), c.inputs.end());
    out_st.assign(c.outputs.begin(), c.outputs.end());
    bool missing = false;
    auto bind = [&](bp_storage& s, uint64_t id) {
      if (id == 0) return;
      auto it = st.buffers.find(id);
      if (it == st.buffers.end()) {
        missing = true;
        return;
      }
      s.buffer_handle = it->second.handle;
      s.data = it->second.host_ptr ? static_cast<char*>(it->second.host_ptr) + s.byte_offset : nullptr;
    };
    for (size_t k = 0; k < in_st.size(); ++k) bind(in_st[k], c.input_buffers[k]);
    bind(out_st[0], c.output_buffers[0]);
    if (missing) {
      code = BP_ERR_INVALID_ARGUMENT;
      error = "call " + std::to_string(i) + ": a buffer it uses was freed";
      failed_call = static_cast<int64_t>(i);
      break;
    }
    DeviceRun& dr = runs[c.device];
    dr.calls.push_back(static_cast<int64_t>(i));
    bp_kernel_context ctx{};
    ctx.struct_size = sizeof ctx;
    ctx.device = d.handle;
    ctx.host = d.plugin->host();
    ctx.kernel_index = c.kernel;
    ctx.plugin = d.plugin->ctx();
    ctx.run = dr.run;
    const auto& kd = d.plugin->api()->kernels[c.kernel];
    if (progress_) progress_->store(static_cast<int64_t>(i));
    if (bp_error* e = kd.fn(&ctx, in_st.data(), in_st.size(), out_st.data(), out_st.size(), c.layouts.data(), &c.params)) {
      code = d.plugin->api()->error_code(d.plugin->ctx(), e);
      error = take(*d.plugin, e);
      failed_call = static_cast<int64_t>(i);
    }
  }
  // Every begun run ends, failed or not; a timed one gives its call times.
  for (auto& [dev, dr] : runs) {
    auto& d = *devices_[dev];
    const auto* api = d.plugin->api();
    if (!api->synchronize) continue;
    const bool want_times = error.empty() && timed(d) && !dr.calls.empty();
    if (want_times) dr.ns.assign(dr.calls.size(), UINT64_MAX);
    if (bp_error* e = api->synchronize(d.plugin->ctx(), d.handle, dr.run, want_times ? dr.ns.data() : nullptr,
                                       want_times ? dr.ns.size() : 0)) {
      dr.ns.clear();
      int64_t idx = -1;
      const bp_status_code c = api->error_code(d.plugin->ctx(), e);
      std::string msg = take(*d.plugin, e, &idx);
      if (error.empty()) {
        code = c;
        error = msg;
        failed_call = idx >= 0 && static_cast<size_t>(idx) < dr.calls.size() ? dr.calls[static_cast<size_t>(idx)] : -1;
      }
    }
  }
  if (progress_) progress_->store(-1);
  if (!error.empty()) return failure(code == BP_OK ? BP_ERR_INTERNAL : code, error, failed_call);
  if (b.timed()) {
    reply.mutable_call_ns()->Resize(static_cast<int>(calls.size()), UINT64_MAX);
    for (const auto& [dev, dr] : runs)
      for (size_t j = 0; j < dr.calls.size() && j < dr.ns.size(); ++j)
        reply.set_call_ns(static_cast<int>(dr.calls[j]), dr.ns[j]);
  }
  return std::nullopt;
}

std::optional<Response> Service::batch_reads(State& st, const Batch& b, BatchReply& reply) {
  size_t total = 0;
  for (const auto& rd : b.reads()) {
    Buffer* buf = nullptr;
    if (auto e = range(st, rd.buffer(), rd.offset(), rd.size(), "read", buf); !e.empty())
      return failure(BP_ERR_INVALID_ARGUMENT, e);
    auto& d = *devices_[buf->device];
    char* dst = nullptr;
    if (rd.to_shm()) {
      dst = shared(rd.shm_offset(), rd.size());
      if (!dst) return failure(BP_ERR_INVALID_ARGUMENT, "read: not inside the memory shared with this server");
    } else {
      total += rd.size();
      if (total > kMaxMessageBytes - (1u << 20)) return failure(BP_ERR_INVALID_ARGUMENT, "read: more than one reply can carry");
      std::string* data = reply.add_reads();
      if (d.info.memory_kind == BP_MEMORY_HOST && buf->host_ptr) {
        // Host memory: copied once into the reply (no zeroed string first).
        data->assign(static_cast<const char*>(buf->host_ptr) + rd.offset(), rd.size());
        continue;
      }
      data->resize(rd.size());
      dst = data->data();
    }
    if (bp_error* e = d.plugin->api()->buffer_read(d.plugin->ctx(), d.handle, buf->handle, rd.offset(), dst, rd.size()))
      return failure(d.plugin->api()->error_code(d.plugin->ctx(), e), "read on " + d.device->name() + ": " + take(*d.plugin, e));
  }
  return std::nullopt;
}

// gRPC unlinks whatever is at a unix listening path before it binds, so a
// second server would silently take a live one's socket over. Refuse a path
// where a server answers; remove a stale socket nobody listens on; never
// touch anything that is not a socket.
void claim_unix_path(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // nothing there
  if (!S_ISSOCK(st.st_mode))
    throw Error("serve: --unix " + path + " exists and is not a socket; not replacing it");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) throw Error("serve: --unix " + path + ": the path is too long for a unix socket");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error("serve: cannot create a socket to probe " + path);
  const bool live = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  const int err = errno;
  ::close(fd);
  if (live)
    throw Error("serve: another server is listening on unix socket " + path +
                "; stop it or choose another path (not taking it over)");
  if (err != ECONNREFUSED && err != ENOENT)
    throw Error("serve: cannot tell whether unix socket " + path + " is in use: " + std::strerror(err));
  ::unlink(path.c_str());  // stale: its server is gone
}

bool loopback_host(const std::string& hostport) {
  return hostport.rfind("127.0.0.1:", 0) == 0 || hostport.rfind("[::1]:", 0) == 0;
}

// The server takes the soft limit on open files up to the hard one: each
// connection is a file, and at the usual soft limit of 1024 a few hundred
// idle connections are enough to run out. Returns the limit now in force.
uint64_t raise_file_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return 1024;
  if (r.rlim_cur != RLIM_INFINITY && (r.rlim_max == RLIM_INFINITY || r.rlim_cur < r.rlim_max)) {
    rlimit want = r;
    want.rlim_cur = r.rlim_max == RLIM_INFINITY ? rlim_t{1} << 20 : r.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &want) == 0) r = want;
  }
  return r.rlim_cur == RLIM_INFINITY ? uint64_t{1} << 20 : static_cast<uint64_t>(r.rlim_cur);
}

// Files this process has open (-1 when it cannot tell: out of files itself).
int64_t open_files() {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  int64_t n = 0;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n - 1;  // not the directory's own
}

// The listening sockets the server accepts on itself (gRPC gets each
// accepted connection through an external connection acceptor): gRPC 1.51's
// own accept loop gives up for good on its first EMFILE.
struct Listener {
  std::vector<int> fds;
  int port = 0;
  ~Listener() {
    for (int fd : fds) ::close(fd);
  }
};

void listen_unix(Listener& l, const std::string& path) {
  claim_unix_path(path);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) throw Error("serve: --unix " + path + ": the path is too long for a unix socket");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw Error("serve: cannot create a unix socket: " + std::string(std::strerror(errno)));
  l.fds.push_back(fd);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 128) != 0)
    throw Error("serve: cannot listen on unix:" + path + ": " + std::strerror(errno));
}

void listen_tcp(Listener& l, const std::string& hostport) {
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) throw Error("serve: --listen wants HOST:PORT, not '" + hostport + "'");
  std::string host = hostport.substr(0, colon);
  const std::string port = hostport.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); rc != 0)
    throw Error("serve: cannot listen on " + hostport + ": " + ::gai_strerror(rc));
  std::string why;
  for (const addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    sockaddr_storage addr{};
    std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
    // Port 0: the first address picks a free port, the others take the same.
    if (l.port) {
      if (addr.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(l.port));
      else reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(l.port));
    }
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    l.port = ntohs(addr.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&addr)->sin_port
                                              : reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    l.fds.push_back(fd);
  }
  ::freeaddrinfo(found);
  if (l.fds.empty()) throw Error("serve: cannot listen on " + hostport + (why.empty() ? "" : ": " + why));
}

// Accepts connections and hands each to gRPC, keeping at most
// max_connections open and a reserve of files for everything else. A
// connection over the limit is closed at once; when the process runs out of
// files (EMFILE) the connection waiting is accepted on a spare descriptor and
// closed, so the loop never stops. gRPC closes the connections it was given:
// a connection counts while its descriptor is still the socket that was
// accepted (the same inode).
class Acceptor {
 public:
  // `to` takes each accepted connection (listening socket, connection).
  Acceptor(const Listener& listener, std::function<void(int, int)> to, int max_connections, uint64_t file_limit,
           bool quiet)
      : listener_(listener), to_(std::move(to)), max_(static_cast<size_t>(std::max(max_connections, 1))), file_limit_(file_limit),
        quiet_(quiet) {}
  void run(const std::atomic<bool>& stop) {
    spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    std::vector<pollfd> pfds;
    for (int fd : listener_.fds) pfds.push_back(pollfd{fd, POLLIN, 0});
    while (!stop) {
      const int n = ::poll(pfds.data(), pfds.size(), 200);
      if (n < 0 && errno != EINTR) fatal("waiting for connections", errno);
      for (const auto& p : pfds)
        if (p.revents & (POLLIN | POLLERR | POLLHUP)) accept_from(p.fd);
    }
    if (spare_ >= 0) ::close(spare_);
  }

 private:
  struct Open {
    int fd;
    dev_t dev;
    ino_t ino;
  };

  [[noreturn]] static void fatal(const char* what, int err) {
    std::fprintf(stderr, "backplane serve: %s failed: %s; exiting so that a supervisor can restart the server\n", what,
                 std::strerror(err));
    std::fflush(stderr);
    _exit(4);
  }

  // One line at most every 10 s about refused connections.
  void note(const std::string& why) {
    ++refused_;
    const auto now = Clock::now();
    if (quiet_ || now - last_note_ < std::chrono::seconds(10)) return;
    last_note_ = now;
    std::fprintf(stderr, "backplane serve: refusing connections (%llu so far): %s\n",
                 static_cast<unsigned long long>(refused_), why.c_str());
    std::fflush(stderr);
  }

  void prune() {
    open_.erase(std::remove_if(open_.begin(), open_.end(),
                               [](const Open& o) {
                                 struct stat sb {};
                                 return ::fstat(o.fd, &sb) != 0 || sb.st_ino != o.ino || sb.st_dev != o.dev;
                               }),
                open_.end());
  }

  void accept_from(int listen_fd) {
    for (int k = 0; k < 64; ++k) {  // then the other listeners' turn
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        const int err = errno;
        if (err == EINTR) continue;
        if (err == EAGAIN || err == EWOULDBLOCK || err == ECONNABORTED || err == EPROTO || err == EPERM) return;
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
          // Out of files: take the waiting connection on the spare and close it.
          note(std::string("out of file descriptors (") + std::strerror(err) + ")");
          if (spare_ >= 0) {
            ::close(spare_);
            const int drop = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
            if (drop >= 0) ::close(drop);
            spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
          } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
          }
          return;
        }
        fatal("accepting a connection", err);
      }
      prune();
      const int64_t files = open_files();
      if (open_.size() >= max_) {
        ::close(fd);
        note(std::to_string(max_) + " connections are open (--max-connections)");
        continue;
      }
      if (files < 0 || static_cast<uint64_t>(files) + kFileReserve > file_limit_) {
        ::close(fd);
        note("too few file descriptors left (limit " + std::to_string(file_limit_) + ", " + std::to_string(files) + " open)");
        continue;
      }
      struct stat sb {};
      if (::fstat(fd, &sb) != 0) {
        ::close(fd);
        continue;
      }
      open_.push_back(Open{fd, sb.st_dev, sb.st_ino});
      to_(listen_fd, fd);
    }
  }

  // Files kept for everything but connections: plugins, gRPC's own, logs.
  static constexpr uint64_t kFileReserve = 16;
  const Listener& listener_;
  std::function<void(int, int)> to_;
  const size_t max_;
  const uint64_t file_limit_;
  const bool quiet_;
  int spare_ = -1;
  std::vector<Open> open_;
  uint64_t refused_ = 0;
  Clock::time_point last_note_{};
};

}  // namespace

namespace {

// The connections of the framed transport, one thread each. A connection's
// thread closes its socket when its session ends; stop_all() shuts the
// open ones down (their blocked reads return) and joins every thread.
class FramedConnections {
 public:
  ~FramedConnections() { stop_all(); }
  void start(int fd, Service& service) {
    std::vector<std::thread> ended;
    {
      std::lock_guard<std::mutex> lk(mu_);
      // Threads whose sessions ended (their socket closed) are joined, outside the lock.
      for (auto it = conns_.begin(); it != conns_.end();) {
        if ((*it)->fd >= 0) {
          ++it;
          continue;
        }
        ended.push_back(std::move((*it)->thread));
        it = conns_.erase(it);
      }
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      Conn* conn = c.get();
      try {
        c->thread = std::thread([this, conn, &service] {
          const int flags = ::fcntl(conn->fd, F_GETFL);
          if (flags >= 0) ::fcntl(conn->fd, F_SETFL, flags & ~O_NONBLOCK);
          service.FramedSession(conn->fd);
          std::lock_guard<std::mutex> done(mu_);
          ::close(conn->fd);
          conn->fd = -1;
        });
      } catch (const std::system_error&) {
        ::close(fd);  // no thread to be had (an address-space limit): the client sees the socket close
        c.reset();
      }
      if (c) conns_.push_back(std::move(c));
    }
    for (auto& t : ended) t.join();
  }
  void stop_all() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& c : conns_)
        if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
    }
    for (auto& c : conns_)
      if (c->thread.joinable()) c->thread.join();
    conns_.clear();
  }

 private:
  struct Conn {
    int fd = -1;
    std::thread thread;
  };
  std::mutex mu_;
  std::vector<std::unique_ptr<Conn>> conns_;
};

// Under an address-space limit (RLIMIT_AS, `ulimit -v`) each thread's stack
// counts whole against it, 8 MiB apiece by default: the server's threads
// (gRPC's, which run the kernel calls) get kLimitedStack instead, so an
// isolated child still starts under a few hundred MB of limit.
constexpr size_t kLimitedStack = size_t{2} << 20;

void fit_thread_stacks_to_limit() {
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return;
  pthread_attr_t attr;
  if (pthread_getattr_default_np(&attr) != 0) return;
  size_t size = 0;
  if (pthread_attr_getstacksize(&attr, &size) == 0 && (size == 0 || size > kLimitedStack) &&
      pthread_attr_setstacksize(&attr, kLimitedStack) == 0)
    pthread_setattr_default_np(&attr);
  pthread_attr_destroy(&attr);
}

}  // namespace

int serve(Runtime& runtime, const ServerOptions& options) {
  fit_thread_stacks_to_limit();
  if (options.listen.empty() == options.unix_path.empty())
    throw Error("serve: give exactly one of --listen HOST:PORT and --unix PATH");
  if (options.framed && options.unix_path.empty()) throw Error("serve: the framed transport is for unix sockets only");
  if (options.token.empty()) throw Error("serve: a token is required (--token-file)");
  if (options.token.size() < 16) throw Error("serve: the token must be at least 16 bytes");
  const bool tls = !options.tls_cert_pem.empty() || !options.tls_key_pem.empty();
  if (tls && (options.tls_cert_pem.empty() || options.tls_key_pem.empty()))
    throw Error("serve: TLS needs both --tls-cert and --tls-key");
  if (!options.listen.empty() && !tls) {
    if (!options.insecure_loopback)
      throw Error("serve: over TCP the server requires TLS (--tls-cert, --tls-key); --insecure-loopback allows "
                  "plain TCP on 127.0.0.1 only");
    if (!loopback_host(options.listen))
      throw Error("serve: --insecure-loopback binds 127.0.0.1 (or [::1]) only, not '" + options.listen + "'");
  }

  // The devices: every loaded plugin's, or only the named plugins'.
  std::vector<std::unique_ptr<ServedDevice>> devices;
  std::set<std::string> wanted(options.plugins.begin(), options.plugins.end());
  std::vector<Device*> chosen;
  for (const auto& name : options.plugins) {
    bool found = false;
    for (const auto& info : runtime.plugins()) found |= info.name == name;
    if (!found) throw Error("serve: no plugin named '" + name + "' on this server's search path");
    runtime.device(name);  // loads only it; throws naming the reason when it cannot
    for (const auto& l : runtime.devices())
      if (l.plugin == name && l.state == PluginState::Loaded) chosen.push_back(&runtime.device(l.name));
  }
  if (wanted.empty()) chosen = runtime.all_devices();
  for (Device* dev : chosen) {
    Plugin& p = DeviceAccess::plugin(*dev);
    if (!wanted.empty() && !wanted.count(p.info().name)) continue;
    auto d = std::make_unique<ServedDevice>();
    d->device = dev;
    d->plugin = &p;
    d->handle = DeviceAccess::handle(*dev);
    d->table = p.info().kernels;
    d->info = DeviceAccess::info(*dev);
    for (size_t k = 0; k < d->table.size(); ++k) d->supported.push_back(DeviceAccess::supports(*dev, static_cast<int>(k)));
    devices.push_back(std::move(d));
  }
  if (devices.size() > kMaxDevices) devices.resize(kMaxDevices);
  if (devices.empty()) throw Error("serve: no device to offer (no plugin loaded a device)");

  std::atomic<int64_t>* progress = nullptr;
  if (!options.progress_file.empty()) {
    const int fd = ::open(options.progress_file.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw Error("serve: cannot open the progress file " + options.progress_file);
    void* m = ::mmap(nullptr, sizeof(int64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) throw Error("serve: cannot map the progress file " + options.progress_file);
    static_assert(std::atomic<int64_t>::is_always_lock_free);
    progress = static_cast<std::atomic<int64_t>*>(m);
    progress->store(-1);
  }
  char* shm = nullptr;
  if (options.shm_fd >= 0) {
    if (options.shm_size == 0 || options.shm_size > (uint64_t{1} << 40)) throw Error("serve: --shm-size out of range");
    // The host sealed its size: it cannot shrink it under a running kernel
    // (a SIGBUS in this process).
    struct stat sb {};
    const int seals = fcntl(options.shm_fd, F_GET_SEALS);
    if (fstat(options.shm_fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) < options.shm_size || seals < 0 ||
        !(seals & F_SEAL_SHRINK))
      throw Error("serve: the shared memory (--shm-fd) is smaller than --shm-size or not sealed against shrinking");
    void* m = ::mmap(nullptr, options.shm_size, PROT_READ | PROT_WRITE, MAP_SHARED, options.shm_fd, 0);
    if (m == MAP_FAILED) {
      // Under an address-space limit (RLIMIT_AS, `ulimit -v`) the host sizes
      // it to fit; say so when it still does not.
      const int err = errno;
      rlimit as{};
      std::string why = std::strerror(err);
      if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
        why += "; the address-space limit (RLIMIT_AS, `ulimit -v`) is " + std::to_string(as.rlim_cur) + " bytes";
      throw Error("serve: cannot map the " + std::to_string(options.shm_size) + " bytes of shared memory (--shm-fd): " + why);
    }
    ::close(options.shm_fd);
    shm = static_cast<char*>(m);
  }
  const uint64_t file_limit = raise_file_limit();
  static const uint64_t physical =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  Budget budget(options.max_total_bytes ? options.max_total_bytes : physical / 4 * 3);
  Watch watch;
  Service service(runtime, devices, options, watch, progress, shm, options.shm_size, budget);
  Listener listener;
  if (options.unix_path.empty()) listen_tcp(listener, options.listen);
  else listen_unix(listener, options.unix_path);

  // SIGINT/SIGTERM end the server; blocked here so every thread inherits it.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  // gRPC for clients; the framed transport for an isolated child's host.
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> handoff;
  FramedConnections framed;
  std::function<void(int, int)> hand_to;
  if (options.framed) {
    hand_to = [&](int, int fd) { framed.start(fd, service); };
  } else {
    grpc::ServerBuilder builder;
    std::shared_ptr<grpc::ServerCredentials> creds;
    if (tls) {
      grpc::SslServerCredentialsOptions ssl;
      ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
      creds = grpc::SslServerCredentials(ssl);
    } else {
      creds = grpc::InsecureServerCredentials();
    }
    handoff = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, creds);
    builder.RegisterService(&service);
    builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes));
    builder.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes));
    grpc::ResourceQuota quota("backplane-serve");
    quota.SetMaxThreads(options.max_sessions + 4);
    builder.SetResourceQuota(quota);
    // Dead peers are noticed: pings every 10 s on idle connections.
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kWindowBytes);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kFrameBytes);
    builder.AddChannelArgument(GRPC_ARG_OPTIMIZATION_TARGET, std::string("latency"));
    // The phase before a session: a connection must finish its handshake
    // (TLS, HTTP/2 settings) within the idle timeout, and one that holds no
    // call (it never sent one, or its calls were refused) is closed after it.
    const int idle_ms = static_cast<int>(std::clamp<int64_t>(options.idle_timeout_ms, 1, INT32_MAX));
    builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, idle_ms);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, idle_ms);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_sessions + 4);
    server = builder.BuildAndStart();
    if (!server)
      throw Error("serve: cannot start the gRPC server for " +
                  (options.unix_path.empty() ? options.listen : "unix:" + options.unix_path));
    hand_to = [&](int listen_fd, int fd) {
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
      p.listener_fd = listen_fd;
      p.fd = fd;
      handoff->HandleNewConnection(&p);
    };
  }
  std::string where = options.unix_path.empty()
                          ? options.listen.substr(0, options.listen.rfind(':')) + ":" + std::to_string(listener.port)
                          : "unix:" + options.unix_path;
  const std::string line = "listening on " + where + (tls ? " (TLS)" : "") + ", " + std::to_string(devices.size()) +
                           " device(s)\n";
  if (!options.quiet) {
    std::fputs(("backplane serve: " + line).c_str(), stdout);
    std::fflush(stdout);
  }
  if (options.ready_fd >= 0) {
    ssize_t ignored = ::write(options.ready_fd, line.data(), line.size());
    (void)ignored;
    ::close(options.ready_fd);
  }

  std::atomic<bool> done{false}, stop_accepting{false};
  Acceptor acceptor(listener, hand_to, options.max_connections, file_limit, options.quiet);
  std::thread accepting([&] { acceptor.run(stop_accepting); });
  std::thread watchdog;
  if (options.deadline_ms > 0)
    watchdog = std::thread([&] {
      while (!done) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        std::lock_guard<std::mutex> lk(watch.mu);
        for (const auto& [id, w] : watch.running)
          if (Clock::now() - w.first > std::chrono::milliseconds(options.deadline_ms)) {
            std::fprintf(stderr, "backplane serve: a batch of %s ran past the deadline of %lld ms; exiting\n",
                         w.second.c_str(), static_cast<long long>(options.deadline_ms));
            std::fflush(stderr);
            _exit(3);
          }
      }
    });
  if (server) {
    std::thread stopper([&] {
      const timespec tick{0, 200 * 1000 * 1000};
      while (!done)
        if (sigtimedwait(&stop, nullptr, &tick) > 0) {
          stop_accepting = true;
          server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
          return;
        }
    });
    server->Wait();
    done = true;
    stopper.join();
  } else {
    while (sigwaitinfo(&stop, nullptr) < 0 && errno == EINTR) {
    }
    done = true;
  }
  stop_accepting = true;
  accepting.join();
  framed.stop_all();
  if (watchdog.joinable()) watchdog.join();
  if (!options.unix_path.empty()) ::unlink(options.unix_path.c_str());
  return 0;
}

struct InProcessSession::Impl {
  std::vector<std::unique_ptr<ServedDevice>> devices;
  ServerOptions options;
  Watch watch;
  std::unique_ptr<Budget> budget;
  std::unique_ptr<Service> service;
  std::unique_ptr<Service::Local> local;
  bool closed = false;
};

InProcessSession::InProcessSession(Runtime& runtime, const ServerOptions& options, const std::string& plugin)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.options = options;
  runtime.device(plugin);  // loads it, or throws naming why
  for (const auto& l : runtime.devices()) {
    if (l.plugin != plugin || l.state != PluginState::Loaded) continue;
    Device* dev = &runtime.device(l.name);
    auto d = std::make_unique<ServedDevice>();
    d->device = dev;
    d->plugin = &DeviceAccess::plugin(*dev);
    d->handle = DeviceAccess::handle(*dev);
    d->table = d->plugin->info().kernels;
    d->info = DeviceAccess::info(*dev);
    for (size_t k = 0; k < d->table.size(); ++k) d->supported.push_back(DeviceAccess::supports(*dev, static_cast<int>(k)));
    m.devices.push_back(std::move(d));
  }
  if (m.devices.empty()) throw Error("in-process session: plugin '" + plugin + "' has no device");
  m.budget = std::make_unique<Budget>(options.max_total_bytes ? options.max_total_bytes : uint64_t{64} << 20);
  m.service = std::make_unique<Service>(runtime, m.devices, m.options, m.watch, nullptr, nullptr, 0, *m.budget);
  m.local = m.service->open_local();
}

InProcessSession::~InProcessSession() { close(); }

std::string InProcessSession::request(const std::string& bytes) {
  if (impl_->closed) throw Error("in-process session: closed");
  return impl_->service->local_request(*impl_->local, bytes);
}

uint64_t InProcessSession::close() {
  if (!impl_->closed) {
    impl_->service->close_local(*impl_->local);
    impl_->closed = true;
  }
  return impl_->budget->used();
}

}  // namespace backplane::remote
