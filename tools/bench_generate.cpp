// `backplane bench --generate`: the GPT-style decoder of examples/generate
// (pre-LayerNorm blocks, causal attention over a KV cache updated in place,
// a GELU MLP, learned positions, an untied head), random weights of a fixed
// seed, built here in C++ so the bench needs no Python. One plan with a
// dynamic dim `seq`: the prompt in one run, then one token per run.
#include "bench_generate.hpp"

#include "commands.hpp"
#include "median_time.hpp"

#include <backplane/backplane.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

namespace backplane::cli {

namespace {

struct Config {
  int64_t vocab, d, layers, heads, max_seq;
};

bool is_product(const std::string& name) {
  const auto dot = name.rfind('.');
  const std::string last = dot == std::string::npos ? name : name.substr(dot + 1);
  return name == "head" || last == "wq" || last == "wk" || last == "wv" || last == "wo" || last == "w1" ||
         last == "w2";
}

HostTensor f32_tensor(Shape shape, const std::vector<float>& v) {
  HostTensor t(BP_DTYPE_F32, std::move(shape));
  std::memcpy(t.data(), v.data(), t.nbytes());
  return t;
}

// W [K, N] in blocks of 32 along K (docs/ops.md, Quantized weights): q
// [N, K] i8 (bits 8) or [N, K/2] u8 nibbles (bits 4), s [N, K/32] f16.
void quantize(const std::vector<float>& w, int64_t K, int64_t N, int bits, HostTensor& q, HostTensor& s) {
  const int top = bits == 8 ? 127 : 7;
  q = HostTensor(bits == 8 ? BP_DTYPE_I8 : BP_DTYPE_U8, {N, bits == 8 ? K : K / 2});
  s = HostTensor(BP_DTYPE_F16, {N, K / 32});
  auto* qs = static_cast<uint8_t*>(q.data());
  auto* ss = static_cast<uint16_t*>(s.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < K / 32; ++b) {
      float amax = 0;
      for (int64_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(w[static_cast<size_t>((b * 32 + j) * N + n)]));
      const uint16_t h = float_to_f16(amax / static_cast<float>(top));  // the SDK's rounding
      ss[n * (K / 32) + b] = h;
      const float sc = f16_to_float(h);
      int v[32];
      for (int64_t j = 0; j < 32; ++j) {
        const float x = w[static_cast<size_t>((b * 32 + j) * N + n)];
        const float r = sc == 0 ? 0.0f : std::nearbyint(x / sc);
        v[j] = static_cast<int>(std::clamp(r, static_cast<float>(-top - (bits == 4)), static_cast<float>(top)));
      }
      if (bits == 8) {
        for (int64_t j = 0; j < 32; ++j) qs[n * K + b * 32 + j] = static_cast<uint8_t>(static_cast<int8_t>(v[j]));
      } else {
        for (int64_t j = 0; j < 16; ++j)
          qs[n * (K / 2) + b * 16 + j] = static_cast<uint8_t>((v[j] + 8) | ((v[j + 16] + 8) << 4));
      }
    }
}

struct Decoder {
  Graph graph;
  uint64_t read_per_token = 0;  // weight bytes every token reads (not the embeddings)
  int64_t params = 0;
};

Decoder build(const Config& cfg, const std::string& dtype, uint64_t seed) {
  Decoder dec;
  Graph& g = dec.graph;
  const int64_t d = cfg.d, h = cfg.heads, hd = d / h, S = cfg.max_seq;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto mat = [&](int64_t n, int64_t m, float scale) {
    std::vector<float> v(static_cast<size_t>(n * m));
    for (auto& x : v) x = normal(rng) * scale;
    return v;
  };
  auto vec = [&](int64_t n, float mean, float spread) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = mean + spread * normal(rng);
    return v;
  };
  auto constant = [&](const std::string& name, Shape shape, const std::vector<float>& v) {
    dec.params += static_cast<int64_t>(v.size());
    if (!is_product(name)) {
      HostTensor t = f32_tensor(shape, v);
      if (name != "tok_emb" && name != "pos_emb") dec.read_per_token += t.nbytes();
      g.constant(name, std::move(t));
      return;
    }
    const int64_t K = shape[0], N = shape[1];
    if (dtype == "f32") {
      dec.read_per_token += static_cast<uint64_t>(K * N * 4);
      g.constant(name, f32_tensor(shape, v));
    } else if (dtype == "bf16") {  // stored [N, K], read through a transposed view
      HostTensor t(BP_DTYPE_BF16, {N, K});
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n) t.set(n * K + k, v[static_cast<size_t>(k * N + n)]);
      dec.read_per_token += t.nbytes();
      g.constant(name + ".t", std::move(t));
      g.node(name, "permute", {name + ".t"}, {{"dims", {1, 0}}});
    } else {
      HostTensor q, s;
      quantize(v, K, N, dtype == "q8" ? 8 : 4, q, s);
      dec.read_per_token += q.nbytes() + s.nbytes();
      g.constant(name + ".q", std::move(q));
      g.constant(name + ".s", std::move(s));
    }
  };
  auto product = [&](const std::string& name, const std::string& x, const std::string& w) {
    if (dtype == "f32") {
      g.node(name, "matmul", {x, w});
    } else if (dtype == "bf16") {
      g.node(name + ".in", "cast", {x}, {{"dtype", "bf16"}});
      g.node(name + ".bf16", "matmul", {name + ".in", w});
      g.node(name, "cast", {name + ".bf16"}, {{"dtype", "f32"}});
    } else {
      g.node(name, "cpu.matmul_" + dtype + "_a8", {x, w + ".q", w + ".s"});
    }
  };
  g.input("tok", BP_DTYPE_I64, {0}, {"seq"});
  g.input("qpos", BP_DTYPE_I64, {0}, {"seq"});
  g.input("pos", BP_DTYPE_I64, {1});
  constant("tok_emb", {cfg.vocab, d}, mat(cfg.vocab, d, 1.0f));
  constant("pos_emb", {S, d}, mat(S, d, 0.1f));
  const float inv_d = 1.0f / std::sqrt(static_cast<float>(d)), inv_4d = 1.0f / std::sqrt(4.0f * d);
  // The cache rows attention reads: 0 .. ctx - 1, ctx (a dynamic dim) the
  // tokens' end rounded up to kCtxStep, so a few specializations serve
  // every length and no step reads the cache's unused rows.
  g.input("kpos", BP_DTYPE_I64, {0}, {"ctx"});
  g.constant("zero", f32_tensor({1}, {0.0f}));
  g.constant("neg_inf", f32_tensor({1}, {-INFINITY}));
  g.constant("scale", f32_tensor({1}, {1.0f / std::sqrt(static_cast<float>(hd))}));
  g.node("te", "index_select", {"tok_emb", "tok"}, {{"dim", 0}});
  g.node("pe", "index_select", {"pos_emb", "qpos"}, {{"dim", 0}});
  g.node("x0", "add", {"te", "pe"});
  g.node("qcol", "reshape", {"qpos"}, {{"shape", {-1, 1}}});
  g.node("visible", "le", {"kpos", "qcol"});
  g.node("mask", "where", {"visible", "zero", "neg_inf"});
  std::string x = "x0";
  for (int64_t i = 0; i < cfg.layers; ++i) {
    const std::string p = "l" + std::to_string(i) + ".";
    const std::string kin = "k_cache" + std::to_string(i), vin = "v_cache" + std::to_string(i);
    for (const char* n : {"ln1", "ln2"}) {
      constant(p + n + ".w", {d}, vec(d, 1.0f, 0.1f));
      constant(p + n + ".b", {d}, vec(d, 0.0f, 0.1f));
    }
    for (const char* n : {"wq", "wk", "wv", "wo"}) constant(p + n, {d, d}, mat(d, d, inv_d));
    constant(p + "w1", {d, 4 * d}, mat(d, 4 * d, inv_d));
    constant(p + "w2", {4 * d, d}, mat(4 * d, d, inv_4d));
    g.input(kin, BP_DTYPE_F32, {S, d});
    g.input(vin, BP_DTYPE_F32, {S, d});
    g.node(p + "h", "layer_norm", {x, p + "ln1.w", p + "ln1.b"}, {{"dims", {-1}}});
    for (const char* n : {"q", "k", "v"}) product(p + n, p + "h", p + "w" + n);
    g.node(kin + "_out", "slice_update", {kin, p + "k", "pos"}, {{"dim", 0}});
    g.node(vin + "_out", "slice_update", {vin, p + "v", "pos"}, {{"dim", 0}});
    g.node(p + "qr", "reshape", {p + "q"}, {{"shape", {-1, h, hd}}});
    g.node(p + "qh", "permute", {p + "qr"}, {{"dims", {1, 0, 2}}});
    g.node(p + "kc", "slice", {kin + "_out"}, {{"dim", 0}, {"start", 0}, {"end", "$ctx"}});
    g.node(p + "vc", "slice", {vin + "_out"}, {{"dim", 0}, {"start", 0}, {"end", "$ctx"}});
    g.node(p + "kr", "reshape", {p + "kc"}, {{"shape", {-1, h, hd}}});
    g.node(p + "kt", "permute", {p + "kr"}, {{"dims", {1, 2, 0}}});
    g.node(p + "vr", "reshape", {p + "vc"}, {{"shape", {-1, h, hd}}});
    g.node(p + "vt", "permute", {p + "vr"}, {{"dims", {1, 0, 2}}});
    g.node(p + "scores", "matmul", {p + "qh", p + "kt"});
    g.node(p + "scaled", "mul", {p + "scores", "scale"});
    g.node(p + "masked", "add", {p + "scaled", "mask"});
    g.node(p + "probs", "softmax", {p + "masked"}, {{"dim", -1}});
    g.node(p + "ctx", "matmul", {p + "probs", p + "vt"});
    g.node(p + "ctxt", "permute", {p + "ctx"}, {{"dims", {1, 0, 2}}});
    g.node(p + "ctx2", "reshape", {p + "ctxt"}, {{"shape", {-1, d}}});
    product(p + "attn", p + "ctx2", p + "wo");
    g.node(p + "x1", "add", {x, p + "attn"});
    g.node(p + "h2", "layer_norm", {p + "x1", p + "ln2.w", p + "ln2.b"}, {{"dims", {-1}}});
    product(p + "up", p + "h2", p + "w1");
    g.node(p + "act", "gelu", {p + "up"});
    product(p + "down", p + "act", p + "w2");
    g.node(p + "x2", "add", {p + "x1", p + "down"});
    g.output(kin + "_out");
    g.output(vin + "_out");
    x = p + "x2";
  }
  constant("lnf.w", {d}, std::vector<float>(static_cast<size_t>(d), 1.0f));
  constant("lnf.b", {d}, std::vector<float>(static_cast<size_t>(d), 0.0f));
  constant("head", {d, cfg.vocab}, mat(d, cfg.vocab, inv_d));
  g.node("last", "slice", {x}, {{"dim", 0}, {"start", -1}});
  g.node("hf", "layer_norm", {"last", "lnf.w", "lnf.b"}, {{"dims", {-1}}});
  product("logits", "hf", "head");
  g.node("next", "argmax", {"logits"}, {{"dim", -1}});
  g.output("next");
  return dec;
}

constexpr int64_t kCtxStep = 32;
int64_t ctx_for(int64_t end, int64_t max_seq) { return std::min(max_seq, (end + kCtxStep - 1) / kCtxStep * kCtxStep); }

HostTensor i64s(int64_t first, int64_t n, bool ramp) {
  HostTensor t(BP_DTYPE_I64, {n});
  for (int64_t i = 0; i < n; ++i) t.set(i, static_cast<double>(ramp ? first + i : first));
  return t;
}

}  // namespace

int bench_generate(Args& args, const std::string& device_name, int threads, bool json) {
  const std::string dtype = take_option(args, "--dtype", "f32");
  const std::string size = take_option(args, "--size", "bench");
  const int64_t prompt = std::stoll(take_option(args, "--prompt", "64"));
  const int64_t tokens = std::stoll(take_option(args, "--tokens", "32"));
  reject_leftovers(args);
  if (dtype != "f32" && dtype != "bf16" && dtype != "q8" && dtype != "q4")
    throw Error("bench --generate: --dtype is f32, bf16, q8 or q4, not '" + dtype + "'");
  if (size != "bench" && size != "small") throw Error("bench --generate: --size is bench or small, not '" + size + "'");
  const Config cfg = size == "bench" ? Config{32000, 1024, 12, 16, 256} : Config{512, 64, 2, 4, 64};
  if (prompt < 1 || tokens < 1 || prompt + tokens > cfg.max_seq)
    throw Error("bench --generate: --prompt and --tokens must be at least 1 and fit max_seq " +
                std::to_string(cfg.max_seq) + " together");
  RuntimeOptions opts;
  opts.num_threads = threads;
  auto rt = Runtime::create(opts);
  const std::vector<Device*> list = rt->select_devices(device_name);
  Decoder dec = build(cfg, dtype, 0);
  CompileOptions co;
  co.dims = {{"seq", prompt}, {"ctx", ctx_for(prompt, cfg.max_seq)}};
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  Plan plan = rt->compile(dec.graph, list, co);
  const double compile_s = std::chrono::duration<double>(clock::now() - t0).count();
  // The caches: device Tensors bound in place (zeros).
  std::vector<Tensor> caches;
  for (int64_t i = 0; i < cfg.layers; ++i)
    for (const char* kind : {"k_cache", "v_cache"}) {
      const std::string name = kind + std::to_string(i);
      Tensor t = rt->upload(HostTensor(BP_DTYPE_F32, {cfg.max_seq, cfg.d}), plan.input_device(name));
      plan.set_input(name, t);
      plan.bind_output(name + "_out", t);
      caches.push_back(std::move(t));
    }
  auto run = [&](const HostTensor& tok, int64_t pos) {
    plan.set_input("tok", tok);
    plan.set_input("qpos", i64s(pos, tok.numel(), true));
    plan.set_input("pos", i64s(pos, 1, false));
    plan.set_input("kpos", i64s(0, ctx_for(pos + tok.numel(), cfg.max_seq), true));
    plan.execute();
    return static_cast<int64_t>(plan.output("next").get_int(0));
  };
  HostTensor prompt_tokens(BP_DTYPE_I64, {prompt});
  for (int64_t i = 0; i < prompt; ++i) prompt_tokens.set(i, static_cast<double>((i * 7919 + 1) % cfg.vocab));
  const auto t1 = clock::now();
  run(prompt_tokens, 0);  // the first run packs weights, makes pipelines
  const double first_s = std::chrono::duration<double>(clock::now() - t1).count();
  const double prompt_s = bench::median_seconds([&] { run(prompt_tokens, 0); }, 1.0);
  // One token at a time after the prompt (seq = 1: a second specialization,
  // compiled on its first use and timed apart).
  int64_t next = run(prompt_tokens, 0);
  const auto t2 = clock::now();
  next = run(i64s(next, 1, false), prompt);
  const double switch_first_s = std::chrono::duration<double>(clock::now() - t2).count();
  // The lengths the timed tokens reach, compiled before the clock starts.
  for (int64_t i = 1; i < tokens; ++i) plan.set_dims({{"seq", 1}, {"ctx", ctx_for(prompt + i + 1, cfg.max_seq)}});
  const auto t3 = clock::now();
  for (int64_t i = 1; i < tokens; ++i) next = run(i64s(next, 1, false), prompt + i);
  const double gen_s = std::chrono::duration<double>(clock::now() - t3).count() / static_cast<double>(tokens - 1);
  const double roof_gbps = 3.0 * 4 * (16 << 20) / stream_add_seconds(rt->num_threads(), 0.3) / 1e9;
  const double gen_gbps = static_cast<double>(dec.read_per_token) / gen_s / 1e9;
  std::string used;
  for (const auto& dv : plan.devices()) used += (used.empty() ? "" : ",") + dv;
  if (json) {
    Json j{{"device", used},
           {"threads", rt->num_threads()},
           {"dtype", dtype},
           {"parameters", dec.params},
           {"weight_bytes_per_token", dec.read_per_token},
           {"compile_seconds", compile_s},
           {"first_run_seconds", first_s},
           {"prompt_tokens", prompt},
           {"prompt_tokens_per_second", static_cast<double>(prompt) / prompt_s},
           {"generated_tokens_per_second", 1.0 / gen_s},
           {"stream_gbps", roof_gbps},
           {"generated_gbps", gen_gbps},
           {"specializations", plan.specializations()}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("decoder d=%lld, %lld layers, %lld heads, vocabulary %lld (%.1f M parameters), %s weights, on %s, %u threads\n",
              static_cast<long long>(cfg.d), static_cast<long long>(cfg.layers), static_cast<long long>(cfg.heads),
              static_cast<long long>(cfg.vocab), dec.params / 1e6, dtype.c_str(), used.c_str(), rt->num_threads());
  std::printf("compile %.1f ms, first run %.1f ms; seq=1 compiled on first use: %.1f ms\n", compile_s * 1e3,
              first_s * 1e3, switch_first_s * 1e3);
  std::printf("prompt tokens/s: %.1f\n", static_cast<double>(prompt) / prompt_s);
  std::printf("generated tokens/s: %.1f\n", 1.0 / gen_s);
  std::printf("weights read per token: %.1f MiB, %.1f GB/s generated; stream roof %.1f GB/s (%.0f%%)\n",
              static_cast<double>(dec.read_per_token) / 1048576.0, gen_gbps, roof_gbps, 100.0 * gen_gbps / roof_gbps);
  return 0;
}

}  // namespace backplane::cli
