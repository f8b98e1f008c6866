// The remote plugin's child process: `backplane serve --unix` started for an
// isolated plugin, its shared memory, and what is said when it is lost.
#include "remote_impl.hpp"

#include <cerrno>
#include <cstring>
#include <set>
#include <sys/resource.h>
#include <sys/stat.h>

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

namespace {

std::string mib(uint64_t bytes) {
  if (bytes % (uint64_t{1} << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

// The address space this process uses (VmSize), or 0 when unknown.
uint64_t address_space_used() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmSize:", 0) == 0) return std::strtoull(line.c_str() + 7, nullptr, 10) * 1024;
  return 0;
}

// The arena's size (see kArenaBytes): everything where no address-space
// limit applies; else a quarter of the room the limit leaves (the child maps
// it too, under the same limit), at least kArenaFloorBytes. `limit` and
// `used` say what it was sized under (limit 0: none).
uint64_t arena_size(uint64_t& limit, uint64_t& used) {
  rlimit r{};
  limit = used = 0;
  if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return kArenaBytes;
  limit = r.rlim_cur;
  used = address_space_used();
  const uint64_t room = limit > used + kShmBytes ? limit - used - kShmBytes : 0;
  const uint64_t quarter = room / 4 & ~((uint64_t{2} << 20) - 1);  // whole 2 MiB
  return std::clamp(quarter, kArenaFloorBytes, kArenaBytes);
}

// The largest file the child may write (RLIMIT_FSIZE): its log among them.
// BACKPLANE_ISOLATE_MAX_FILE_BYTES, default 64 MiB, at least 4 KiB.
uint64_t file_limit() {
  if (const char* e = std::getenv("BACKPLANE_ISOLATE_MAX_FILE_BYTES"); e && *e) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(e, &end, 10);
    if (end && *end == 0 && v >= 4096) return v;
  }
  return uint64_t{64} << 20;
}

// The last `max_bytes` of a file, read from there (a log of any size costs
// the host a few KB); "..." in front when that was not the whole file.
std::string log_tail(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  struct stat st {};
  std::string out;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    const uint64_t from = size > max_bytes ? size - max_bytes : 0;
    out.resize(size - from);
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t n = ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(from + got));
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    out.resize(got);
    // Text only: a NUL would cut the message short (a sparse or binary
    // log), other control bytes (terminal escapes) would garble it.
    out.erase(std::remove(out.begin(), out.end(), '\0'), out.end());
    for (char& c : out)
      if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') c = '?';
    if (from > 0) out = "..." + out;
  }
  ::close(fd);
  return out;
}

}  // namespace

std::string address_space_note(const std::string& said) {
  rlimit r{};
  if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY || said.find("RLIMIT_AS") != std::string::npos) return {};
  return " (under an address-space limit of " + mib(r.rlim_cur) +
         " (RLIMIT_AS, `ulimit -v`), which the child shares: it may need more room for its threads and the memory "
         "it shares with the host)";
}

namespace {

constexpr const char* kDirPrefix = "backplane-isolate-";

// Private folders of hosts that are gone (killed with -9, say, before their
// children could remove them): backplane-isolate-PID-XXXXXX of this user
// whose PID no longer runs. Once per process and folder, at its first child.
void remove_stale_folders(const std::string& base) {
  // Never destroyed: a host that keeps its Runtime in a static may start a
  // child after this library's static destructors ran (see g_instances).
  static std::mutex& mu = *new std::mutex;
  static std::set<std::string>& done = *new std::set<std::string>;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (done.size() >= 64 || !done.insert(base).second) return;
  }
  {
    std::error_code ec;
    std::filesystem::directory_iterator it(base, ec), end;
    for (int seen = 0; !ec && it != end && seen < 100000; it.increment(ec), ++seen) {
      const std::string name = it->path().filename().string();
      if (name.rfind(kDirPrefix, 0) != 0) continue;
      const std::string rest = name.substr(std::strlen(kDirPrefix));
      const size_t dash = rest.find('-');
      if (dash == 0 || dash == std::string::npos || rest.find_first_not_of("0123456789") != dash) continue;
      const long owner = std::strtol(rest.substr(0, dash).c_str(), nullptr, 10);
      if (owner <= 0 || owner == static_cast<long>(getpid())) continue;
      if (::kill(static_cast<pid_t>(owner), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to ask)
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) continue;
      std::error_code rm;
      std::filesystem::remove_all(it->path(), rm);
    }
  }
}

}  // namespace

void Instance::start_child(Server& s) {
  const char* env_base = std::getenv("XDG_RUNTIME_DIR");
  const std::string base = env_base && *env_base ? env_base : "/tmp";
  remove_stale_folders(base);
  // The host's pid in the name: a folder whose host is gone is known as stale.
  std::string tmpl = base + "/" + kDirPrefix + std::to_string(getpid()) + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data()))
    throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": cannot create a private folder for its process in " + base + " (" +
                                             std::strerror(errno) + "; XDG_RUNTIME_DIR, else /tmp)");
  s.child.dir = buf.data();  // mode 0700: only this user reaches the socket
  {
    std::lock_guard<std::mutex> lk(s.guard.mu);
    s.guard.fired.clear();
  }
  try {
    start_process(s);
  } catch (...) {
    // Whatever had been made goes: the process, the mappings, the folder.
    stop_child(s);
    throw;
  }
}

void Instance::start_process(Server& s) {
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
  uint64_t as_limit = 0, as_used = 0;
  const uint64_t arena = arena_size(as_limit, as_used);
  const uint64_t shm_size = kShmBytes + arena;
  // Why a mapping failed, with the limit that made it fail where there is one.
  auto cannot = [&](const char* what, int err) {
    std::string m = who() + ": cannot " + what + " the " + mib(shm_size) + " of memory it shares with its process (" +
                    std::strerror(err) + ")";
    if (as_limit)
      m += ": the address-space limit (RLIMIT_AS, `ulimit -v`) is " + mib(as_limit) + ", of which the host uses " +
           mib(as_used) + "; raise the limit, or run the plugin without isolation";
    return sdk::Error(BP_ERR_UNAVAILABLE, m);
  };
  const int shm_fd = memfd_create("backplane-isolate", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (shm_fd < 0 || ftruncate(shm_fd, static_cast<off_t>(shm_size)) != 0 ||
      fcntl(shm_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    const int err = errno;
    if (shm_fd >= 0) ::close(shm_fd);
    throw cannot("create", err);
  }
  {
    void* m = ::mmap(nullptr, shm_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, shm_fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(shm_fd);
      throw cannot("map", err);
    }
    s.child.shm = static_cast<char*>(m);
    s.child.shm_size = shm_size;
    s.arena_free.clear();
    s.arena_free[kShmBytes] = arena;
    s.retained = 0;
  }
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) {
    ::close(shm_fd);
    throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": pipe failed");
  }
  std::vector<std::string> args = {server_exe_, "serve", "--unix", s.child.socket, "--token-file", token_file,
                                   "--plugin", name, "--plugin-dir", manifest_dir_, "--isolated-child",
                                   "--private-dir", s.child.dir,
                                   "--progress-file", progress_file, "--shm-fd", "4",
                                   "--shm-size", std::to_string(shm_size),
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
  // Files the child writes (its log first) stop growing at the limit; a
  // write past it fails (EFBIG) instead of raising SIGXFSZ.
  rlimit fsize{};
  getrlimit(RLIMIT_FSIZE, &fsize);
  const rlim_t cap = static_cast<rlim_t>(file_limit());
  if (fsize.rlim_cur == RLIM_INFINITY || fsize.rlim_cur > cap) fsize.rlim_cur = cap;
  if (fsize.rlim_max == RLIM_INFINITY || fsize.rlim_max > cap) fsize.rlim_max = fsize.rlim_cur;
  // What the child writes to its log when exec fails (made before fork: the
  // child may only make async-signal-safe calls), so that the error names
  // the program: BACKPLANE_SERVER may name a path that is not there.
  const std::string exec_failed = "cannot run the server program " + server_exe_ + ": ";
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec. Its own session and process
    // group: Ctrl-C at the host's terminal (SIGINT to the foreground group)
    // does not reach it, and the host ends the whole group, a plugin's
    // forked helpers included.
    setsid();
    setrlimit(RLIMIT_FSIZE, &fsize);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &ign, nullptr);
    // The pipe becomes fd 3 and the shared memory fd 4 (moved out of the
    // way first, so neither clobbers the other).
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
  {
    std::lock_guard<std::mutex> lk(s.guard.mu);
    s.guard.group = pid;
  }
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
    std::string log = trim(log_tail(s.child.log, 4096));
    if (!s.broken_reason.empty()) log = s.broken_reason + (log.empty() ? "" : "; its log: " + log);
    if (log.size() > 2000) log = "..." + log.substr(log.size() - 2000);
    throw sdk::Error(BP_ERR_UNAVAILABLE, who() + ": its process did not start" + (log.empty() ? "" : ": " + trim(log)));
  }
  s.address = "unix:" + s.child.socket;
  s.token = s.child.token;
}

namespace {
// Waits up to `ms` for the child to end, leaving it unreaped (so that its
// process group's id stays its own); its exit status in `info`.
bool ended(pid_t pid, int ms, siginfo_t& info) {
  for (int waited = 0;; waited += 10) {
    info = siginfo_t{};
    if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) return true;
    if (waited >= ms) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}
}  // namespace

// Ends what is left of the child's process group (a plugin's forked
// helpers), then reaps the child. The group's id is the child's pid, which
// stays reserved until this reaps it.
void Instance::reap(Server& s) {
  if (s.child.pid <= 0) return;
  {
    std::lock_guard<std::mutex> lk(s.guard.mu);
    s.guard.group = -1;
  }
  // (The child itself too, should it not lead a group: setsid failed.)
  if (::kill(-s.child.pid, SIGKILL) != 0) ::kill(s.child.pid, SIGKILL);
  int status = 0;
  waitpid(s.child.pid, &status, 0);
  s.child.pid = -1;
}

void Instance::stop_child(Server& s) {
  if (s.child.pid > 0) {
    // The whole group: the server, and anything its plugin started.
    if (::kill(-s.child.pid, SIGTERM) != 0) ::kill(s.child.pid, SIGTERM);
    siginfo_t info{};
    ended(s.child.pid, 1000, info);
    reap(s);
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
  std::string fired;
  {
    std::lock_guard<std::mutex> lk(s.guard.mu);
    fired = s.guard.fired;
  }
  if (s.child.pid > 0) {
    siginfo_t info{};
    if (ended(s.child.pid, 1000, info)) {  // up to a second for the exit status
      if (info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED) {
        const int sig = info.si_status;
        const char* name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGABRT ? "SIGABRT" : sig == SIGKILL ? "SIGKILL"
                         : sig == SIGBUS  ? "SIGBUS"  : sig == SIGFPE  ? "SIGFPE"  : sig == SIGILL  ? "SIGILL" : "a signal";
        why = "its process died of " + std::string(name) + " (signal " + std::to_string(sig) + ")";
      } else if (info.si_code == CLD_EXITED) {
        why = info.si_status == 3 ? "it ran past its deadline of " + std::to_string(deadline_ms_) + " ms and its process was ended"
                                  : "its process exited with status " + std::to_string(info.si_status);
      }
      reap(s);
      // What it said last (a sanitizer's report, a plugin's complaint): the
      // log's tail only, however much it wrote.
      std::string log = trim(log_tail(s.child.log, 4096));
      if (log.size() > 400) log = "..." + log.substr(log.size() - 400);
      if (!log.empty() && what != "" && fired.empty()) why += "; its last words: " + log;
    }
  }
  if (!fired.empty())
    why = "it did not answer " + fired + " within its deadline of " + std::to_string(deadline_ms_) + " ms (and " +
          std::to_string(kGraceMs) + " ms of grace): the host ended its process (BACKPLANE_ISOLATE_DEADLINE_MS)";
  s.broken_reason = why;
}

}  // namespace bp_remote
