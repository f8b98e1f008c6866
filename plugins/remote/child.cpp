// The remote plugin's child process: `backplane serve --unix` started for an
// isolated plugin, its shared memory, and what is said when it is lost.
#include "remote_impl.hpp"

#include <cerrno>
#include <cstring>

namespace bp_remote {

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
  // What the child writes to its log when exec fails (made before fork: the
  // child may only make async-signal-safe calls), so that the error names
  // the program: BACKPLANE_SERVER may name a path that is not there.
  const std::string exec_failed = "cannot run the server program " + server_exe_ + ": ";
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
    const int err = errno;
    const char* why = err == ENOENT    ? "no such file"
                      : err == EACCES  ? "permission denied"
                      : err == ENOEXEC ? "not an executable format"
                                       : "exec failed";
    (void)!::write(2, exec_failed.data(), exec_failed.size());
    (void)!::write(2, why, std::strlen(why));
    (void)!::write(2, "\n", 1);
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

}  // namespace bp_remote
