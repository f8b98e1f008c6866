// The f64 reference: views (reshape, permute, slice, ...) as shape, strides
// and offset over a dense tensor, materialized.
#include "conformance/reference_impl.hpp"

namespace backplane::conformance::refimpl {

// ---------------------------------------------------------------------------
// Views over a dense tensor: shape, strides and offset in elements.

struct RefView {
  Shape shape;
  std::vector<int64_t> strides;
  int64_t offset = 0;
};

RefView dense_view(const Shape& s) { return RefView{s, dense_strides(s), 0}; }

RefView apply_view(const std::string& op, const RefView& v, const Json& p) {
  const auto rank = static_cast<int64_t>(v.shape.size());
  RefView r = v;
  if (op == "contiguous") return r;
  if (op == "reshape") {
    if (v.strides != dense_strides(v.shape) || v.offset != 0) bad(op, "reference reshape needs dense input");
    Shape shape = p.at("shape").get<Shape>();
    int64_t known = 1, infer = -1;
    for (size_t k = 0; k < shape.size(); ++k) {
      if (shape[k] == -1) {
        if (infer >= 0) bad(op, "two -1 entries");
        infer = static_cast<int64_t>(k);
      } else if (shape[k] < 0) {
        bad(op, "negative size");
      } else {
        known *= shape[k];
      }
    }
    const int64_t n = shape_numel(v.shape);
    if (infer >= 0) {
      if (known == 0 || n % known != 0) bad(op, "cannot infer -1");
      shape[static_cast<size_t>(infer)] = n / known;
    }
    if (shape_numel(shape) != n) bad(op, "element count differs");
    return dense_view(shape);
  }
  if (op == "permute") {
    auto dims = p.at("dims").get<std::vector<int64_t>>();
    if (static_cast<int64_t>(dims.size()) != rank) bad(op, "dims must name every dim");
    std::vector<bool> used(static_cast<size_t>(rank), false);
    for (size_t k = 0; k < dims.size(); ++k) {
      const int64_t d = norm_dim(op, dims[k], rank);
      if (used[static_cast<size_t>(d)]) bad(op, "repeated dim");
      used[static_cast<size_t>(d)] = true;
      r.shape[k] = v.shape[static_cast<size_t>(d)];
      r.strides[k] = v.strides[static_cast<size_t>(d)];
    }
    return r;
  }
  if (op == "transpose") {
    const auto d0 = static_cast<size_t>(norm_dim(op, require_int(op, p, "dim0"), rank));
    const auto d1 = static_cast<size_t>(norm_dim(op, require_int(op, p, "dim1"), rank));
    std::swap(r.shape[d0], r.shape[d1]);
    std::swap(r.strides[d0], r.strides[d1]);
    return r;
  }
  if (op == "broadcast_to") {
    const Shape target = p.at("shape").get<Shape>();
    if (target.size() < v.shape.size()) bad(op, "target rank smaller than input rank");
    r.shape = target;
    r.strides.assign(target.size(), 0);
    const size_t lead = target.size() - v.shape.size();
    for (size_t k = 0; k < v.shape.size(); ++k) {
      if (v.shape[k] == target[lead + k]) {
        r.strides[lead + k] = v.strides[k];
      } else if (v.shape[k] != 1) {
        bad(op, "cannot broadcast");
      }
    }
    return r;
  }
  if (op == "slice") {
    const auto d = static_cast<size_t>(norm_dim(op, require_int(op, p, "dim"), rank));
    const int64_t step = p_int(p, "step", 1);
    if (step == 0) bad(op, "step 0");
    const int64_t n = v.shape[d];
    // NumPy's clamping.
    int64_t start, end;
    if (step > 0) {
      start = has(p, "start") ? p["start"].get<int64_t>() : 0;
      end = has(p, "end") ? p["end"].get<int64_t>() : n;
      if (start < 0) start += n;
      if (end < 0) end += n;
      start = std::clamp<int64_t>(start, 0, n);
      end = std::clamp<int64_t>(end, 0, n);
    } else {
      start = has(p, "start") ? p["start"].get<int64_t>() : n - 1;
      end = has(p, "end") ? p["end"].get<int64_t>() : -1 - n;  // "before index 0"
      if (start < 0) start += n;
      if (end < 0) end += n;
      start = std::clamp<int64_t>(start, -1, n - 1);
      end = std::clamp<int64_t>(end, -1, n - 1);
    }
    int64_t len = 0;
    if (step > 0 && end > start) len = (end - start + step - 1) / step;
    if (step < 0 && start > end) len = (start - end + (-step) - 1) / (-step);
    r.shape[d] = len;
    r.strides[d] = v.strides[d] * step;
    if (len > 0) r.offset = v.offset + start * v.strides[d];
    return r;
  }
  if (op == "squeeze") {
    auto dims = p_ints(p, "dims");
    std::vector<bool> drop(static_cast<size_t>(rank), false);
    if (dims) {
      for (int64_t d0 : *dims) {
        const auto d = static_cast<size_t>(norm_dim(op, d0, rank));
        if (v.shape[d] != 1) bad(op, "squeeze of a dim whose size is not 1");
        drop[d] = true;
      }
    } else {
      for (size_t k = 0; k < v.shape.size(); ++k) drop[k] = v.shape[k] == 1;
    }
    r.shape.clear();
    r.strides.clear();
    for (size_t k = 0; k < v.shape.size(); ++k) {
      if (drop[k]) continue;
      r.shape.push_back(v.shape[k]);
      r.strides.push_back(v.strides[k]);
    }
    return r;
  }
  if (op == "unsqueeze") {
    const int64_t d = norm_dim(op, require_int(op, p, "dim"), rank + 1);
    r.shape.insert(r.shape.begin() + d, 1);
    r.strides.insert(r.strides.begin() + d, 0);
    return r;
  }
  bad(op, "not a view op");
}

HostTensor materialize(const HostTensor& x, const RefView& v) {
  HostTensor out = make_tensor(x.dtype, v.shape);
  const size_t es = dtype_size(x.dtype);
  for (MultiIndex m(v.shape); m; ++m) {
    int64_t src = v.offset;
    for (size_t k = 0; k < v.shape.size(); ++k) src += m[k] * v.strides[k];
    std::memcpy(out.bytes.data() + static_cast<size_t>(m.flat()) * es, x.bytes.data() + static_cast<size_t>(src) * es,
                es);
  }
  return out;
}

bool is_view_op(const std::string& op) {
  static const char* const ops[] = {"contiguous", "reshape",  "permute", "transpose",
                                    "broadcast_to", "slice", "squeeze", "unsqueeze"};
  return std::find_if(std::begin(ops), std::end(ops), [&](const char* o) { return op == o; }) != std::end(ops);
}

HostTensor view_reference(const std::string& op, const HostTensor& x, const Json& params) {
  return materialize(x, apply_view(op, dense_view(x.shape), params));
}

}  // namespace backplane::conformance::refimpl
