#include "validate.hpp"

#include "input_files.hpp"  // bounded JSON parsing (core/src)
#include "ops.hpp"  // the core's shape inference (core/src)
#include "fused_program.hpp"  // fused_elementwise's program (core/src)

#include <backplane/sdk/dtype.hpp>
#include <backplane/sdk/plugin.hpp>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/message.h>
#include <google/protobuf/wire_format_lite.h>

#include <array>
#include <climits>
#include <mutex>
#include <unordered_map>

namespace backplane::remote {

namespace {

Json dims_json(uint32_t n, const int32_t* dims) {
  Json a = Json::array();
  for (uint32_t i = 0; i < n; ++i) a.push_back(dims[i]);
  return a;
}

Shape shape_of(const bp_layout& l) { return Shape(l.shape, l.shape + l.rank); }

bool dense_at_zero(const bp_layout& l) { return l.offset == 0 && sdk::is_contiguous(l); }

// One storage of the call: its buffer is this session's, on this device, the
// byte range lies inside it, and its start is aligned as the device needs.
std::string check_range(const Storage& s, const CallContext& ctx, const std::string& what) {
  const auto size = ctx.buffer_size(s.buffer());
  if (!size) return what + " names buffer " + std::to_string(s.buffer()) + ", which this session does not own on this device";
  uint64_t end = 0;
  if (__builtin_add_overflow(s.byte_offset(), s.byte_size(), &end) || end > *size)
    return what + " spans bytes [" + std::to_string(s.byte_offset()) + ", +" + std::to_string(s.byte_size()) +
           ") of a buffer of " + std::to_string(*size);
  if (ctx.alignment && s.byte_offset() % ctx.alignment != 0)
    return what + " starts at byte " + std::to_string(s.byte_offset()) + ", not aligned to " +
           std::to_string(ctx.alignment);
  return {};
}

}  // namespace

CheckedCall& CheckedCall::operator=(const CheckedCall& o) {
  if (this == &o) return *this;
  device = o.device;
  kernel = o.kernel;
  inputs = o.inputs;
  outputs = o.outputs;
  input_buffers = o.input_buffers;
  output_buffers = o.output_buffers;
  output_slots = o.output_slots;
  layouts = o.layouts;
  params = o.params;
  json = o.json;
  if (params.kind == BP_PARAMS_CUSTOM) params.u.custom.json = bp_string{json.data(), json.size()};
  if (params.kind == BP_PARAMS_FUSED) params.u.fused.code = reinterpret_cast<const bp_fused_instr*>(json.data());
  for (size_t i = 0; i < outputs.size(); ++i)
    outputs[i].slots = output_slots[i].empty() ? nullptr : output_slots[i].data();
  return *this;
}

Json params_json(const std::string& op, const bp_op_params& p, bp_dtype x, int64_t x_rank) {
  Json j = Json::object();
  const auto& u = p.u;
  switch (p.kind) {
    case BP_PARAMS_NONE:
    case BP_PARAMS_CUSTOM: break;
    case BP_PARAMS_REDUCE:
      if (u.reduce.n_dims) j["dims"] = dims_json(u.reduce.n_dims, u.reduce.dims);
      j["keepdim"] = u.reduce.keepdim;
      break;
    case BP_PARAMS_ARG_REDUCE:
      j["dim"] = u.arg_reduce.dim;
      j["keepdim"] = u.arg_reduce.keepdim;
      j["select_last_index"] = u.arg_reduce.select_last_index;
      break;
    case BP_PARAMS_DIM:
      j["dim"] = u.dim.dim;
      if (op == "cumsum") {
        j["exclusive"] = u.dim.exclusive;
        j["reverse"] = u.dim.reverse;
      }
      break;
    case BP_PARAMS_CAST: j["dtype"] = std::string(dtype_name(u.cast.dtype)); break;
    case BP_PARAMS_CLAMP:
      if (u.clamp.has_min) j["min"] = is_float(x) ? Json(u.clamp.min_f) : Json(u.clamp.min_i);
      if (u.clamp.has_max) j["max"] = is_float(x) ? Json(u.clamp.max_f) : Json(u.clamp.max_i);
      break;
    case BP_PARAMS_AFFINE:
      j["mul"] = u.affine.mul;
      j["add"] = u.affine.add;
      break;
    case BP_PARAMS_GELU: j["approximate"] = u.gelu.tanh_approximation ? "tanh" : "none"; break;
    case BP_PARAMS_LAYER_NORM: {
      Json d = Json::array();
      for (int64_t i = x_rank - static_cast<int64_t>(u.layer_norm.n_dims); i < x_rank; ++i) d.push_back(i);
      j["dims"] = d;
      j["eps"] = u.layer_norm.eps;
      break;
    }
    case BP_PARAMS_CONV2D:
      j["stride"] = {u.conv2d.stride[0], u.conv2d.stride[1]};
      j["padding"] = {u.conv2d.padding[0], u.conv2d.padding[1], u.conv2d.padding[2], u.conv2d.padding[3]};
      j["dilation"] = {u.conv2d.dilation[0], u.conv2d.dilation[1]};
      j["groups"] = u.conv2d.groups;
      break;
    case BP_PARAMS_TOPK:
      j["k"] = u.topk.k;
      j["dim"] = u.topk.dim;
      j["largest"] = u.topk.largest;
      j["sorted"] = u.topk.sorted;
      break;
    case BP_PARAMS_VAR_MEAN:
      if (u.var_mean.n_dims) j["dims"] = dims_json(u.var_mean.n_dims, u.var_mean.dims);
      j["correction"] = u.var_mean.correction;
      j["keepdim"] = u.var_mean.keepdim;
      break;
    case BP_PARAMS_SELECTIVE_SCAN: j["delta_softplus"] = u.selective_scan.delta_softplus; break;
    case BP_PARAMS_POOL2D:
      j["kernel_size"] = {u.pool2d.kernel[0], u.pool2d.kernel[1]};
      j["stride"] = {u.pool2d.stride[0], u.pool2d.stride[1]};
      j["padding"] = {u.pool2d.padding[0], u.pool2d.padding[1], u.pool2d.padding[2], u.pool2d.padding[3]};
      j["dilation"] = {u.pool2d.dilation[0], u.pool2d.dilation[1]};
      j["ceil_mode"] = u.pool2d.ceil_mode;
      // max_pool2d takes no count_include_pad (its params say false); a max
      // call that says true re-infers to false and is refused as not in form.
      if (op == "avg_pool2d") j["count_include_pad"] = u.pool2d.count_include_pad;
      break;
    case BP_PARAMS_ATTENTION:
      j["scale"] = u.attention.scale;
      j["causal"] = u.attention.causal;
      break;
    case BP_PARAMS_FUSED:
      j["program"] = detail::program_json(u.fused.code, u.fused.n_code);
      break;
  }
  return j;
}

std::string check_call(const Call& call, const CallContext& ctx, CheckedCall& out) {
  const KernelInfo& k = *ctx.kernel;
  if (k.dtypes.empty() || k.layouts.size() + 1 != k.dtypes.size() || (k.variadic && k.layouts.empty()))
    return k.op + ": the kernel's row is malformed";
  const size_t fixed = k.dtypes.size() - 1;  // declared inputs
  const size_t n_in = static_cast<size_t>(call.inputs_size());
  if (k.variadic ? (n_in < fixed || n_in > kMaxCallInputs) : n_in != fixed)
    return k.op + ": " + std::to_string(n_in) + " inputs; the kernel takes " + std::to_string(fixed) +
           (k.variadic ? " or more" : "");
  if (call.outputs_size() != 1) return k.op + ": a kernel call has exactly one output storage";
  if (static_cast<size_t>(call.layouts_size()) != n_in + 1)
    return k.op + ": " + std::to_string(call.layouts_size()) + " layouts for " + std::to_string(n_in + 1) + " storages";

  out = CheckedCall();
  out.device = call.device();
  out.kernel = call.kernel();
  out.layouts.resize(n_in + 1);
  for (size_t i = 0; i <= n_in; ++i)
    if (auto e = decode_layout(call.layouts(static_cast<int>(i)), out.layouts[i]); !e.empty())
      return k.op + ": layout " + std::to_string(i) + ": " + e;
  if (auto e = decode_params(call.params(), out.params, out.json); !e.empty()) return k.op + ": " + e;

  const auto opt = detail::optional_inputs(k.op);
  std::vector<detail::ValueType> types(n_in);
  std::vector<const detail::ValueType*> type_ptrs(n_in, nullptr);
  out.inputs.assign(n_in, bp_storage{});
  out.input_buffers.assign(n_in, 0);
  for (size_t i = 0; i < n_in; ++i) {
    const Storage& s = call.inputs(static_cast<int>(i));
    const std::string what = k.op + ": input " + std::to_string(i);
    const bp_dtype key = k.dtypes[i < fixed ? i : fixed - 1];
    const auto cap = k.layouts[i < fixed ? i : fixed - 1];
    bp_storage& st = out.inputs[i];
    st.struct_size = sizeof st;
    if (s.slots_size() != 0) return what + " carries bundle slots";
    if (s.buffer() == 0) {
      const bool optional = i >= opt.first && i < opt.total;  // total: every input, optional ones included
      if (!optional) return what + " is absent but required";
      if (s.byte_size() || s.byte_offset()) return what + " is absent but has bytes";
      st.dtype = key;
      continue;
    }
    bp_dtype dt{};
    if (auto e = decode_dtype(s.dtype(), dt); !e.empty()) return what + ": " + e;
    // A repeat the op table types on its own (fused_elementwise's
    // conditions) may differ from the row's dtype; the re-inference below
    // checks it against the program.
    if (dt != key && !detail::own_typed_repeat(k.op, i, dt))
      return what + " is " + std::string(dtype_name(dt)) + "; the kernel takes " + std::string(dtype_name(key));
    if (auto e = check_range(s, ctx, what); !e.empty()) return e;
    const bp_layout& l = out.layouts[i];
    if (!sdk::layout_fits(l, dtype_size(dt), 0, s.byte_size()))
      return what + ": its layout reaches outside its " + std::to_string(s.byte_size()) + " bytes";
    if (cap == BP_LAYOUT_CONTIGUOUS && !dense_at_zero(l)) return what + " must be dense (the kernel is contiguous-only)";
    st.byte_offset = s.byte_offset();
    st.byte_size = s.byte_size();
    st.dtype = dt;
    out.input_buffers[i] = s.buffer();
    types[i].dtype = dt;
    types[i].shape = shape_of(l);
    type_ptrs[i] = &types[i];
  }

  // The output: dense, inside its buffer; a bundle's slots likewise.
  const Storage& o = call.outputs(0);
  const std::string what = k.op + ": the output";
  if (o.buffer() == 0) return what + " is absent";
  bp_dtype odt{};
  if (auto e = decode_dtype(o.dtype(), odt); !e.empty()) return what + ": " + e;
  if (odt != k.dtypes.back())
    return what + " is " + std::string(dtype_name(odt)) + "; the kernel writes " +
           std::string(dtype_name(k.dtypes.back()));
  if (auto e = check_range(o, ctx, what); !e.empty()) return e;
  const bp_layout& ol = out.layouts[n_in];
  out.outputs.assign(1, bp_storage{});
  out.output_slots.assign(1, {});
  out.output_buffers.assign(1, o.buffer());
  bp_storage& ost = out.outputs[0];
  ost.struct_size = sizeof ost;
  ost.byte_offset = o.byte_offset();
  ost.byte_size = o.byte_size();
  ost.dtype = odt;
  if (static_cast<uint32_t>(o.slots_size()) != k.bundle_slots)
    return what + " has " + std::to_string(o.slots_size()) + " bundle slots; the kernel writes " +
           std::to_string(k.bundle_slots);
  auto& slots = out.output_slots[0];
  for (int i = 0; i < o.slots_size(); ++i) {
    const Slot& s = o.slots(i);
    bp_bundle_slot bs{};
    if (auto e = decode_dtype(s.dtype(), bs.dtype); !e.empty()) return what + " slot " + std::to_string(i) + ": " + e;
    if (auto e = decode_layout(s.layout(), bs.layout); !e.empty()) return what + " slot " + std::to_string(i) + ": " + e;
    bs.byte_offset = s.byte_offset();
    if (!dense_at_zero(bs.layout) || s.byte_offset() % dtype_size(bs.dtype) != 0 ||
        !sdk::layout_fits(bs.layout, dtype_size(bs.dtype), s.byte_offset(), o.byte_size()))
      return what + " slot " + std::to_string(i) + " is not a dense range inside the output's bytes";
    if (ctx.alignment && s.byte_offset() % std::min<uint64_t>(ctx.alignment, 16) != 0)
      return what + " slot " + std::to_string(i) + " is not aligned as the host aligns slots";
    slots.push_back(bs);
  }
  // Slots are disjoint byte ranges, as the host lays them out.
  for (size_t i = 0; i < slots.size(); ++i)
    for (size_t j = i + 1; j < slots.size(); ++j) {
      const uint64_t ai = slots[i].byte_offset, ae = ai + static_cast<uint64_t>(sdk::numel(slots[i].layout)) * dtype_size(slots[i].dtype);
      const uint64_t bi = slots[j].byte_offset, be = bi + static_cast<uint64_t>(sdk::numel(slots[j].layout)) * dtype_size(slots[j].dtype);
      if (ai < be && bi < ae) return what + ": slots " + std::to_string(i) + " and " + std::to_string(j) + " overlap";
    }
  if (!slots.empty()) {
    if (slots[0].dtype != odt || shape_of(slots[0].layout) != shape_of(ol))
      return what + ": its layout must describe slot 0";
    ost.n_slots = static_cast<uint32_t>(slots.size());
    ost.slots = slots.data();
  }
  if (!dense_at_zero(ol) || !sdk::layout_fits(ol, dtype_size(odt), 0, o.byte_size()))
    return what + " is not dense inside its " + std::to_string(o.byte_size()) + " bytes";

  // The op's own rules: re-infer the call and compare.
  if (detail::is_custom_op(k.op)) {
    if (!ctx.infer_custom) return k.op + ": vendor ops are not served";
    // A vendor op's params are the graph's params object as JSON text, and
    // nothing else: any other kind would hand the plugin a pointer of the
    // client's choosing through the union.
    if (out.params.kind != BP_PARAMS_CUSTOM) return k.op + ": a vendor op takes custom params";
    try {
      if (!detail::parse_json_bounded(out.json, "").is_object()) return k.op + ": its params are not a JSON object";
    } catch (const std::exception& e) {
      return k.op + ": its params: " + e.what();
    }
    std::vector<bp_dtype> dts;
    std::vector<bp_layout> ls;
    for (size_t i = 0; i < n_in; ++i) {
      dts.push_back(types[i].dtype == BP_DTYPE_INVALID ? odt : types[i].dtype);
      ls.push_back(out.layouts[i]);
    }
    bp_dtype idt{};
    bp_layout il{};
    if (auto e = ctx.infer_custom(k.op, dts, ls, out.params, idt, il); !e.empty()) return k.op + ": " + e;
    if (il.rank > BP_MAX_RANK) return k.op + ": the plugin's inference gave a rank above 8";
    if (idt != odt || shape_of(il) != shape_of(ol))
      return k.op + ": the output is " + shape_str(shape_of(ol)) + "; the op gives " + shape_str(shape_of(il));
    return {};
  }
  if (out.params.kind == BP_PARAMS_CUSTOM) return k.op + ": custom params for a standard op";
  Node node;
  node.name = "call";
  node.op = k.op;
  node.params = params_json(k.op, out.params, types.empty() ? odt : types[0].dtype,
                            types.empty() ? 0 : static_cast<int64_t>(types[0].shape.size()));
  detail::InferredNode r;
  try {
    r = detail::infer_node(node, type_ptrs);
  } catch (const std::exception& e) {
    return k.op + ": " + e.what();
  }
  if (r.cls != detail::OpClass::Kernel) return k.op + ": not a kernel op";
  if (!same_params(r.params, out.params)) return k.op + ": params are not in the form shape inference gives";
  if (r.out.is_bundle()) {
    if (r.out.slots.size() != slots.size()) return what + ": wrong number of bundle slots";
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].dtype != r.out.slots[i].first || shape_of(slots[i].layout) != r.out.slots[i].second)
        return what + " slot " + std::to_string(i) + " is " + shape_str(shape_of(slots[i].layout)) + "; the op gives " +
               shape_str(r.out.slots[i].second);
  } else if (odt != r.out.dtype || shape_of(ol) != r.out.shape) {
    return what + " is " + shape_str(shape_of(ol)) + " " + std::string(dtype_name(odt)) + "; the op gives " +
           shape_str(r.out.shape) + " " + std::string(dtype_name(r.out.dtype));
  }
  // What the host does before an elementwise or matmul kernel.
  if (r.canon == detail::Canon::Broadcast) {
    for (size_t i = 0; i < n_in; ++i)
      if (type_ptrs[i] && types[i].shape != r.out.shape)
        return k.op + ": input " + std::to_string(i) + " is " + shape_str(types[i].shape) +
               "; an elementwise kernel takes inputs broadcast to the output's " + shape_str(r.out.shape);
  } else if (r.canon == detail::Canon::Matmul) {
    const Shape& a = types[0].shape;
    const Shape& b = types[1].shape;
    if (a.size() < 2 || a.size() != b.size() || a.size() != r.out.shape.size() ||
        !std::equal(a.begin(), a.end() - 2, b.begin()) || !std::equal(a.begin(), a.end() - 2, r.out.shape.begin()))
      return k.op + ": operands " + shape_str(a) + " and " + shape_str(b) +
             " are not of equal rank >= 2 with equal batch dims";
  }
  return {};
}

namespace {

namespace pb = google::protobuf;
using pb::internal::WireFormatLite;

// The most entries a repeated field of a Request may have. The server's own
// checks are stricter (a call has one output, a rank is at most 8); these
// only keep the decoder from allocating what those checks would then refuse.
uint64_t max_entries(const pb::FieldDescriptor* f) {
  static const std::unordered_map<std::string, uint64_t> limits = {
      {"backplane.remote.Batch.calls", kMaxCallsPerBatch},
      {"backplane.remote.Batch.writes", kMaxWritesPerBatch},
      {"backplane.remote.Batch.reads", kMaxReadsPerBatch},
      {"backplane.remote.Call.inputs", kMaxCallInputs},
      {"backplane.remote.Call.outputs", 16},
      {"backplane.remote.Call.layouts", kMaxCallInputs + 16},
      {"backplane.remote.Storage.slots", 1024},
      {"backplane.remote.Layout.shape", 64},
      {"backplane.remote.Layout.strides", 64},
      // fused_elementwise's program: 4 integers, 2 numbers, 2 flags per
      // instruction, at most BP_FUSED_MAX_CODE instructions.
      {"backplane.remote.Params.ints", 4 * BP_FUSED_MAX_CODE},
      {"backplane.remote.Params.floats", 2 * BP_FUSED_MAX_CODE},
      {"backplane.remote.Params.flags", 2 * BP_FUSED_MAX_CODE},
  };
  const auto it = limits.find(f->full_name());
  return it == limits.end() ? 4096 : it->second;
}

// What an object of each message type takes (its class), found once.
uint64_t message_space(const pb::Descriptor* d) {
  static std::mutex mu;
  static std::unordered_map<const pb::Descriptor*, uint64_t> known;
  std::lock_guard<std::mutex> lk(mu);
  auto it = known.find(d);
  if (it != known.end()) return it->second;
  const pb::Message* proto = pb::MessageFactory::generated_factory()->GetPrototype(d);
  const uint64_t n = proto ? static_cast<uint64_t>(proto->SpaceUsedLong()) : 512;
  known[d] = n;
  return n;
}

// Each entry of a repeated field: a pointer or a value, and the array's growth.
constexpr uint64_t kEntryBytes = 16;
// A string's own object and its allocation's overhead.
constexpr uint64_t kStringBytes = 48;

std::string field_name(const pb::FieldDescriptor* f) { return f->containing_type()->name() + "." + f->name(); }

std::string too_big() {
  return "decoding it would take more than " + std::to_string(kMaxDecodedBytes >> 20) + " MiB of the server's memory";
}

std::string scan(pb::io::CodedInputStream& in, const pb::Descriptor* d, int depth, uint64_t& bytes) {
  if (depth > 16) return "messages nested more than 16 deep";
  bytes += message_space(d);
  // Entries of each repeated field of this message (no message here has 32 fields).
  std::array<uint64_t, 32> counts{};
  for (;;) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return in.ConsumedEntireMessage() ? "" : "not a valid message (a field number of 0)";
    const pb::FieldDescriptor* f = d->FindFieldByNumber(static_cast<int>(WireFormatLite::GetTagFieldNumber(tag)));
    const bool repeated = f && f->is_repeated();
    uint64_t entries = 1;
    switch (WireFormatLite::GetTagWireType(tag)) {
      case WireFormatLite::WIRETYPE_VARINT: {
        uint64_t v = 0;
        if (!in.ReadVarint64(&v)) return "not a valid message (a truncated number)";
        break;
      }
      case WireFormatLite::WIRETYPE_FIXED64: {
        uint64_t v = 0;
        if (!in.ReadLittleEndian64(&v)) return "not a valid message (a truncated number)";
        break;
      }
      case WireFormatLite::WIRETYPE_FIXED32: {
        uint32_t v = 0;
        if (!in.ReadLittleEndian32(&v)) return "not a valid message (a truncated number)";
        break;
      }
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
        uint32_t len = 0;
        if (!in.ReadVarint32(&len) || len > static_cast<uint32_t>(INT_MAX)) return "not a valid message (a bad length)";
        if (f && f->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
          const int start = in.CurrentPosition();
          const auto limit = in.PushLimit(static_cast<int>(len));
          if (auto e = scan(in, f->message_type(), depth + 1, bytes); !e.empty()) return e;
          if (in.CurrentPosition() - start != static_cast<int>(len)) return "not a valid message (truncated)";
          in.PopLimit(limit);
        } else if (repeated && f->cpp_type() != pb::FieldDescriptor::CPPTYPE_STRING) {
          // Packed numbers: each becomes an 8-byte (or smaller) value.
          switch (f->type()) {
            case pb::FieldDescriptor::TYPE_FIXED32:
            case pb::FieldDescriptor::TYPE_SFIXED32:
            case pb::FieldDescriptor::TYPE_FLOAT:
              entries = len / 4;
              if (!in.Skip(static_cast<int>(len))) return "not a valid message (truncated)";
              break;
            case pb::FieldDescriptor::TYPE_FIXED64:
            case pb::FieldDescriptor::TYPE_SFIXED64:
            case pb::FieldDescriptor::TYPE_DOUBLE:
              entries = len / 8;
              if (!in.Skip(static_cast<int>(len))) return "not a valid message (truncated)";
              break;
            default: {
              entries = 0;
              const auto limit = in.PushLimit(static_cast<int>(len));
              for (uint64_t v = 0; in.BytesUntilLimit() > 0; ++entries)
                if (!in.ReadVarint64(&v)) return "not a valid message (a truncated number)";
              in.PopLimit(limit);
              break;
            }
          }
        } else {
          // A string, bytes, or a field this server does not know (kept).
          if (!in.Skip(static_cast<int>(len))) return "not a valid message (truncated)";
          bytes += len + kStringBytes;
        }
        break;
      }
      default: return "not a valid message (a wire type this protocol does not use)";
    }
    if (repeated) {
      bytes += entries * kEntryBytes;
      const int i = f->index();
      if (i < static_cast<int>(counts.size())) {
        counts[static_cast<size_t>(i)] += entries;
        if (counts[static_cast<size_t>(i)] > max_entries(f))
          return field_name(f) + " has more than " + std::to_string(max_entries(f)) + " entries";
      }
    } else if (!f) {
      bytes += kEntryBytes;
    }
    if (bytes > kMaxDecodedBytes) return too_big();
  }
}

}  // namespace

std::string measure_request(pb::io::ZeroCopyInputStream& raw, uint64_t& bytes) {
  bytes = 0;
  pb::io::CodedInputStream in(&raw);
  in.SetTotalBytesLimit(INT_MAX);
  return scan(in, Request::descriptor(), 0, bytes);
}

}  // namespace backplane::remote
