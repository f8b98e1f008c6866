// The f64 reference: reductions, arg-reductions, softmax, cumsum, layer_norm, var_mean.
#include "conformance/reference_impl.hpp"

namespace backplane::conformance::refimpl {

// ---------------------------------------------------------------------------
// Reductions

struct ReducePlan {
  Shape out_shape;
  std::vector<bool> reduced;
  int64_t count = 1;  // elements per output
};

ReducePlan plan_reduce(const std::string& op, const Shape& in, const Json& p, const char* dims_name) {
  const auto rank = static_cast<int64_t>(in.size());
  ReducePlan r;
  r.reduced.assign(in.size(), false);
  auto dims = p_ints(p, dims_name);
  if (dims) {
    for (int64_t d : norm_dims(op, *dims, rank)) r.reduced[static_cast<size_t>(d)] = true;
  } else {
    r.reduced.assign(in.size(), true);
  }
  const bool keepdim = p_bool(p, "keepdim", false);
  for (size_t k = 0; k < in.size(); ++k) {
    if (r.reduced[k]) {
      r.count *= in[k];
      if (keepdim) r.out_shape.push_back(1);
    } else {
      r.out_shape.push_back(in[k]);
    }
  }
  return r;
}

int64_t reduce_out_flat(const ReducePlan& r, const std::vector<int64_t>& in_idx, const Shape& in) {
  int64_t flat = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    if (r.reduced[k]) continue;
    flat = flat * in[k] + in_idx[k];
  }
  return flat;
}

std::vector<RefTensor> ref_reduce(const std::string& op, const HostTensor& x, const Json& p) {
  const ReducePlan r = plan_reduce(op, x.shape, p, "dims");
  RefTensor out(x.dtype, r.out_shape);
  const int64_t n_out = shape_numel(r.out_shape);
  const bool fl = is_float(x.dtype);
  if (!fl && !is_int(x.dtype)) bad(op, "not defined on bool");
  if (op == "mean" && !fl) bad(op, "float only");
  if ((op == "max" || op == "min") && r.count == 0 && n_out > 0)
    throw ReferenceError(op + ": reduction over an empty axis");
  std::vector<double> facc(static_cast<size_t>(n_out));
  std::vector<int64_t> iacc(static_cast<size_t>(n_out));
  std::vector<bool> seen(static_cast<size_t>(n_out), false);
  const double finit = op == "prod" ? 1.0 : 0.0;
  std::fill(facc.begin(), facc.end(), finit);
  std::fill(iacc.begin(), iacc.end(), op == "prod" ? 1 : 0);
  for (MultiIndex m(x.shape); m; ++m) {
    const auto o = static_cast<size_t>(reduce_out_flat(r, m.idx(), x.shape));
    if (fl) {
      const double v = load_f64(x, m.flat());
      if (op == "sum" || op == "mean") {
        facc[o] += v;
      } else if (op == "prod") {
        facc[o] *= v;
      } else if (op == "max" || op == "min") {
        if (!seen[o] || std::isnan(v)) {
          facc[o] = v;  // the first value, or NaN, which then stays (see below)
        } else if (!std::isnan(facc[o])) {
          facc[o] = op == "max" ? std::max(facc[o], v) : std::min(facc[o], v);
        }
      } else {
        bad(op, "not a reduction");
      }
    } else {
      const int64_t v = load_i64(x, m.flat());
      if (op == "sum") {
        iacc[o] = wadd(iacc[o], v);
      } else if (op == "prod") {
        iacc[o] = wmul(iacc[o], v);
      } else if (op == "max") {
        iacc[o] = seen[o] ? std::max(iacc[o], v) : v;
      } else if (op == "min") {
        iacc[o] = seen[o] ? std::min(iacc[o], v) : v;
      } else {
        bad(op, "not a reduction");
      }
    }
    seen[o] = true;
  }
  for (int64_t k = 0; k < n_out; ++k) {
    if (fl) {
      double v = facc[static_cast<size_t>(k)];
      if (op == "mean") v /= static_cast<double>(r.count);
      out.set(k, v);
    } else {
      out.set_int(k, iacc[static_cast<size_t>(k)]);
    }
  }
  return {out};
}

std::vector<RefTensor> ref_argreduce(const std::string& op, const HostTensor& x, const Json& p) {
  const int64_t dim = norm_dim(op, require_int(op, p, "dim"), rank_of(x));
  const bool keepdim = p_bool(p, "keepdim", false), last = p_bool(p, "select_last_index", false);
  const bool is_max = op == "argmax";
  Shape shape = x.shape;
  if (keepdim) {
    shape[static_cast<size_t>(dim)] = 1;
  } else {
    shape.erase(shape.begin() + dim);
  }
  const Around a = around(x.shape, dim);
  if (a.n == 0 && a.outer * a.inner > 0) throw ReferenceError(op + ": reduction over an empty axis");
  RefTensor out(BP_DTYPE_I64, shape);
  const bool fl = is_float(x.dtype);
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t i = 0; i < a.inner; ++i) {
      int64_t best = 0;
      for (int64_t j = 0; j < a.n; ++j) {
        if (fl) {
          const double v = load_f64(x, a.at(o, j, i)), b = load_f64(x, a.at(o, best, i));
          if (std::isnan(v)) {  // the first NaN wins
            best = j;
            break;
          }
          if (j == 0) continue;
          const bool better = is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
          if (better) best = j;
        } else {
          if (j == 0) continue;
          const int64_t v = load_i64(x, a.at(o, j, i)), b = load_i64(x, a.at(o, best, i));
          const bool better = is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
          if (better) best = j;
        }
      }
      out.set_int(o * a.inner + i, best);
    }
  }
  return {out};
}

std::vector<RefTensor> ref_softmax(const std::string& op, const HostTensor& x, const Json& p) {
  const int64_t dim = norm_dim(op, require_int(op, p, "dim"), rank_of(x));
  const Around a = around(x.shape, dim);
  RefTensor out(x.dtype, x.shape);
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t i = 0; i < a.inner; ++i) {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < a.n; ++j) m = std::max(m, load_f64(x, a.at(o, j, i)));
      double s = 0;
      for (int64_t j = 0; j < a.n; ++j) s += std::exp(load_f64(x, a.at(o, j, i)) - m);
      for (int64_t j = 0; j < a.n; ++j) {
        const double v = load_f64(x, a.at(o, j, i));
        out.set(a.at(o, j, i), op == "softmax" ? std::exp(v - m) / s : v - m - std::log(s));
      }
    }
  }
  return {out};
}

std::vector<RefTensor> ref_cumsum(const HostTensor& x, const Json& p) {
  const int64_t dim = norm_dim("cumsum", require_int("cumsum", p, "dim"), rank_of(x));
  const bool exclusive = p_bool(p, "exclusive", false), reverse = p_bool(p, "reverse", false);
  const Around a = around(x.shape, dim);
  RefTensor out(x.dtype, x.shape);
  const bool fl = is_float(x.dtype);
  if (!fl && !is_int(x.dtype)) bad("cumsum", "not defined on bool");
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t i = 0; i < a.inner; ++i) {
      double fs = 0;
      int64_t is = 0;
      for (int64_t s = 0; s < a.n; ++s) {
        const int64_t j = reverse ? a.n - 1 - s : s;
        const int64_t at = a.at(o, j, i);
        if (exclusive) {
          if (fl) out.set(at, fs); else out.set_int(at, is);
        }
        if (fl) fs += load_f64(x, at); else is = wadd(is, load_i64(x, at));
        if (!exclusive) {
          if (fl) out.set(at, fs); else out.set_int(at, is);
        }
      }
    }
  }
  return {out};
}

std::vector<RefTensor> ref_layer_norm(const HostTensor& x, const HostTensor* w, const HostTensor* b, const Json& p) {
  auto dims = p_ints(p, "dims");
  if (!dims) bad("layer_norm", "dims is required");
  const auto rank = rank_of(x);
  const auto nd = norm_dims("layer_norm", *dims, rank);
  for (size_t k = 0; k < nd.size(); ++k)
    if (nd[k] != rank - static_cast<int64_t>(nd.size()) + static_cast<int64_t>(k)) bad("layer_norm", "dims must be trailing");
  const double eps = p_double(p, "eps", 1e-5);
  int64_t inner = 1;
  for (size_t k = x.shape.size() - nd.size(); k < x.shape.size(); ++k) inner *= x.shape[k];
  const int64_t outer = inner == 0 ? 0 : shape_numel(x.shape) / inner;
  RefTensor out(x.dtype, x.shape);
  for (int64_t o = 0; o < outer; ++o) {
    double mean = 0;
    for (int64_t i = 0; i < inner; ++i) mean += load_f64(x, o * inner + i);
    mean /= static_cast<double>(inner);
    double var = 0;
    for (int64_t i = 0; i < inner; ++i) {
      const double d = load_f64(x, o * inner + i) - mean;
      var += d * d;
    }
    var /= static_cast<double>(inner);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < inner; ++i) {
      double y = (load_f64(x, o * inner + i) - mean) * inv;
      if (w) y *= load_f64(*w, i);
      if (b) y += load_f64(*b, i);
      out.set(o * inner + i, y);
    }
  }
  return {out};
}

std::vector<RefTensor> ref_var_mean(const HostTensor& x, const Json& p) {
  const ReducePlan r = plan_reduce("var_mean", x.shape, p, "dims");
  const double correction = p_double(p, "correction", 1.0);
  const int64_t n_out = shape_numel(r.out_shape);
  std::vector<double> sum(static_cast<size_t>(n_out), 0.0), sq(static_cast<size_t>(n_out), 0.0);
  for (MultiIndex m(x.shape); m; ++m) sum[static_cast<size_t>(reduce_out_flat(r, m.idx(), x.shape))] += load_f64(x, m.flat());
  const auto count = static_cast<double>(r.count);
  for (MultiIndex m(x.shape); m; ++m) {
    const auto o = static_cast<size_t>(reduce_out_flat(r, m.idx(), x.shape));
    const double d = load_f64(x, m.flat()) - sum[o] / count;
    sq[o] += d * d;
  }
  RefTensor var(x.dtype, r.out_shape), mean(x.dtype, r.out_shape);
  for (int64_t k = 0; k < n_out; ++k) {
    mean.set(k, sum[static_cast<size_t>(k)] / count);
    var.set(k, sq[static_cast<size_t>(k)] / (count - correction));
  }
  return {var, mean};
}

}  // namespace backplane::conformance::refimpl
