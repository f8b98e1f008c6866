// `backplane serve`: offers the devices of this machine's plugins over gRPC
// (or, for an isolated child's host, framed messages on a unix socket).
#pragma once

#include <backplane/backplane.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace backplane::remote {

struct ServerOptions {
  std::string listen;     // HOST:PORT (TCP), or empty
  std::string unix_path;  // a unix socket path, or empty
  std::string token;      // required of every client
  std::string tls_cert_pem, tls_key_pem;  // TLS for TCP
  bool insecure_loopback = false;         // TCP without TLS, 127.0.0.1 only
  std::vector<std::string> plugins;       // serve only these plugins (empty = all)
  int64_t deadline_ms = 0;                // a batch running longer ends the server (0 = none)
  uint64_t max_session_bytes = 0;         // memory one session may hold: buffers and recorded sequences (0 = no limit)
  // Memory all sessions together may hold: buffers, recorded sequences and
  // requests being decoded (0 = three quarters of this machine's memory).
  uint64_t max_total_bytes = 0;
  int max_sessions = 16;
  // Connections open at once; more are closed as soon as they are accepted.
  int max_connections = 128;
  // A connection that holds no call for this long is closed: one that never
  // finishes its handshake, never sends a call, or only had calls refused.
  int64_t idle_timeout_ms = 20000;
  bool quiet = false;
  // Set by `serve --ready-fd N`: the server writes one line there once it
  // accepts connections (a supervisor waits for it instead of polling).
  int ready_fd = -1;
  // Set for an isolated child: an 8-byte file both processes map, where the
  // server writes which call of the batch is running, so the host can name
  // the node whose kernel crashed the child.
  std::string progress_file;
  // Set for an isolated child: a memfd its host passed (inherited fd) and its
  // size. Bulk writes and reads then travel through it, not the socket.
  int shm_fd = -1;
  uint64_t shm_size = 0;
  // Set for an isolated child: the unix socket speaks the framed transport
  // (remote/wire/frames.hpp) to its one host instead of gRPC: one thread
  // per connection, no HTTP/2, no gRPC threads in the child.
  bool framed = false;
};

// Checks the options (TLS and token over TCP, loopback rules), loads the
// plugins, listens, and serves until SIGINT/SIGTERM. Returns the process exit
// code; a refusal to start is an Error naming the reason.
int serve(Runtime& runtime, const ServerOptions& options);

// One session of the server in this process, without a transport or a
// token: the fuzzers send it whole request streams (fuzz/session_harness.cpp).
// It serves the loaded devices of `runtime`'s plugin `plugin`, with no shared
// memory, under options.max_total_bytes (0: 64 MiB) and the other limits of
// `options`.
class InProcessSession {
 public:
  InProcessSession(Runtime& runtime, const ServerOptions& options, const std::string& plugin);
  ~InProcessSession();
  InProcessSession(const InProcessSession&) = delete;
  InProcessSession& operator=(const InProcessSession&) = delete;
  // One request as a client's stream carries it (a serialized Request); the
  // serialized Response, exactly what the client would read.
  std::string request(const std::string& bytes);
  // Ends the session as a closed stream does (its buffers freed); returns the
  // bytes still counted against the memory budget, 0 unless accounting leaked.
  uint64_t close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace backplane::remote
