#include "conformance/check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

namespace backplane::conformance {

Tolerance tolerance_for(bp_dtype dtype, TolClass cls) {
  switch (dtype) {
    case BP_DTYPE_F64:
    case BP_DTYPE_F32:
    case BP_DTYPE_F16:
    case BP_DTYPE_BF16:
      if (cls == TolClass::Exact) return {0, 0, true};
      if (cls == TolClass::Selection) return {0, 0, false};
      break;
    default: return {};
  }
  // Probabilities of a row of 1024 are ~1e-3: an absolute floor of 1e-2
  // would pass a softmax of zeros.
  if (cls == TolClass::Probability) {
    switch (dtype) {
      case BP_DTYPE_F64: return {1e-12, 1e-15};
      case BP_DTYPE_F32: return {1e-4, 1e-8};
      case BP_DTYPE_F16: return {1e-2, 1e-5};
      default: return {2e-2, 1e-5};
    }
  }
  switch (dtype) {
    case BP_DTYPE_F64: return {1e-12, 1e-12};
    case BP_DTYPE_F32: return cls == TolClass::Compound ? Tolerance{1e-4, 1e-6} : Tolerance{1e-5, 1e-6};
    case BP_DTYPE_F16: return {1e-2, 1e-2};
    default: return {2e-2, 2e-2};
  }
}

const char* tol_class_name(TolClass cls) {
  switch (cls) {
    case TolClass::Exact: return "exact";
    case TolClass::Selection: return "selection";
    case TolClass::Probability: return "probability";
    case TolClass::Elementwise: return "elementwise";
    case TolClass::Compound: return "compound";
  }
  return "?";
}

std::string index_str(const Shape& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = shape[k] == 0 ? 0 : flat % shape[k];
    flat = shape[k] == 0 ? 0 : flat / shape[k];
  }
  std::string s = "[";
  for (size_t k = 0; k < idx.size(); ++k) s += (k ? "," : "") + std::to_string(idx[k]);
  return s + "]";
}

std::string value_str(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

namespace {

void fail_once(CheckResult& r, const std::string& msg) {
  r.ok = false;
  if (r.message.empty()) r.message = msg;
}

}  // namespace

CheckResult compare(const RefTensor& got, const RefTensor& want, const Tolerance& tol) {
  CheckResult r;
  if (got.dtype != want.dtype) {
    fail_once(r, "dtype " + std::string(dtype_name(got.dtype)) + ", want " + std::string(dtype_name(want.dtype)));
    return r;
  }
  if (got.shape != want.shape) {
    fail_once(r, "shape " + shape_str(got.shape) + ", want " + shape_str(want.shape));
    return r;
  }
  const int64_t n = want.numel();
  for (int64_t k = 0; k < n; ++k) {
    if (!want.is_float_dtype()) {
      const int64_t g = got.i[static_cast<size_t>(k)], w = want.i[static_cast<size_t>(k)];
      if (g != w) {
        ++r.mismatches;
        fail_once(r, "at " + index_str(want.shape, k) + ": got " + std::to_string(g) + ", want " + std::to_string(w));
      }
      continue;
    }
    const double g = got.f[static_cast<size_t>(k)], w = want.f[static_cast<size_t>(k)];
    bool pass;
    std::string why;
    if (std::isnan(w) || std::isnan(g)) {
      pass = std::isnan(w) && std::isnan(g);
    } else if (std::isinf(w) || std::isinf(g)) {
      pass = g == w;
    } else {
      const double abs_err = std::fabs(g - w);
      const double rel_err = w != 0 ? abs_err / std::fabs(w) : (abs_err == 0 ? 0 : INFINITY);
      r.worst_abs = std::max(r.worst_abs, abs_err);
      if (std::fabs(w) > tol.abs) r.worst_rel = std::max(r.worst_rel, rel_err);
      if (tol.exact()) {
        pass = abs_err == 0 && !(tol.signed_zero && w == 0 && std::signbit(g) != std::signbit(w));
        if (!pass && abs_err == 0) why = " (the sign of zero differs)";
        r.worst_ratio = std::max(r.worst_ratio, abs_err == 0 ? 0.0 : INFINITY);
      } else {
        const double ratio = std::min(tol.abs > 0 ? abs_err / tol.abs : INFINITY, tol.rel > 0 ? rel_err / tol.rel : INFINITY);
        r.worst_ratio = std::max(r.worst_ratio, ratio);
        pass = abs_err <= tol.abs || rel_err <= tol.rel;
      }
      if (!pass && why.empty()) {
        why = " (abs err " + value_str(abs_err) + ", rel err " + value_str(rel_err) + "; tol rel " + value_str(tol.rel) +
              " abs " + value_str(tol.abs) + ")";
      }
    }
    if (!pass) {
      ++r.mismatches;
      fail_once(r, "at " + index_str(want.shape, k) + ": got " + value_str(g) + ", want " + value_str(w) + why);
    }
  }
  if (r.mismatches > 1) r.message += " [" + std::to_string(r.mismatches) + " of " + std::to_string(n) + " elements differ]";
  return r;
}

CheckResult compare(const HostTensor& got, const RefTensor& want, const Tolerance& tol) {
  if (got.dtype != want.dtype || got.shape != want.shape ||
      got.bytes.size() != static_cast<size_t>(want.numel()) * dtype_size(want.dtype)) {
    CheckResult r;
    fail_once(r, "got " + std::string(dtype_name(got.dtype)) + shape_str(got.shape) + " (" +
                     std::to_string(got.bytes.size()) + " bytes), want " + std::string(dtype_name(want.dtype)) +
                     shape_str(want.shape));
    return r;
  }
  return compare(RefTensor::from_host(got), want, tol);
}

void merge(CheckResult& a, const CheckResult& b) {
  a.worst_abs = std::max(a.worst_abs, b.worst_abs);
  a.worst_rel = std::max(a.worst_rel, b.worst_rel);
  a.worst_ratio = std::max(a.worst_ratio, b.worst_ratio);
  a.mismatches += b.mismatches;
  if (!b.ok) fail_once(a, b.message);
}

void sort_rows_by_index(RefTensor& values, RefTensor& indices, int64_t dim) {
  const Shape& s = indices.shape;
  if (s.empty() || values.shape != s) return;
  const auto d = static_cast<size_t>(dim < 0 ? dim + static_cast<int64_t>(s.size()) : dim);
  int64_t outer = 1, inner = 1;
  for (size_t k = 0; k < d; ++k) outer *= s[k];
  for (size_t k = d + 1; k < s.size(); ++k) inner *= s[k];
  const int64_t n = s[d];
  std::vector<int64_t> order(static_cast<size_t>(n));
  const RefTensor v0 = values, i0 = indices;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return (o * n + j) * inner + i; };
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return i0.get_int(at(a)) < i0.get_int(at(b)); });
      for (int64_t j = 0; j < n; ++j) {
        const int64_t from = at(order[static_cast<size_t>(j)]), to = at(j);
        indices.i[static_cast<size_t>(to)] = i0.i[static_cast<size_t>(from)];
        if (values.is_float_dtype()) {
          values.f[static_cast<size_t>(to)] = v0.f[static_cast<size_t>(from)];
        } else {
          values.i[static_cast<size_t>(to)] = v0.i[static_cast<size_t>(from)];
        }
      }
    }
  }
}

}  // namespace backplane::conformance
