// Isolation under abuse (issue 24): the child of an isolated plugin must not
// cost its host memory or time for what the plugin does (a flood on stderr,
// a hung buffer_write, a stopped process), must fit an address-space limit,
// must leave no private folder behind on any path, and must live in a
// process group of its own that ends with it. The plugin is the fixture
// fx_iso (tests/fixtures/isolation_plugin.cpp), misbehaving on magic
// values. Every test points XDG_RUNTIME_DIR at a folder of its own, where
// the children's private folders are made, so that it can see them. Every
// wait is bounded; the only bounds on time are generous correctness bounds
// ("returned within 5 s of a 300 ms deadline").
#ifdef BACKPLANE_HAVE_REMOTE

#include "remote_test_support.hpp"

#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace backplane;

namespace {

using backplane::remotetest::Env;

using Clock = std::chrono::steady_clock;

const std::string kFixtures = std::string(BACKPLANE_FIXTURE_DIR) + "/isolation";
const std::string kBin = std::string(BACKPLANE_BIN_DIR) + "/backplane";

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// A private XDG_RUNTIME_DIR: the children's folders are made in it.
struct RuntimeDir {
  Env env;
  std::string path = remotetest::make_temp_dir("bp-isolation");
  RuntimeDir() { env.set("XDG_RUNTIME_DIR", path); }
  ~RuntimeDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  // The backplane-isolate-* folders in it.
  std::vector<std::string> folders() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(path, ec))
      if (e.path().filename().string().rfind("backplane-isolate-", 0) == 0) out.push_back(e.path().string());
    return out;
  }
};

std::unique_ptr<Runtime> iso_runtime(int64_t deadline_ms = 0) {
  RuntimeOptions o;
  o.use_default_path = true;  // cpu, remote
  o.plugin_paths = {kFixtures};
  o.isolate_deadline_ms = deadline_ms;
  return Runtime::create(o);
}

HostTensor f32(Shape shape, std::vector<float> v) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) t.set(static_cast<int64_t>(i), v[i]);
  return t;
}

// s = a + b, on fx_iso unless said otherwise.
Graph add_graph(const std::string& device = "fx_iso") {
  Graph g;
  g.input("a", BP_DTYPE_F32, {2, 3});
  g.input("b", BP_DTYPE_F32, {3});
  g.node("s", "add", {"a", "b"});
  g.output("s");
  g.pin("s", device);
  return g;
}
std::map<std::string, HostTensor> add_inputs(float first = 1) {
  return {{"a", f32({2, 3}, {first, 2, 3, 4, 5, 6})}, {"b", f32({3}, {1, 0, -1})}};
}
void check_add(const std::map<std::string, HostTensor>& out, float first = 1) {
  const float want[] = {first + 1, 2, 2, 5, 5, 5};
  for (int i = 0; i < 6; ++i) CHECK(out.at("s").get(i) == want[i]);
}
Plan add_plan(Runtime& rt) { return rt.compile(add_graph(), rt.select_devices("fx_iso,cpu")); }

// The message of what `f` throws ("" when it throws nothing).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Waits up to `limit` for `done`, in steps of 20 ms.
bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const auto until = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// No such process, or only its zombie (a process reparented to an init
// that does not reap is dead all the same).
bool gone(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return true;
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

struct IsolatedChild {
  pid_t pid = -1;
  std::string dir;  // its --private-dir
};
// The children of `parent` that serve fx_iso isolated.
std::vector<IsolatedChild> fx_iso_children(pid_t parent) {
  std::vector<IsolatedChild> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(e.path().string() + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent || state == 'Z') continue;
    std::vector<std::string> args;
    std::string cmdline = read_file(e.path().string() + "/cmdline"), arg;
    for (char c : cmdline) {
      if (c) arg += c;
      else args.push_back(std::move(arg)), arg.clear();
    }
    bool isolated = false, ours = false;
    IsolatedChild child;
    child.pid = static_cast<pid_t>(std::stol(name));
    for (size_t i = 0; i < args.size(); ++i) {
      isolated |= args[i] == "--isolated-child";
      if (i + 1 < args.size() && args[i] == "--plugin") ours |= args[i + 1] == "fx_iso";
      if (i + 1 < args.size() && args[i] == "--private-dir") child.dir = args[i + 1];
      if (child.dir.empty() && i + 1 < args.size() && args[i] == "--unix")
        child.dir = std::filesystem::path(args[i + 1]).parent_path().string();
    }
    if (isolated && ours) out.push_back(child);
  }
  return out;
}

// This test binary again, running only the hidden helper test below with
// `mode`, in a process group of its own; its output in `log`.
pid_t spawn_helper(const std::string& mode, const std::string& dir, const std::string& log) {
  std::vector<std::string> args = {std::filesystem::read_symlink("/proc/self/exe").string(), "[isolation-helper]"};
  return remotetest::spawn_logged(args, log, [&] {
    setpgid(0, 0);
    setenv("BP_ISOLATION_HELPER", mode.c_str(), 1);
    setenv("BP_ISOLATION_DIR", dir.c_str(), 1);
    setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
    setenv("BACKPLANE_TEST_GRANDCHILD_FILE", (dir + "/grandchild").c_str(), 1);
  });
}

// Waits (bounded) for a helper; its exit status, or -1 if it had to be killed.
int wait_helper(pid_t pid, std::chrono::seconds limit) {
  int status = 0;
  const bool done = eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; }, limit);
  if (!done) {
    ::kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

pid_t read_pid(const std::string& path) {
  const std::string text = read_file(path);
  return text.empty() ? -1 : static_cast<pid_t>(std::stol(text));
}

// The number that follows `after` in `text`, or -1.
long long number_after(const std::string& text, const std::string& after) {
  const size_t at = text.find(after);
  if (at == std::string::npos) return -1;
  return std::atoll(text.c_str() + at + after.size());
}

// Peak resident memory of this process since the last reset (VmHWM).
uint64_t peak_rss() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  return 0;
}
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

volatile sig_atomic_t g_sigint = 0;
void on_sigint(int) { g_sigint = 1; }

}  // namespace

// Not run on its own: the tests below start this binary with it, as a host
// in a process (group) of its own that they signal or kill.
TEST_CASE("isolation: a host in a process of its own (started by the tests below)", "[.][isolation-helper]") {
  const char* mode_env = std::getenv("BP_ISOLATION_HELPER");
  const char* dir_env = std::getenv("BP_ISOLATION_DIR");
  if (!mode_env || !dir_env) return;
  const std::string mode = mode_env, dir = dir_env;
  auto rt = iso_runtime();
  Plan plan = add_plan(*rt);
  check_add(plan.run(add_inputs()));
  if (mode == "sigint") {
    // Ctrl-C at a terminal: SIGINT to the whole foreground process group,
    // which this host survives (it has a handler) and its isolated child
    // must never see.
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, nullptr);
    const auto children = fx_iso_children(getpid());
    REQUIRE(children.size() == 1);
    REQUIRE(::kill(0, SIGINT) == 0);
    REQUIRE(eventually([] { return g_sigint != 0; }));
    // A child that took the signal would shut down: within its 200 ms tick
    // and the 2 s it gives its session to end.
    CHECK(!eventually([&] { return gone(children[0].pid); }, std::chrono::seconds(3)));
    check_add(plan.run(add_inputs()));
    check_add(plan.run(add_inputs(2)), 2);
  } else if (mode == "kill9") {
    // A helper of the plugin's (a grandchild), then wait to be killed.
    check_add(plan.run(add_inputs(444)), 444);
    std::ofstream(dir + "/ready") << getpid() << "\n";
    std::this_thread::sleep_for(std::chrono::seconds(30));
    FAIL("the test should have killed this host");
  }
}

// Catches: the host reading the child's whole log to keep its tail (a
// plugin that wrote 2 GiB to stderr and crashed cost the host 101 s and
// 4.1 GiB), and a log that grows without bound.
TEST_CASE("isolation: a flood on stderr stops at the file limit and the host reads only the log's tail", "[isolation]") {
  RuntimeDir run_dir;
  SECTION("the log stops growing at BACKPLANE_ISOLATE_MAX_FILE_BYTES") {
    Env env;
    env.set("BACKPLANE_ISOLATE_MAX_FILE_BYTES", "1048576");
    auto rt = iso_runtime();
    Plan plan = add_plan(*rt);
    // 555: the plugin writes 8 MiB to stderr and says how big its log is.
    const std::string m = error_of([&] { plan.run(add_inputs(555)); });
    INFO(m);
    const long long log = number_after(m, "its log is ");
    REQUIRE(log >= 0);
    CHECK(log <= 1048576);
    CHECK(number_after(m, "stderr took ") < 8388608);
    // The child lives on (a write that fails is no crash), and works.
    check_add(plan.run(add_inputs()));
  }
  SECTION("a crash after a huge log: its last words, from the tail, at no cost to the host") {
    Env env;
    env.set("BACKPLANE_ISOLATE_MAX_FILE_BYTES", "2147483648");
    auto rt = iso_runtime();
    Plan plan = add_plan(*rt);
    check_add(plan.run(add_inputs()));
    const bool measured = reset_peak_rss();
    const uint64_t before = peak_rss();
    // 556: a log of 1.5 GiB (sparse), its last words at the end, SIGSEGV.
    const std::string m = error_of([&] { plan.run(add_inputs(556)); });
    const uint64_t after = peak_rss();
    INFO(m);
    CHECK_THAT(m, Catch::Contains("fx_iso"));
    // Under ASan the child's own report comes after the plugin's words.
    if (!kSanitized) CHECK_THAT(m, Catch::Contains("these are my last words"));
    if (measured) {
      INFO("peak resident memory before " << before << " bytes, after " << after);
      CHECK(after < before + (uint64_t{256} << 20));
    } else {
      WARN("/proc/self/clear_refs cannot be written here: the host's memory is not checked");
    }
    check_add(add_plan(*rt).run(add_inputs()));
  }
  CHECK(run_dir.folders().empty());
}

// Catches: the 64 GiB arena reserved whatever the address-space limit (under
// `ulimit -v` every isolated plugin was rejected with "cannot map the memory
// it shares with its process", saying nothing of the limit) and its private
// folder left behind on that path.
TEST_CASE("isolation: the shared arena fits an address-space limit, and says why when it cannot", "[isolation]") {
  if (kSanitized) {
    WARN("SKIPPED: needs an address-space limit, which the sanitizers' shadow memory cannot live under");
    return;
  }
  RuntimeDir run_dir;
  SECTION("too little room even for the smallest arena: the message names the size and the limit") {
    // The remote plugin's library loaded first (it stays loaded), and the
    // runtime made, so that little else needs address space below.
    { check_add(add_plan(*iso_runtime()).run(add_inputs())); }
    auto rt = iso_runtime();
    // 96 MiB of room for this process, briefly: the staging area and the
    // smallest arena (128 MiB) cannot be mapped.
    struct Lowered {
      rlimit saved{};
      explicit Lowered(rlim_t room) {
        getrlimit(RLIMIT_AS, &saved);
        uint64_t used = 0;
        std::ifstream f("/proc/self/status");
        for (std::string line; std::getline(f, line);)
          if (line.rfind("VmSize:", 0) == 0) used = std::strtoull(line.c_str() + 7, nullptr, 10) * 1024;
        rlimit r{static_cast<rlim_t>(used) + room, saved.rlim_max};
        setrlimit(RLIMIT_AS, &r);
      }
      ~Lowered() { setrlimit(RLIMIT_AS, &saved); }
    };
    std::string m;
    {
      Lowered lowered(rlim_t{96} << 20);
      m = error_of([&] { rt->device("fx_iso"); });
    }
    INFO(m);
    CHECK_THAT(m, Catch::Contains("fx_iso") && Catch::Contains("cannot map the 128 MiB") && Catch::Contains("RLIMIT_AS"));
    CHECK(run_dir.folders().empty());
  }
  SECTION("backplane devices --load under ulimit -v 8 GiB: the plugin loads") {
    auto devices_under = [&](rlim_t limit) {
      const std::string log = run_dir.path + "/devices.log";
      const pid_t pid = remotetest::spawn_logged({kBin, "devices", "--load"}, log, [&] {
        setenv("BACKPLANE_PLUGIN_PATH", kFixtures.c_str(), 1);
        setenv("MALLOC_ARENA_MAX", "2", 1);
        rlimit r{limit, limit};
        setrlimit(RLIMIT_AS, &r);
      });
      const int rc = wait_helper(pid, std::chrono::seconds(60));
      return std::make_pair(rc, read_file(log));
    };
    // 8 GiB: room for the host and the child, not for 64 GiB of arena.
    auto [rc, out] = devices_under(rlim_t{8} << 30);
    INFO(out);
    CHECK(rc == 0);
    bool loaded = false;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);)
      loaded |= line.rfind("fx_iso ", 0) == 0 && line.find(" loaded ") != std::string::npos;
    CHECK(loaded);
    CHECK_THAT(out, Catch::Contains("isolated: a plugin that misbehaves"));
    CHECK(run_dir.folders().empty());
  }
  SECTION("backplane run on the isolated plugin under ulimit -v 300 MiB, five times in a row") {
    // Host and child each under 300 MiB of address space. The host's gRPC
    // threads (timers, executors) once failed to start here at times, and
    // the host then hung at exit or lost its child's hello.
    const std::string graph = run_dir.path + "/add.json";
    std::ofstream(graph) << R"({"inputs": {"a": {"value": [[1, 2, 3], [4, 5, 6]]}, "b": {"value": [1, 0, -1]}},
      "nodes": [{"name": "s", "op": "add", "inputs": ["a", "b"]}], "outputs": ["s"]})";
    for (int i = 0; i < 5; ++i) {
      const std::string log = run_dir.path + "/run.log";
      const pid_t pid =
          remotetest::spawn_logged({kBin, "run", graph, "--device", "fx_iso", "--out", run_dir.path + "/out"}, log, [&] {
            setenv("BACKPLANE_PLUGIN_PATH", kFixtures.c_str(), 1);
            // As on the 2-core machines the figure was measured on: a pool of
            // one thread per core, and malloc's per-thread arenas (64 MiB of
            // address space each), would not fit 300 MiB on a large machine.
            setenv("BACKPLANE_NUM_THREADS", "2", 1);
            setenv("MALLOC_ARENA_MAX", "2", 1);
            rlimit r{rlim_t{300} << 20, rlim_t{300} << 20};
            setrlimit(RLIMIT_AS, &r);
          });
      const int rc = wait_helper(pid, std::chrono::seconds(60));
      const std::string out = read_file(log);
      INFO("run " << i << ": " << out);
      REQUIRE(rc == 0);
      REQUIRE_THAT(out, Catch::Contains("[2, 2, 2, 5, 5, 5]"));
    }
    CHECK(run_dir.folders().empty());
  }
}

// The names of a process's threads that belong to gRPC (its timer manager,
// executors, event engine, resolver and server threads).
std::vector<std::string> grpc_threads(pid_t pid) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::string name = read_file(e.path().string() + "/comm");
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    for (const char* prefix : {"grpc", "default-execut", "event_engine", "resolver-execut", "timer_manager"})
      if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

// Catches: the host and its isolated child speaking gRPC to each other
// again. Its threads in both processes cost the round trip most of its
// 50 us (now a few), and under an address-space limit they were what failed.
TEST_CASE("isolation: host and child speak the framed transport: neither starts a gRPC thread", "[isolation]") {
  RuntimeDir run_dir;
  auto rt = iso_runtime();
  Plan plan = add_plan(*rt);
  for (int i = 0; i < 3; ++i) check_add(plan.run(add_inputs(static_cast<float>(i))), static_cast<float>(i));
  const auto children = fx_iso_children(getpid());
  REQUIRE(children.size() == 1);
  auto names = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& t : v) s += t + " ";
    return s;
  };
  const auto host = grpc_threads(getpid());
  const auto child = grpc_threads(children[0].pid);
  INFO("the host's gRPC threads: " << names(host) << "; the child's: " << names(child));
  CHECK(host.empty());
  CHECK(child.empty());
}

// Catches: a private folder (socket, token, log) left behind when the host
// is killed with -9, when the child cannot start, and stale folders of dead
// hosts never cleaned.
TEST_CASE("isolation: private folders go on every path, stale ones of dead hosts at start-up", "[isolation]") {
  RuntimeDir run_dir;
  SECTION("at shutdown, and when the child cannot start") {
    {
      auto rt = iso_runtime();
      check_add(add_plan(*rt).run(add_inputs()));
      CHECK(run_dir.folders().size() == 1);
    }
    CHECK(run_dir.folders().empty());
    Env env;
    env.set("BACKPLANE_SERVER", run_dir.path + "/no-such-server");
    auto rt = iso_runtime();
    CHECK_THROWS_WITH(rt->device("fx_iso"), Catch::Contains("did not start") && Catch::Contains("no-such-server"));
    CHECK(run_dir.folders().empty());
  }
  SECTION("a folder of a host that is gone is removed at the next start; others are kept") {
    // A pid that no longer runs: a child that exited and was reaped.
    const pid_t dead = fork();
    if (dead == 0) _exit(0);
    REQUIRE(dead > 0);
    waitpid(dead, nullptr, 0);
    const std::string stale = run_dir.path + "/backplane-isolate-" + std::to_string(dead) + "-abcdef";
    const std::string live = run_dir.path + "/backplane-isolate-" + std::to_string(getppid()) + "-abcdef";
    const std::string other = run_dir.path + "/backplane-isolate-notapid";
    for (const auto& d : {stale, live, other}) {
      std::filesystem::create_directory(d);
      std::ofstream(d + "/log") << "left behind\n";
    }
    {
      auto rt = iso_runtime();
      check_add(add_plan(*rt).run(add_inputs()));
    }
    CHECK(!std::filesystem::exists(stale));
    CHECK(std::filesystem::exists(live));
    CHECK(std::filesystem::exists(other));
  }
  SECTION("after kill -9 of the host: its child, the plugin's helper and the folder go") {
    const pid_t host = spawn_helper("kill9", run_dir.path, run_dir.path + "/host.log");
    const bool ready = eventually([&] { return std::filesystem::exists(run_dir.path + "/ready"); }, std::chrono::seconds(30));
    INFO(read_file(run_dir.path + "/host.log"));
    if (!ready) {
      ::kill(host, SIGKILL);
      waitpid(host, nullptr, 0);
      FAIL("the host did not start its isolated plugin");
    }
    const auto children = fx_iso_children(host);
    const pid_t grandchild = read_pid(run_dir.path + "/grandchild");
    REQUIRE(children.size() == 1);
    REQUIRE(grandchild > 0);
    CHECK(std::filesystem::exists(children[0].dir));
    ::kill(host, SIGKILL);
    waitpid(host, nullptr, 0);
    CHECK(eventually([&] { return gone(children[0].pid); }));
    CHECK(eventually([&] { return gone(grandchild); }));
    CHECK(eventually([&] { return run_dir.folders().empty(); }));
    // Nothing outlives the test, whatever failed.
    if (!gone(grandchild)) ::kill(grandchild, SIGKILL);
    if (!gone(children[0].pid)) ::kill(children[0].pid, SIGKILL);
  }
}

// Catches: the children in the host's process group (Ctrl-C at a terminal
// ended them behind the host's back, and the next run failed), and a
// plugin's forked helper outliving the host.
TEST_CASE("isolation: children lead their own process group, and it ends with them", "[isolation]") {
  RuntimeDir run_dir;
  SECTION("a session and group of its own; the plugin's helper ends at shutdown") {
    Env env;
    env.set("BACKPLANE_TEST_GRANDCHILD_FILE", run_dir.path + "/grandchild");
    pid_t grandchild = -1, child = -1;
    {
      auto rt = iso_runtime();
      check_add(add_plan(*rt).run(add_inputs(444)), 444);
      const auto children = fx_iso_children(getpid());
      REQUIRE(children.size() == 1);
      child = children[0].pid;
      grandchild = read_pid(run_dir.path + "/grandchild");
      REQUIRE(grandchild > 0);
      CHECK(getpgid(child) == child);
      CHECK(getsid(child) == child);
      CHECK(getpgid(grandchild) == child);
    }
    // It ignores SIGTERM: only the group's SIGKILL ends it.
    CHECK(eventually([&] { return gone(grandchild); }));
    if (!gone(grandchild)) ::kill(grandchild, SIGKILL);
  }
  SECTION("Ctrl-C at the host's terminal does not reach the child") {
    const pid_t host = spawn_helper("sigint", run_dir.path, run_dir.path + "/host.log");
    const int rc = wait_helper(host, std::chrono::seconds(60));
    INFO(read_file(run_dir.path + "/host.log"));
    CHECK(rc == 0);
    CHECK(run_dir.folders().empty());
  }
}

// Catches: deadlines that covered kernel calls only, enforced inside the
// child (a hung buffer_write held a run 40-45 s past a 300 ms deadline, a
// stopped child was noticed after 16 s).
TEST_CASE("isolation: the host bounds every request to a child by the deadline", "[isolation]") {
  RuntimeDir run_dir;
  auto rt = iso_runtime(300);
  SECTION("a buffer_write that never returns") {
    Plan plan = add_plan(*rt);
    check_add(plan.run(add_inputs()));
    const auto children = fx_iso_children(getpid());
    REQUIRE(children.size() == 1);
    // 777 as the first value written: the plugin's buffer_write hangs.
    const auto start = Clock::now();
    auto run = std::async(std::launch::async, [&] { return error_of([&] { plan.run(add_inputs(777)); }); });
    const bool returned = run.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    if (!returned) ::kill(children[0].pid, SIGKILL);  // let the run end, whatever it does
    REQUIRE(returned);
    const std::string m = run.get();
    INFO("returned after " << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count() << " ms");
    INFO(m);
    CHECK_THAT(m, Catch::Contains("fx_iso") && Catch::Contains("buffer_write") && Catch::Contains("300 ms"));
  }
  SECTION("a stopped child") {
    Plan plan = add_plan(*rt);
    check_add(plan.run(add_inputs()));
    const auto children = fx_iso_children(getpid());
    REQUIRE(children.size() == 1);
    REQUIRE(::kill(children[0].pid, SIGSTOP) == 0);
    const auto start = Clock::now();
    auto run = std::async(std::launch::async, [&] { return error_of([&] { plan.run(add_inputs()); }); });
    const bool returned = run.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    if (!returned) ::kill(children[0].pid, SIGCONT);  // let the run end, whatever it does
    REQUIRE(returned);
    const std::string m = run.get();
    INFO("returned after " << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count() << " ms");
    INFO(m);
    CHECK_THAT(m, Catch::Contains("fx_iso") && Catch::Contains("deadline of 300 ms"));
    CHECK(eventually([&] { return gone(children[0].pid); }));
  }
  // The host, its other plugins and a fresh child work.
  const std::string m = error_of([&] {
    auto out = rt->run_graph(add_graph("cpu"), rt->device("cpu"), add_inputs());
    check_add(out);
  });
  CHECK(m == "");
  check_add(add_plan(*rt).run(add_inputs()));
}

#endif  // BACKPLANE_HAVE_REMOTE
