// Shape and dtype inference of the standard ops, per op family: each
// function gets its node's checked arguments (Args) and fills the result.
#include "ops_spec.hpp"
#include "fused_program.hpp"

#include <cstring>

namespace backplane::detail::spec {

// ---- shape helpers ------------------------------------------------------------------

bp_op_params params_of(bp_params_kind kind) {
  // Zeroed, padding included: equal params are equal bytes (pass_patterns.cpp
  // compares them so).
  bp_op_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof(bp_op_params);
  p.kind = kind;
  return p;
}

// The NumPy broadcast of several shapes (a 0 against a 1 gives 0).
Shape broadcast_shapes(const Args& a, const std::vector<const Shape*>& shapes) {
  size_t rank = 0;
  for (auto* s : shapes) rank = std::max(rank, s->size());
  Shape out(rank, 1);
  for (auto* s : shapes) {
    const size_t lead = rank - s->size();
    for (size_t i = 0; i < s->size(); ++i) {
      const int64_t d = (*s)[i];
      int64_t& o = out[lead + i];
      if (d == o || d == 1) continue;
      if (o == 1) {
        o = d;
        continue;
      }
      std::string text;
      for (auto* w : shapes) text += (text.empty() ? "" : " and ") + shape_str(*w);
      a.fail("shapes " + text + " do not broadcast");
    }
  }
  return out;
}

// A shape the core can hold: its element count, and the product of its
// non-zero dims (the strides of its dense layout), within 2^62.
void check_counts(const Args& a, const Shape& shape) {
  int64_t n = 1;
  for (auto d : shape) {
    if (d < 0) a.fail("negative dim in " + shape_str(shape));
    n = checked_mul(n, std::max<int64_t>(d, 1), a.where() + ": the element count of " + shape_str(shape));
  }
}

Shape reduced_shape(const Shape& in, const std::vector<int32_t>& dims, bool keepdim) {
  Shape out;
  for (size_t i = 0; i < in.size(); ++i) {
    const bool r = std::find(dims.begin(), dims.end(), static_cast<int32_t>(i)) != dims.end();
    if (!r)
      out.push_back(in[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

// The dims param of reductions: given (normalised, sorted), or every dim.
std::vector<int32_t> reduce_dims(const Args& a, int64_t rank) {
  std::vector<int32_t> dims;
  if (!a.given("dims")) {
    for (int64_t i = 0; i < rank; ++i) dims.push_back(static_cast<int32_t>(i));
    return dims;
  }
  for (auto d : a.ints("dims")) dims.push_back(static_cast<int32_t>(d));
  std::sort(dims.begin(), dims.end());
  return dims;
}

// ---- inference, per op family ------------------------------------------------------------
// The reader has checked arity, input dtypes and ranks and every param; the
// generic code after these fills output dtypes from the table and checks
// output ranks and element counts.

void same_shape(const Args& a, InferredNode& r) { r.out.shape = a.x(0).shape; }

void gelu(const Args& a, InferredNode& r) {
  r.params.u.gelu.tanh_approximation = a.s("approximate") == "tanh";
  same_shape(a, r);
}

// Integer bounds must fit the input's dtype (a u8 clamped to 300 has no answer).
bool fits(bp_dtype d, int64_t v) {
  switch (d) {
    case BP_DTYPE_I8:
      return v >= INT8_MIN && v <= INT8_MAX;
    case BP_DTYPE_I16:
      return v >= INT16_MIN && v <= INT16_MAX;
    case BP_DTYPE_I32:
      return v >= INT32_MIN && v <= INT32_MAX;
    case BP_DTYPE_U8:
      return v >= 0 && v <= UINT8_MAX;
    default:
      return true;
  }
}

void clamp(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  auto& p = r.params.u.clamp;
  for (const char* name : {"min", "max"}) {
    if (!a.given(name)) continue;
    const bool is_min = name[1] == 'i';
    (is_min ? p.has_min : p.has_max) = true;
    (is_min ? p.min_f : p.max_f) = a.f(name);
    if (is_int(x.dtype)) {
      if (!a.integral(name))
        a.fail(std::string("param '") + name + "' must be an integer for an integer input");
      if (!fits(x.dtype, a.i(name)))
        a.fail(std::string("param '") + name + "' = " + std::to_string(a.i(name)) + " is out of range for " +
               std::string(dtype_name(x.dtype)));
      (is_min ? p.min_i : p.max_i) = a.i(name);
    }
  }
  same_shape(a, r);
}

void affine(const Args& a, InferredNode& r) {
  r.params.u.affine.mul = a.f("mul");
  r.params.u.affine.add = a.f("add");
  same_shape(a, r);
}

void cast(const Args& a, InferredNode& r) {
  r.params.u.cast.dtype = a.dtype("dtype");
  same_shape(a, r);
}

void broadcast_all(const Args& a, InferredNode& r) {
  std::vector<const Shape*> shapes;
  for (size_t i = 0; i < a.n_inputs(); ++i) shapes.push_back(&a.x(i).shape);
  r.out.shape = broadcast_shapes(a, shapes);
}

static_assert(sizeof(bp_fused_params) <= sizeof(bp_conv2d_params), "bp_op_params must not grow");

// fused_elementwise: x0 carries the compute dtype (float, the output's);
// every other input has it or is a condition (bool). At most 16 inputs, all
// broadcast to the output's shape. The program is read and checked here.
void fused_elementwise(const Args& a, InferredNode& r) {
  const bp_dtype compute = a.x(0).dtype;
  if (compute == BP_DTYPE_BOOL) a.fail(a.label(0) + " must have the compute dtype (a float), not bool");
  if (a.n_inputs() > 16) a.fail("takes at most 16 inputs, got " + std::to_string(a.n_inputs()));
  std::vector<bool> cond;
  for (size_t i = 0; i < a.n_inputs(); ++i) {
    const bp_dtype d = a.x(i).dtype;
    if (d != compute && d != BP_DTYPE_BOOL)
      a.fail(a.label(i) + " has dtype " + std::string(dtype_name(d)) + "; fused_elementwise takes " +
             std::string(dtype_name(compute)) + " (x0's) or bool");
    cond.push_back(d == BP_DTYPE_BOOL);
  }
  auto prog = std::make_shared<Program>(
      parse_program(a.node().params.value("program", Json()), cond, [&](const std::string& m) { a.fail(m); }));
  r.params.u.fused.code = prog->data();
  r.params.u.fused.n_code = static_cast<uint32_t>(prog->size());
  r.program = std::move(prog);
  broadcast_all(a, r);
}

// ---- layout ops

void view_common(const Args& a, InferredNode& r, std::function<Layout(const Layout&)> f) {
  const auto& x = a.x(0);
  // Run the view once on a dense layout to check it and get the shape.
  Layout out;
  try {
    out = f(Layout::contiguous(x.shape));
  } catch (const Error& e) {
    a.fail(e.what());
  }
  r.out.shape = out.shape();
  r.view = [f](const Layout& l) -> std::optional<Layout> { return f(l); };
}

void permute(const Args& a, InferredNode& r) {
  const auto dims = a.ints("dims");
  view_common(a, r, [dims](const Layout& l) { return l.permute(dims); });
}
void transpose(const Args& a, InferredNode& r) {
  const auto d0 = a.i("dim0"), d1 = a.i("dim1");
  view_common(a, r, [d0, d1](const Layout& l) { return l.transpose(d0, d1); });
}
void broadcast_to(const Args& a, InferredNode& r) {
  const Shape shape = a.ints("shape");
  check_counts(a, shape);
  view_common(a, r, [shape](const Layout& l) { return l.broadcast_to(shape); });
}
void slice(const Args& a, InferredNode& r) {
  const auto dim = a.i("dim");
  std::optional<int64_t> start, end;
  if (a.given("start")) start = a.i("start");
  if (a.given("end")) end = a.i("end");
  // A step beyond the dim's size takes at most one element either way; bound
  // it by the size so that stride * step cannot overflow.
  const int64_t n = std::max<int64_t>(a.x(0).shape[static_cast<size_t>(dim)], 1);
  const int64_t step = std::clamp(a.i("step"), -n, n);
  view_common(a, r, [=](const Layout& l) { return l.slice(dim, start, end, step); });
}
void squeeze(const Args& a, InferredNode& r) {
  std::optional<std::vector<int64_t>> dims;
  if (a.given("dims")) dims = a.ints("dims");
  view_common(a, r, [dims](const Layout& l) { return l.squeeze(dims); });
}
void unsqueeze(const Args& a, InferredNode& r) {
  const auto dim = a.i("dim");
  view_common(a, r, [dim](const Layout& l) { return l.unsqueeze(dim); });
}
void reshape(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  Shape shape = a.ints("shape");
  if (shape.size() > BP_MAX_RANK) a.fail("rank " + std::to_string(shape.size()) + " exceeds 8");
  const std::string what = a.where() + ": shape " + shape_str(shape);
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer_at >= 0) a.fail("shape " + shape_str(shape) + " has more than one -1");
      infer_at = static_cast<int64_t>(i);
    } else {
      known = checked_mul(known, shape[i], what);
    }
  }
  const int64_t n = checked_numel(x.shape, a.where());
  if (infer_at >= 0) {
    if (known == 0 || n % known != 0)
      a.fail("cannot reshape " + shape_str(x.shape) + " to " + shape_str(shape));
    shape[static_cast<size_t>(infer_at)] = n / known;
  }
  check_counts(a, shape);
  if (checked_numel(shape, what) != n)
    a.fail("cannot reshape " + shape_str(x.shape) + " (" + std::to_string(n) + " elements) to " +
           shape_str(shape));
  r.out.shape = shape;
  r.view = [shape](const Layout& l) { return l.reshape(shape); };
}
void slot_view(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto slot = a.i("slot");
  if (slot >= static_cast<int64_t>(x.slots.size()))
    a.fail("slot " + std::to_string(slot) + " out of range (the producer has " +
           std::to_string(x.slots.size()) + " slots)");
  r.slot = slot;
  r.out = {x.slots[static_cast<size_t>(slot)].first, x.slots[static_cast<size_t>(slot)].second, {}};
}

// ---- reductions

void reduce(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  auto& p = r.params.u.reduce;
  const auto dims = reduce_dims(a, static_cast<int64_t>(x.shape.size()));
  p.n_dims = static_cast<uint32_t>(dims.size());
  std::copy(dims.begin(), dims.end(), p.dims);
  p.keepdim = a.b("keepdim");
  if (a.op().name == "max" || a.op().name == "min")
    for (auto d : dims)
      if (x.shape[static_cast<size_t>(d)] == 0)
        a.fail("reduction over the empty dim " + std::to_string(d) + " of " + shape_str(x.shape));
  r.out.shape = reduced_shape(x.shape, dims, p.keepdim);
}

void arg_reduce(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  auto& p = r.params.u.arg_reduce;
  p.dim = static_cast<int32_t>(a.i("dim"));
  p.keepdim = a.b("keepdim");
  p.select_last_index = a.b("select_last_index");
  if (x.shape.empty()) return;  // a scalar: its own index, shape []
  if (x.shape[static_cast<size_t>(p.dim)] == 0)
    a.fail("reduction over the empty dim " + std::to_string(p.dim));
  r.out.shape = reduced_shape(x.shape, {p.dim}, p.keepdim);
}

void dim_op(const Args& a, InferredNode& r) {
  r.params.u.dim.dim = static_cast<int32_t>(a.i("dim"));
  if (a.op().name == "cumsum") {
    r.params.u.dim.exclusive = a.b("exclusive");
    r.params.u.dim.reverse = a.b("reverse");
  }
  same_shape(a, r);
}

void layer_norm(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto rank = static_cast<int64_t>(x.shape.size());
  const auto& raw = a.ints("dims");
  const std::set<int64_t> s(raw.begin(), raw.end());
  if (*s.begin() != rank - static_cast<int64_t>(s.size()))
    a.fail("dims " + a.node().params["dims"].dump() + " must be the trailing dims of rank " +
           std::to_string(rank));
  const Shape norm_shape(x.shape.end() - static_cast<int64_t>(s.size()), x.shape.end());
  for (size_t i = 1; i < 3; ++i) {
    const ValueType* v = a.opt(i);
    if (v && v->shape != norm_shape)
      a.fail(a.label(i) + " has shape " + shape_str(v->shape) + ", expected " + shape_str(norm_shape));
  }
  r.params.u.layer_norm.n_dims = static_cast<uint32_t>(s.size());
  r.params.u.layer_norm.eps = a.f("eps");
  same_shape(a, r);
}

void var_mean(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  auto& p = r.params.u.var_mean;
  const auto dims = reduce_dims(a, static_cast<int64_t>(x.shape.size()));
  p.n_dims = static_cast<uint32_t>(dims.size());
  std::copy(dims.begin(), dims.end(), p.dims);
  p.correction = a.f("correction");
  p.keepdim = a.b("keepdim");
  const Shape out = reduced_shape(x.shape, dims, p.keepdim);
  r.out.slots = {{BP_DTYPE_INVALID, out}, {BP_DTYPE_INVALID, out}};
}

void topk(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  auto& p = r.params.u.topk;
  p.dim = static_cast<int32_t>(a.i("dim"));
  p.k = a.i("k");
  if (p.k > x.shape[static_cast<size_t>(p.dim)])
    a.fail("k=" + std::to_string(p.k) + " out of range for dim " + std::to_string(p.dim) + " of size " +
           std::to_string(x.shape[static_cast<size_t>(p.dim)]));
  p.largest = a.b("largest");
  p.sorted = a.b("sorted");
  Shape out = x.shape;
  out[static_cast<size_t>(p.dim)] = p.k;
  r.out.slots = {{BP_DTYPE_INVALID, out}, {BP_DTYPE_INVALID, out}};
}

void selective_scan(const Args& a, InferredNode& r) {
  const auto& u = a.x(0);
  const int64_t B = u.shape[0], L = u.shape[1], D = u.shape[2];
  const int64_t N = a.x(2).shape[1];
  auto expect = [&](size_t i, const Shape& s) {
    if (a.x(i).shape != s)
      a.fail(a.label(i) + " has shape " + shape_str(a.x(i).shape) + ", expected " + shape_str(s) + " (u is " +
             shape_str(u.shape) + ", a " + shape_str(a.x(2).shape) + ")");
  };
  expect(1, {B, L, D});
  expect(2, {D, N});
  expect(3, {B, L, N});
  expect(4, {B, L, N});
  r.params.u.selective_scan.delta_softplus = a.b("delta_softplus");
  r.out.slots = {{BP_DTYPE_INVALID, {B, L, D}}, {BP_DTYPE_INVALID, {B, D, N}}};
}

// ---- linear algebra, conv, indexing

void matmul(const Args& a, InferredNode& r) {
  const Shape& sa = a.x(0).shape;
  const Shape& sb = a.x(1).shape;
  Shape as = sa, bs = sb;
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  const int64_t M = as[as.size() - 2], K = as.back(), K2 = bs[bs.size() - 2], N = bs.back();
  if (K != K2)
    a.fail("shapes " + shape_str(sa) + " and " + shape_str(sb) + " do not match (" + std::to_string(K) +
           " vs " + std::to_string(K2) + ")");
  // Batch dims broadcast as NumPy's: a 0 against a 1 is 0.
  const Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  Shape out = broadcast_shapes(a, {&ab, &bb});
  if (!a1) out.push_back(M);
  if (!b1) out.push_back(N);
  r.out.shape = out;
}

void conv2d(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto& w = a.x(1);
  auto& p = r.params.u.conv2d;
  const auto& st = a.ints("stride");
  const auto& dl = a.ints("dilation");
  const auto& pd = a.ints("padding");
  std::copy(st.begin(), st.end(), p.stride);
  std::copy(dl.begin(), dl.end(), p.dilation);
  std::copy(pd.begin(), pd.end(), p.padding);
  p.groups = a.i("groups");
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t O = w.shape[0], Cg = w.shape[1], kH = w.shape[2], kW = w.shape[3];
  if (kH == 0 || kW == 0)
    a.fail(a.label(1) + " has shape " + shape_str(w.shape) + "; kH and kW must be >= 1");
  if (C % p.groups != 0 || O % p.groups != 0)
    a.fail("groups=" + std::to_string(p.groups) + " must divide C=" + std::to_string(C) +
           " and O=" + std::to_string(O));
  if (Cg != C / p.groups)
    a.fail("w has " + std::to_string(Cg) + " input channels per group, expected " +
           std::to_string(C / p.groups));
  if (const ValueType* bias = a.opt(2); bias && bias->shape != Shape{O})
    a.fail(a.label(2) + " has shape " + shape_str(bias->shape) + ", expected [" + std::to_string(O) + "]");
  // Output size per spatial dim, every step checked: padding and dilation come from the graph.
  const std::string what = a.where() + ": conv2d geometry";
  auto out_size = [&](int64_t in, int64_t pad0, int64_t pad1, int64_t dil, int64_t k,
                      int64_t stride) -> int64_t {
    const int64_t padded = checked_add(checked_add(in, pad0, what), pad1, what);
    const int64_t span = checked_add(checked_mul(dil, std::max<int64_t>(k - 1, 0), what), 1, what);
    if (padded < span) return -1;
    return (padded - span) / stride + 1;
  };
  const int64_t Ho = out_size(H, p.padding[0], p.padding[2], p.dilation[0], kH, p.stride[0]);
  const int64_t Wo = out_size(W, p.padding[1], p.padding[3], p.dilation[1], kW, p.stride[1]);
  if (Ho < 0 || Wo < 0)
    a.fail("kernel " + shape_str({kH, kW}) + " larger than padded input " + shape_str({H, W}));
  r.out.shape = {N, O, Ho, Wo};
}

// ABI 1.5 added bp_pool2d_params to the union without growing it (its
// largest member is still conv2d's): plugins built against 1.4 keep their
// bp_op_params size.
static_assert(sizeof(bp_pool2d_params) <= sizeof(bp_conv2d_params), "bp_op_params must not grow");

static_assert(sizeof(bp_attention_params) <= sizeof(bp_conv2d_params), "bp_op_params must not grow");

// scaled_dot_product_attention: q [..., Sq, D], k [..., Sk, D], v [..., Sk,
// Dv] with the same batch dims (no broadcast between them: a kernel walks one
// batch of each together); the mask broadcasts to [..., Sq, Sk].
void attention(const Args& a, InferredNode& r) {
  const Shape& q = a.x(0).shape;
  const Shape& k = a.x(1).shape;
  const Shape& v = a.x(2).shape;
  const size_t rank = q.size();
  if (k.size() != rank || v.size() != rank)
    a.fail("q, k and v must have one rank (" + shape_str(q) + ", " + shape_str(k) + ", " + shape_str(v) + ")");
  const Shape batch(q.begin(), q.end() - 2);
  if (Shape(k.begin(), k.end() - 2) != batch || Shape(v.begin(), v.end() - 2) != batch)
    a.fail("q, k and v must have the same batch dims (" + shape_str(q) + ", " + shape_str(k) + ", " + shape_str(v) +
           ")");
  const int64_t Sq = q[rank - 2], D = q[rank - 1], Sk = k[rank - 2];
  if (k[rank - 1] != D)
    a.fail("k's last dim is " + std::to_string(k[rank - 1]) + ", q's is " + std::to_string(D) + "; they must match");
  if (v[rank - 2] != Sk)
    a.fail("v has " + std::to_string(v[rank - 2]) + " rows, k has " + std::to_string(Sk) + "; they must match");
  Shape scores = batch;
  scores.push_back(Sq);
  scores.push_back(Sk);
  if (const ValueType* m = a.opt(3)) {
    if (m->shape.size() > scores.size())
      a.fail(a.label(3) + " has shape " + shape_str(m->shape) + ", of higher rank than the scores " +
             shape_str(scores));
    if (broadcast_shapes(a, {&scores, &m->shape}) != scores)
      a.fail(a.label(3) + " has shape " + shape_str(m->shape) + ", which does not broadcast to the scores " +
             shape_str(scores));
  }
  auto& p = r.params.u.attention;
  p.scale = a.given("scale") ? a.f("scale") : (D > 0 ? 1.0 / std::sqrt(static_cast<double>(D)) : 1.0);
  if (!std::isfinite(p.scale)) a.fail("scale must be finite");
  p.causal = a.b("causal");
  r.out.shape = batch;
  r.out.shape.push_back(Sq);
  r.out.shape.push_back(v[rank - 1]);
}

// max_pool2d, avg_pool2d: one window per output element, each of x's N·C
// planes on its own. H' as conv2d's, or rounded up with ceil_mode; a last
// window that would start in the bottom/right padding is dropped (PyTorch,
// ONNX). Every value must fit the int32 fields of bp_pool2d_params.
void pool2d(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  auto& p = r.params.u.pool2d;
  const auto& ks = a.ints("kernel_size");
  const auto& st = a.given("stride") ? a.ints("stride") : ks;  // absent: the kernel size, as PyTorch
  const auto& pd = a.ints("padding");
  const auto& dl = a.ints("dilation");
  auto i32 = [&](const char* name, int64_t v) {
    if (v > INT32_MAX)
      a.fail(std::string("param '") + name + "' = " + std::to_string(v) + " does not fit int32");
    return static_cast<int32_t>(v);
  };
  for (int i = 0; i < 2; ++i) {
    p.kernel[i] = i32("kernel_size", ks[static_cast<size_t>(i)]);
    p.stride[i] = i32(a.given("stride") ? "stride" : "kernel_size", st[static_cast<size_t>(i)]);
    p.dilation[i] = i32("dilation", dl[static_cast<size_t>(i)]);
  }
  for (int i = 0; i < 4; ++i) p.padding[i] = i32("padding", pd[static_cast<size_t>(i)]);
  p.ceil_mode = a.b("ceil_mode");
  p.count_include_pad = a.op().name == "avg_pool2d" && a.b("count_include_pad");
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const std::string what = a.where() + ": pool2d geometry";
  auto out_size = [&](int64_t in, int64_t pad0, int64_t pad1, int64_t dil, int64_t k, int64_t stride) -> int64_t {
    const int64_t padded = checked_add(checked_add(in, pad0, what), pad1, what);
    const int64_t span = checked_add(checked_mul(dil, k - 1, what), 1, what);
    if (padded < span) return -1;
    int64_t n = (padded - span) / stride + 1;
    if (p.ceil_mode && (padded - span) % stride != 0) {
      ++n;
      if ((n - 1) * stride >= in + pad0) --n;  // the last window would start past the input and top/left padding
    }
    return n;
  };
  const int64_t Ho = out_size(H, p.padding[0], p.padding[2], p.dilation[0], p.kernel[0], p.stride[0]);
  const int64_t Wo = out_size(W, p.padding[1], p.padding[3], p.dilation[1], p.kernel[1], p.stride[1]);
  if (Ho < 0 || Wo < 0)
    a.fail("kernel " + shape_str({p.kernel[0], p.kernel[1]}) + " with dilation " +
           shape_str({p.dilation[0], p.dilation[1]}) + " spans more than the padded input " +
           shape_str({H + p.padding[0] + p.padding[2], W + p.padding[1] + p.padding[3]}));
  r.out.shape = {N, C, Ho, Wo};
}

void gather(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto& idx = a.x(1);
  const auto rank = static_cast<int64_t>(x.shape.size());
  if (static_cast<int64_t>(idx.shape.size()) != rank)
    a.fail("index rank " + std::to_string(idx.shape.size()) + " differs from input rank " +
           std::to_string(rank));
  r.params.u.dim.dim = static_cast<int32_t>(a.i("dim"));
  for (int64_t i = 0; i < rank; ++i)
    if (i != r.params.u.dim.dim && idx.shape[static_cast<size_t>(i)] > x.shape[static_cast<size_t>(i)])
      a.fail("index shape " + shape_str(idx.shape) + " exceeds input shape " + shape_str(x.shape) +
             " in dim " + std::to_string(i));
  r.out.shape = idx.shape;
}

void index_select(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto& idx = a.x(1);
  const auto d = a.i("dim");
  r.params.u.dim.dim = static_cast<int32_t>(d);
  Shape out(x.shape.begin(), x.shape.begin() + d);
  out.insert(out.end(), idx.shape.begin(), idx.shape.end());
  out.insert(out.end(), x.shape.begin() + d + 1, x.shape.end());
  if (x.shape[static_cast<size_t>(d)] == 0 &&
      std::find(idx.shape.begin(), idx.shape.end(), 0) == idx.shape.end())
    a.fail("cannot select from the empty dim " + std::to_string(d));
  r.out.shape = out;
}

void concat(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto rank = static_cast<int64_t>(x.shape.size());
  const auto d = a.i("dim");
  Shape out = x.shape;
  out[static_cast<size_t>(d)] = 0;
  for (size_t i = 0; i < a.n_inputs(); ++i) {
    const auto& v = a.x(i);
    if (static_cast<int64_t>(v.shape.size()) != rank)
      a.fail(a.label(i) + " has rank " + std::to_string(v.shape.size()) + ", " + a.label(0) + " " +
             std::to_string(rank));
    for (int64_t k = 0; k < rank; ++k)
      if (k != d && v.shape[static_cast<size_t>(k)] != x.shape[static_cast<size_t>(k)])
        a.fail(a.label(i) + " has shape " + shape_str(v.shape) + ", " + a.label(0) + " " +
               shape_str(x.shape));
    out[static_cast<size_t>(d)] = checked_add(out[static_cast<size_t>(d)], v.shape[static_cast<size_t>(d)],
                                              a.where() + ": the size of dim " + std::to_string(d));
  }
  r.params.u.dim.dim = static_cast<int32_t>(d);
  r.out.shape = out;
}

void slice_update(const Args& a, InferredNode& r) {
  const auto& x = a.x(0);
  const auto& u = a.x(1);
  const auto& start = a.x(2);
  const auto d = a.i("dim");
  if (u.shape.size() != x.shape.size())
    a.fail(a.label(1) + " has rank " + std::to_string(u.shape.size()) + ", " + a.label(0) + " " +
           std::to_string(x.shape.size()));
  for (size_t k = 0; k < x.shape.size(); ++k) {
    const bool along = static_cast<int64_t>(k) == d;
    if (along ? u.shape[k] > x.shape[k] : u.shape[k] != x.shape[k])
      a.fail(a.label(1) + " has shape " + shape_str(u.shape) + ", which does not fit in " + a.label(0) + " " +
             shape_str(x.shape) + " along dim " + std::to_string(d));
  }
  int64_t n = 1;
  for (auto s : start.shape) n *= s;
  if (n != 1) a.fail(a.label(2) + " must hold one element, it has shape " + shape_str(start.shape));
  r.params.u.dim.dim = static_cast<int32_t>(d);
  r.out.shape = x.shape;
}

}  // namespace backplane::detail::spec
