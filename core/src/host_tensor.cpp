#include <backplane/backplane.hpp>

#include <cmath>
#include <cstring>

namespace backplane {

HostTensor::HostTensor(bp_dtype d, Shape s) : dtype(d), shape(std::move(s)) {
  if (dtype_size(d) == 0) throw Error("tensor: invalid dtype");
  for (auto x : shape)
    if (x < 0) throw Error("tensor: negative dim in shape " + shape_str(shape));
  bytes.assign(static_cast<size_t>(numel()) * dtype_size(d), std::byte{0});
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

double HostTensor::get(int64_t i) const {
  double out = 0;
  visit_dtype(dtype, [&](auto tag) {
    using T = dtype_t<decltype(tag)::value>;
    T v;
    std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
    if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>) {
      out = to_float(v);
    } else {
      out = static_cast<double>(v);
    }
  });
  return out;
}

int64_t HostTensor::get_int(int64_t i) const {
  if (is_float(dtype)) return static_cast<int64_t>(get(i));
  int64_t out = 0;
  visit_dtype(dtype, [&](auto tag) {
    using T = dtype_t<decltype(tag)::value>;
    if constexpr (std::is_integral_v<T>) {
      T v;
      std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
      out = static_cast<int64_t>(v);
    }
  });
  return out;
}

void HostTensor::set(int64_t i, double x) {
  visit_dtype(dtype, [&](auto tag) {
    using T = dtype_t<decltype(tag)::value>;
    T v;
    if constexpr (std::is_same_v<T, f16>) {
      v.bits = float_to_f16(static_cast<float>(x));
    } else if constexpr (std::is_same_v<T, bf16>) {
      v.bits = float_to_bf16(static_cast<float>(x));
    } else if constexpr (std::is_same_v<T, bool>) {
      v = x != 0;
    } else if constexpr (std::is_floating_point_v<T>) {
      v = static_cast<T>(x);
    } else {
      // Integers: wrap like a two's complement store of the truncated value.
      v = static_cast<T>(static_cast<int64_t>(std::isfinite(x) ? std::trunc(x) : 0));
    }
    std::memcpy(bytes.data() + i * sizeof(T), &v, sizeof(T));
  });
}

void HostTensor::set_int(int64_t i, int64_t x) {
  if (is_float(dtype)) return set(i, static_cast<double>(x));
  visit_dtype(dtype, [&](auto tag) {
    using T = dtype_t<decltype(tag)::value>;
    if constexpr (std::is_integral_v<T>) {
      T v = std::is_same_v<T, bool> ? static_cast<T>(x != 0) : static_cast<T>(x);
      std::memcpy(bytes.data() + i * sizeof(T), &v, sizeof(T));
    }
  });
}

HostTensor HostTensor::from_doubles(bp_dtype d, Shape s, const std::vector<double>& values) {
  HostTensor t(d, std::move(s));
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw Error("tensor: " + std::to_string(values.size()) + " values for shape " + shape_str(t.shape));
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

}  // namespace backplane
