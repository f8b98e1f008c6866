// Reading an ONNX file: ModelProto parsing (bounded), the checker, tensors
// out of TensorProtos (raw or typed fields, external data), dtypes.
#include "model.hpp"

#include <onnx/checker.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <unordered_map>

namespace backplane::onnx::detail {

namespace {

// A model above 2 GiB must keep its weights as external data (protobuf's own
// limit on one message).
constexpr int kMaxProtoBytes = std::numeric_limits<int>::max();

void parse(google::protobuf::io::ZeroCopyInputStream* in, ::onnx::ModelProto& m, const std::string& label) {
  google::protobuf::io::CodedInputStream coded(in);
  coded.SetTotalBytesLimit(kMaxProtoBytes);
  // Nesting of subgraphs and attributes; far above any real model.
  coded.SetRecursionLimit(64);
  if (!m.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage())
    throw Error(label + ": not an ONNX model (the file does not parse as an ONNX ModelProto)");
}

}  // namespace

void read_model_file(const std::filesystem::path& path, ::onnx::ModelProto& m) {
  const std::string label = path.string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw Error(label + ": no such file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(label + ": cannot open: " + std::strerror(errno));
  // Streamed from the file: the parsed message is the only copy of the
  // weights in memory (no file-sized buffer beside it).
  google::protobuf::io::FileInputStream in(fd, 1 << 20);
  in.SetCloseOnDelete(true);
  parse(&in, m, label);
}

void read_model_bytes(std::string_view bytes, ::onnx::ModelProto& m, const std::string& label) {
  if (bytes.size() > static_cast<size_t>(kMaxProtoBytes)) throw Error(label + ": larger than 2 GiB (keep weights as external data)");
  google::protobuf::io::ArrayInputStream in(bytes.data(), static_cast<int>(bytes.size()));
  parse(&in, m, label);
}

void check_model(const ::onnx::ModelProto& m, const std::string& label, const std::filesystem::path& base) {
  // External data names are checked here first: ONNX's checker looks for
  // the files itself, relative to the folder it is given.
  for (const auto& t : m.graph().initializer()) {
    if (t.data_location() != ::onnx::TensorProto::EXTERNAL) continue;
    const std::string where = label + ": initializer '" + t.name() + "'";
    if (base.empty()) throw Error(where + ": keeps its data in an external file, which an in-memory model cannot name");
    std::string location;
    for (const auto& kv : t.external_data())
      if (kv.key() == "location") location = kv.value();
    check_location(location, where);
  }
  try {
    // What ::onnx::checker::check_model(ModelProto) does, with the model's
    // own folder for external data (it would look in the working folder).
    ::onnx::checker::CheckerContext ctx;
    ctx.set_model_dir(base.string());
    if (m.ir_version() <= 0) throw std::runtime_error("the model does not set ir_version");
    if (m.ir_version() > ::onnx::IR_VERSION)
      throw std::runtime_error("ir_version " + std::to_string(m.ir_version()) + " is newer than this ONNX library's " +
                               std::to_string(::onnx::IR_VERSION));
    ctx.set_ir_version(static_cast<int>(m.ir_version()));
    std::unordered_map<std::string, int> opsets;
    for (const auto& o : m.opset_import()) opsets[o.domain()] = static_cast<int>(o.version());
    if (opsets.empty()) throw std::runtime_error("the model imports no opset");
    ctx.set_opset_imports(opsets);
    ::onnx::checker::LexicalScopeContext lex;
    ::onnx::checker::check_graph(m.graph(), ctx, lex);
    if (ctx.get_ir_version() >= 8) ::onnx::checker::check_model_local_functions(m, ctx, lex);
  } catch (const std::exception& e) {
    std::string what = e.what();
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    throw Error(label + ": the ONNX checker rejects the model: " + what);
  }
}

std::optional<bp_dtype> dtype_of(int32_t onnx_type) {
  using T = ::onnx::TensorProto;
  switch (onnx_type) {
    case T::FLOAT: return BP_DTYPE_F32;
    case T::DOUBLE: return BP_DTYPE_F64;
    case T::FLOAT16: return BP_DTYPE_F16;
    case T::BFLOAT16: return BP_DTYPE_BF16;
    case T::INT8: return BP_DTYPE_I8;
    case T::INT16: return BP_DTYPE_I16;
    case T::INT32: return BP_DTYPE_I32;
    case T::INT64: return BP_DTYPE_I64;
    case T::UINT8: return BP_DTYPE_U8;
    case T::BOOL: return BP_DTYPE_BOOL;
    default: return std::nullopt;
  }
}

std::string onnx_type_name(int32_t onnx_type) {
  if (::onnx::TensorProto::DataType_IsValid(onnx_type))
    return ::onnx::TensorProto::DataType_Name(static_cast<::onnx::TensorProto::DataType>(onnx_type));
  return "type " + std::to_string(onnx_type);
}

void check_location(const std::string& location, const std::string& where) {
  const std::filesystem::path rel(location);
  if (location.empty() || rel.is_absolute()) throw Error(where + ": external data needs a relative 'location'");
  for (const auto& part : rel)
    if (part == "..") throw Error(where + ": external data location '" + location + "' leaves the model's folder");
}

namespace {

// External data: `location` relative to the model's folder, never outside
// it, and a file that holds `nbytes` at the offset (checked before the
// tensor is allocated).
std::filesystem::path external_path(const ::onnx::TensorProto& t, const std::filesystem::path& base, uint64_t nbytes,
                                    const std::string& where, uint64_t& offset_out) {
  if (base.empty()) throw Error(where + ": keeps its data in an external file, which an in-memory model cannot name");
  std::string location;
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  auto number = [&](const std::string& key, const std::string& v) {
    try {
      size_t used = 0;
      const unsigned long long n = std::stoull(v, &used);
      if (used != v.size()) throw std::invalid_argument(v);
      return static_cast<uint64_t>(n);
    } catch (const std::exception&) {
      throw Error(where + ": external data '" + key + "' is not a number: '" + v + "'");
    }
  };
  for (const auto& kv : t.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = number("offset", kv.value());
    else if (kv.key() == "length") length = number("length", kv.value());
  }
  check_location(location, where);
  const std::filesystem::path rel(location);
  if (length && *length != nbytes)
    throw Error(where + ": external data length " + std::to_string(*length) + " differs from the " +
                std::to_string(nbytes) + " bytes its shape needs");
  const auto path = base / rel;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw Error(where + ": no external data file " + path.string());
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec || offset > size || size - offset < nbytes)
    throw Error(where + ": external data file " + path.string() + " holds " + std::to_string(size) + " bytes; " +
                std::to_string(nbytes) + " wanted at offset " + std::to_string(offset));
  offset_out = offset;
  return path;
}

// Reads nbytes at `offset` of `path` (external_path checked both).
void read_external(const std::filesystem::path& path, uint64_t offset, std::byte* dst, uint64_t nbytes,
                   const std::string& where) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(where + ": cannot open external data file " + path.string());
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(nbytes));
  if (!f) throw Error(where + ": reading external data from " + path.string() + " failed");
}

// The typed field's count was checked against the shape before allocation.
template <typename Field, typename Store> void copy_typed(const Field& field, int64_t n, Store store) {
  for (int64_t i = 0; i < n; ++i) store(i, field.Get(static_cast<int>(i)));
}

}  // namespace

HostTensor tensor_from_proto(::onnx::TensorProto& t, const std::filesystem::path& base, const std::string& where,
                             bool release) {
  const auto dt = dtype_of(t.data_type());
  if (!dt) throw Error(where + ": dtype " + onnx_type_name(t.data_type()) + " has no Backplane dtype");
  Shape shape;
  if (t.dims_size() > BP_MAX_RANK) throw Error(where + ": rank " + std::to_string(t.dims_size()) + " exceeds 8");
  for (auto d : t.dims()) {
    if (d < 0) throw Error(where + ": negative dim " + std::to_string(d));
    shape.push_back(d);
  }
  int64_t n = 1;
  for (auto d : shape) {
    if (d != 0 && n > (int64_t{1} << 40) / d) throw Error(where + ": shape " + shape_str(shape) + " is too large");
    n *= d;
  }
  const uint64_t nbytes = static_cast<uint64_t>(n) * dtype_size(*dt);
  // The data's size is checked against the shape before anything is
  // allocated: a small model cannot claim a large tensor it does not hold.
  if (t.data_location() == ::onnx::TensorProto::EXTERNAL) {
    uint64_t offset = 0;
    const auto path = external_path(t, base, nbytes, where, offset);
    HostTensor out(*dt, shape);
    read_external(path, offset, out.bytes.data(), nbytes, where);
    return out;
  }
  if (t.has_raw_data()) {
    if (t.raw_data().size() != nbytes)
      throw Error(where + ": raw_data holds " + std::to_string(t.raw_data().size()) + " bytes; " + std::string(dtype_name(*dt)) +
                  " " + shape_str(shape) + " needs " + std::to_string(nbytes));
    HostTensor out(*dt, shape);
    if (nbytes) std::memcpy(out.bytes.data(), t.raw_data().data(), nbytes);
    if (release) std::string().swap(*t.mutable_raw_data());  // the parsed copy goes as ours arrives
    return out;
  }
  using T = ::onnx::TensorProto;
  const int typed = t.data_type() == T::FLOAT    ? t.float_data_size()
                    : t.data_type() == T::DOUBLE ? t.double_data_size()
                    : t.data_type() == T::INT64  ? t.int64_data_size()
                                                 : t.int32_data_size();
  if (typed != n)
    throw Error(where + ": holds " + std::to_string(typed) + " values; " + std::string(dtype_name(*dt)) + " " + shape_str(shape) +
                " needs " + std::to_string(n));
  HostTensor out(*dt, shape);
  switch (t.data_type()) {
    case T::FLOAT:
      copy_typed(t.float_data(), n, [&](int64_t i, float v) { out.as<float>()[i] = v; });
      break;
    case T::DOUBLE:
      copy_typed(t.double_data(), n, [&](int64_t i, double v) { out.as<double>()[i] = v; });
      break;
    case T::INT64:
      copy_typed(t.int64_data(), n, [&](int64_t i, int64_t v) { out.as<int64_t>()[i] = v; });
      break;
    case T::FLOAT16:
    case T::BFLOAT16:
      // 16-bit floats travel as their bit patterns in int32_data.
      copy_typed(t.int32_data(), n, [&](int64_t i, int32_t v) { out.as<uint16_t>()[i] = static_cast<uint16_t>(v); });
      break;
    default:
      copy_typed(t.int32_data(), n, [&](int64_t i, int32_t v) { out.set_int(i, v); });
      break;
  }
  if (release) {
    t.clear_float_data();
    t.clear_double_data();
    t.clear_int64_data();
    t.clear_int32_data();
  }
  return out;
}

}  // namespace backplane::onnx::detail
