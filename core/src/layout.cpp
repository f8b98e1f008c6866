// Layout view ops. Every op here only rewrites shape/strides/offset.
#include <backplane/backplane.hpp>

#include <algorithm>
#include <numeric>
#include <sstream>

namespace backplane {

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << ']';
  return o.str();
}

namespace {
int64_t norm_dim(int64_t d, size_t rank, const char* what) {
  const auto r = static_cast<int64_t>(rank);
  if (d < -r || d >= r || (r == 0))
    throw Error(std::string(what) + ": dim " + std::to_string(d) + " out of range for rank " + std::to_string(r));
  return d < 0 ? d + r : d;
}
}  // namespace

Layout::Layout(Shape shape, std::vector<int64_t> strides, int64_t offset)
    : shape_(std::move(shape)), strides_(std::move(strides)), offset_(offset) {
  if (shape_.size() != strides_.size()) throw Error("layout: shape and strides differ in rank");
  if (shape_.size() > BP_MAX_RANK) throw Error("layout: rank " + std::to_string(shape_.size()) + " exceeds 8");
  for (auto d : shape_)
    if (d < 0) throw Error("layout: negative dim in shape " + shape_str(shape_));
}

Layout Layout::contiguous(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    // A 0 dim elsewhere keeps the element count small while the strides of
    // the other dims still multiply: [0, 2^61, 4] must not wrap.
    if (i > 0 && (__builtin_mul_overflow(s, std::max<int64_t>(shape[i], 1), &s) || s > (int64_t{1} << 62)))
      throw Error("layout: the strides of " + shape_str(shape) + " overflow (the limit is 2^62)", BP_ERR_OUT_OF_RANGE);
  }
  return Layout(shape, std::move(strides), 0);
}

Layout Layout::from_bp(const bp_layout& l) {
  Shape shape(l.shape, l.shape + l.rank);
  std::vector<int64_t> strides(l.strides, l.strides + l.rank);
  return Layout(std::move(shape), std::move(strides), l.offset);
}

int64_t Layout::numel() const {
  int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

bool Layout::is_contiguous() const {
  if (offset_ != 0) return false;
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 0) return true;
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

std::pair<int64_t, int64_t> Layout::extent() const {
  if (numel() == 0) return {offset_, offset_ - 1};
  int64_t lo = offset_, hi = offset_;
  for (size_t i = 0; i < shape_.size(); ++i) {
    const int64_t span = (shape_[i] - 1) * strides_[i];
    if (span < 0) lo += span; else hi += span;
  }
  return {lo, hi};
}

bp_layout Layout::to_bp() const {
  bp_layout l{};
  l.rank = static_cast<uint32_t>(shape_.size());
  for (size_t i = 0; i < shape_.size(); ++i) {
    l.shape[i] = shape_[i];
    l.strides[i] = strides_[i];
  }
  l.offset = offset_;
  return l;
}

Layout Layout::permute(const std::vector<int64_t>& dims) const {
  if (dims.size() != rank())
    throw Error("permute: dims has " + std::to_string(dims.size()) + " entries for rank " + std::to_string(rank()));
  std::vector<bool> seen(rank(), false);
  Shape shape(rank());
  std::vector<int64_t> strides(rank());
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = norm_dim(dims[i], rank(), "permute");
    if (seen[d]) throw Error("permute: dim " + std::to_string(dims[i]) + " repeated");
    seen[d] = true;
    shape[i] = shape_[d];
    strides[i] = strides_[d];
  }
  return Layout(std::move(shape), std::move(strides), offset_);
}

Layout Layout::transpose(int64_t dim0, int64_t dim1) const {
  std::vector<int64_t> dims(rank());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[norm_dim(dim0, rank(), "transpose")], dims[norm_dim(dim1, rank(), "transpose")]);
  return permute(dims);
}

Layout Layout::broadcast_to(const Shape& shape) const {
  if (shape.size() < rank())
    throw Error("broadcast_to: cannot broadcast " + shape_str(shape_) + " to " + shape_str(shape));
  const size_t lead = shape.size() - rank();
  std::vector<int64_t> strides(shape.size(), 0);
  for (size_t i = 0; i < rank(); ++i) {
    const int64_t want = shape[lead + i];
    if (shape_[i] == want) {
      strides[lead + i] = strides_[i];
    } else if (shape_[i] == 1) {
      strides[lead + i] = 0;
    } else {
      throw Error("broadcast_to: cannot broadcast " + shape_str(shape_) + " to " + shape_str(shape));
    }
  }
  return Layout(shape, std::move(strides), offset_);
}

Layout Layout::slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) const {
  const int64_t d = norm_dim(dim, rank(), "slice");
  if (step == 0) throw Error("slice: step must not be 0");
  const int64_t n = shape_[d];
  // NumPy's clamping rules.
  int64_t s, e;
  if (step > 0) {
    s = start ? (*start < 0 ? std::max<int64_t>(*start + n, 0) : std::min(*start, n)) : 0;
    e = end ? (*end < 0 ? std::max<int64_t>(*end + n, 0) : std::min(*end, n)) : n;
  } else {
    s = start ? (*start < 0 ? std::max<int64_t>(*start + n, -1) : std::min(*start, n - 1)) : n - 1;
    e = end ? (*end < 0 ? std::max<int64_t>(*end + n, -1) : std::min(*end, n - 1)) : -1;
  }
  int64_t len = 0;
  if (step > 0 && e > s) len = (e - s + step - 1) / step;
  if (step < 0 && s > e) len = (s - e + (-step) - 1) / (-step);
  Shape shape = shape_;
  std::vector<int64_t> strides = strides_;
  shape[d] = len;
  strides[d] = strides_[d] * step;
  const int64_t offset = len > 0 ? offset_ + s * strides_[d] : offset_;
  return Layout(std::move(shape), std::move(strides), offset);
}

Layout Layout::squeeze(const std::optional<std::vector<int64_t>>& dims) const {
  std::vector<bool> drop(rank(), false);
  if (dims) {
    for (auto raw : *dims) {
      const int64_t d = norm_dim(raw, rank(), "squeeze");
      if (shape_[d] != 1)
        throw Error("squeeze: dim " + std::to_string(raw) + " has size " + std::to_string(shape_[d]) + ", not 1");
      drop[d] = true;
    }
  } else {
    for (size_t i = 0; i < rank(); ++i) drop[i] = shape_[i] == 1;
  }
  Shape shape;
  std::vector<int64_t> strides;
  for (size_t i = 0; i < rank(); ++i)
    if (!drop[i]) {
      shape.push_back(shape_[i]);
      strides.push_back(strides_[i]);
    }
  return Layout(std::move(shape), std::move(strides), offset_);
}

Layout Layout::unsqueeze(int64_t dim) const {
  const int64_t out_rank = static_cast<int64_t>(rank()) + 1;
  if (dim < -out_rank || dim >= out_rank)
    throw Error("unsqueeze: dim " + std::to_string(dim) + " out of range for output rank " + std::to_string(out_rank));
  const int64_t d = dim < 0 ? dim + out_rank : dim;
  Shape shape = shape_;
  std::vector<int64_t> strides = strides_;
  const int64_t st = d < static_cast<int64_t>(rank()) ? strides_[d] * shape_[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, st);
  return Layout(std::move(shape), std::move(strides), offset_);
}

std::optional<Layout> Layout::reshape(const Shape& shape) const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  if (n != numel())
    throw Error("reshape: cannot reshape " + shape_str(shape_) + " (" + std::to_string(numel()) + " elements) to " +
                shape_str(shape));
  if (is_contiguous() || n == 0) {
    Layout l = Layout::contiguous(shape);
    l.offset_ = offset_;
    return l;
  }
  // Group old dims into chunks that are contiguous among themselves and match
  // products of new dims (the rule NumPy and PyTorch use for views).
  std::vector<int64_t> new_strides(shape.size());
  size_t oi = 0, ni = 0;
  Shape os;
  std::vector<int64_t> ost;
  for (size_t i = 0; i < rank(); ++i)
    if (shape_[i] != 1) {
      os.push_back(shape_[i]);
      ost.push_back(strides_[i]);
    }
  while (ni < shape.size() || oi < os.size()) {
    if (ni < shape.size() && shape[ni] == 1) {
      new_strides[ni] = 1;
      ++ni;
      continue;
    }
    if (oi >= os.size() || ni >= shape.size()) return std::nullopt;
    // Take old dims until their product matches a product of new dims.
    size_t o_end = oi + 1, n_end = ni + 1;
    int64_t op = os[oi], np = shape[ni];
    while (op != np) {
      if (op < np) {
        if (o_end >= os.size()) return std::nullopt;
        if (ost[o_end - 1] != ost[o_end] * os[o_end]) return std::nullopt;
        op *= os[o_end++];
      } else {
        if (n_end >= shape.size()) return std::nullopt;
        np *= shape[n_end++];
      }
    }
    // Old chunk [oi, o_end) is internally contiguous; lay new dims over it.
    int64_t st = ost[o_end - 1];
    for (size_t k = n_end; k-- > ni;) {
      new_strides[k] = st;
      st *= shape[k];
    }
    oi = o_end;
    ni = n_end;
  }
  return Layout(shape, std::move(new_strides), offset_);
}

}  // namespace backplane
