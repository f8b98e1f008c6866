// The f64 reference's insides, shared by its files (reference_*.cpp): the
// lenient param readers, wrap-around integer arithmetic, broadcasting and
// index helpers, and one entry per op family. Not part of the library's API.
#pragma once

#include "conformance/reference.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numbers>
#include <numeric>
#include <optional>
#include <initializer_list>
#include <string>
#include <vector>

namespace backplane::conformance::refimpl {

[[noreturn]] inline void bad(const std::string& op, const std::string& what) {
  throw std::invalid_argument("reference " + op + ": " + what);
}

// ---------------------------------------------------------------------------
// Params (lenient: the reference does not police unknown names, the core does)

inline bool has(const Json& p, const char* name) { return p.is_object() && p.contains(name) && !p[name].is_null(); }

inline int64_t p_int(const Json& p, const char* name, int64_t def) {
  return has(p, name) ? p[name].get<int64_t>() : def;
}
inline bool p_bool(const Json& p, const char* name, bool def) { return has(p, name) ? p[name].get<bool>() : def; }
inline double p_double(const Json& p, const char* name, double def) {
  return has(p, name) ? p[name].get<double>() : def;
}
// An int or a list of ints; nullopt when absent.
inline std::optional<std::vector<int64_t>> p_ints(const Json& p, const char* name) {
  if (!has(p, name)) return std::nullopt;
  const Json& v = p[name];
  if (v.is_number_integer()) return std::vector<int64_t>{v.get<int64_t>()};
  return v.get<std::vector<int64_t>>();
}
inline int64_t require_int(const std::string& op, const Json& p, const char* name) {
  if (!has(p, name)) bad(op, std::string("missing param ") + name);
  return p[name].get<int64_t>();
}

inline int64_t norm_dim(const std::string& op, int64_t d, int64_t rank) {
  const int64_t r = d < 0 ? d + rank : d;
  if (r < 0 || r >= rank) bad(op, "dim " + std::to_string(d) + " out of range for rank " + std::to_string(rank));
  return r;
}

inline std::vector<int64_t> norm_dims(const std::string& op, const std::vector<int64_t>& dims, int64_t rank) {
  if (dims.empty()) bad(op, "dims: [] is ambiguous");
  std::vector<int64_t> out;
  for (int64_t d : dims) out.push_back(norm_dim(op, d, rank));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end()) bad(op, "repeated dim");
  return out;
}

inline int64_t rank_of(const HostTensor& t) { return static_cast<int64_t>(t.shape.size()); }

// ---------------------------------------------------------------------------
// Integer arithmetic with two's-complement wrap (no UB)

inline int64_t wadd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
inline int64_t wsub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
inline int64_t wmul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
inline int64_t wneg(int64_t a) { return static_cast<int64_t>(0 - static_cast<uint64_t>(a)); }

// ---------------------------------------------------------------------------
// Broadcasting (NumPy)

inline Shape broadcast_shapes(const std::string& op, const std::vector<Shape>& shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  Shape out(rank, 1);
  for (const auto& s : shapes) {
    for (size_t k = 0; k < s.size(); ++k) {
      const size_t o = rank - s.size() + k;
      if (s[k] == out[o]) continue;
      if (out[o] == 1) {
        out[o] = s[k];
      } else if (s[k] != 1) {
        bad(op, "shapes do not broadcast");
      }
    }
  }
  return out;
}

// Dense flat index into a tensor of shape `in` for an index of the
// broadcast output (aligned from the right; size-1 dims stretch).
inline int64_t broadcast_flat(const std::vector<int64_t>& out_idx, const Shape& in) {
  int64_t flat = 0;
  const size_t lead = out_idx.size() - in.size();
  for (size_t k = 0; k < in.size(); ++k) {
    const int64_t i = in[k] == 1 ? 0 : out_idx[lead + k];
    flat = flat * in[k] + i;
  }
  return flat;
}

inline int64_t flat_of(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t flat = 0;
  for (size_t k = 0; k < shape.size(); ++k) flat = flat * shape[k] + idx[k];
  return flat;
}

// outer x n x inner decomposition around one dim of a dense tensor.
struct Around {
  int64_t outer = 1, n = 1, inner = 1;
  int64_t at(int64_t o, int64_t j, int64_t i) const { return (o * n + j) * inner + i; }
};
inline Around around(const Shape& s, int64_t dim) {
  Around a;
  for (int64_t k = 0; k < dim; ++k) a.outer *= s[static_cast<size_t>(k)];
  a.n = s[static_cast<size_t>(dim)];
  for (size_t k = static_cast<size_t>(dim) + 1; k < s.size(); ++k) a.inner *= s[k];
  return a;
}

inline void copy_elem(RefTensor& out, int64_t k, const HostTensor& in, int64_t j) {
  if (out.is_float_dtype()) {
    out.f[static_cast<size_t>(k)] = round_to_dtype(load_f64(in, j), out.dtype);
  } else {
    out.i[static_cast<size_t>(k)] = wrap_to_dtype(load_i64(in, j), out.dtype);
  }
}

inline const HostTensor& need(const std::string& op, const std::vector<const HostTensor*>& in, size_t k) {
  if (k >= in.size() || in[k] == nullptr) bad(op, "missing input " + std::to_string(k));
  return *in[k];
}


// log(1 + e^x) without overflow (softplus, and selective_scan's delta).
inline double softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }

inline bool in_list(const std::string& op, std::initializer_list<const char*> ops) {
  for (const char* o : ops)
    if (op == o) return true;
  return false;
}

// Views (reference_views.cpp)
bool is_view_op(const std::string& op);
HostTensor view_reference(const std::string& op, const HostTensor& x, const Json& params);

// Elementwise (reference_elementwise.cpp)
std::vector<RefTensor> ref_unary(const std::string& op, const HostTensor& x, const Json& p);
std::vector<RefTensor> ref_binary(const std::string& op, const HostTensor& a, const HostTensor& b);
std::vector<RefTensor> ref_where(const HostTensor& c, const HostTensor& a, const HostTensor& b);
// fused_elementwise: its program run as the ops it names, each result a
// value of x0's dtype (or bool), then broadcast to every input's shape.
std::vector<RefTensor> ref_fused(const std::vector<const HostTensor*>& in, const Json& p);
std::vector<RefTensor> ref_cast(const HostTensor& x, const Json& p);

// Reductions, norms, scans (reference_reduce.cpp)
std::vector<RefTensor> ref_reduce(const std::string& op, const HostTensor& x, const Json& p);
std::vector<RefTensor> ref_argreduce(const std::string& op, const HostTensor& x, const Json& p);
std::vector<RefTensor> ref_softmax(const std::string& op, const HostTensor& x, const Json& p);
std::vector<RefTensor> ref_cumsum(const HostTensor& x, const Json& p);
std::vector<RefTensor> ref_layer_norm(const HostTensor& x, const HostTensor* w, const HostTensor* b, const Json& p);
std::vector<RefTensor> ref_var_mean(const HostTensor& x, const Json& p);

// Products, convolutions, pooling, indexing (reference_linalg.cpp)
std::vector<RefTensor> ref_matmul(const HostTensor& a, const HostTensor& b);
std::vector<RefTensor> ref_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                     const HostTensor* mask, const Json& p);
std::vector<RefTensor> ref_conv2d(const HostTensor& x, const HostTensor& w, const HostTensor* bias, const Json& p);
std::vector<RefTensor> ref_pool2d(const std::string& op, const HostTensor& x, const Json& p);
std::vector<RefTensor> ref_gather(const HostTensor& x, const HostTensor& index, const Json& p);
std::vector<RefTensor> ref_index_select(const HostTensor& x, const HostTensor& index, const Json& p);
std::vector<RefTensor> ref_concat(const std::vector<const HostTensor*>& in, const Json& p);
std::vector<RefTensor> ref_slice_update(const HostTensor& x, const HostTensor& update, const HostTensor& start,
                                        const Json& p);
std::vector<RefTensor> ref_topk(const HostTensor& x, const Json& p);
std::vector<RefTensor> ref_selective_scan(const std::vector<const HostTensor*>& in, const Json& p);

}  // namespace backplane::conformance::refimpl
