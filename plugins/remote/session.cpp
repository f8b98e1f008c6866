// The remote plugin's sessions: connecting to a server (or the child),
// exchanging requests, losing a session, an instance's kernel and device
// tables and its life from initialize() to shutdown(); errors that know
// their call.
#include "remote_impl.hpp"

#include <condition_variable>

namespace bp_remote {

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

// ---- connecting ---------------------------------------------------------------------------------

namespace {
// A deadline from the environment (1 ms .. 10 min), default 10 s:
// BACKPLANE_REMOTE_CONNECT_MS to connect, BACKPLANE_REMOTE_HELLO_MS for the
// server's answer to hello.
std::chrono::milliseconds deadline_from(const char* variable) {
  if (const char* e = std::getenv(variable); e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (end && *end == 0 && v >= 1 && v <= 600000) return std::chrono::milliseconds(v);
  }
  return std::chrono::seconds(10);
}
std::chrono::milliseconds hello_deadline() { return deadline_from("BACKPLANE_REMOTE_HELLO_MS"); }
}  // namespace

void Instance::connect(Server& s) {
  if (isolated_) {
    stop_child(s);
    try {
      start_child(s);
      try {
        open_session(s);
      } catch (...) {
        // A child that cannot be spoken to goes now, with its folder.
        s.broken = true;
        stop_child(s);
        throw;
      }
    } catch (const sdk::Error& e) {
      // Under `ulimit -v` a child short of address space fails in many
      // ways (a thread not made, a server that never listens): say so.
      throw sdk::Error(e.code(), e.what() + address_space_note(e.what()));
    } catch (const std::exception& e) {
      throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": " + e.what() + address_space_note(e.what()));
    }
    return;
  }
  open_session(s);
}

void Instance::open_session(Server& s) {
  s.link.reset();
  // An isolated child speaks the framed transport on its private socket;
  // remote servers speak gRPC.
  if (isolated_) s.link = framed_link(s.child.socket, s.token);
  else s.link = grpc_link(s.address, s.token, s.ca_pem, deadline_from("BACKPLANE_REMOTE_CONNECT_MS"));
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
  // A server that accepts the stream and never answers must not hang the
  // host (`backplane devices --load`, every `--device auto` run): the hello
  // has a deadline, after which a watchdog cancels the stream.
  const std::chrono::milliseconds limit = hello_deadline();
  std::mutex mu;
  std::condition_variable cv;
  bool answered = false, timed_out = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lk(mu);
    if (!cv.wait_for(lk, limit, [&] { return answered; })) {
      timed_out = true;
      s.link->cancel();
    }
  });
  auto stop_watchdog = [&] {
    {
      std::lock_guard<std::mutex> lk(mu);
      answered = true;
    }
    cv.notify_all();
    watchdog.join();
  };
  Response r;
  try {
    r = exchange(s, req);
  } catch (...) {
    stop_watchdog();
    if (timed_out)
      throw sdk::Error(BP_ERR_UNAVAILABLE, s.address + ": the server accepted the session but did not answer hello within " +
                                               std::to_string(limit.count()) + " ms (BACKPLANE_REMOTE_HELLO_MS)");
    throw;
  }
  stop_watchdog();
  if (r.has_failure())
    throw sdk::Error(BP_ERR_UNAVAILABLE, s.address + ": the server refused the session: " + r.failure().message());
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
  describe_loss(s, s.link->finish());
  throw sdk::Error(BP_ERR_UNAVAILABLE, who() + " (" + s.label + "): " + s.broken_reason);
}

namespace {
// The request a child is asked, as errors name it.
std::string describe(const Request& req) {
  if (req.has_hello()) return "hello";
  if (req.has_allocate()) return "buffer_allocate";
  if (req.has_free()) return "buffer_free";
  if (!req.has_batch()) return "a request";
  const Batch& b = req.batch();
  std::string parts;
  auto add = [&](const std::string& p) { parts += (parts.empty() ? "" : ", ") + p; };
  if (b.writes_size() > 0) add("buffer_write");
  if (b.calls_size() > 0 || b.replay() != 0) add("a batch of kernel calls");
  if (b.reads_size() > 0) add("buffer_read");
  return parts.empty() ? "a batch" : parts;
}

// While a request to an isolated child is waited on: the Guard's watchdog
// may end the child once it waits past the bound (no deadline, no guard).
class Waiting {
 public:
  // The request is named only when a guard watches (no string built per
  // request otherwise).
  Waiting(Server& s, const Request& req) : g_(s.guard.thread.joinable() ? &s.guard : nullptr) {
    if (g_) arm(describe(req));
  }
  Waiting(Server& s, const char* what) : g_(s.guard.thread.joinable() ? &s.guard : nullptr) {
    if (g_) arm(what);
  }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;
  ~Waiting() {
    if (!g_) return;
    std::lock_guard<std::mutex> lk(g_->mu);
    g_->waiting = false;
  }

 private:
  void arm(std::string what) {
    std::lock_guard<std::mutex> lk(g_->mu);
    g_->waiting = true;
    g_->since = std::chrono::steady_clock::now();
    g_->what = std::move(what);
  }
  Guard* g_;
};
}  // namespace

void Instance::watch(Server& s) {
  const auto bound = std::chrono::milliseconds(deadline_ms_ + kGraceMs);
  const auto tick = std::clamp<std::chrono::milliseconds>(bound / 8, std::chrono::milliseconds(10), std::chrono::milliseconds(250));
  Guard& g = s.guard;
  std::unique_lock<std::mutex> lk(g.mu);
  while (!g.stop) {
    g.cv.wait_for(lk, tick);
    if (g.stop || !g.waiting || g.group <= 0) continue;
    if (std::chrono::steady_clock::now() - g.since <= bound) continue;
    // A stopped or hung child: its whole group goes, and the stream's
    // reads and writes fail at once. `link` is not replaced while a
    // request waits (connect() holds s.mu, as does the waiting caller).
    g.fired = g.what;
    g.waiting = false;
    if (::kill(-g.group, SIGKILL) != 0) ::kill(g.group, SIGKILL);
    if (s.link) s.link->cancel();
  }
}

void Instance::send(Server& s, const Request& req) {
  if (s.broken) throw sdk::Error(BP_ERR_UNAVAILABLE, who() + " (" + s.label + "): " + s.broken_reason);
  if (!s.link->write(req)) lost(s);
  ++s.outstanding;
}

void Instance::post(Server& s, const Request& req) {
  Waiting w(s, req);
  send(s, req);
}

void Instance::post_encoded(Server& s, std::string&& bytes) {
  Waiting w(s, "buffer_write");
  if (s.broken) throw sdk::Error(BP_ERR_UNAVAILABLE, who() + " (" + s.label + "): " + s.broken_reason);
  if (!s.link->write_encoded(std::move(bytes))) lost(s);
  ++s.outstanding;
}

Response Instance::receive(Server& s) {
  Waiting w(s, "a reply");
  Response resp;
  if (!s.link->read(resp)) {
    s.outstanding = 0;
    lost(s);
  }
  --s.outstanding;
  return resp;
}

Response Instance::exchange(Server& s, const Request& req) {
  Waiting w(s, req);
  send(s, req);
  // Replies come in order: those of posted batches first. The first failure
  // among them is this exchange's answer (an error of a queued write shows
  // at the next synchronize or read, as on an asynchronous device).
  Response first_failure, resp;
  bool failed = false;
  while (s.outstanding > 0) {
    if (!s.link->read(resp)) {
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
  bp_error* e = sdk::guard([&] {
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
      // The host bounds every request to the child (Guard).
      if (deadline_ms_ > 0) s->guard.thread = std::thread([this, srv = s.get()] { watch(*srv); });
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
  // The host does not shut down a plugin whose initialize() failed: its
  // children and their private folders go now.
  if (e) stop_all();
  return e;
}

void Instance::shutdown() { stop_all(); }

void Instance::stop_all() {
  for (auto& s : servers_) {
    std::lock_guard<std::mutex> lk(s->mu);
    if (s->link && !s->broken) {
      Waiting w(*s, "the end of its session");
      s->link->finish();
    }
    if (s->guard.thread.joinable()) {
      {
        std::lock_guard<std::mutex> g(s->guard.mu);
        s->guard.stop = true;
      }
      s->guard.cv.notify_all();
      s->guard.thread.join();
    }
    s->link.reset();
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
Response flush(Server& s, Batch* extra) {
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

}  // namespace bp_remote
