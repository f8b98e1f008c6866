// The f64 reference: matmul, conv2d, pooling, gather/index_select/concat/slice_update, topk,
// selective_scan.
#include "conformance/reference_impl.hpp"

namespace backplane::conformance::refimpl {

// ---------------------------------------------------------------------------
// Linear algebra, convolution, indexing

std::vector<RefTensor> ref_matmul(const HostTensor& a, const HostTensor& b) {
  if (a.shape.empty() || b.shape.empty()) bad("matmul", "rank-0 operand");
  Shape as = a.shape, bs = b.shape;
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  if (bs[bs.size() - 2] != K) bad("matmul", "inner dims differ");
  const Shape ba(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const Shape batch = broadcast_shapes("matmul", {ba, bb});
  Shape full = batch;
  full.push_back(M);
  full.push_back(N);
  Shape shape = batch;
  if (!a1) shape.push_back(M);
  if (!b1) shape.push_back(N);
  RefTensor out(a.dtype, shape);
  const bool fl = is_float(a.dtype);
  int64_t flat = 0;
  for (MultiIndex bi(batch); bi; ++bi) {
    const int64_t oa = broadcast_flat(bi.idx(), ba) * M * K, ob = broadcast_flat(bi.idx(), bb) * K * N;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double fs = 0;
        int64_t is = 0;
        for (int64_t k = 0; k < K; ++k) {
          if (fl) {
            fs += load_f64(a, oa + m * K + k) * load_f64(b, ob + k * N + n);
          } else {
            is = wadd(is, wmul(load_i64(a, oa + m * K + k), load_i64(b, ob + k * N + n)));
          }
        }
        if (fl) out.set(flat, fs); else out.set_int(flat, is);
        ++flat;
      }
    }
  }
  return {out};
}

// scaled_dot_product_attention, composed in f64 as docs/ops.md writes it:
// scores, mask and causal -inf, a softmax over the keys, the weighted sum.
std::vector<RefTensor> ref_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                     const HostTensor* mask, const Json& p) {
  const size_t rank = q.shape.size();
  if (rank < 2 || k.shape.size() != rank || v.shape.size() != rank) bad("scaled_dot_product_attention", "ranks");
  const Shape batch(q.shape.begin(), q.shape.end() - 2);
  const int64_t Sq = q.shape[rank - 2], D = q.shape[rank - 1], Sk = k.shape[rank - 2], Dv = v.shape[rank - 1];
  const double scale = has(p, "scale") ? p_double(p, "scale", 1.0) : 1.0 / std::sqrt(static_cast<double>(D));
  const bool causal = p_bool(p, "causal", false);
  Shape out_shape = batch;
  out_shape.push_back(Sq);
  out_shape.push_back(Dv);
  RefTensor out(q.dtype, out_shape);
  std::vector<double> s(static_cast<size_t>(Sk));
  int64_t b = 0;
  for (MultiIndex bi(batch); bi; ++bi, ++b) {
    for (int64_t i = 0; i < Sq; ++i) {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < Sk; ++j) {
        double d = 0;
        for (int64_t c = 0; c < D; ++c) d += load_f64(q, (b * Sq + i) * D + c) * load_f64(k, (b * Sk + j) * D + c);
        d *= scale;
        if (mask) {
          std::vector<int64_t> idx = bi.idx();
          idx.push_back(i);
          idx.push_back(j);
          d += load_f64(*mask, broadcast_flat(idx, mask->shape));
        }
        if (causal && j > i + Sk - Sq) d = -std::numeric_limits<double>::infinity();
        s[static_cast<size_t>(j)] = d;
        mx = std::max(mx, d);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));  // a row of -inf gives NaN
      if (Sk == 0) sum = 1;  // no keys: zeros, as the composed ops give
      for (int64_t c = 0; c < Dv; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < Sk; ++j) acc += s[static_cast<size_t>(j)] * load_f64(v, (b * Sk + j) * Dv + c);
        out.set((b * Sq + i) * Dv + c, acc / sum);
      }
    }
  }
  return {out};
}

std::vector<int64_t> pair_param(const Json& p, const char* name, int64_t def) {
  if (!has(p, name)) return {def, def};
  auto v = p_ints(p, name).value();
  if (v.size() == 1) return {v[0], v[0]};
  if (v.size() != 2) bad("conv2d", std::string(name) + " takes 1 or 2 values");
  return v;
}

std::vector<RefTensor> ref_conv2d(const HostTensor& x, const HostTensor& w, const HostTensor* bias, const Json& p) {
  if (x.shape.size() != 4 || w.shape.size() != 4) bad("conv2d", "x and w must be rank 4");
  const auto stride = pair_param(p, "stride", 1), dil = pair_param(p, "dilation", 1);
  std::vector<int64_t> pad = {0, 0, 0, 0};  // top, left, bottom, right
  if (has(p, "padding")) {
    auto v = p_ints(p, "padding").value();
    if (v.size() == 1) pad = {v[0], v[0], v[0], v[0]};
    else if (v.size() == 2) pad = {v[0], v[1], v[0], v[1]};
    else if (v.size() == 4) pad = v;
    else bad("conv2d", "padding takes 1, 2 or 4 values");
  }
  const int64_t groups = p_int(p, "groups", 1);
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t O = w.shape[0], Cg = w.shape[1], KH = w.shape[2], KW = w.shape[3];
  if (groups < 1 || C % groups != 0 || O % groups != 0 || Cg != C / groups) bad("conv2d", "channels/groups mismatch");
  const int64_t OH = (H + pad[0] + pad[2] - dil[0] * (KH - 1) - 1) / stride[0] + 1;
  const int64_t OW = (W + pad[1] + pad[3] - dil[1] * (KW - 1) - 1) / stride[1] + 1;
  if (OH < 0 || OW < 0) bad("conv2d", "kernel larger than padded input");
  RefTensor out(x.dtype, {N, O, OH, OW});
  const int64_t Og = O / groups;
  for (MultiIndex m(out.shape); m; ++m) {
    const int64_t n = m[0], o = m[1], oh = m[2], ow = m[3];
    const int64_t g = o / Og;
    double s = bias ? load_f64(*bias, o) : 0.0;
    for (int64_t c = 0; c < Cg; ++c) {
      for (int64_t kh = 0; kh < KH; ++kh) {
        const int64_t ih = oh * stride[0] - pad[0] + kh * dil[0];
        if (ih < 0 || ih >= H) continue;
        for (int64_t kw = 0; kw < KW; ++kw) {
          const int64_t iw = ow * stride[1] - pad[1] + kw * dil[1];
          if (iw < 0 || iw >= W) continue;
          const int64_t xc = g * Cg + c;
          s += load_f64(x, ((n * C + xc) * H + ih) * W + iw) * load_f64(w, ((o * Cg + c) * KH + kh) * KW + kw);
        }
      }
    }
    out.set(m.flat(), s);
  }
  return {out};
}

// max_pool2d / avg_pool2d, straight from docs/ops.md: window positions in
// padded coordinates, H' with ceil_mode's rounding and its dropped last
// window, max over the positions inside x (-inf for none, NaN if any is
// NaN), avg = sum over x's positions / the positions counted.
std::vector<RefTensor> ref_pool2d(const std::string& op, const HostTensor& x, const Json& p) {
  if (x.shape.size() != 4) bad(op, "x must be rank 4");
  if (!has(p, "kernel_size")) bad(op, "kernel_size is required");
  const auto k = pair_param(p, "kernel_size", 1);
  const auto stride = has(p, "stride") ? pair_param(p, "stride", 1) : k;
  const auto dil = pair_param(p, "dilation", 1);
  std::vector<int64_t> pad = {0, 0, 0, 0};  // top, left, bottom, right
  if (has(p, "padding")) {
    auto v = p_ints(p, "padding").value();
    if (v.size() == 1) pad = {v[0], v[0], v[0], v[0]};
    else if (v.size() == 2) pad = {v[0], v[1], v[0], v[1]};
    else if (v.size() == 4) pad = v;
    else bad(op, "padding takes 1, 2 or 4 values");
  }
  const bool ceil_mode = p_bool(p, "ceil_mode", false);
  const bool avg = op == "avg_pool2d";
  const bool include_pad = avg && p_bool(p, "count_include_pad", true);
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t in[2] = {H, W};
  int64_t out_hw[2];
  for (int d = 0; d < 2; ++d) {
    const int64_t padded = in[d] + pad[d] + pad[d + 2];
    const int64_t span = dil[d] * (k[d] - 1) + 1;
    if (k[d] < 1 || stride[d] < 1 || dil[d] < 1 || padded < span) bad(op, "bad window");
    const int64_t q = padded - span;
    int64_t n = (ceil_mode ? (q + stride[d] - 1) / stride[d] : q / stride[d]) + 1;
    if (ceil_mode && (n - 1) * stride[d] >= in[d] + pad[d]) --n;
    out_hw[d] = n;
  }
  RefTensor out(x.dtype, {N, C, out_hw[0], out_hw[1]});
  const int64_t ph = H + pad[0] + pad[2], pw = W + pad[1] + pad[3];
  for (MultiIndex m(out.shape); m; ++m) {
    const int64_t n = m[0], c = m[1], oh = m[2], ow = m[3];
    double best = -std::numeric_limits<double>::infinity(), sum = 0;
    bool nan = false;
    int64_t count = 0;
    for (int64_t i = 0; i < k[0]; ++i) {
      const int64_t r = oh * stride[0] + i * dil[0];  // in the padded input
      for (int64_t j = 0; j < k[1]; ++j) {
        const int64_t q = ow * stride[1] + j * dil[1];
        const int64_t ih = r - pad[0], iw = q - pad[1];
        const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
        if (include_pad ? (r < ph && q < pw) : inside) ++count;
        if (!inside) continue;
        const double v = load_f64(x, ((n * C + c) * H + ih) * W + iw);
        if (std::isnan(v)) nan = true;
        if (v > best) best = v;
        sum += v;
      }
    }
    if (avg) out.set(m.flat(), count == 0 ? std::numeric_limits<double>::quiet_NaN() : sum / static_cast<double>(count));
    else out.set(m.flat(), nan ? std::numeric_limits<double>::quiet_NaN() : best);
  }
  return {out};
}

int64_t checked_index(const std::string& op, int64_t j, int64_t size) {
  const int64_t r = j < 0 ? j + size : j;
  if (r < 0 || r >= size)
    throw ReferenceError(op + ": index " + std::to_string(j) + " out of range for size " + std::to_string(size));
  return r;
}

std::vector<RefTensor> ref_gather(const HostTensor& x, const HostTensor& index, const Json& p) {
  const int64_t dim = norm_dim("gather", require_int("gather", p, "dim"), rank_of(x));
  if (index.shape.size() != x.shape.size()) bad("gather", "index rank must equal x rank");
  for (size_t k = 0; k < x.shape.size(); ++k)
    if (static_cast<int64_t>(k) != dim && index.shape[k] > x.shape[k]) bad("gather", "index dim larger than x dim");
  RefTensor out(x.dtype, index.shape);
  for (MultiIndex m(index.shape); m; ++m) {
    std::vector<int64_t> xi = m.idx();
    xi[static_cast<size_t>(dim)] = checked_index("gather", load_i64(index, m.flat()), x.shape[static_cast<size_t>(dim)]);
    copy_elem(out, m.flat(), x, flat_of(xi, x.shape));
  }
  return {out};
}

std::vector<RefTensor> ref_index_select(const HostTensor& x, const HostTensor& index, const Json& p) {
  const int64_t dim = norm_dim("index_select", require_int("index_select", p, "dim"), rank_of(x));
  const auto d = static_cast<size_t>(dim);
  Shape shape(x.shape.begin(), x.shape.begin() + dim);
  shape.insert(shape.end(), index.shape.begin(), index.shape.end());
  shape.insert(shape.end(), x.shape.begin() + dim + 1, x.shape.end());
  RefTensor out(x.dtype, shape);
  const size_t ri = index.shape.size();
  for (MultiIndex m(shape); m; ++m) {
    const std::vector<int64_t>& oi = m.idx();
    const std::vector<int64_t> mid(oi.begin() + dim, oi.begin() + dim + static_cast<int64_t>(ri));
    std::vector<int64_t> xi(oi.begin(), oi.begin() + dim);
    xi.push_back(checked_index("index_select", load_i64(index, flat_of(mid, index.shape)), x.shape[d]));
    xi.insert(xi.end(), oi.begin() + dim + static_cast<int64_t>(ri), oi.end());
    copy_elem(out, m.flat(), x, flat_of(xi, x.shape));
  }
  return {out};
}

std::vector<RefTensor> ref_concat(const std::vector<const HostTensor*>& in, const Json& p) {
  if (in.empty()) bad("concat", "no inputs");
  const HostTensor& first = need("concat", in, 0);
  const int64_t dim = norm_dim("concat", require_int("concat", p, "dim"), rank_of(first));
  const auto d = static_cast<size_t>(dim);
  Shape shape = first.shape;
  shape[d] = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    const HostTensor& t = need("concat", in, k);
    if (t.shape.size() != first.shape.size()) bad("concat", "ranks differ");
    for (size_t j = 0; j < shape.size(); ++j)
      if (j != d && t.shape[j] != first.shape[j]) bad("concat", "shapes differ outside dim");
    shape[d] += t.shape[d];
  }
  RefTensor out(first.dtype, shape);
  for (MultiIndex m(shape); m; ++m) {
    std::vector<int64_t> xi = m.idx();
    size_t k = 0;
    while (xi[d] >= in[k]->shape[d]) {
      xi[d] -= in[k]->shape[d];
      ++k;
    }
    copy_elem(out, m.flat(), *in[k], flat_of(xi, in[k]->shape));
  }
  return {out};
}

std::vector<RefTensor> ref_slice_update(const HostTensor& x, const HostTensor& update, const HostTensor& start,
                                        const Json& p) {
  const int64_t dim = norm_dim("slice_update", require_int("slice_update", p, "dim"), rank_of(x));
  const auto d = static_cast<size_t>(dim);
  if (update.shape.size() != x.shape.size()) bad("slice_update", "ranks differ");
  for (size_t j = 0; j < x.shape.size(); ++j)
    if (j == d ? update.shape[j] > x.shape[j] : update.shape[j] != x.shape[j])
      bad("slice_update", "update does not fit x");
  if (start.numel() != 1) bad("slice_update", "start must hold one element");
  const int64_t at = load_i64(start, 0);
  if (at < 0 || at > x.shape[d] - update.shape[d]) bad("slice_update", "start out of range");
  RefTensor out(x.dtype, x.shape);
  for (MultiIndex m(x.shape); m; ++m) {
    std::vector<int64_t> i = m.idx();
    if (i[d] >= at && i[d] < at + update.shape[d]) {
      i[d] -= at;
      copy_elem(out, m.flat(), update, flat_of(i, update.shape));
    } else {
      copy_elem(out, m.flat(), x, m.flat());
    }
  }
  return {out};
}

std::vector<RefTensor> ref_topk(const HostTensor& x, const Json& p) {
  const int64_t k = require_int("topk", p, "k");
  if (x.shape.empty()) bad("topk", "rank-0 input");
  const int64_t dim = norm_dim("topk", p_int(p, "dim", -1), rank_of(x));
  const bool largest = p_bool(p, "largest", true);
  const Around a = around(x.shape, dim);
  if (k < 0 || k > a.n) bad("topk", "k out of range");
  Shape shape = x.shape;
  shape[static_cast<size_t>(dim)] = k;
  RefTensor values(x.dtype, shape), indices(BP_DTYPE_I64, shape);
  const bool fl = is_float(x.dtype);
  // "a ranks before b": by value (NaN above every number), ties keep index
  // order because the sort is stable.
  auto before = [&](int64_t va_at, int64_t vb_at) {
    if (fl) {
      const double va = load_f64(x, va_at), vb = load_f64(x, vb_at);
      const bool na = std::isnan(va), nb = std::isnan(vb);
      if (largest) {
        if (na || nb) return na && !nb;
        return va > vb;
      }
      if (na || nb) return !na && nb;
      return va < vb;
    }
    const int64_t va = load_i64(x, va_at), vb = load_i64(x, vb_at);
    return largest ? va > vb : va < vb;
  };
  std::vector<int64_t> order(static_cast<size_t>(a.n));
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t i = 0; i < a.inner; ++i) {
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t j1, int64_t j2) { return before(a.at(o, j1, i), a.at(o, j2, i)); });
      for (int64_t r = 0; r < k; ++r) {
        const int64_t at = (o * k + r) * a.inner + i;
        copy_elem(values, at, x, a.at(o, order[static_cast<size_t>(r)], i));
        indices.set_int(at, order[static_cast<size_t>(r)]);
      }
    }
  }
  return {values, indices};
}

std::vector<RefTensor> ref_selective_scan(const std::vector<const HostTensor*>& in, const Json& p) {
  const HostTensor &u = need("selective_scan", in, 0), &delta = need("selective_scan", in, 1),
                   &A = need("selective_scan", in, 2), &Bm = need("selective_scan", in, 3),
                   &Cm = need("selective_scan", in, 4);
  if (u.shape.size() != 3 || A.shape.size() != 2) bad("selective_scan", "u is [B,L,D], a is [D,N]");
  const int64_t B = u.shape[0], L = u.shape[1], D = u.shape[2], N = A.shape[1];
  if (delta.shape != u.shape || A.shape[0] != D || Bm.shape != Shape{B, L, N} || Cm.shape != Shape{B, L, N})
    bad("selective_scan", "shapes do not agree");
  const bool sp = p_bool(p, "delta_softplus", false);
  RefTensor y(u.dtype, {B, L, D}), last(u.dtype, {B, D, N});
  std::vector<double> h(static_cast<size_t>(D * N));
  for (int64_t b = 0; b < B; ++b) {
    std::fill(h.begin(), h.end(), 0.0);
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t i = 0; i < D; ++i) {
        const int64_t ui = (b * L + t) * D + i;
        double d = load_f64(delta, ui);
        if (sp) d = softplus(d);
        double acc = 0;
        for (int64_t j = 0; j < N; ++j) {
          double& hij = h[static_cast<size_t>(i * N + j)];
          hij = std::exp(d * load_f64(A, i * N + j)) * hij + d * load_f64(Bm, (b * L + t) * N + j) * load_f64(u, ui);
          acc += hij * load_f64(Cm, (b * L + t) * N + j);
        }
        y.set(ui, acc);
      }
    }
    for (int64_t k = 0; k < D * N; ++k) last.set(b * D * N + k, h[static_cast<size_t>(k)]);
  }
  return {y, last};
}

}  // namespace backplane::conformance::refimpl
