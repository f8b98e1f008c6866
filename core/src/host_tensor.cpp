#include <backplane/backplane.hpp>

#include "checked.hpp"

#include <cmath>
#include <cstring>

namespace backplane {

HostTensor::HostTensor(bp_dtype d, Shape s) : dtype(d), shape(std::move(s)) {
  if (dtype_size(d) == 0) throw Error("tensor: invalid dtype");
  if (shape.size() > BP_MAX_RANK) throw Error("tensor: rank " + std::to_string(shape.size()) + " exceeds 8");
  const uint64_t n = detail::checked_bytes(shape, dtype_size(d), "tensor");
  // Beyond any host's memory (and what allocators, ASan's included, serve):
  // refused before asking for it.
  if (n > (uint64_t{1} << 40))
    throw Error("tensor of " + std::string(dtype_name(d)) + shape_str(shape) + ": cannot allocate " + std::to_string(n) +
                    " bytes of host memory (more than 1 TiB)",
                BP_ERR_OUT_OF_MEMORY);
  try {
    bytes.assign(static_cast<size_t>(n), std::byte{0});
  } catch (const std::exception&) {  // bad_alloc, length_error
    throw Error("tensor of " + std::string(dtype_name(d)) + shape_str(shape) + ": cannot allocate " + std::to_string(n) +
                    " bytes of host memory",
                BP_ERR_OUT_OF_MEMORY);
  }
}

void HostTensor::check_access(size_t size, bool floating, bool signed_int) const {
  bool ok = dtype_size(dtype) == size;
  if (floating) ok = ok && (dtype == BP_DTYPE_F32 || dtype == BP_DTYPE_F64);
  if (signed_int)
    ok = ok && (dtype == BP_DTYPE_I8 || dtype == BP_DTYPE_I16 || dtype == BP_DTYPE_I32 || dtype == BP_DTYPE_I64);
  if (!ok)
    throw Error("tensor of " + std::string(dtype_name(dtype)) + ": typed access as a " + std::to_string(size) + "-byte " +
                (floating ? "float" : signed_int ? "signed integer" : "unsigned integer") + " does not fit its dtype");
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
