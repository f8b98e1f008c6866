// Checked arithmetic for shapes, strides, element and byte counts: every
// count the core computes from user or plugin data goes through these, so an
// overflow is an Error naming what overflowed, never a wrapped number.
#pragma once

#include <backplane/backplane.hpp>

#include <cstdint>
#include <string>

namespace backplane::detail {

// The largest element or byte count the core accepts: 2^62, far above any
// memory, so products below it never wrap int64_t or uint64_t.
inline constexpr int64_t kMaxCount = int64_t{1} << 62;

inline int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r) || r > kMaxCount)
    throw Error(what + ": " + std::to_string(a) + " x " + std::to_string(b) + " overflows (the limit is 2^62)",
                BP_ERR_OUT_OF_RANGE);
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r) || r > kMaxCount || r < -kMaxCount)
    throw Error(what + ": " + std::to_string(a) + " + " + std::to_string(b) + " overflows", BP_ERR_OUT_OF_RANGE);
  return r;
}

// The element count of `shape` (dims must be >= 0), or an Error naming `what`.
inline int64_t checked_numel(const Shape& shape, const std::string& what) {
  int64_t n = 1;
  for (auto d : shape) {
    if (d < 0) throw Error(what + ": negative dim in " + shape_str(shape), BP_ERR_INVALID_ARGUMENT);
    n = checked_mul(n, d, what + ": the element count of " + shape_str(shape));
  }
  return n;
}

// The byte count of a dense tensor of `shape` with elements of `elem_size` bytes.
inline uint64_t checked_bytes(const Shape& shape, size_t elem_size, const std::string& what) {
  return static_cast<uint64_t>(
      checked_mul(checked_numel(shape, what), static_cast<int64_t>(elem_size), what + ": the byte count of " + shape_str(shape)));
}

}  // namespace backplane::detail
