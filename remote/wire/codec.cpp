#include "codec.hpp"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <cmath>
#include <cstring>

namespace backplane::remote {

namespace {

// What each params kind puts in ints / floats / flags (fixed counts; the
// dims of reduce and var_mean are variable, at most BP_MAX_RANK).
struct Shape {
  int ints, floats, flags;  // -1: 0..BP_MAX_RANK
};

Shape shape_of(bp_params_kind k) {
  switch (k) {
    case BP_PARAMS_NONE: return {0, 0, 0};
    case BP_PARAMS_REDUCE: return {-1, 0, 1};
    case BP_PARAMS_ARG_REDUCE: return {1, 0, 2};
    case BP_PARAMS_DIM: return {1, 0, 2};
    case BP_PARAMS_CAST: return {1, 0, 0};
    case BP_PARAMS_CLAMP: return {2, 2, 2};
    case BP_PARAMS_AFFINE: return {0, 2, 0};
    case BP_PARAMS_GELU: return {0, 0, 1};
    case BP_PARAMS_LAYER_NORM: return {1, 1, 0};
    case BP_PARAMS_CONV2D: return {9, 0, 0};
    case BP_PARAMS_TOPK: return {2, 0, 2};
    case BP_PARAMS_VAR_MEAN: return {-1, 1, 1};
    case BP_PARAMS_SELECTIVE_SCAN: return {0, 0, 1};
    case BP_PARAMS_CUSTOM: return {0, 0, 0};
    case BP_PARAMS_POOL2D: return {10, 0, 2};
    case BP_PARAMS_ATTENTION: return {0, 1, 1};
    case BP_PARAMS_FUSED: return {-1, -1, -1};  // 4, 2 and 2 per instruction
  }
  return {0, 0, 0};
}

bool fits_i32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

// fused_elementwise's program, into `store` (whose heap buffer, 16-aligned,
// holds the instructions: a program is at least 32 bytes, past any short
// string). Only the form is checked here; the server's re-inference checks
// the program against the call's inputs.
std::string decode_fused(const Params& in, bp_op_params& out, std::string& store) {
  const int n = in.floats_size() / 2;
  if (n < 1 || n > BP_FUSED_MAX_CODE || in.floats_size() != 2 * n || in.ints_size() != 4 * n ||
      in.flags_size() != 2 * n || !in.json().empty())
    return "fused_elementwise params carry the wrong number of fields";
  store.assign(static_cast<size_t>(n) * sizeof(bp_fused_instr), '\0');
  if (reinterpret_cast<uintptr_t>(store.data()) % alignof(bp_fused_instr) != 0)
    return "internal: the program's storage is not aligned";
  auto* code = reinterpret_cast<bp_fused_instr*>(store.data());
  for (int k = 0; k < n; ++k) {
    for (int a = 0; a < 4; ++a)
      if (in.ints(4 * k + a) < 0 || in.ints(4 * k + a) > UINT16_MAX) return "a program field out of range";
    code[k].op = static_cast<uint16_t>(in.ints(4 * k));
    for (int a = 0; a < 3; ++a) code[k].args[a] = static_cast<uint16_t>(in.ints(4 * k + 1 + a));
    for (int a = 0; a < 2; ++a) {
      const double f = in.floats(2 * k + a);
      if (!std::isfinite(f)) return "a program number is not finite";
      code[k].imm[a] = in.flags(2 * k + a) ? std::nan("") : f;
    }
  }
  out.u.fused.code = code;
  out.u.fused.n_code = static_cast<uint32_t>(n);
  return {};
}

}  // namespace

void encode_layout(const bp_layout& in, Layout* out) {
  const uint32_t rank = in.rank > BP_MAX_RANK ? BP_MAX_RANK : in.rank;
  for (uint32_t i = 0; i < rank; ++i) {
    out->add_shape(in.shape[i]);
    out->add_strides(in.strides[i]);
  }
  out->set_offset(in.offset);
}

void encode_params(const bp_op_params& p, Params* out) {
  out->set_kind(static_cast<uint32_t>(p.kind));
  const auto& u = p.u;
  switch (p.kind) {
    case BP_PARAMS_NONE: break;
    case BP_PARAMS_REDUCE:
      for (uint32_t i = 0; i < u.reduce.n_dims && i < BP_MAX_RANK; ++i) out->add_ints(u.reduce.dims[i]);
      out->add_flags(u.reduce.keepdim);
      break;
    case BP_PARAMS_ARG_REDUCE:
      out->add_ints(u.arg_reduce.dim);
      out->add_flags(u.arg_reduce.keepdim);
      out->add_flags(u.arg_reduce.select_last_index);
      break;
    case BP_PARAMS_DIM:
      out->add_ints(u.dim.dim);
      out->add_flags(u.dim.exclusive);
      out->add_flags(u.dim.reverse);
      break;
    case BP_PARAMS_CAST: out->add_ints(u.cast.dtype); break;
    case BP_PARAMS_CLAMP:
      out->add_ints(u.clamp.min_i);
      out->add_ints(u.clamp.max_i);
      out->add_floats(u.clamp.min_f);
      out->add_floats(u.clamp.max_f);
      out->add_flags(u.clamp.has_min);
      out->add_flags(u.clamp.has_max);
      break;
    case BP_PARAMS_AFFINE:
      out->add_floats(u.affine.mul);
      out->add_floats(u.affine.add);
      break;
    case BP_PARAMS_GELU: out->add_flags(u.gelu.tanh_approximation); break;
    case BP_PARAMS_LAYER_NORM:
      out->add_ints(u.layer_norm.n_dims);
      out->add_floats(u.layer_norm.eps);
      break;
    case BP_PARAMS_CONV2D:
      for (int64_t v : u.conv2d.stride) out->add_ints(v);
      for (int64_t v : u.conv2d.padding) out->add_ints(v);
      for (int64_t v : u.conv2d.dilation) out->add_ints(v);
      out->add_ints(u.conv2d.groups);
      break;
    case BP_PARAMS_TOPK:
      out->add_ints(u.topk.k);
      out->add_ints(u.topk.dim);
      out->add_flags(u.topk.largest);
      out->add_flags(u.topk.sorted);
      break;
    case BP_PARAMS_VAR_MEAN:
      for (uint32_t i = 0; i < u.var_mean.n_dims && i < BP_MAX_RANK; ++i) out->add_ints(u.var_mean.dims[i]);
      out->add_floats(u.var_mean.correction);
      out->add_flags(u.var_mean.keepdim);
      break;
    case BP_PARAMS_SELECTIVE_SCAN: out->add_flags(u.selective_scan.delta_softplus); break;
    case BP_PARAMS_CUSTOM:
      if (u.custom.json.data) out->set_json(std::string(u.custom.json.data, u.custom.json.len));
      break;
    case BP_PARAMS_POOL2D:
      for (int32_t v : u.pool2d.kernel) out->add_ints(v);
      for (int32_t v : u.pool2d.stride) out->add_ints(v);
      for (int32_t v : u.pool2d.padding) out->add_ints(v);
      for (int32_t v : u.pool2d.dilation) out->add_ints(v);
      out->add_flags(u.pool2d.ceil_mode);
      out->add_flags(u.pool2d.count_include_pad);
      break;
    case BP_PARAMS_ATTENTION:
      out->add_floats(u.attention.scale);
      out->add_flags(u.attention.causal);
      break;
    case BP_PARAMS_FUSED:
      // Per instruction: op and three registers; two numbers, each with a
      // flag for NaN (clamp's absent bound: the wire refuses NaN numbers).
      for (uint32_t k = 0; k < u.fused.n_code && k < BP_FUSED_MAX_CODE && u.fused.code; ++k) {
        const bp_fused_instr& ins = u.fused.code[k];
        out->add_ints(ins.op);
        for (uint16_t a : ins.args) out->add_ints(a);
        for (double f : ins.imm) {
          out->add_floats(std::isnan(f) ? 0.0 : f);
          out->add_flags(std::isnan(f));
        }
      }
      break;
  }
}

void encode_storage(const bp_storage& in, uint64_t wire_buffer, Storage* out) {
  out->set_buffer(wire_buffer);
  out->set_byte_offset(in.byte_offset);
  out->set_byte_size(in.byte_size);
  out->set_dtype(static_cast<uint32_t>(in.dtype));
  for (uint32_t i = 0; i < in.n_slots && in.slots; ++i) {
    auto* s = out->add_slots();
    s->set_dtype(static_cast<uint32_t>(in.slots[i].dtype));
    encode_layout(in.slots[i].layout, s->mutable_layout());
    s->set_byte_offset(in.slots[i].byte_offset);
  }
}

std::string decode_dtype(uint32_t in, bp_dtype& out) {
  if (in == BP_DTYPE_INVALID || in >= BP_DTYPE_COUNT_) return "dtype " + std::to_string(in) + " is not a dtype";
  out = static_cast<bp_dtype>(in);
  return {};
}

std::string decode_layout(const Layout& in, bp_layout& out) {
  std::memset(&out, 0, sizeof out);
  if (in.shape_size() > BP_MAX_RANK) return "rank " + std::to_string(in.shape_size()) + " exceeds 8";
  if (in.strides_size() != in.shape_size())
    return "a layout has " + std::to_string(in.shape_size()) + " dims and " + std::to_string(in.strides_size()) +
           " strides";
  out.rank = static_cast<uint32_t>(in.shape_size());
  // As the core holds shapes: the non-zero dims multiply to at most 2^62,
  // so a kernel multiplying dims never overflows, even for an empty tensor.
  int64_t count = 1;
  for (int i = 0; i < in.shape_size(); ++i) {
    if (in.shape(i) < 0) return "a negative dim (" + std::to_string(in.shape(i)) + ")";
    const int64_t d = in.shape(i) ? in.shape(i) : 1;
    if (__builtin_mul_overflow(count, d, &count) || count > (int64_t{1} << 62)) return "more than 2^62 elements";
    out.shape[i] = in.shape(i);
    out.strides[i] = in.strides(i);
  }
  out.offset = in.offset();
  return {};
}

std::string decode_params(const Params& in, bp_op_params& out, std::string& json) {
  std::memset(&out, 0, sizeof out);
  out.struct_size = sizeof out;
  if (in.kind() > BP_PARAMS_FUSED) return "params kind " + std::to_string(in.kind()) + " is unknown";
  out.kind = static_cast<bp_params_kind>(in.kind());
  if (out.kind == BP_PARAMS_FUSED) return decode_fused(in, out, json);
  const Shape want = shape_of(out.kind);
  const bool variable = want.ints < 0;
  if (variable ? in.ints_size() > BP_MAX_RANK : in.ints_size() != want.ints)
    return "params of kind " + std::to_string(in.kind()) + " carry " + std::to_string(in.ints_size()) + " integers";
  if (in.floats_size() != want.floats || in.flags_size() != want.flags)
    return "params of kind " + std::to_string(in.kind()) + " carry the wrong number of fields";
  for (double f : in.floats())
    if (std::isnan(f)) return "a params number is NaN";
  if (!in.json().empty() && out.kind != BP_PARAMS_CUSTOM) return "only vendor-op params carry JSON";
  auto& u = out.u;
  const auto& I = in.ints();
  const auto& F = in.floats();
  const auto& B = in.flags();
  auto dims = [&](uint32_t& n, int32_t* d) -> std::string {
    n = static_cast<uint32_t>(I.size());
    for (int i = 0; i < I.size(); ++i) {
      if (I[i] < 0 || I[i] >= BP_MAX_RANK) return "a dim (" + std::to_string(I[i]) + ") outside [0, 8)";
      d[i] = static_cast<int32_t>(I[i]);
    }
    return {};
  };
  switch (out.kind) {
    case BP_PARAMS_NONE: break;
    case BP_PARAMS_REDUCE:
      if (auto e = dims(u.reduce.n_dims, u.reduce.dims); !e.empty()) return e;
      u.reduce.keepdim = B[0];
      break;
    case BP_PARAMS_ARG_REDUCE:
      if (!fits_i32(I[0])) return "dim out of range";
      u.arg_reduce.dim = static_cast<int32_t>(I[0]);
      u.arg_reduce.keepdim = B[0];
      u.arg_reduce.select_last_index = B[1];
      break;
    case BP_PARAMS_DIM:
      if (!fits_i32(I[0])) return "dim out of range";
      u.dim.dim = static_cast<int32_t>(I[0]);
      u.dim.exclusive = B[0];
      u.dim.reverse = B[1];
      break;
    case BP_PARAMS_CAST:
      if (I[0] <= BP_DTYPE_INVALID || I[0] >= BP_DTYPE_COUNT_) return "cast to a dtype that does not exist";
      u.cast.dtype = static_cast<bp_dtype>(I[0]);
      break;
    case BP_PARAMS_CLAMP:
      u.clamp.min_i = I[0];
      u.clamp.max_i = I[1];
      u.clamp.min_f = F[0];
      u.clamp.max_f = F[1];
      u.clamp.has_min = B[0];
      u.clamp.has_max = B[1];
      break;
    case BP_PARAMS_AFFINE:
      u.affine.mul = F[0];
      u.affine.add = F[1];
      break;
    case BP_PARAMS_GELU: u.gelu.tanh_approximation = B[0]; break;
    case BP_PARAMS_LAYER_NORM:
      if (I[0] < 1 || I[0] > BP_MAX_RANK) return "layer_norm over " + std::to_string(I[0]) + " dims";
      u.layer_norm.n_dims = static_cast<uint32_t>(I[0]);
      u.layer_norm.eps = F[0];
      break;
    case BP_PARAMS_CONV2D:
      for (int i = 0; i < 2; ++i) u.conv2d.stride[i] = I[i];
      for (int i = 0; i < 4; ++i) u.conv2d.padding[i] = I[2 + i];
      for (int i = 0; i < 2; ++i) u.conv2d.dilation[i] = I[6 + i];
      u.conv2d.groups = I[8];
      break;
    case BP_PARAMS_TOPK:
      if (!fits_i32(I[1])) return "dim out of range";
      u.topk.k = I[0];
      u.topk.dim = static_cast<int32_t>(I[1]);
      u.topk.largest = B[0];
      u.topk.sorted = B[1];
      break;
    case BP_PARAMS_VAR_MEAN:
      if (auto e = dims(u.var_mean.n_dims, u.var_mean.dims); !e.empty()) return e;
      u.var_mean.correction = F[0];
      u.var_mean.keepdim = B[0];
      break;
    case BP_PARAMS_SELECTIVE_SCAN: u.selective_scan.delta_softplus = B[0]; break;
    case BP_PARAMS_CUSTOM:
      if (in.json().size() > kMaxParamsJson) return "vendor-op params exceed 64 KiB";
      json = in.json();
      u.custom.json = bp_string{json.data(), json.size()};
      break;
    case BP_PARAMS_POOL2D:
      // The fields are int32; the check of the call re-infers the op and
      // compares, so only the range is checked here.
      for (int i = 0; i < 10; ++i)
        if (!fits_i32(I[i])) return "a pool2d value out of range";
      for (int i = 0; i < 2; ++i) u.pool2d.kernel[i] = static_cast<int32_t>(I[i]);
      for (int i = 0; i < 2; ++i) u.pool2d.stride[i] = static_cast<int32_t>(I[2 + i]);
      for (int i = 0; i < 4; ++i) u.pool2d.padding[i] = static_cast<int32_t>(I[4 + i]);
      for (int i = 0; i < 2; ++i) u.pool2d.dilation[i] = static_cast<int32_t>(I[8 + i]);
      u.pool2d.ceil_mode = B[0];
      u.pool2d.count_include_pad = B[1];
      break;
    case BP_PARAMS_ATTENTION:
      u.attention.scale = F[0];
      u.attention.causal = B[0];
      break;
    case BP_PARAMS_FUSED: break;  // decoded by decode_fused, above
  }
  return {};
}

bool same_params(const bp_op_params& a, const bp_op_params& b) {
  Params pa, pb;
  encode_params(a, &pa);
  encode_params(b, &pb);
  if (pa.kind() != pb.kind() || pa.ints_size() != pb.ints_size() || pa.floats_size() != pb.floats_size() ||
      pa.flags_size() != pb.flags_size() || pa.json() != pb.json())
    return false;
  for (int i = 0; i < pa.ints_size(); ++i)
    if (pa.ints(i) != pb.ints(i)) return false;
  for (int i = 0; i < pa.floats_size(); ++i)
    if (!(pa.floats(i) == pb.floats(i))) return false;
  for (int i = 0; i < pa.flags_size(); ++i)
    if (pa.flags(i) != pb.flags(i)) return false;
  return true;
}

bool same_secret(const std::string& a, const std::string& b) {
  // Every byte of the longer string is looked at whatever the content.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

std::string encode_bulk_write(uint64_t buffer, uint64_t offset, const char* data, uint64_t n) {
  using Wire = google::protobuf::internal::WireFormatLite;
  using Out = google::protobuf::io::CodedOutputStream;
  constexpr auto kLen = Wire::WIRETYPE_LENGTH_DELIMITED;
  // Write's fields before its bytes, then the two enclosing headers.
  uint8_t head[64];
  uint8_t* h = Wire::WriteUInt64ToArray(Write::kBufferFieldNumber, buffer, head);
  h = Wire::WriteUInt64ToArray(Write::kOffsetFieldNumber, offset, h);
  h = Wire::WriteTagToArray(Write::kDataFieldNumber, kLen, h);
  h = Out::WriteVarint64ToArray(n, h);
  const uint64_t write_len = static_cast<uint64_t>(h - head) + n;
  const uint64_t batch_len = Out::VarintSize32(Wire::MakeTag(Batch::kWritesFieldNumber, kLen)) + Out::VarintSize64(write_len) + write_len;
  uint8_t outer[32];
  uint8_t* o = Wire::WriteTagToArray(Request::kBatchFieldNumber, kLen, outer);
  o = Out::WriteVarint64ToArray(batch_len, o);
  o = Wire::WriteTagToArray(Batch::kWritesFieldNumber, kLen, o);
  o = Out::WriteVarint64ToArray(write_len, o);
  std::string out;
  out.reserve(static_cast<size_t>(o - outer) + static_cast<size_t>(write_len));
  out.append(reinterpret_cast<const char*>(outer), static_cast<size_t>(o - outer));
  out.append(reinterpret_cast<const char*>(head), static_cast<size_t>(h - head));
  out.append(data, static_cast<size_t>(n));
  return out;
}

}  // namespace backplane::remote
