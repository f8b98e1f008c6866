// The f64 reference of every standard op: the public helpers of reference.hpp
// and the dispatch to each op family (reference_views.cpp,
// reference_elementwise.cpp, reference_reduce.cpp, reference_linalg.cpp).
#include "conformance/reference_impl.hpp"

namespace backplane::conformance {

// ---------------------------------------------------------------------------
// Public helpers

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> dense_strides(const Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t k = shape.size(); k-- > 1;) s[k - 1] = s[k] * shape[k];
  return s;
}

MultiIndex::MultiIndex(Shape shape) : shape_(std::move(shape)), idx_(shape_.size(), 0) {
  done_ = shape_numel(shape_) == 0;
}

MultiIndex& MultiIndex::operator++() {
  ++flat_;
  for (size_t k = shape_.size(); k-- > 0;) {
    if (++idx_[k] < shape_[k]) return *this;
    idx_[k] = 0;
  }
  done_ = true;
  return *this;
}

HostTensor make_tensor(bp_dtype dtype, Shape shape) {
  HostTensor t;
  t.dtype = dtype;
  t.bytes.assign(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), std::byte{0});
  t.shape = std::move(shape);
  return t;
}

namespace {
template <typename T> T read_as(const HostTensor& t, int64_t i) {
  T v;
  std::memcpy(&v, t.bytes.data() + static_cast<size_t>(i) * sizeof(T), sizeof(T));
  return v;
}
template <typename T> void write_as(HostTensor& t, int64_t i, T v) {
  std::memcpy(t.bytes.data() + static_cast<size_t>(i) * sizeof(T), &v, sizeof(T));
}
}  // namespace

double load_f64(const HostTensor& t, int64_t i) {
  switch (t.dtype) {
    case BP_DTYPE_F32: return read_as<float>(t, i);
    case BP_DTYPE_F64: return read_as<double>(t, i);
    case BP_DTYPE_F16: return f16_to_float(read_as<uint16_t>(t, i));
    case BP_DTYPE_BF16: return bf16_to_float(read_as<uint16_t>(t, i));
    default: return static_cast<double>(load_i64(t, i));
  }
}

int64_t load_i64(const HostTensor& t, int64_t i) {
  switch (t.dtype) {
    case BP_DTYPE_I8: return read_as<int8_t>(t, i);
    case BP_DTYPE_I16: return read_as<int16_t>(t, i);
    case BP_DTYPE_I32: return read_as<int32_t>(t, i);
    case BP_DTYPE_I64: return read_as<int64_t>(t, i);
    case BP_DTYPE_U8: return read_as<uint8_t>(t, i);
    case BP_DTYPE_BOOL: return read_as<uint8_t>(t, i);
    default: throw std::invalid_argument("load_i64 on a float dtype");
  }
}

// v rounded to float with round-to-odd (an inexact result keeps its last
// bit set), so that rounding that float to f16 or bf16 (nearest even) equals
// one rounding of v: the float keeps more than two bits beyond either, and
// the odd bit stands for everything the first rounding dropped.
float to_float_odd(double v) {
  float f = static_cast<float>(v);
  if (std::isfinite(v) && std::isfinite(f) && static_cast<double>(f) != v) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    if ((b & 1u) == 0) b = std::fabs(static_cast<double>(f)) > std::fabs(v) ? b - 1 : b + 1;
    std::memcpy(&f, &b, 4);
  }
  return f;
}

void store_f64(HostTensor& t, int64_t i, double v) {
  switch (t.dtype) {
    case BP_DTYPE_F32: write_as<float>(t, i, static_cast<float>(v)); return;
    case BP_DTYPE_F64: write_as<double>(t, i, v); return;
    case BP_DTYPE_F16: write_as<uint16_t>(t, i, float_to_f16(to_float_odd(v))); return;
    case BP_DTYPE_BF16: write_as<uint16_t>(t, i, float_to_bf16(to_float_odd(v))); return;
    default: throw std::invalid_argument("store_f64 on an integer dtype");
  }
}

void store_i64(HostTensor& t, int64_t i, int64_t v) {
  v = wrap_to_dtype(v, t.dtype);
  switch (t.dtype) {
    case BP_DTYPE_I8: write_as<int8_t>(t, i, static_cast<int8_t>(v)); return;
    case BP_DTYPE_I16: write_as<int16_t>(t, i, static_cast<int16_t>(v)); return;
    case BP_DTYPE_I32: write_as<int32_t>(t, i, static_cast<int32_t>(v)); return;
    case BP_DTYPE_I64: write_as<int64_t>(t, i, v); return;
    case BP_DTYPE_U8:
    case BP_DTYPE_BOOL: write_as<uint8_t>(t, i, static_cast<uint8_t>(v)); return;
    default: throw std::invalid_argument("store_i64 on a float dtype");
  }
}

double round_to_dtype(double v, bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F64: return v;
    case BP_DTYPE_F32: return static_cast<float>(v);
    case BP_DTYPE_F16: return f16_to_float(float_to_f16(to_float_odd(v)));
    case BP_DTYPE_BF16: return bf16_to_float(float_to_bf16(to_float_odd(v)));
    default: throw std::invalid_argument("round_to_dtype on an integer dtype");
  }
}

int64_t wrap_to_dtype(int64_t v, bp_dtype d) {
  switch (d) {
    case BP_DTYPE_I8: return static_cast<int8_t>(v);  // modular since C++20
    case BP_DTYPE_I16: return static_cast<int16_t>(v);
    case BP_DTYPE_I32: return static_cast<int32_t>(v);
    case BP_DTYPE_I64: return v;
    case BP_DTYPE_U8: return static_cast<uint8_t>(v);
    case BP_DTYPE_BOOL: return v != 0 ? 1 : 0;
    default: throw std::invalid_argument("wrap_to_dtype on a float dtype");
  }
}

int64_t int_min(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_I8: return std::numeric_limits<int8_t>::min();
    case BP_DTYPE_I16: return std::numeric_limits<int16_t>::min();
    case BP_DTYPE_I32: return std::numeric_limits<int32_t>::min();
    case BP_DTYPE_I64: return std::numeric_limits<int64_t>::min();
    default: return 0;  // u8, bool
  }
}

int64_t int_max(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_I8: return std::numeric_limits<int8_t>::max();
    case BP_DTYPE_I16: return std::numeric_limits<int16_t>::max();
    case BP_DTYPE_I32: return std::numeric_limits<int32_t>::max();
    case BP_DTYPE_I64: return std::numeric_limits<int64_t>::max();
    case BP_DTYPE_U8: return 255;
    default: return 1;  // bool
  }
}

RefTensor::RefTensor(bp_dtype dt, Shape s) : dtype(dt), shape(std::move(s)) {
  const auto n = static_cast<size_t>(shape_numel(shape));
  if (is_float(dtype)) f.assign(n, 0.0); else i.assign(n, 0);
}
bool RefTensor::is_float_dtype() const { return is_float(dtype); }
int64_t RefTensor::numel() const { return shape_numel(shape); }
double RefTensor::get(int64_t k) const {
  return is_float(dtype) ? f[static_cast<size_t>(k)] : static_cast<double>(i[static_cast<size_t>(k)]);
}
int64_t RefTensor::get_int(int64_t k) const {
  return is_float(dtype) ? static_cast<int64_t>(f[static_cast<size_t>(k)]) : i[static_cast<size_t>(k)];
}
void RefTensor::set(int64_t k, double v) {
  if (is_float(dtype)) {
    f[static_cast<size_t>(k)] = round_to_dtype(v, dtype);
  } else {
    i[static_cast<size_t>(k)] = wrap_to_dtype(static_cast<int64_t>(v), dtype);
  }
}
void RefTensor::set_int(int64_t k, int64_t v) {
  if (is_float(dtype)) {
    f[static_cast<size_t>(k)] = round_to_dtype(static_cast<double>(v), dtype);
  } else {
    i[static_cast<size_t>(k)] = wrap_to_dtype(v, dtype);
  }
}
HostTensor RefTensor::to_host() const {
  HostTensor t = make_tensor(dtype, shape);
  for (int64_t k = 0; k < numel(); ++k) {
    if (is_float(dtype)) store_f64(t, k, f[static_cast<size_t>(k)]); else store_i64(t, k, i[static_cast<size_t>(k)]);
  }
  return t;
}
RefTensor RefTensor::from_host(const HostTensor& t) {
  RefTensor r(t.dtype, t.shape);
  for (int64_t k = 0; k < r.numel(); ++k) {
    if (is_float(t.dtype)) r.f[static_cast<size_t>(k)] = load_f64(t, k); else r.i[static_cast<size_t>(k)] = load_i64(t, k);
  }
  return r;
}

HostTensor reference_view(const std::string& op, const HostTensor& x, const Json& params) {
  return refimpl::view_reference(op, x, params);
}

std::vector<RefTensor> reference(const std::string& op, const std::vector<const HostTensor*>& in, const Json& p) {
  using namespace refimpl;
  if (is_view_op(op)) return {RefTensor::from_host(reference_view(op, need(op, in, 0), p))};
  if (in_list(op, {"neg", "abs", "sign", "sqr", "sqrt", "rsqrt", "recip", "exp", "log", "sin", "cos", "tanh", "erf",
                   "floor", "ceil", "round", "relu", "sigmoid", "silu", "softplus", "gelu", "clamp", "affine"}))
    return ref_unary(op, need(op, in, 0), p);
  if (in_list(op, {"add", "sub", "mul", "div", "maximum", "minimum", "pow", "eq", "ne", "lt", "le", "gt", "ge"}))
    return ref_binary(op, need(op, in, 0), need(op, in, 1));
  if (op == "where") return ref_where(need(op, in, 0), need(op, in, 1), need(op, in, 2));
  if (op == "fused_elementwise") return ref_fused(in, p);
  if (op == "cast") return ref_cast(need(op, in, 0), p);
  if (in_list(op, {"sum", "mean", "prod", "max", "min"})) return ref_reduce(op, need(op, in, 0), p);
  if (op == "argmax" || op == "argmin") return ref_argreduce(op, need(op, in, 0), p);
  if (op == "softmax" || op == "log_softmax") return ref_softmax(op, need(op, in, 0), p);
  if (op == "cumsum") return ref_cumsum(need(op, in, 0), p);
  if (op == "layer_norm")
    return ref_layer_norm(need(op, in, 0), in.size() > 1 ? in[1] : nullptr, in.size() > 2 ? in[2] : nullptr, p);
  if (op == "matmul") return ref_matmul(need(op, in, 0), need(op, in, 1));
  if (op == "scaled_dot_product_attention")
    return ref_attention(need(op, in, 0), need(op, in, 1), need(op, in, 2), in.size() > 3 ? in[3] : nullptr, p);
  if (op == "conv2d") return ref_conv2d(need(op, in, 0), need(op, in, 1), in.size() > 2 ? in[2] : nullptr, p);
  if (op == "max_pool2d" || op == "avg_pool2d") return ref_pool2d(op, need(op, in, 0), p);
  if (op == "gather") return ref_gather(need(op, in, 0), need(op, in, 1), p);
  if (op == "index_select") return ref_index_select(need(op, in, 0), need(op, in, 1), p);
  if (op == "concat") return ref_concat(in, p);
  if (op == "slice_update") return ref_slice_update(need(op, in, 0), need(op, in, 1), need(op, in, 2), p);
  if (op == "topk") return ref_topk(need(op, in, 0), p);
  if (op == "var_mean") return ref_var_mean(need(op, in, 0), p);
  if (op == "selective_scan") return ref_selective_scan(in, p);
  bad(op, "unknown op");
}

const std::vector<std::string>& reference_ops() {
  static const std::vector<std::string> ops = {
      "neg", "abs", "sign", "sqr", "sqrt", "rsqrt", "recip", "exp", "log", "sin", "cos", "tanh", "erf", "floor",
      "ceil", "round", "relu", "sigmoid", "silu", "softplus", "gelu", "clamp", "affine", "add", "sub", "mul", "div",
      "maximum", "minimum", "pow", "eq", "ne", "lt", "le", "gt", "ge", "where", "fused_elementwise", "cast", "reshape", "permute",
      "transpose", "broadcast_to", "slice", "squeeze", "unsqueeze", "contiguous", "sum", "mean", "prod", "max", "min",
      "argmax", "argmin", "softmax", "log_softmax", "cumsum", "layer_norm", "matmul", "scaled_dot_product_attention", "conv2d", "max_pool2d", "avg_pool2d", "gather",
      "index_select", "concat", "slice_update", "topk", "var_mean", "selective_scan"};
  return ops;
}

}  // namespace backplane::conformance
