// The remote server's decoder and call check as a fuzz harness: bytes -> a
// protobuf Request -> for each call of a batch, remote::check_call against a
// fixed table of kernels and buffers. A call the check accepts must be one a
// kernel can run safely: every storage inside its buffer, every layout
// inside its storage, outputs dense, dtypes as the kernel's key. Params must
// survive decode -> encode -> decode unchanged. Any broken invariant is a
// HarnessFailure (a finding).
#include "harness.hpp"

#include "codec.hpp"
#include "validate.hpp"

#include <backplane/backplane.hpp>
#include <backplane/sdk/plugin.hpp>

namespace backplane::fuzz {

namespace {

namespace rp = backplane::remote;

KernelInfo kernel(std::string op, std::vector<bp_dtype> dtypes, std::vector<bp_layout_capability> layouts,
                  uint32_t bundle = 0, bool variadic = false) {
  KernelInfo k;
  k.op = std::move(op);
  k.dtypes = std::move(dtypes);
  k.layouts = std::move(layouts);
  k.bundle_slots = bundle;
  k.variadic = variadic;
  return k;
}

const std::vector<KernelInfo>& table() {
  constexpr auto F = BP_DTYPE_F32, D = BP_DTYPE_F64, I = BP_DTYPE_I64, I32 = BP_DTYPE_I32;
  constexpr auto S = BP_LAYOUT_STRIDED, C = BP_LAYOUT_CONTIGUOUS;
  static const std::vector<KernelInfo> t = {
      kernel("add", {F, F, F}, {S, S}),
      kernel("where", {BP_DTYPE_BOOL, F, F, F}, {S, S, S}),
      kernel("sum", {F, F}, {S}),
      kernel("max", {I32, I32}, {C}),
      kernel("matmul", {F, F, F}, {S, S}),
      kernel("softmax", {F, F}, {C}),
      kernel("cumsum", {I, I}, {S}),
      kernel("topk", {F, F}, {C}, 2),
      kernel("var_mean", {D, D}, {S}, 2),
      kernel("concat", {F, F}, {S}, 0, true),
      kernel("layer_norm", {F, F, F, F}, {C, C, C}),
      kernel("conv2d", {F, F, F, F}, {C, C, C}),
      kernel("gather", {F, I, F}, {S, S}),
      kernel("index_select", {F, I, F}, {S, S}),
      kernel("cast", {F, I32}, {S}),
      kernel("clamp", {I32, I32}, {S}),
      kernel("argmax", {F, I}, {S}),
      kernel("selective_scan", {F, F, F, F, F, F}, {C, C, C, C, C}, 2),
      kernel("contiguous", {F, F}, {S}),
      kernel("affine", {F, F}, {S}),
  };
  return t;
}

// Buffers 1..5 of this fake session: sizes, and the device each lives on.
std::optional<uint64_t> buffer(uint64_t id, uint32_t device) {
  static const uint64_t sizes[] = {0, 0, 64, 4096, 1u << 20, 4096};
  if (id == 0 || id > 5) return std::nullopt;
  if ((id == 5) != (device == 1)) return std::nullopt;
  return sizes[id];
}

void verify(const rp::CheckedCall& c, const KernelInfo& k, uint32_t device) {
  auto fail = [&](const std::string& what) { throw HarnessFailure("check_call accepted " + k.op + " with " + what); };
  const size_t fixed = k.dtypes.size() - 1;
  if (c.inputs.size() + 1 != c.layouts.size() || c.outputs.size() != 1) fail("the wrong counts");
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const auto& s = c.inputs[i];
    if (c.input_buffers[i] == 0) continue;
    const auto size = buffer(c.input_buffers[i], device);
    if (!size || s.byte_offset + s.byte_size < s.byte_offset || s.byte_offset + s.byte_size > *size)
      fail("input " + std::to_string(i) + " outside its buffer");
    if (s.dtype != k.dtypes[i < fixed ? i : fixed - 1]) fail("an input dtype off the key");
    if (!sdk::layout_fits(c.layouts[i], dtype_size(s.dtype), 0, s.byte_size)) fail("an input layout outside its storage");
    if (k.layouts[i < fixed ? i : fixed - 1] == BP_LAYOUT_CONTIGUOUS && !sdk::is_contiguous(c.layouts[i]))
      fail("a strided input to a contiguous kernel");
  }
  const auto& o = c.outputs[0];
  const auto size = buffer(c.output_buffers[0], device);
  if (!size || o.byte_offset + o.byte_size > *size) fail("the output outside its buffer");
  const bp_layout& ol = c.layouts.back();
  if (!sdk::is_contiguous(ol) || ol.offset != 0 || !sdk::layout_fits(ol, dtype_size(o.dtype), 0, o.byte_size))
    fail("an output that is not dense inside its storage");
  if (o.n_slots != k.bundle_slots) fail("the wrong number of slots");
  for (uint32_t i = 0; i < o.n_slots; ++i)
    if (!sdk::layout_fits(o.slots[i].layout, dtype_size(o.slots[i].dtype), o.slots[i].byte_offset, o.byte_size))
      fail("a slot outside the output");
}

}  // namespace

int remote_one(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  rp::Request req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) {
    set_note("refused: not a Request");
    return 0;
  }
  if (!req.has_batch()) {
    set_note("not a batch");
    return 0;
  }
  size_t accepted = 0, refused = 0;
  for (const auto& call : req.batch().calls()) {
    const auto& t = table();
    const KernelInfo& k = t[call.kernel() % t.size()];
    const uint32_t device = call.device() % 2;
    // Params: a decoded params value encodes to something that decodes the same.
    bp_op_params p{};
    std::string json;
    if (rp::decode_params(call.params(), p, json).empty()) {
      rp::Params again;
      rp::encode_params(p, &again);
      bp_op_params q{};
      std::string json2;
      if (!rp::decode_params(again, q, json2).empty() || !rp::same_params(p, q))
        throw HarnessFailure("params do not survive decode -> encode -> decode");
    }
    rp::CallContext ctx;
    ctx.kernel = &k;
    ctx.alignment = 16;
    ctx.buffer_size = [device](uint64_t id) { return buffer(id, device); };
    rp::CheckedCall checked;
    if (!rp::check_call(call, ctx, checked).empty()) {
      ++refused;
      continue;
    }
    ++accepted;
    verify(checked, k, device);
    rp::CheckedCall copy = checked;  // the copy re-points its slots and params
    verify(copy, k, device);
  }
  set_note("calls: " + std::to_string(accepted) + " accepted, " + std::to_string(refused) + " refused");
  return 0;
}

}  // namespace backplane::fuzz
