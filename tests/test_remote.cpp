// Remote and isolated devices: `backplane serve` processes started here on a
// unix socket in a private folder (loopback only), the remote plugin talking
// to them, and plugins that crash, abort or hang, each in its own child.
#ifdef BACKPLANE_HAVE_REMOTE

#include "backplane_remote.grpc.pb.h"
#include "codec.hpp"
#include "remote_test_support.hpp"

#include <backplane/backplane.hpp>
#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace backplane;
namespace rp = backplane::remote;

namespace {

using backplane::remotetest::Env;

const std::string kBin = std::string(BACKPLANE_BIN_DIR) + "/backplane";

std::string temp_dir() { return backplane::remotetest::make_temp_dir("bp-remote-test"); }

// A `backplane serve` child on a unix socket, killed when it goes out of scope.
struct Server {
  std::string dir, socket, token = "0123456789abcdef0123456789abcdef";
  pid_t pid = -1;

  explicit Server(const std::vector<std::string>& extra = {"--plugin", "cpu"}) {
    dir = temp_dir();
    socket = dir + "/sock";
    std::ofstream(dir + "/token") << token << "\n";
    std::vector<std::string> args = {kBin, "serve", "--unix", socket, "--token-file", dir + "/token"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid = backplane::remotetest::spawn_logged(args, dir + "/log");
    for (int i = 0; i < 300 && !listening(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    INFO(read_log());
    REQUIRE(listening());
  }
  ~Server() {
    kill_now();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  void kill_now() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  std::string read_log() const {
    std::ifstream f(dir + "/log");
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  bool listening() const { return read_log().find("listening") != std::string::npos; }
  std::string address() const { return "unix:" + socket; }
};

std::unique_ptr<Runtime> runtime(std::vector<std::filesystem::path> extra = {}) {
  RuntimeOptions o;
  o.use_default_path = true;  // cpu, vulkan, remote
  o.plugin_paths = std::move(extra);
  return Runtime::create(o);
}

HostTensor f32(Shape shape, std::vector<float> v) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) t.set(static_cast<int64_t>(i), v[i]);
  return t;
}

// y = (a + b) * a, softmax over the last dim of y: values by hand.
Graph small_graph() {
  Graph g;
  g.input("a", BP_DTYPE_F32, {2, 3});
  g.input("b", BP_DTYPE_F32, {3});
  g.node("s", "add", {"a", "b"});
  g.node("y", "mul", {"s", "a"});
  g.node("p", "softmax", {"y"}, {{"dim", -1}});
  g.output("y");
  g.output("p");
  return g;
}

void check_small(const std::map<std::string, HostTensor>& out) {
  // a = [[1,2,3],[4,5,6]], b = [1,0,-1]: y = [[2,4,6],[20,25,30]]
  const double y[] = {2, 4, 6, 20, 25, 30};
  for (int i = 0; i < 6; ++i) CHECK(out.at("y").get(i) == y[i]);
  for (int r = 0; r < 2; ++r) {
    double sum = 0;
    for (int c = 0; c < 3; ++c) sum += std::exp(y[r * 3 + c] - y[r * 3 + 2]);
    for (int c = 0; c < 3; ++c) CHECK(std::abs(out.at("p").get(r * 3 + c) - std::exp(y[r * 3 + c] - y[r * 3 + 2]) / sum) < 1e-6);
  }
}

std::map<std::string, HostTensor> small_inputs(float first = 1) {
  return {{"a", f32({2, 3}, {first, 2, 3, 4, 5, 6})}, {"b", f32({3}, {1, 0, -1})}};
}

// A raw session with the server, as a hostile client would have.
struct RawClient {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<rp::Remote::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<rp::Request, rp::Response>> stream;
  RawClient(const std::string& address, const std::string& token) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(100 << 20);
    channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    stub = rp::Remote::NewStub(channel);
    ctx.AddMetadata(rp::kTokenKey, token);
    stream = stub->Session(&ctx);
  }
  // The reply, or nullopt when the stream ended.
  std::optional<rp::Response> ask(const rp::Request& r) {
    rp::Response resp;
    if (!stream->Write(r) || !stream->Read(&resp)) return std::nullopt;
    return resp;
  }
  grpc::Status end() {
    stream->WritesDone();
    return stream->Finish();
  }
};

// A runtime whose remote plugin reaches `server` with the token in
// `token_file` (default: the server's own); `env` holds the variables for
// the test's scope.
std::unique_ptr<Runtime> served_runtime(const Server& server, Env& env, const std::string& token_file = "") {
  env.set("BACKPLANE_REMOTE", server.address());
  env.set("BACKPLANE_REMOTE_TOKEN_FILE", token_file.empty() ? server.dir + "/token" : token_file);
  return runtime();
}

rp::Request hello() {
  rp::Request r;
  r.mutable_hello()->set_protocol(rp::kProtocolVersion);
  return r;
}

// An isolated plugin whose child dies before it serves: the plugin is
// rejected, naming itself and that its process did not start.
void check_never_starts(Runtime& rt, const std::string& name) {
  try {
    rt.device(name);
    FAIL("the device should not load");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK_THAT(std::string(e.what()), Catch::Contains(name));
    CHECK_THAT(std::string(e.what()), Catch::Contains("did not start"));
  }
}

}  // namespace

TEST_CASE("remote: a served CPU device runs a graph, alone and beside a local device", "[remote]") {
  Server server;
  Env env;
  auto rt = served_runtime(server, env);
  Device& remote = rt->device("cpu@" + server.address());
  CHECK(remote.plugin_name() == "remote");
  CHECK(remote.kind() == "cpu");
  Plan plan = rt->compile(small_graph(), remote);
  for (int run = 0; run < 3; ++run) check_small(plan.run(small_inputs()));  // runs 2 and 3 replay the batch

  // The softmax pinned to the local CPU, the add to the served one: one
  // graph across both (pins also keep the optimizer from fusing s and y
  // into one node that placement would then move beside the softmax).
  Graph g = small_graph();
  g.pin("p", "cpu");
  g.pin("s", "cpu@" + server.address());
  Plan split = rt->compile(g, rt->select_devices("cpu@" + server.address() + ",cpu"));
  check_small(split.run(small_inputs()));
  bool crossed = false;
  for (const auto& t : split.transfers()) crossed |= t.from != t.to;
  CHECK(crossed);
}

// Catches: the wire path's pieces (1 MiB each, writes posted without
// waiting, reads eight requests ahead of their replies) put back at the
// wrong offset, in the wrong order, or short at the tail; a read's reply
// taken for an earlier write's; a queued write's failure lost.
TEST_CASE("remote: 21 MiB up and down in pieces arrive whole and in order", "[remote]") {
  Server server;
  Env env;
  auto rt = served_runtime(server, env);
  Device& remote = rt->device("cpu@" + server.address());
  // Not a multiple of the piece: a short tail; every 4-byte word different.
  const int64_t n = (int64_t{21} << 20) / 4 + 7;
  HostTensor host(BP_DTYPE_I32, {n});
  auto* p = static_cast<int32_t*>(host.data());
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(i * 2654435761u);
  Tensor t = rt->upload(host, remote);
  HostTensor back = t.download();
  REQUIRE(back.numel() == n);
  const auto* q = static_cast<const int32_t*>(back.data());
  int64_t wrong = 0, first = -1;
  for (int64_t i = 0; i < n; ++i)
    if (q[i] != p[i]) {
      if (first < 0) first = i;
      ++wrong;
    }
  INFO("first wrong element " << first);
  CHECK(wrong == 0);
  // Again through a plan: its output read back in pieces after its run.
  Graph g;
  g.input("x", BP_DTYPE_I32, {n});
  g.node("y", "neg", {"x"});
  g.output("y");
  Plan plan = rt->compile(g, remote);
  auto out = plan.run({{"x", host}});
  const auto* y = static_cast<const int32_t*>(out.at("y").data());
  wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += y[i] != static_cast<int32_t>(0u - static_cast<uint32_t>(p[i]));
  CHECK(wrong == 0);
}

TEST_CASE("remote: many plans run in turn keep recording and replaying", "[remote]") {
  // 70 live plans, 4 rounds: more distinct batches than the client keeps
  // (64) and than a server session may record (256).
  Server server;
  Env env;
  auto rt = served_runtime(server, env);
  Device& remote = rt->device("cpu@" + server.address());
  std::vector<Plan> plans;
  for (int i = 0; i < 70; ++i) plans.push_back(rt->compile(small_graph(), remote));
  for (int round = 0; round < 4; ++round)
    for (auto& p : plans) check_small(p.run(small_inputs()));
}

TEST_CASE("remote: a wrong token is refused and the other plugins keep working", "[remote]") {
  Server server;
  const std::string bad = server.dir + "/bad";
  std::ofstream(bad) << "not-the-token-not-the-token\n";
  Env env;
  auto rt = served_runtime(server, env, bad);
  REQUIRE_THROWS_WITH(rt->device("cpu@" + server.address()), Catch::Contains("refused the token"));
  check_small(rt->run_graph(small_graph(), rt->device("cpu"), small_inputs()));
  // A raw client without the token learns nothing but the refusal.
  RawClient raw(server.address(), "");
  CHECK(!raw.ask(hello()));
  const auto st = raw.end();
  CHECK(st.error_code() == grpc::StatusCode::UNAUTHENTICATED);
}

TEST_CASE("remote: hostile requests get a refusal each; the server lives on", "[remote]") {
  Server server;
  RawClient c(server.address(), server.token);
  auto h = c.ask(hello());
  REQUIRE(h);
  REQUIRE(h->has_hello());
  REQUIRE(h->hello().devices_size() == 1);
  const auto& kernels = h->hello().plugins(0).kernels();
  uint32_t add = UINT32_MAX;
  for (int i = 0; i < kernels.size(); ++i)
    if (kernels.Get(i).op() == "add" && kernels.Get(i).dtypes(0) == BP_DTYPE_F32) add = static_cast<uint32_t>(i);
  REQUIRE(add != UINT32_MAX);

  auto alloc = [&](uint64_t size) {
    rp::Request r;
    r.mutable_allocate()->set_size(size);
    return c.ask(r);
  };
  auto a = alloc(24);
  REQUIRE(a);
  REQUIRE(a->has_allocate());
  const uint64_t buf = a->allocate().buffer();

  // A well-formed add of two [2,3] f32 views of `buf` into itself.
  auto good_call = [&] { return backplane::remotetest::add_call(add, buf); };
  auto batch_with = [&](const rp::Call& call) {
    rp::Request r;
    *r.mutable_batch()->add_calls() = call;
    return c.ask(r);
  };
  {
    auto ok = batch_with(good_call());
    REQUIRE(ok);
    INFO(ok->failure().message());
    CHECK(!ok->has_failure());
  }
  struct Case {
    const char* what;
    std::function<void(rp::Call&)> spoil;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"a buffer of no one", [](rp::Call& k) { k.mutable_inputs(0)->set_buffer(999); }, "does not own"},
      {"bytes past the buffer", [](rp::Call& k) { k.mutable_inputs(1)->set_byte_size(4096); }, "spans bytes"},
      {"a layout outside its storage", [](rp::Call& k) { k.mutable_layouts(0)->set_offset(5); }, "outside"},
      {"a shape the op does not give", [](rp::Call& k) { k.mutable_layouts(2)->set_shape(0, 1); }, "the op gives"},
      {"an input not broadcast", [](rp::Call& k) { k.mutable_layouts(1)->set_shape(0, 1); }, "broadcast"},
      {"a rank of 9", [](rp::Call& k) { for (int i = 0; i < 7; ++i) { k.mutable_layouts(0)->add_shape(1); k.mutable_layouts(0)->add_strides(1); } }, "rank"},
      {"a negative dim", [](rp::Call& k) { k.mutable_layouts(0)->set_shape(0, -2); }, "negative"},
      {"an overflowing element count", [](rp::Call& k) { k.mutable_layouts(0)->set_shape(0, INT64_MAX / 2); }, "more than 2^62 elements"},
      {"a dtype that is none", [](rp::Call& k) { k.mutable_inputs(0)->set_dtype(77); }, "not a dtype"},
      {"the wrong dtype", [](rp::Call& k) { k.mutable_inputs(0)->set_dtype(BP_DTYPE_I32); }, "the kernel takes"},
      {"a kernel that is not there", [](rp::Call& k) { k.set_kernel(1u << 30); }, "no kernel"},
      {"a device that is not there", [](rp::Call& k) { k.set_device(7); }, "no device"},
      {"too few inputs", [](rp::Call& k) { k.mutable_inputs()->RemoveLast(); }, "inputs"},
      {"params of another kind", [](rp::Call& k) { k.mutable_params()->set_kind(BP_PARAMS_TOPK); }, "params"},
      {"a params kind that is none", [](rp::Call& k) { k.mutable_params()->set_kind(99); }, "unknown"},
      {"slots on a plain output", [](rp::Call& k) { k.mutable_outputs(0)->add_slots(); }, "slots"},
      {"a misaligned storage", [](rp::Call& k) { k.mutable_inputs(0)->set_byte_offset(4); k.mutable_inputs(0)->set_byte_size(20); }, "aligned"},
  };
  for (const auto& cs : cases) {
    INFO(cs.what);
    rp::Call call = good_call();
    cs.spoil(call);
    auto r = batch_with(call);
    REQUIRE(r);
    CHECK(r->has_failure());
    CHECK_THAT(r->failure().message(), Catch::Contains(cs.says));
  }
  // Reads and writes outside buffers, replays that were never recorded, a
  // free of nothing, an empty request, an allocation beyond memory.
  {
    rp::Request r;
    auto* rd = r.mutable_batch()->add_reads();
    rd->set_buffer(buf);
    rd->set_offset(16);
    rd->set_size(16);
    auto resp = c.ask(r);
    REQUIRE(resp);
    CHECK(resp->has_failure());
  }
  {
    rp::Request r;
    auto* w = r.mutable_batch()->add_writes();
    w->set_buffer(buf);
    w->set_offset(UINT64_MAX - 2);
    w->set_data("abcd");
    auto resp = c.ask(r);
    REQUIRE(resp);
    CHECK(resp->has_failure());
  }
  {
    rp::Request r;
    r.mutable_batch()->set_replay(12345);
    auto resp = c.ask(r);
    REQUIRE(resp);
    CHECK(resp->has_failure());
  }
  {
    rp::Request r;
    r.mutable_free()->set_buffer(424242);
    auto resp = c.ask(r);
    REQUIRE(resp);
    CHECK(resp->has_failure());
  }
  {
    auto resp = c.ask(rp::Request());
    REQUIRE(resp);
    CHECK(resp->has_failure());
  }
  {
    auto resp = alloc(uint64_t{1} << 62);
    REQUIRE(resp);
    CHECK(resp->has_failure());
  }
  // Another session cannot reach this session's buffer.
  {
    RawClient other(server.address(), server.token);
    REQUIRE(other.ask(hello()));
    rp::Request r;
    auto* rd = r.mutable_batch()->add_reads();
    rd->set_buffer(buf);
    rd->set_size(4);
    auto resp = other.ask(r);
    REQUIRE(resp);
    CHECK(resp->has_failure());
    other.end();
  }
  // Still serving.
  auto again = batch_with(good_call());
  REQUIRE(again);
  CHECK(!again->has_failure());
  c.end();
}

TEST_CASE("remote: garbage bytes and truncated messages do not hurt the server", "[remote]") {
  Server server;
  auto raw_send = [&](const std::string& bytes) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", server.socket.c_str());
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    (void)!::write(fd, bytes.data(), bytes.size());
    ::close(fd);
  };
  std::string garbage(4096, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>((i * 2654435761u) >> 13);
  raw_send(garbage);
  // The HTTP/2 preface, then a frame header promising more than follows.
  raw_send(std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + std::string("\x00\x10\x00\x01\x05\x00\x00\x00\x01\x00", 10));
  // A message the protobuf decoder must reject: a Request whose bytes end midway.
  rp::Request big;
  big.mutable_batch()->add_writes()->set_data(std::string(1000, 'x'));
  std::string bytes;
  big.SerializeToString(&bytes);
  rp::Request cut;
  CHECK(!cut.ParseFromString(bytes.substr(0, bytes.size() / 2)));
  // The server still serves a proper client.
  Env env;
  auto rt = served_runtime(server, env);
  check_small(rt->run_graph(small_graph(), rt->device("cpu@" + server.address()), small_inputs()));
}

TEST_CASE("remote: a server killed in the middle of a run is an error, not a hang", "[remote]") {
  Server server;
  Env env;
  auto rt = served_runtime(server, env);
  // Enough matmuls for the run to take a while on the server.
  Graph g;
  g.input("x", BP_DTYPE_F32, {768, 768});
  std::string last = "x";
  for (int i = 0; i < 24; ++i) {
    const std::string n = "m" + std::to_string(i);
    g.node(n, "matmul", {last, "x"});
    last = n;
  }
  g.output(last);
  Plan plan = rt->compile(g, rt->device("cpu@" + server.address()));
  HostTensor x(BP_DTYPE_F32, {768, 768});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, (i % 7) * 1e-3);
  // Runs until the server goes (bounded: at most 500 runs).
  auto run = std::async(std::launch::async, [&] {
    for (int i = 0; i < 500; ++i) plan.run({{"x", x}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto killed = std::chrono::steady_clock::now();
  server.kill_now();
  // Bounded wait: a hang fails the test instead of stalling it.
  REQUIRE(run.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  INFO("error after " << seconds << " s");
  REQUIRE_THROWS_WITH(run.get(), Catch::Contains("remote server"));
  // The local CPU is unaffected.
  check_small(rt->run_graph(small_graph(), rt->device("cpu"), small_inputs()));
}

TEST_CASE("serve: refuses plain TCP, open interfaces and missing tokens", "[remote]") {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/token") << "0123456789abcdef0123456789abcdef";
  auto serve = [&](const std::string& args) {
    const std::string cmd = kBin + " serve " + args + " > " + dir + "/out 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream f(dir + "/out");
    return std::make_pair(WEXITSTATUS(rc), std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()));
  };
  auto [rc1, out1] = serve("--listen 127.0.0.1:0 --token-file " + dir + "/token");
  CHECK(rc1 != 0);
  CHECK_THAT(out1, Catch::Contains("requires TLS"));
  auto [rc2, out2] = serve("--listen 0.0.0.0:0 --insecure-loopback --token-file " + dir + "/token");
  CHECK(rc2 != 0);
  CHECK_THAT(out2, Catch::Contains("--insecure-loopback binds 127.0.0.1 (or [::1]) only, not '0.0.0.0:0'"));
  auto [rc3, out3] = serve("--unix " + dir + "/s");
  CHECK(rc3 != 0);
  CHECK_THAT(out3, Catch::Contains("--token-file FILE is required"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("remote: an address nobody serves is refused after the connect deadline, with a TLS hint", "[remote]") {
  // A loopback port that was free a moment ago: bind, read the port, close.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  const std::string dir = temp_dir();
  std::ofstream(dir + "/token") << "0123456789abcdef0123456789abcdef\n";
  Env env;
  env.set("BACKPLANE_REMOTE", address);
  env.set("BACKPLANE_REMOTE_TOKEN_FILE", dir + "/token");
  env.set("BACKPLANE_REMOTE_CONNECT_MS", "300");
  auto rt = runtime();
  // Before: "cannot connect to ... within 10 s" and nothing about TLS.
  CHECK_THROWS_WITH(rt->device("cpu@" + address),
                    Catch::Contains("cannot connect to " + address + " within 300 ms") &&
                        Catch::Contains("spoke plain TCP") && Catch::Contains("BACKPLANE_REMOTE_CA_FILE"));
  check_small(rt->run_graph(small_graph(), rt->device("cpu"), small_inputs()));
  std::filesystem::remove_all(dir);
}

// A server that takes the session's first request and never answers.
class SilentService final : public rp::Remote::Service {
 public:
  grpc::Status Session(grpc::ServerContext* ctx, grpc::ServerReaderWriter<rp::Response, rp::Request>* stream) override {
    rp::Request req;
    stream->Read(&req);
    for (int i = 0; i < 3000 && !ctx->IsCancelled(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return grpc::Status::CANCELLED;
  }
};

TEST_CASE("remote: a server that never answers hello is an error after the deadline, not a hang", "[remote]") {
  const std::string dir = temp_dir();
  const std::string path = dir + "/silent";
  std::ofstream(dir + "/token") << "0123456789abcdef0123456789abcdef\n";
  SilentService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server);
  {
    Env env;
    env.set("BACKPLANE_REMOTE", "unix:" + path);
    env.set("BACKPLANE_REMOTE_TOKEN_FILE", dir + "/token");
    env.set("BACKPLANE_REMOTE_HELLO_MS", "300");
    auto rt = runtime();
    // Before: the remote plugin's initialize waited on the hello forever.
    CHECK_THROWS_WITH(rt->device("cpu@unix:" + path),
                      Catch::Contains("unix:" + path) && Catch::Contains("did not answer hello within 300 ms"));
    // The host and its other plugins are intact.
    check_small(rt->run_graph(small_graph(), rt->device("cpu"), small_inputs()));
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  std::filesystem::remove_all(dir);
}

TEST_CASE("serve: a live unix socket is not taken over; a stale one is reused; a file is never replaced",
          "[remote]") {
  Server first;
  // Runs `serve --unix PATH` for at most 3 s (killed by timeout once it
  // listens); its exit code and output.
  auto serve_on = [&](const std::string& path) {
    const std::string out = first.dir + "/second";
    const std::string cmd = "timeout 3 " + kBin + " serve --unix " + path + " --token-file " + first.dir +
                            "/token --plugin cpu > " + out + " 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream f(out);
    return std::make_pair(WEXITSTATUS(rc), std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()));
  };
  auto [rc, out] = serve_on(first.socket);
  CHECK(rc == 1);
  CHECK_THAT(out, Catch::Contains("another server is listening on unix socket " + first.socket));
  // The first server still has its socket and serves.
  {
    Env env;
    auto rt = served_runtime(first, env);
    check_small(rt->run_graph(small_graph(), rt->device("cpu@" + first.address()), small_inputs()));
  }
  // Killed without clean-up, it leaves a socket nobody listens on: reused.
  first.kill_now();
  REQUIRE(std::filesystem::is_socket(first.socket));
  auto [rc2, out2] = serve_on(first.socket);
  CHECK(rc2 == 124);  // it listened until the timeout stopped it
  CHECK_THAT(out2, Catch::Contains("listening"));
  // A regular file at the path is left alone.
  const std::string file = first.dir + "/notes.txt";
  std::ofstream(file) << "keep me\n";
  auto [rc3, out3] = serve_on(file);
  CHECK(rc3 == 1);
  CHECK_THAT(out3, Catch::Contains("exists and is not a socket"));
  std::ifstream kept(file);
  std::string line;
  std::getline(kept, line);
  CHECK(line == "keep me");
}

TEST_CASE("isolation: a kernel that segfaults is an error naming plugin, kernel and node", "[remote][isolation]") {
  auto rt = runtime({std::string(BACKPLANE_FIXTURE_DIR) + "/isolated"});
  Graph g = small_graph();
  g.pin("s", "fx_segv");
  Plan plan = rt->compile(g, rt->select_devices("fx_segv,cpu"));
  std::string placed;
  for (const auto& p : plan.placement())
    if (p.node == "s") placed = p.device;
  REQUIRE(placed == "fx_segv");
  // 666 makes the fixture's add crash.
  try {
    plan.run(small_inputs(666));
    FAIL("the run should fail");
  } catch (const Error& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK_THAT(m, Catch::Contains("fx_segv"));
    CHECK_THAT(m, Catch::Contains("'s'"));
    CHECK_THAT(m, Catch::Contains("add"));
    // SIGSEGV; under ASan its handler reports and aborts (SIGABRT) or exits.
    CHECK((m.find("its process died of SIG") != std::string::npos || m.find("exited") != std::string::npos));
  }
  // The host and the CPU plugin keep working.
  check_small(rt->run_graph(small_graph(), rt->device("cpu"), small_inputs()));
  // The next use starts a fresh child.
  Plan again = rt->compile(g, rt->select_devices("fx_segv,cpu"));
  check_small(again.run(small_inputs()));
}

TEST_CASE("isolation: a plugin that aborts in initialize is rejected with its reason", "[remote][isolation]") {
  auto rt = runtime({std::string(BACKPLANE_FIXTURE_DIR) + "/isolated"});
  check_never_starts(*rt, "fx_initabort");
  check_small(rt->run_graph(small_graph(), rt->device("cpu"), small_inputs()));
}

TEST_CASE("isolation: a kernel that hangs past the deadline is an error", "[remote][isolation]") {
  RuntimeOptions o;
  o.plugin_paths = {std::string(BACKPLANE_FIXTURE_DIR) + "/isolated"};
  o.isolate_deadline_ms = 300;
  auto rt = Runtime::create(o);
  Graph g = small_graph();
  g.pin("s", "fx_hang");
  Plan plan = rt->compile(g, rt->select_devices("fx_hang,cpu"));
  auto run = std::async(std::launch::async, [&] { plan.run(small_inputs(666)); });
  REQUIRE(run.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  REQUIRE_THROWS_WITH(run.get(), Catch::Contains("deadline"));
  check_small(rt->run_graph(small_graph(), rt->device("cpu"), small_inputs()));
  check_small(rt->compile(g, rt->select_devices("fx_hang,cpu")).run(small_inputs()));
}

TEST_CASE("isolation: a garbage error pointer and a crashing library constructor are contained", "[remote][isolation]") {
  auto rt = runtime({std::string(BACKPLANE_FIXTURE_DIR) + "/isolated"});
  Graph g = small_graph();
  g.pin("s", "fx_badptr");
  Plan plan = rt->compile(g, rt->select_devices("fx_badptr,cpu"));
  try {
    plan.run(small_inputs(666));
    FAIL("the run should fail");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK_THAT(std::string(e.what()), Catch::Contains("fx_badptr"));
    CHECK_THAT(std::string(e.what()), Catch::Contains("node 's'"));
  }
  // The plan's buffers went with the child: it says so, and a new plan works.
  REQUIRE_THROWS_WITH(plan.run(small_inputs()), Catch::Contains("compile the plan again"));
  check_small(rt->compile(g, rt->select_devices("fx_badptr,cpu")).run(small_inputs()));
  // A library whose constructor crashes is loaded only in the child.
  check_never_starts(*rt, "fx_ctorcrash");
  check_small(rt->run_graph(small_graph(), rt->device("cpu"), small_inputs()));
}
TEST_CASE("isolation: a profiled plan on an isolated vulkan0 shows each kernel's device time", "[remote][isolation][profile]") {
  // Where the local vulkan0 times its calls (BP_RUN_TIMED), the isolated one must
  // too: the server times the batch and returns the times with its reply.
  auto local = runtime();
  Device* lv = nullptr;
  for (Device* d : local->all_devices())
    if (d->name() == "vulkan0") lv = d;
  if (!lv) {
    WARN("SKIPPED: no vulkan0 here");
    return;
  }
  Graph g;
  g.input("a", BP_DTYPE_F32, {128, 128});
  g.node("m", "matmul", {"a", "a"});
  g.node("y", "add", {"m", "a"});
  g.output("y");
  HostTensor a(BP_DTYPE_F32, {128, 128});
  for (int64_t i = 0; i < a.numel(); ++i) a.set(i, static_cast<double>(i % 7) - 3.0);
  CompileOptions co;
  co.profile = true;
  auto kernel_rows_timed = [&](Runtime& rt) {
    Plan p = rt.compile(g, rt.device("vulkan0"), co);
    p.run({{"a", a}});
    int timed = 0, kernels = 0;
    for (const auto& r : p.profile())
      if (!r.node.empty() && !r.transfer) {
        ++kernels;
        timed += r.device_seconds >= 0;
      }
    CHECK(kernels >= 2);
    return timed == kernels;
  };
  // A local vulkan0 that does not time its calls would make the comparison
  // hold whatever the isolated one did: that is a skip, not a pass.
  if (!kernel_rows_timed(*local)) {
    WARN("SKIPPED: the local vulkan0 does not time its calls (no timestamp queries)");
    return;
  }
  RuntimeOptions o;
  o.use_default_path = true;
  o.isolate = {"vulkan"};
  auto iso = Runtime::create(o);
  CHECK_THAT(iso->device("vulkan0").description(), Catch::StartsWith("isolated:"));
  CHECK(kernel_rows_timed(*iso));
}

namespace {

// One add, s = a + b on [2, 3] f32: the fixtures' only kernel.
Graph add_graph() {
  Graph g;
  g.input("a", BP_DTYPE_F32, {2, 3});
  g.input("b", BP_DTYPE_F32, {2, 3});
  g.node("s", "add", {"a", "b"});
  g.output("s");
  return g;
}

std::map<std::string, HostTensor> add_inputs(float first = 1) {
  return {{"a", f32({2, 3}, {first, 2, 3, 4, 5, 6})}, {"b", f32({2, 3}, {10, 20, 30, 40, 50, 60})}};
}

void check_add(const std::map<std::string, HostTensor>& out, float first = 1) {
  const double s[] = {first + 10.0, 22, 33, 44, 55, 66};
  for (int i = 0; i < 6; ++i) CHECK(out.at("s").get(i) == s[i]);
}

// Waits (bounded, 30 s) for the child `pid` to end; its wait status, or -1
// when it is still running.
int wait_bounded(pid_t pid) {
  for (int i = 0; i < 1500; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

}  // namespace

// Catches: `serve --deadline` not enforced (the hung kernel holds the device
// and the client waits forever), or the server ending some other way than
// the documented exit status 3 (a supervisor tells a deadline from a crash
// by it), or the client hanging instead of getting an error.
TEST_CASE("serve: a batch running past --deadline ends the server with exit status 3", "[remote]") {
  Env env;
  env.set("BACKPLANE_PLUGIN_PATH", std::string(BACKPLANE_FIXTURE_DIR) + "/isolated");
  Server server({"--plugin", "fx_hang", "--deadline", "300"});
  auto rt = served_runtime(server, env);
  const std::string name = "fx_hang@" + server.address();
  Plan plan = rt->compile(add_graph(), rt->device(name));
  check_add(plan.run(add_inputs()));  // served, and within the deadline
  // 666 makes the fixture's add never return.
  auto run = std::async(std::launch::async, [&] { plan.run(add_inputs(666)); });
  if (run.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    server.kill_now();  // so that the run (and the future's destructor) returns
    FAIL("the server did not end the batch within 30 s; log: " << server.read_log());
  }
  REQUIRE_THROWS_WITH(run.get(), Catch::Contains("remote server") && Catch::Contains(server.address()));
  const int status = wait_bounded(server.pid);
  INFO("log: " << server.read_log());
  REQUIRE(status != -1);
  server.pid = -1;  // reaped
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
  CHECK_THAT(server.read_log(), Catch::Contains("ran past the deadline of 300 ms; exiting"));
  // The host's own devices are unaffected.
  check_small(rt->run_graph(small_graph(), rt->device("cpu"), small_inputs()));
}

// Catches: BACKPLANE_ISOLATE ignored (the plugin loaded in the host's own
// process, where its crash would end the host), or every plugin isolated
// whether named or not.
TEST_CASE("isolation: BACKPLANE_ISOLATE=name runs that plugin isolated, and only then", "[remote][isolation]") {
  const std::string fixtures = BACKPLANE_FIXTURE_DIR;
  Graph g = small_graph();
  g.pin("s", "fx_good");
  {
    auto rt = runtime({fixtures});
    const std::string d = rt->device("fx_good").description();
    INFO(d);
    CHECK(d.rfind("isolated:", 0) == std::string::npos);
    CHECK(d == "deliberately broken test plugin");
  }
  Env env;
  env.set("BACKPLANE_ISOLATE", "fx_good");
  auto rt = runtime({fixtures});
  CHECK_THAT(rt->device("fx_good").description(), Catch::StartsWith("isolated: "));
  CHECK(rt->device("fx_good").plugin_name() == "fx_good");
  CHECK_THAT(rt->device("cpu").description(), !Catch::StartsWith("isolated:"));
  check_small(rt->compile(g, rt->select_devices("fx_good,cpu")).run(small_inputs()));
}

// Catches: BACKPLANE_SERVER ignored (the isolated plugin started from
// bin/backplane beside the core library whatever it says), and a server
// program that cannot be run reported without naming it (before: "its
// process exited with status 127" and nothing else).
TEST_CASE("isolation: BACKPLANE_SERVER names the server program of isolated plugins", "[remote][isolation]") {
  const std::string dir = temp_dir();
  const std::string wrapper = dir + "/server.sh", ran = dir + "/ran";
  std::ofstream(wrapper) << "#!/bin/sh\necho \"$@\" > '" << ran << "'\nexec '" << kBin << "' \"$@\"\n";
  std::filesystem::permissions(wrapper, std::filesystem::perms::owner_all);
  Graph g = small_graph();
  g.pin("s", "fx_segv");
  {
    Env env;
    env.set("BACKPLANE_SERVER", wrapper);
    auto rt = runtime({std::string(BACKPLANE_FIXTURE_DIR) + "/isolated"});
    CHECK_THAT(rt->device("fx_segv").description(), Catch::StartsWith("isolated: "));
    check_small(rt->compile(g, rt->select_devices("fx_segv,cpu")).run(small_inputs()));
    REQUIRE(std::filesystem::exists(ran));
    std::ifstream f(ran);
    std::string args((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    CHECK_THAT(args, Catch::StartsWith("serve ") && Catch::Contains("--isolated-child") && Catch::Contains("--plugin fx_segv"));
  }
  {
    const std::string missing = dir + "/no-such-server";
    Env env;
    env.set("BACKPLANE_SERVER", missing);
    auto rt = runtime({std::string(BACKPLANE_FIXTURE_DIR) + "/isolated"});
    CHECK_THROWS_WITH(rt->device("fx_segv"), Catch::Contains("did not start") && Catch::Contains(missing));
    check_small(rt->run_graph(small_graph(), rt->device("cpu"), small_inputs()));
  }
  std::filesystem::remove_all(dir);
}
#endif  // BACKPLANE_HAVE_REMOTE
