// The remote server's whole request stream as a fuzz harness. The input is a
// short program; each step sends one request to one in-process session of
// `backplane serve` over the CPU plugin, or the test plugin "partial" where
// the build has no CPU plugin (remote::InProcessSession: the same
// decoding, checks, budget and kernels as a served session, without gRPC's
// transport). Steps, each starting with a byte taken modulo 7:
//   0 hello (the next byte's low bit: the wrong protocol version)
//   1 allocate: device (1 byte), size (2 bytes) shifted left by (1 byte % 5)
//   2 free: buffer id (1 byte)
//   3 write: buffer (1), offset (2), length (1), then that many data bytes
//   4 read: buffer (1), offset (2), size (2)
//   5 a batch of one call: device (1), kernel index (2), inputs (1 % 5); per
//     input and then the output: buffer (1), byte offset (2), dtype (1),
//     rank (1 % 5) and that many dims (1 % 9 each), laid out dense; params:
//     kind (1 % 16), a count (1 % 4) of ints, a count (1 % 3) of floats
//     (1 signed byte each), a count (1 % 3) of flags and their bits (1);
//     record and replay ids (1 byte: 2 bits each)
//   6 raw: a length (2) and that many bytes, sent as they are
// Missing bytes read as 0. Invariants: every answer is a Response; a failure
// has a message; a read that succeeds returns exactly the bytes asked for;
// after the session closes, the server's memory budget is back at 0.
#include "harness.hpp"

#include "codec.hpp"
#include "server.hpp"

#include <backplane/backplane.hpp>

#include <memory>
#include <mutex>
#include <sstream>

namespace backplane::fuzz {

namespace {

namespace rp = backplane::remote;

constexpr int kMaxSteps = 64;

class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool done() const { return i_ >= n_; }
  uint8_t u8() { return i_ < n_ ? d_[i_++] : 0; }
  uint16_t u16() {
    const uint16_t lo = u8();
    return static_cast<uint16_t>(lo | (u8() << 8));
  }
  std::string bytes(size_t n) {
    n = std::min(n, n_ - std::min(i_, n_));
    std::string s(reinterpret_cast<const char*>(d_ + i_), n);
    i_ += n;
    return s;
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

Runtime* runtime() {
  static std::once_flag once;
  static std::unique_ptr<Runtime> rt;
  std::call_once(once, [] {
    RuntimeOptions o;
    o.use_default_path = false;
    o.use_environment = false;
    o.num_threads = 1;
    o.max_memory_bytes = uint64_t{64} << 20;
    std::stringstream ss(plugin_dirs());
    for (std::string d; std::getline(ss, d, ':');)
      if (!d.empty()) o.plugin_paths.emplace_back(d);
    rt = Runtime::create(o);
  });
  return rt.get();
}

void tensor(Reader& r, rp::Storage* s, rp::Layout* l) {
  s->set_buffer(r.u8());
  s->set_byte_offset(r.u16());
  const auto dt = static_cast<bp_dtype>(r.u8() % BP_DTYPE_COUNT_);
  s->set_dtype(dt);
  const int rank = r.u8() % 5;
  int64_t numel = 1;
  std::vector<int64_t> shape;
  for (int i = 0; i < rank; ++i) {
    shape.push_back(r.u8() % 9);
    numel *= shape.back();
  }
  int64_t stride = 1;
  std::vector<int64_t> strides(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  for (auto d : shape) l->add_shape(d);
  for (auto st : strides) l->add_strides(st);
  s->set_byte_size(static_cast<uint64_t>(numel) * std::max<size_t>(dtype_size(dt), 1));
}

}  // namespace

int session_one(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  Runtime* rt = runtime();
  // The CPU plugin where the build has it (fuzz_replay), else the test
  // plugin "partial" (the libFuzzer build).
  std::string plugin;
  for (const auto& p : rt->plugins())
    if (p.name == "cpu" || (p.name == "partial" && plugin.empty())) plugin = p.name;
  if (plugin.empty()) {
    set_note("skipped: no cpu or partial plugin in '" + plugin_dirs() + "'");
    return 0;
  }
  rp::ServerOptions o;
  o.max_total_bytes = uint64_t{32} << 20;
  o.max_session_bytes = uint64_t{16} << 20;
  rp::InProcessSession session(*rt, o, plugin);
  Reader in(data, size);
  int steps = 0, failures = 0;
  std::string first_refusal;
  for (; steps < kMaxSteps && !in.done(); ++steps) {
    rp::Request req;
    uint64_t read_size = 0;
    bool is_read = false;
    std::string raw;
    switch (in.u8() % 7) {
      case 0: req.mutable_hello()->set_protocol(rp::kProtocolVersion + (in.u8() & 1)); break;
      case 1: {
        auto* a = req.mutable_allocate();
        a->set_device(in.u8());
        const uint64_t n = in.u16();
        a->set_size(n << (in.u8() % 5));
        break;
      }
      case 2: req.mutable_free()->set_buffer(in.u8()); break;
      case 3: {
        auto* w = req.mutable_batch()->add_writes();
        w->set_buffer(in.u8());
        w->set_offset(in.u16());
        w->set_data(in.bytes(in.u8()));
        break;
      }
      case 4: {
        auto* rd = req.mutable_batch()->add_reads();
        rd->set_buffer(in.u8());
        rd->set_offset(in.u16());
        read_size = in.u16();
        rd->set_size(read_size);
        is_read = true;
        break;
      }
      case 5: {
        auto* b = req.mutable_batch();
        auto* c = b->add_calls();
        c->set_device(in.u8());
        c->set_kernel(in.u16());
        const int n_in = in.u8() % 5;
        for (int i = 0; i < n_in; ++i) tensor(in, c->add_inputs(), c->add_layouts());
        tensor(in, c->add_outputs(), c->add_layouts());
        auto* p = c->mutable_params();
        p->set_kind(in.u8() % 16);
        for (int i = 0, n = in.u8() % 4; i < n; ++i) p->add_ints(static_cast<int8_t>(in.u8()));
        for (int i = 0, n = in.u8() % 3; i < n; ++i) p->add_floats(static_cast<int8_t>(in.u8()));
        const int n_flags = in.u8() % 3;
        const uint8_t flags = in.u8();
        for (int i = 0; i < n_flags; ++i) p->add_flags((flags >> i) & 1);
        const uint8_t seq = in.u8();
        b->set_record(seq & 3);
        b->set_replay((seq >> 2) & 3);
        if (b->replay()) b->clear_calls();
        break;
      }
      default: raw = in.bytes(in.u16()); break;
    }
    const std::string answer = session.request(raw.empty() ? req.SerializeAsString() : raw);
    rp::Response resp;
    if (!resp.ParseFromString(answer)) throw HarnessFailure("step " + std::to_string(steps) + ": the answer is not a Response");
    if (resp.has_failure()) {
      if (failures++ == 0) first_refusal = "step " + std::to_string(steps) + ": " + resp.failure().message();
      if (resp.failure().message().empty()) throw HarnessFailure("step " + std::to_string(steps) + ": a failure without a message");
      continue;
    }
    if (is_read) {
      if (!resp.has_batch() || resp.batch().reads_size() != 1)
        throw HarnessFailure("step " + std::to_string(steps) + ": a read answered without its bytes");
      if (resp.batch().reads(0).size() != read_size)
        throw HarnessFailure("step " + std::to_string(steps) + ": a read of " + std::to_string(read_size) + " bytes gave " +
                             std::to_string(resp.batch().reads(0).size()));
    }
  }
  const uint64_t left = session.close();
  if (left != 0)
    throw HarnessFailure("the session closed with " + std::to_string(left) + " bytes still counted against the budget");
  set_note(std::to_string(steps) + " requests, " + std::to_string(failures) + " refused" +
           (first_refusal.empty() ? "" : "; the first: " + first_refusal.substr(0, 200)));
  return 0;
}

}  // namespace backplane::fuzz
