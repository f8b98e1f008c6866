// The `remote` plugin: devices that live in another process, on this machine
// or another, reached over gRPC (remote/backplane_remote.proto). An ordinary
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
#include "backplane_remote.grpc.pb.h"
#include "codec.hpp"

#include <backplane/sdk/api.hpp>
#include <backplane/sdk/plugin.hpp>

#include <grpcpp/grpcpp.h>
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
#include <poll.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <unordered_map>

namespace {

using namespace backplane;
using namespace backplane::remote;
using sdk::make_error;

constexpr const char* kPluginName = "remote";
constexpr const char* kPluginVersion = "0.1.0";

// ---- errors that know which call failed --------------------------------------------------------

std::mutex g_error_mu;
std::unordered_map<const bp_error*, int64_t> g_error_calls;

bp_error* call_error(bp_status_code code, const std::string& msg, int64_t call_index) {
  bp_error* e = make_error(code, msg);
  if (call_index >= 0 && e != sdk::out_of_memory_error()) {
    std::lock_guard<std::mutex> lk(g_error_mu);
    g_error_calls[e] = call_index;
  }
  return e;
}

void remote_error_destroy(void* plugin, bp_error* e) {
  {
    std::lock_guard<std::mutex> lk(g_error_mu);
    g_error_calls.erase(e);
  }
  sdk::error_destroy(plugin, e);
}

int64_t remote_error_call_index(void*, const bp_error* e) {
  std::lock_guard<std::mutex> lk(g_error_mu);
  auto it = g_error_calls.find(e);
  return it == g_error_calls.end() ? -1 : it->second;
}

std::string read_small_file(const std::string& path, const char* what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw sdk::Error(BP_ERR_UNAVAILABLE, std::string(what) + " '" + path + "' is not a readable file");
  if (std::filesystem::file_size(path, ec) > (1u << 20)) throw sdk::Error(BP_ERR_INVALID_ARGUMENT, std::string(what) + " '" + path + "' exceeds 1 MiB");
  std::ifstream f(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return s;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// ---- one server session ------------------------------------------------------------------------

struct Child {
  pid_t pid = -1;
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
// buffer's pages are given back (MADV_REMOVE).
constexpr uint64_t kShmBytes = 2 * kMaxChunkBytes;
constexpr uint64_t kArenaBytes = uint64_t{64} << 30;
constexpr uint64_t kRetainBytes = uint64_t{1} << 30;
// Below this a write or read goes inline in the message: cheaper than a
// round of staging.
constexpr uint64_t kShmThreshold = 16 * 1024;

class Instance;

struct Server {
  std::string address;  // "127.0.0.1:7601", "unix:/path"
  std::string label;    // what device names carry after '@'
  std::string token, ca_pem;
  Child child;  // isolation only
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<Remote::Stub> stub;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReaderWriter<Request, Response>> stream;
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
uint64_t make_handle(uint64_t generation, uint64_t id) { return (generation << 48) | id; }
uint64_t handle_generation(uint64_t h) { return h >> 48; }
uint64_t handle_id(uint64_t h) { return h & ((uint64_t{1} << 48) - 1); }

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
  [[noreturn]] void lost(Server& s);

 private:
  void start_child(Server& s);
  void stop_child(Server& s);
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

// ---- the child process of an isolated plugin ---------------------------------------------------

std::string random_token() {
  std::array<unsigned char, 32> bytes{};
  std::ifstream u("/dev/urandom", std::ios::binary);
  u.read(reinterpret_cast<char*>(bytes.data()), bytes.size());
  if (!u) throw sdk::Error(BP_ERR_UNAVAILABLE, "cannot read /dev/urandom for a token");
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (auto b : bytes) {
    t += hex[b >> 4];
    t += hex[b & 15];
  }
  return t;
}

void Instance::start_child(Server& s) {
  const char* base = std::getenv("XDG_RUNTIME_DIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/backplane-isolate-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": cannot create a private folder for its process");
  s.child.dir = buf.data();  // mode 0700: only this user reaches the socket
  s.child.socket = s.child.dir + "/sock";
  s.child.log = s.child.dir + "/log";
  s.child.token = random_token();
  const std::string token_file = s.child.dir + "/token";
  {
    const int fd = ::open(token_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": cannot write its token file");
    const ssize_t n = ::write(fd, s.child.token.data(), s.child.token.size());
    ::close(fd);
    if (n != static_cast<ssize_t>(s.child.token.size())) throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": cannot write its token file");
  }
  const std::string progress_file = s.child.dir + "/progress";
  {
    const int fd = ::open(progress_file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, sizeof(int64_t)) != 0) {
      if (fd >= 0) ::close(fd);
      throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": cannot create its progress file");
    }
    void* m = ::mmap(nullptr, sizeof(int64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": cannot map its progress file");
    s.child.progress = static_cast<std::atomic<int64_t>*>(m);
    s.child.progress->store(-1);
  }
  const int shm_fd = memfd_create("backplane-isolate", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (shm_fd < 0 || ftruncate(shm_fd, static_cast<off_t>(kShmBytes + kArenaBytes)) != 0 ||
      fcntl(shm_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    if (shm_fd >= 0) ::close(shm_fd);
    throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": cannot create the memory it shares with its process");
  }
  {
    void* m = ::mmap(nullptr, kShmBytes + kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, shm_fd, 0);
    if (m == MAP_FAILED) {
      ::close(shm_fd);
      throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": cannot map the memory it shares with its process");
    }
    s.child.shm = static_cast<char*>(m);
    s.child.shm_size = kShmBytes + kArenaBytes;
    s.arena_free.clear();
    s.arena_free[kShmBytes] = kArenaBytes;
    s.retained = 0;
  }
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": pipe failed");
  std::vector<std::string> args = {server_exe_, "serve", "--unix", s.child.socket, "--token-file", token_file,
                                   "--plugin", name, "--plugin-dir", manifest_dir_, "--isolated-child",
                                   "--progress-file", progress_file, "--shm-fd", "4",
                                   "--shm-size", std::to_string(kShmBytes + kArenaBytes),
                                   "--ready-fd", "3", "--quiet"};
  if (deadline_ms_ > 0) {
    args.push_back("--deadline");
    args.push_back(std::to_string(deadline_ms_));
  }
  if (threads_ > 0) {
    args.push_back("--threads");
    args.push_back(std::to_string(threads_));
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int log_fd = ::open(s.child.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec. The pipe becomes fd 3 and the
    // shared memory fd 4 (moved out of the way first, so neither clobbers
    // the other).
    const int r = fcntl(ready[1], F_DUPFD, 10), m = fcntl(shm_fd, F_DUPFD, 10);
    dup2(r, 3);
    dup2(m, 4);
    ::close(r);
    ::close(m);
    if (log_fd >= 0) {
      dup2(log_fd, 1);
      dup2(log_fd, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  ::close(ready[1]);
  ::close(shm_fd);
  if (log_fd >= 0) ::close(log_fd);
  if (pid < 0) {
    ::close(ready[0]);
    throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": fork failed");
  }
  s.child.pid = pid;
  // Wait (bounded) for "listening ..." on the pipe.
  std::string line;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (line.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    pollfd p{ready[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) break;
    char c[256];
    const ssize_t n = ::read(ready[0], c, sizeof c);
    if (n <= 0) break;
    line.append(c, static_cast<size_t>(n));
  }
  ::close(ready[0]);
  if (line.find("listening") == std::string::npos) {
    describe_loss(s, "");  // how it ended, when it did
    std::string log;
    {
      std::ifstream f(s.child.log);
      log.assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    }
    if (!s.broken_reason.empty()) log = s.broken_reason + (log.empty() ? "" : "; its log: " + trim(log));
    stop_child(s);
    if (log.size() > 2000) log = "..." + log.substr(log.size() - 2000);
    throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": its process did not start" + (log.empty() ? "" : ": " + trim(log)));
  }
  s.address = "unix:" + s.child.socket;
  s.token = s.child.token;
}

void Instance::stop_child(Server& s) {
  if (s.child.pid > 0) {
    ::kill(s.child.pid, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100; ++i) {
      if (waitpid(s.child.pid, &status, WNOHANG) == s.child.pid) {
        s.child.pid = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (s.child.pid > 0) {
      ::kill(s.child.pid, SIGKILL);
      waitpid(s.child.pid, &status, 0);
      s.child.pid = -1;
    }
  }
  if (s.child.progress) {
    ::munmap(static_cast<void*>(s.child.progress), sizeof(int64_t));
    s.child.progress = nullptr;
  }
  if (s.child.shm) {
    // The host may still hold buffers in it (lost ones): it stays mapped
    // until they are freed or the instance shuts down.
    bool held = false;
    for (const auto& [h, b] : s.shm_buffers) held |= b.base == s.child.shm;
    if (held) s.retired.emplace_back(s.child.shm, s.child.shm_size);
    else ::munmap(s.child.shm, s.child.shm_size);
    s.child.shm = nullptr;
    s.child.shm_size = 0;
    s.arena_free.clear();
  }
  s.use_shm = false;
  if (!s.child.dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(s.child.dir, ec);
    s.child.dir.clear();
  }
}

// What became of a lost session: for a child, how it ended.
void Instance::describe_loss(Server& s, const std::string& what) {
  s.broken = true;
  s.lost_call = s.child.progress ? s.child.progress->load() : -1;
  std::string why = what;
  if (s.child.pid > 0) {
    int status = 0;
    pid_t r = 0;
    for (int i = 0; i < 100 && r == 0; ++i) {  // up to a second for the exit status
      r = waitpid(s.child.pid, &status, WNOHANG);
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (r == s.child.pid) {
      s.child.pid = -1;
      if (WIFSIGNALED(status)) {
        const int sig = WTERMSIG(status);
        const char* name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGABRT ? "SIGABRT" : sig == SIGKILL ? "SIGKILL"
                         : sig == SIGBUS  ? "SIGBUS"  : sig == SIGFPE  ? "SIGFPE"  : sig == SIGILL  ? "SIGILL" : "a signal";
        why = "its process died of " + std::string(name) + " (signal " + std::to_string(sig) + ")";
      } else if (WIFEXITED(status)) {
        why = WEXITSTATUS(status) == 3 ? "it ran past its deadline of " + std::to_string(deadline_ms_) + " ms and its process was ended"
                                       : "its process exited with status " + std::to_string(WEXITSTATUS(status));
      }
      // What it said last (a sanitizer's report, a plugin's complaint).
      std::ifstream f(s.child.log);
      std::string log((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      log = trim(log);
      if (log.size() > 400) log = "..." + log.substr(log.size() - 400);
      if (!log.empty() && what != "") why += "; its last words: " + log;
    }
  }
  s.broken_reason = why;
}

// ---- connecting ---------------------------------------------------------------------------------

void Instance::connect(Server& s) {
  if (isolated_) {
    stop_child(s);
    start_child(s);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes));
  args.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kWindowBytes);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kFrameBytes);
  args.SetString(GRPC_ARG_OPTIMIZATION_TARGET, "latency");
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!s.ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = s.ca_pem;
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  s.channel = grpc::CreateCustomChannel(s.address, creds, args);
  if (!s.channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)))
    throw sdk::Error(BP_ERR_UNAVAILABLE, "cannot connect to " + s.address + " within 10 s");
  s.stub = Remote::NewStub(s.channel);
  s.context = std::make_unique<grpc::ClientContext>();
  s.context->AddMetadata(kTokenKey, s.token);
  s.stream = s.stub->Session(s.context.get());
  s.broken = false;
  s.broken_reason.clear();
  s.generation = (s.generation + 1) & 0xffff;
  if (s.generation == 0) s.generation = 1;
  s.sequences.clear();
  s.pending_writes.clear();
  s.pending_bytes = 0;
  s.outstanding = 0;
  Request req;
  req.mutable_hello()->set_protocol(kProtocolVersion);
  Response r = exchange(s, req);
  if (!r.has_hello()) throw sdk::Error(BP_ERR_INTERNAL, s.address + ": the server did not answer hello");
  // The server is not trusted either: bounded, well-formed tables only.
  const auto& h = r.hello();
  if (h.devices_size() > static_cast<int>(kMaxDevices) || h.plugins_size() > static_cast<int>(kMaxDevices))
    throw sdk::Error(BP_ERR_INVALID_ARGUMENT, s.address + ": the server lists too many devices");
  for (const auto& p : h.plugins()) {
    if (p.kernels_size() > static_cast<int>(kMaxKernels) || p.name().size() > kMaxStringBytes)
      throw sdk::Error(BP_ERR_INVALID_ARGUMENT, s.address + ": the server's kernel table is too large");
    for (const auto& k : p.kernels()) {
      bp_dtype d{};
      bool ok = k.op().size() <= 128 && k.dtypes_size() >= 1 && k.layouts_size() == k.dtypes_size() - 1 &&
                k.n_outputs() == 1 && k.bundle_slots() <= 16 && k.flags() <= BP_KERNEL_FLAG_VARIADIC;
      for (auto t : k.dtypes()) ok = ok && decode_dtype(t, d).empty();
      for (auto l : k.layouts()) ok = ok && l <= BP_LAYOUT_STRIDED;
      if (!ok) throw sdk::Error(BP_ERR_INVALID_ARGUMENT, s.address + ": the server sent a malformed kernel row");
    }
  }
  for (const auto& d : h.devices()) {
    bool ok = d.name().size() <= 64 && !d.name().empty() && d.kind().size() <= 32 && d.description().size() <= kMaxStringBytes;
    int plugin = -1;
    for (int i = 0; i < h.plugins_size(); ++i)
      if (h.plugins(i).name() == d.plugin()) plugin = i;
    ok = ok && plugin >= 0;
    if (ok)
      for (auto k : d.kernels()) ok = ok && static_cast<int>(k) < h.plugins(plugin).kernels_size();
    if (!ok) throw sdk::Error(BP_ERR_INVALID_ARGUMENT, s.address + ": the server sent a malformed device");
  }
  s.hello = h;
  s.use_shm = h.shared_memory() && s.child.shm;
  s.shm_used = 0;
}

void Instance::lost(Server& s) {
  // The stream ended: a refusal, or a server that went away.
  s.stream->WritesDone();
  const grpc::Status st = s.stream->Finish();
  std::string what = st.ok() ? "the server closed the session" : st.error_message();
  if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED) what = "the server refused the token";
  else if (st.error_code() == grpc::StatusCode::UNAVAILABLE) what = "connection lost (" + st.error_message() + ")";
  describe_loss(s, what);
  throw sdk::Error(BP_ERR_UNAVAILABLE, who() + " (" + s.label + "): " + s.broken_reason);
}

void Instance::post(Server& s, const Request& req) {
  if (s.broken) throw sdk::Error(BP_ERR_UNAVAILABLE, who() + " (" + s.label + "): " + s.broken_reason);
  if (!s.stream->Write(req)) lost(s);
  ++s.outstanding;
}

Response Instance::exchange(Server& s, const Request& req) {
  post(s, req);
  // Replies come in order: those of posted batches first. The first failure
  // among them is this exchange's answer (an error of a queued write shows
  // at the next synchronize or read, as on an asynchronous device).
  Response first_failure, resp;
  bool failed = false;
  while (s.outstanding > 0) {
    if (!s.stream->Read(&resp)) {
      s.outstanding = 0;
      lost(s);
    }
    --s.outstanding;
    if (resp.has_failure() && !failed && s.outstanding > 0) {
      failed = true;
      first_failure = resp;
      first_failure.mutable_failure()->set_call_index(-1);  // not a call of this batch
    }
  }
  return failed ? first_failure : resp;
}

void Instance::build_tables() {
  // Isolation: the one plugin's table as it is. Remote: the union of every
  // server's rows, one row per (op, dtypes, bundle, variadic); an input is
  // strided only when every device with the row takes it strided.
  std::map<std::tuple<std::string, std::vector<uint32_t>, uint32_t, uint32_t>, size_t> rows;
  struct Row {
    std::string op;
    std::vector<bp_dtype> dtypes;
    std::vector<uint8_t> layouts;
    uint32_t bundle, flags;
  };
  std::vector<Row> table;
  std::vector<std::map<size_t, uint32_t>> device_rows(devices_.size());
  for (size_t di = 0; di < devices_.size(); ++di) {
    auto& d = *devices_[di];
    const auto& h = d.server->hello;
    const auto& dd = h.devices(static_cast<int>(d.index));
    int plugin = 0;
    for (int i = 0; i < h.plugins_size(); ++i)
      if (h.plugins(i).name() == dd.plugin()) plugin = i;
    const auto& kernels = h.plugins(plugin).kernels();
    if (isolated_) {
      if (table.empty())
        for (const auto& k : kernels) {
          Row r{k.op(), {}, {}, k.bundle_slots(), k.flags()};
          for (auto t : k.dtypes()) r.dtypes.push_back(static_cast<bp_dtype>(t));
          for (auto l : k.layouts()) r.layouts.push_back(static_cast<uint8_t>(l));
          table.push_back(std::move(r));
        }
      for (auto k : dd.kernels()) device_rows[di][k] = k;
      continue;
    }
    for (auto ki : dd.kernels()) {
      const auto& k = kernels.Get(static_cast<int>(ki));
      if (k.op().find('.') != std::string::npos) continue;  // vendor ops stay with their own plugin
      auto key = std::make_tuple(k.op(), std::vector<uint32_t>(k.dtypes().begin(), k.dtypes().end()), k.bundle_slots(), k.flags());
      auto [it, fresh] = rows.emplace(key, table.size());
      if (fresh) {
        Row r{k.op(), {}, {}, k.bundle_slots(), k.flags()};
        for (auto t : k.dtypes()) r.dtypes.push_back(static_cast<bp_dtype>(t));
        for (auto l : k.layouts()) r.layouts.push_back(static_cast<uint8_t>(l));
        table.push_back(std::move(r));
      } else {
        auto& r = table[it->second];
        for (int i = 0; i < k.layouts_size() && static_cast<size_t>(i) < r.layouts.size(); ++i)
          r.layouts[static_cast<size_t>(i)] = std::min<uint8_t>(r.layouts[static_cast<size_t>(i)], static_cast<uint8_t>(k.layouts(i)));
      }
      device_rows[di][it->second] = ki;
    }
  }
  for (auto& r : table) {
    keys_.push_back(r.dtypes);
    caps_.push_back(r.layouts);
    ops_.push_back(r.op);
    bp_kernel_desc d{};
    d.struct_size = sizeof d;
    d.op = sdk::to_bp(ops_.back());
    d.dtypes = keys_.back().data();
    d.n_dtypes = static_cast<uint32_t>(keys_.back().size());
    d.input_layouts = caps_.back().data();
    d.n_inputs = static_cast<uint32_t>(caps_.back().size());
    d.n_outputs = 1;
    d.bundle_slots = r.bundle;
    d.flags = r.flags;
    d.fn = nullptr;  // set by the caller (remote_kernel)
    descs_.push_back(d);
  }
  for (size_t di = 0; di < devices_.size(); ++di) {
    devices_[di]->kernel_map.assign(descs_.size(), UINT32_MAX);
    for (auto [row, k] : device_rows[di]) devices_[di]->kernel_map[row] = k;
  }
}

bp_error* remote_kernel(const bp_kernel_context*, const bp_storage*, size_t, const bp_storage*, size_t, const bp_layout*,
                        const bp_op_params*);

bp_error* Instance::initialize(const bp_host_api* host) {
  initialized = true;
  return sdk::guard([&] {
    threads_ = host && host->num_threads ? host->num_threads(host->host_ctx) : 0;
    if (!config_.empty()) {
      const auto j = nlohmann::json::parse(config_, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("isolate"))
        throw sdk::Error(BP_ERR_INVALID_ARGUMENT, "remote: an instance text it does not understand");
      isolated_ = true;
      name = j.value("isolate", "");
      version = j.value("version", "");
      server_exe_ = j.value("server", "");
      manifest_dir_ = j.value("manifest_dir", "");
      deadline_ms_ = j.value("deadline_ms", int64_t{0});
      auto s = std::make_unique<Server>();
      s->label = "isolated";
      s->owner = this;
      servers_.push_back(std::move(s));
    } else if (const char* env = std::getenv("BACKPLANE_REMOTE"); env && *env) {
      const char* tf = std::getenv("BACKPLANE_REMOTE_TOKEN_FILE");
      if (!tf || !*tf) throw sdk::Error(BP_ERR_UNAVAILABLE, "remote: BACKPLANE_REMOTE is set but BACKPLANE_REMOTE_TOKEN_FILE is not");
      const std::string token = trim(read_small_file(tf, "BACKPLANE_REMOTE_TOKEN_FILE"));
      std::string ca;
      if (const char* cf = std::getenv("BACKPLANE_REMOTE_CA_FILE"); cf && *cf) ca = read_small_file(cf, "BACKPLANE_REMOTE_CA_FILE");
      std::string list = env;
      size_t start = 0;
      while (start <= list.size()) {
        size_t end = list.find(',', start);
        if (end == std::string::npos) end = list.size();
        const std::string item = trim(list.substr(start, end - start));
        start = end + 1;
        if (item.empty()) continue;
        auto s = std::make_unique<Server>();
        s->address = item;
        s->label = item;
        s->token = token;
        const bool is_unix = item.rfind("unix:", 0) == 0;
        if (!is_unix) {
          if (ca.empty() && item.rfind("127.0.0.1:", 0) != 0 && item.rfind("[::1]:", 0) != 0)
            throw sdk::Error(BP_ERR_UNAVAILABLE, "remote: server " + item + " is not on loopback: set BACKPLANE_REMOTE_CA_FILE to the certificate to trust (TLS)");
          s->ca_pem = ca;
        }
        s->owner = this;
        servers_.push_back(std::move(s));
      }
    }
    for (auto& s : servers_) {
      std::lock_guard<std::mutex> lk(s->mu);
      connect(*s);
      const auto& h = s->hello;
      if (isolated_) {
        if (h.plugins_size() != 1 || h.plugins(0).name() != name || h.plugins(0).version() != version)
          throw sdk::Error(BP_ERR_INCOMPATIBLE, who() + ": its process serves another plugin than the manifest's");
      }
      for (int i = 0; i < h.devices_size(); ++i) {
        auto d = std::make_unique<RemoteDevice>();
        d->server = s.get();
        d->index = static_cast<uint32_t>(i);
        const auto& dd = h.devices(i);
        d->name = isolated_ ? dd.name() : dd.name() + "@" + s->label;
        d->kind = dd.kind();
        d->description = (isolated_ ? "isolated: " : "remote: ") + dd.description();
        d->alignment = dd.buffer_alignment() ? dd.buffer_alignment() : 16;
        d->max_buffer = dd.max_buffer_size();
        d->shm_buffers = isolated_ && s->use_shm && dd.shm_buffers();
        devices_.push_back(std::move(d));
      }
    }
    build_tables();
    for (auto& d : descs_) d.fn = remote_kernel;
    api.kernels = descs_.data();
    api.n_kernels = descs_.size();
    api.name = sdk::to_bp(name);
    api.version = sdk::to_bp(version);
  });
}

void Instance::shutdown() {
  for (auto& s : servers_) {
    std::lock_guard<std::mutex> lk(s->mu);
    if (s->stream && !s->broken) {
      s->stream->WritesDone();
      s->stream->Finish();
    }
    s->stream.reset();
    s->context.reset();
    s->shm_buffers.clear();
    stop_child(*s);
    for (auto& [base, size] : s->retired) ::munmap(base, size);
    s->retired.clear();
  }
  devices_.clear();
  servers_.clear();
}

RemoteDevice* dev_of(bp_device* d) { return reinterpret_cast<RemoteDevice*>(d); }

// A handle of the current session, or an error naming why not.
uint64_t live_id(Server& s, uint64_t handle) {
  if (handle_generation(handle) != s.generation || s.broken)
    throw sdk::Error(BP_ERR_UNAVAILABLE, s.owner->who() + ": this buffer was lost when " +
                                             (s.broken ? s.broken_reason : std::string("an earlier session ended")) +
                                             "; compile the plan again");
  return handle_id(handle);
}

// Sends what is queued plus `b`; returns the reply.
Response flush(Server& s, Batch* extra = nullptr) {
  Request req;
  Batch* b = req.mutable_batch();
  if (extra) b->Swap(extra);  // calls and reads; never writes of its own
  // The server applies a batch's writes before its calls and reads.
  for (auto& w : s.pending_writes) *b->add_writes() = std::move(w);
  s.pending_writes.clear();
  s.pending_bytes = 0;
  Response r = s.owner->exchange(s, req);
  s.shm_used = 0;  // the server is done with the staged bytes
  return r;
}

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
      if (at == UINT64_MAX) throw sdk::Error(BP_ERR_OUT_OF_MEMORY, s.owner->who() + ": its shared memory is full");
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
      const uint64_t n = std::min<uint64_t>(size - done, kMaxChunkBytes);
      if (s.pending_bytes + n > kMaxChunkBytes) {
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
    for (uint64_t done = 0; done < size;) {
      const uint64_t n = std::min<uint64_t>(size - done, kMaxChunkBytes);
      const bool staged = s.use_shm && n >= kShmThreshold;
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
        if (r.batch().reads_size() != 1 || r.batch().reads(0).size() != n)
          throw sdk::Error(BP_ERR_INTERNAL, "remote: a read reply of the wrong size");
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
std::mutex g_instances_mu;
std::vector<std::unique_ptr<Instance>> g_instances;

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

}  // namespace

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
