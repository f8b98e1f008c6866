// The `remote` plugin: devices that live in another process, on this machine
// or another, reached over gRPC (remote/wire/backplane_remote.proto), or, for
// an isolated plugin's child, the same messages framed on a unix socket
// (remote/wire/frames.hpp; link.cpp). An ordinary
// plugin to the host: same ABI, same manifest rules, built with the SDK.
//
// Instances (ABI 1.2 bp_plugin_query.instance):
//  - the default instance (empty text): the servers named in
//    BACKPLANE_REMOTE, their devices named DEVICE@SERVER, the kernel table
//    filled in initialize() ("dynamic_kernels") as the union of theirs;
//  - an isolation instance (JSON text from the host): a private
//    `backplane serve --unix` child running one plugin, presented under that
//    plugin's own name, version, devices and kernel table. A child that dies
//    makes the calls in flight errors naming the plugin and the signal; the
//    next allocation starts a fresh child.
//
// Kernels only enqueue: a device's calls go to the server in one batch at
// synchronize(), with the writes queued before them; a batch identical to
// one sent before (a plan run again) is replayed by id, so per run only the
// inputs and outputs travel.
//
// Files: remote_impl.hpp (the types: servers, devices, runs, instances),
// child.cpp (the child process of an isolated plugin), link.cpp (the two
// transports), session.cpp
// (connecting, the session's exchanges, an instance's tables and life),
// api.cpp (the ABI entries and the entry symbol).
#pragma once

#include "backplane_remote.pb.h"
#include "codec.hpp"
#include <backplane/sdk/api.hpp>
#include <backplane/sdk/plugin.hpp>
#include <nlohmann/json.hpp>
#include <array>
#include <atomic>
#include <chrono>
#include <sys/mman.h>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <algorithm>
#include <condition_variable>
#include <poll.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <unordered_map>

namespace bp_remote {

using namespace backplane;
using namespace backplane::remote;
using sdk::make_error;

inline constexpr const char* kPluginName = "remote";
inline constexpr const char* kPluginVersion = "0.1.0";

// An error that knows which kernel call of its run failed
// (error_call_index), and the ABI's error functions that read and free it.
bp_error* call_error(bp_status_code code, const std::string& msg, int64_t call_index);
void remote_error_destroy(void* plugin, bp_error* e);
int64_t remote_error_call_index(void*, const bp_error* e);
// A file of at most 1 MiB (tokens, certificates), or an error naming `what`.
std::string read_small_file(const std::string& path, const char* what);
std::string trim(std::string s);
// Under an address-space limit (RLIMIT_AS), a note naming it for an error
// about an isolated child that does not already; else "".
std::string address_space_note(const std::string& said);

// ---- one server session ------------------------------------------------------------------------

struct Child {
  pid_t pid = -1;  // also its process group's id: it starts its own session (setsid)
  std::string dir, socket, token, log;
  // Which call of the batch the child is running (it writes, we read when
  // it dies): an 8-byte file both map.
  std::atomic<int64_t>* progress = nullptr;
  // Memory shared with the child (a memfd it inherits): bulk writes and
  // reads are staged here instead of travelling through the socket.
  char* shm = nullptr;
  uint64_t shm_size = 0;
};

// The memory shared with an isolated child: a staging area for pieces of up
// to kMaxChunkBytes, then an arena for buffers the child's plugin imports
// (its devices are then BP_MEMORY_MAPPED: the host reads and writes them in
// place). The arena is virtual: pages exist once touched, and a freed
// buffer's pages are given back (MADV_REMOVE). It reserves kArenaBytes of
// address space, or under an address-space limit (RLIMIT_AS, `ulimit -v`) a
// quarter of the room the limit leaves, at least kArenaFloorBytes
// (child.cpp, arena_size).
constexpr uint64_t kShmBytes = 2 * kMaxChunkBytes;
constexpr uint64_t kArenaBytes = uint64_t{64} << 30;
constexpr uint64_t kArenaFloorBytes = uint64_t{64} << 20;
constexpr uint64_t kRetainBytes = uint64_t{1} << 30;
// Bytes of one Write or Read on the wire (not staged in shared memory):
// pieces this size reuse the allocator's memory, where 32 MiB pieces were
// fresh pages (mapped, faulted in and zeroed) for every message, and keep
// both sides busy: a 256 MiB TCP+TLS upload measured 0.8-1.2 GB/s with 4 MiB
// pieces, 0.8-1.3 (median 1.17) with 1 MiB, 0.65-0.73 with 16 MiB.
constexpr uint64_t kWireChunkBytes = uint64_t{1} << 20;
// Below this a write or read goes inline in the message: cheaper than a
// round of staging.
constexpr uint64_t kShmThreshold = 16 * 1024;

class Instance;

// The host's own bound on every request to an isolated child (a hello, a
// buffer call, a batch of kernels), when a deadline is set: a thread that
// ends the child's whole process group once a request has waited longer
// than the deadline plus kGraceMs. The child's own watchdog ends a kernel
// batch at the deadline itself; this one also covers what it cannot (a
// hung buffer_write, a stopped child).
constexpr int64_t kGraceMs = 1000;
struct Guard {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  pid_t group = -1;  // the child's process group while the child is not reaped
  bool waiting = false;
  std::chrono::steady_clock::time_point since{};
  std::string what;   // the request being waited on
  std::string fired;  // what the host gave up on when it ended the child
  std::thread thread;
};

// The transport of one session: requests out, responses back in order.
//  - GrpcLink: a gRPC stream (remote servers, TCP with TLS or unix);
//  - FramedLink: length-prefixed messages on a unix socket (an isolated
//    child, remote/wire/frames.hpp): one system call each way, no HTTP/2,
//    and no gRPC threads in the host.
class Link {
 public:
  virtual ~Link() = default;
  // False once the session is gone (lost(), then finish(), say why).
  virtual bool write(const Request& req) = 0;
  // A Request already in wire form (encode_write): a bulk write's bytes go
  // into it once, not into a Write message and then its serialization.
  virtual bool write_encoded(std::string&& bytes) = 0;
  virtual bool read(Response& resp) = 0;
  // From any thread: a read or write waiting now, and every later one, fails.
  virtual void cancel() = 0;
  // Ends the session; what ended it, as errors say it ("the server refused
  // the token", "connection lost (...)", "the server closed the session").
  virtual std::string finish() = 0;
};

// A gRPC session to `address` (connect_ms to connect), or an error naming why not.
std::unique_ptr<Link> grpc_link(const std::string& address, const std::string& token, const std::string& ca_pem,
                                std::chrono::milliseconds connect_ms);
// A framed session on the unix socket `path`, the token sent first.
std::unique_ptr<Link> framed_link(const std::string& path, const std::string& token);

struct Server {
  std::string address;  // "127.0.0.1:7601", "unix:/path"
  std::string label;    // what device names carry after '@'
  std::string token, ca_pem;
  Child child;  // isolation only
  Guard guard;  // isolation with a deadline only
  std::unique_ptr<Link> link;
  HelloReply hello;
  uint64_t generation = 0;  // bumped at each (re)connect: handles carry it
  bool broken = true;
  std::string broken_reason;
  int64_t lost_call = -1;  // the call running when an isolated child died
  std::mutex mu;  // one exchange at a time; guards everything below
  std::vector<Write> pending_writes;
  size_t pending_bytes = 0;
  int outstanding = 0;  // posted requests whose replies are not read yet
  bool use_shm = false;  // the server mapped child.shm
  uint64_t shm_used = 0;  // staged bytes of the pending batch
  // Buffers in the arena, by handle: the mapping they live in (a dead
  // child's stays mapped while the host holds its buffers), offset, size.
  struct ShmBuffer {
    char* base;
    uint64_t offset, size;
  };
  std::unordered_map<uint64_t, ShmBuffer> shm_buffers;
  std::map<uint64_t, uint64_t> arena_free;  // offset -> bytes, of the current mapping
  uint64_t retained = 0;  // freed arena bytes whose pages were kept (about)
  std::vector<std::pair<char*, uint64_t>> retired;  // mappings of dead children
  // First fit, aligned; UINT64_MAX when the arena is full.
  uint64_t arena_take(uint64_t size, uint64_t align) {
    size = (size + 63) & ~uint64_t{63};
    for (auto it = arena_free.begin(); it != arena_free.end(); ++it) {
      const uint64_t start = (it->first + align - 1) / align * align;
      if (start + size > it->first + it->second) continue;
      const uint64_t off = it->first, len = it->second;
      arena_free.erase(it);
      retained -= std::min(retained, size);
      if (start > off) arena_free[off] = start - off;
      if (start + size < off + len) arena_free[start + size] = off + len - start - size;
      return start;
    }
    return UINT64_MAX;
  }
  void arena_give(uint64_t off, uint64_t size) {
    size = (size + 63) & ~uint64_t{63};
    auto next = arena_free.lower_bound(off);
    if (next != arena_free.end() && off + size == next->first) {
      size += next->second;
      next = arena_free.erase(next);
    }
    if (next != arena_free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        prev->second += size;
        return;
      }
    }
    arena_free[off] = size;
  }
  std::map<std::string, uint64_t> sequences;  // recorded batch text -> id
  uint64_t next_sequence = 1;
  Instance* owner = nullptr;
};

struct RemoteDevice {
  Server* server = nullptr;
  uint32_t index = 0;  // on the server
  std::string name, kind, description;
  uint64_t alignment = 16, max_buffer = 0;
  bool shm_buffers = false;  // buffers live in the memory shared with the child
  std::vector<uint32_t> kernel_map;  // our table index -> the server plugin's kernel, or UINT32_MAX
};

// A run (bp_run*): the calls made since begin(), sent as one batch at
// synchronize(). Runs on one device may be open on several threads at once.
struct Run {
  RemoteDevice* device = nullptr;
  std::vector<Call> calls;
  bool timed = false;  // BP_RUN_TIMED: the server times the calls on its device
};

// Buffer handles: the session's generation in the top 16 bits, the server's
// id below, so a buffer of a session that ended is recognised as lost.
inline uint64_t make_handle(uint64_t generation, uint64_t id) { return (generation << 48) | id; }
inline uint64_t handle_generation(uint64_t h) { return h >> 48; }
inline uint64_t handle_id(uint64_t h) { return h & ((uint64_t{1} << 48) - 1); }

class Instance {
 public:
  explicit Instance(std::string config) : config_(std::move(config)) {}

  bp_plugin_api api{};
  std::string name = kPluginName, version = kPluginVersion;

  bp_error* initialize(const bp_host_api* host);
  void shutdown();
  bool initialized = false;  // set once initialize() was called
  uint32_t device_count() const { return static_cast<uint32_t>(devices_.size()); }
  bp_device* device(uint32_t i) const {
    return i < devices_.size() ? reinterpret_cast<bp_device*>(devices_[i].get()) : nullptr;
  }
  const std::string& config() const { return config_; }

  // Isolation: the plugin's name, as errors say it.
  std::string who() const { return isolated_ ? "isolated plugin '" + name + "'" : "remote server"; }
  bool isolated() const { return isolated_; }

  void connect(Server& s);  // throws sdk::Error
  void describe_loss(Server& s, const std::string& what);
  Response exchange(Server& s, const Request& req);  // s.mu held; throws sdk::Error
  void post(Server& s, const Request& req);          // sends without waiting for the reply
  void post_encoded(Server& s, std::string&& bytes);  // the same for a Request in wire form
  Response receive(Server& s);                       // the reply of the oldest posted request
  [[noreturn]] void lost(Server& s);
  // The host's bound on the requests to an isolated child (Guard).
  void watch(Server& s);

 private:
  void open_session(Server& s);
  void start_child(Server& s);
  void start_process(Server& s);
  void stop_child(Server& s);
  void reap(Server& s);
  void stop_all();
  void send(Server& s, const Request& req);
  void build_tables();

  std::string config_;
  bool isolated_ = false;
  std::string server_exe_, manifest_dir_;
  int64_t deadline_ms_ = 0;
  uint32_t threads_ = 0;
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<std::unique_ptr<RemoteDevice>> devices_;
  // The kernel table (filled in initialize).
  std::deque<std::vector<bp_dtype>> keys_;
  std::deque<std::vector<uint8_t>> caps_;
  std::deque<std::string> ops_;
  std::vector<bp_kernel_desc> descs_;
};

RemoteDevice* dev_of(bp_device* d);
// A handle of the current session, or an error naming why not.
uint64_t live_id(Server& s, uint64_t handle);
// Sends what is queued plus `b`; returns the reply.
Response flush(Server& s, Batch* extra = nullptr);

}  // namespace bp_remote
