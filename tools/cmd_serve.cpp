// backplane serve: offer this machine's devices to remote clients over gRPC
// (docs/remote.md), or, with --isolated-child, run one plugin for the host
// that started this process.
#include "commands.hpp"

#include <backplane/backplane.hpp>

#include "server.hpp"

#include <chrono>
#include <csignal>
#include <pthread.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace backplane::cli {

namespace {

std::string read_secret(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(std::string("serve: cannot read ") + what + " '" + path + "'");
  std::ostringstream s;
  s << f.rdbuf();
  std::string text = s.str();
  if (text.size() > (1u << 20)) throw Error(std::string("serve: ") + what + " '" + path + "' exceeds 1 MiB");
  return text;
}

}  // namespace

int cmd_serve(const Args& in) {
  Args args = in;
  remote::ServerOptions o;
  o.listen = take_option(args, "--listen");
  o.unix_path = take_option(args, "--unix");
  const std::string token_file = take_option(args, "--token-file");
  const std::string cert = take_option(args, "--tls-cert");
  const std::string key = take_option(args, "--tls-key");
  o.insecure_loopback = take_switch(args, "--insecure-loopback");
  const std::string deadline = take_option(args, "--deadline");
  const std::string max_memory = take_option(args, "--max-memory");
  const std::string max_total = take_option(args, "--max-total-memory");
  const std::string max_connections = take_option(args, "--max-connections");
  const std::string idle_timeout = take_option(args, "--idle-timeout");
  const std::string threads = take_option(args, "--threads");
  const std::string ready_fd = take_option(args, "--ready-fd");
  const std::string plugin_dir = take_option(args, "--plugin-dir");
  const std::string private_dir = take_option(args, "--private-dir");
  o.progress_file = take_option(args, "--progress-file");
  const std::string shm_fd = take_option(args, "--shm-fd");
  const std::string shm_size = take_option(args, "--shm-size");
  const bool child = take_switch(args, "--isolated-child");
  o.quiet = take_switch(args, "--quiet");
  for (std::string p; !(p = take_option(args, "--plugin")).empty();) o.plugins.push_back(p);
  reject_leftovers(args);

  if (token_file.empty()) throw Error("serve: --token-file FILE is required (the token every client must present)");
  o.token = read_secret(token_file, "token file");
  while (!o.token.empty() && (o.token.back() == '\n' || o.token.back() == '\r' || o.token.back() == ' ')) o.token.pop_back();
  if (!cert.empty()) o.tls_cert_pem = read_secret(cert, "certificate");
  if (!key.empty()) o.tls_key_pem = read_secret(key, "key");
  auto number = [](const std::string& s, const char* what) -> int64_t {
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end || v < 0) throw Error(std::string("serve: ") + what + " must be a non-negative integer");
    return v;
  };
  if (!deadline.empty()) o.deadline_ms = number(deadline, "--deadline (milliseconds)");
  if (!max_memory.empty()) o.max_session_bytes = static_cast<uint64_t>(number(max_memory, "--max-memory (bytes)"));
  if (!max_total.empty()) {
    o.max_total_bytes = static_cast<uint64_t>(number(max_total, "--max-total-memory (bytes)"));
    if (o.max_total_bytes == 0) throw Error("serve: --max-total-memory must be at least 1 byte");
  }
  if (!max_connections.empty()) {
    const int64_t n = number(max_connections, "--max-connections");
    if (n < 1 || n > 1000000) throw Error("serve: --max-connections must be between 1 and 1000000");
    o.max_connections = static_cast<int>(n);
  }
  if (!idle_timeout.empty()) {
    o.idle_timeout_ms = number(idle_timeout, "--idle-timeout (milliseconds)");
    if (o.idle_timeout_ms < 1 || o.idle_timeout_ms > 86400000) throw Error("serve: --idle-timeout must be between 1 and 86400000 ms");
  }
  if (!ready_fd.empty()) o.ready_fd = static_cast<int>(number(ready_fd, "--ready-fd"));
  if (!shm_fd.empty()) o.shm_fd = static_cast<int>(number(shm_fd, "--shm-fd"));
  if (!shm_size.empty()) o.shm_size = static_cast<uint64_t>(number(shm_size, "--shm-size"));

  // SIGINT/SIGTERM end the server through its own handler thread: blocked
  // before any thread exists (the runtime's pool included), so no other
  // thread takes them with their default action.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  RuntimeOptions ro;
  // The child runs its plugin in its own process: never isolated again, and
  // only the folder its host named.
  ro.allow_isolation = false;
  if (!threads.empty()) ro.num_threads = static_cast<int>(number(threads, "--threads"));
  if (child) {
    if (plugin_dir.empty() || o.plugins.size() != 1) throw Error("serve: --isolated-child needs --plugin-dir and one --plugin");
    ro.use_default_path = false;
    ro.use_environment = false;
    // Its host speaks the framed transport to it, not gRPC.
    o.framed = true;
    // It ends with the host that started it, however the host ended (kill
    // -9 included): the host's private folder for it goes (socket, token,
    // log), and so does its process group (a plugin's forked helpers) when
    // it leads one, as the host starts it (setsid).
    const std::filesystem::path dir = private_dir;
    if (!private_dir.empty() && dir.filename().string().rfind("backplane-isolate-", 0) != 0)
      throw Error("serve: --private-dir must name a backplane-isolate-* folder");
    const pid_t parent = getppid();
    std::thread([parent, dir] {
      while (getppid() == parent) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (!dir.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
      if (getpgrp() == getpid()) ::kill(0, SIGKILL);
      _exit(0);
    }).detach();
  }
  if (!plugin_dir.empty()) ro.plugin_paths.push_back(plugin_dir);
  auto runtime = Runtime::create(ro);
  return remote::serve(*runtime, o);
}

}  // namespace backplane::cli
