// Each ONNX op (domain ai.onnx, opsets 11-18) mapped onto the standard ops of
// docs/ops.md. A handler reads the node's attributes and inputs as its opset
// defines them, emits one or more standard nodes (Importer::emit infers each
// with the core's op table and folds it when its inputs are known), and binds
// the node's outputs. docs/onnx.md lists the mapping.
#include "importer.hpp"

#include <cmath>
#include <cstring>

namespace backplane::onnx::detail {

namespace {

using NodeP = ::onnx::NodeProto;
using I = Importer;

[[noreturn]] void fail(I& imp, const NodeP& n, const std::string& what, bp_status_code code = BP_ERR_INVALID_ARGUMENT) {
  throw Error(imp.where(n) + ": " + what, code);
}

std::string out_name(const NodeP& n, const std::string& suffix = "") {
  std::string base = n.output_size() && !n.output(0).empty() ? n.output(0) : n.name();
  return suffix.empty() ? base : base + "." + suffix;
}

int64_t rank_of(const ValPtr& v) { return static_cast<int64_t>(v->type.shape.size()); }

int64_t norm_axis(I& imp, const NodeP& n, int64_t axis, int64_t rank, const char* what = "axis") {
  if (axis < -rank || axis >= rank)
    fail(imp, n, std::string(what) + " " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

ValPtr scalar(I& imp, double v, bp_dtype dt, const std::string& base) {
  HostTensor t(dt, {});
  if (is_float(dt)) t.set(0, v);
  else t.set_int(0, static_cast<int64_t>(v));
  return imp.constant(std::move(t), base);
}

// A constant output of `n` from data computed at import.
void bind_constant(I& imp, const NodeP& n, HostTensor t) { imp.set(n, 0, imp.constant(std::move(t), out_name(n))); }

HostTensor i64_tensor(const std::vector<int64_t>& v, bool scalar_shape = false) {
  HostTensor t(BP_DTYPE_I64, scalar_shape ? Shape{} : Shape{static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.as<int64_t>()[i] = v[i];
  return t;
}

// Axes from the attribute (older opsets) or from input k (newer): nullopt
// when neither is given.
std::optional<std::vector<int64_t>> axes_of(I& imp, const NodeP& n, int input_k) {
  if (auto a = I::attr_ints(n, "axes")) return a;
  if (imp.get(n, input_k)) return I::ints_of(imp.known(n, input_k, "axes"));
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Elementwise

Handler unary(const std::string& op) {
  return [op](I& imp, const NodeP& n) { imp.set(n, 0, imp.emit(out_name(n), op, {imp.need(n, 0)})); };
}

Handler binary(const std::string& op) {
  return [op](I& imp, const NodeP& n) {
    imp.set(n, 0, imp.emit(out_name(n), op, {imp.need(n, 0), imp.need(n, 1)}));
  };
}

// Max, Min, Sum, Mean: a chain of binary ops over every input.
Handler variadic(const std::string& op, bool mean = false) {
  return [op, mean](I& imp, const NodeP& n) {
    ValPtr acc = imp.need(n, 0);
    const int count = n.input_size();
    for (int k = 1; k < count; ++k)
      acc = imp.emit(out_name(n, k + 1 < count || mean ? std::to_string(k) : ""), op, {acc, imp.need(n, k)});
    if (mean && count > 1) acc = imp.emit(out_name(n), "affine", {acc}, {{"mul", 1.0 / count}});
    imp.set(n, 0, acc);
  };
}

void identity(I& imp, const NodeP& n) { imp.set(n, 0, imp.need(n, 0)); }

void dropout(I& imp, const NodeP& n) {
  if (n.output_size() > 1 && !n.output(1).empty() && imp.uses(n.output(1)))
    fail(imp, n, "the mask output is used; only inference (no mask) is supported", BP_ERR_UNIMPLEMENTED);
  if (imp.get(n, 2)) {
    const auto& t = imp.known(n, 2, "training_mode");
    if (t.numel() && t.get_int(0)) fail(imp, n, "training_mode is true; only inference is supported", BP_ERR_UNIMPLEMENTED);
  }
  identity(imp, n);
}

void pow_op(I& imp, const NodeP& n) {
  auto a = imp.need(n, 0), b = imp.need(n, 1);
  if (b->value && b->value->numel() == 1 && is_float(a->type.dtype) && b->type.shape.size() <= a->type.shape.size()) {
    const double e = b->value->get(0);
    const char* op = e == 2.0 ? "sqr" : e == 0.5 ? "sqrt" : e == -1.0 ? "recip" : nullptr;
    if (op) return imp.set(n, 0, imp.emit(out_name(n), op, {a}));
    if (e == 1.0) return imp.set(n, 0, a);
  }
  if (b->type.dtype != a->type.dtype) {
    if (!is_float(a->type.dtype)) fail(imp, n, "integer bases are not supported (pow takes floats)", BP_ERR_UNIMPLEMENTED);
    b = imp.emit(out_name(n, "exp"), "cast", {b}, {{"dtype", std::string(dtype_name(a->type.dtype))}});
  }
  imp.set(n, 0, imp.emit(out_name(n), "pow", {a, b}));
}

void cast(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  const auto to = dtype_of(static_cast<int32_t>(I::attr_i(n, "to", 0)));
  if (!to) fail(imp, n, "cast to " + onnx_type_name(static_cast<int32_t>(I::attr_i(n, "to", 0))) + ", which Backplane lacks",
                BP_ERR_UNIMPLEMENTED);
  if (*to == x->type.dtype) return imp.set(n, 0, x);
  imp.set(n, 0, imp.emit(out_name(n), "cast", {x}, {{"dtype", std::string(dtype_name(*to))}}));
}

void clip(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  std::optional<double> lo, hi;
  if (imp.opset() < 11) {
    if (I::attr(n, "min")) lo = I::attr_f(n, "min", 0);
    if (I::attr(n, "max")) hi = I::attr_f(n, "max", 0);
  } else {
    if (imp.get(n, 1)) lo = imp.known(n, 1, "min").get(0);
    if (imp.get(n, 2)) hi = imp.known(n, 2, "max").get(0);
  }
  if (!lo && !hi) return imp.set(n, 0, x);
  if (lo && *lo == 0.0 && !hi && is_float(x->type.dtype)) return imp.set(n, 0, imp.emit(out_name(n), "relu", {x}));
  Json p = Json::object();
  auto bound = [&](double v) -> Json {
    if (is_float(x->type.dtype)) return v;
    return static_cast<int64_t>(v);
  };
  if (lo) p["min"] = bound(*lo);
  if (hi) p["max"] = bound(*hi);
  imp.set(n, 0, imp.emit(out_name(n), "clamp", {x}, p));
}

void leaky_relu(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  const double alpha = I::attr_f(n, "alpha", 0.01);
  auto ax = imp.emit(out_name(n, "ax"), "affine", {x}, {{"mul", alpha}});
  if (alpha >= 0.0 && alpha <= 1.0) return imp.set(n, 0, imp.emit(out_name(n), "maximum", {x, ax}));
  auto pos = imp.emit(out_name(n, "pos"), "gt", {x, scalar(imp, 0, x->type.dtype, out_name(n, "zero"))});
  imp.set(n, 0, imp.emit(out_name(n), "where", {pos, x, ax}));
}

void elu(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  const double alpha = I::attr_f(n, "alpha", 1.0);
  auto e = imp.emit(out_name(n, "exp"), "exp", {x});
  auto neg = imp.emit(out_name(n, "neg"), "affine", {e}, {{"mul", alpha}, {"add", -alpha}});
  auto pos = imp.emit(out_name(n, "pos"), "gt", {x, scalar(imp, 0, x->type.dtype, out_name(n, "zero"))});
  imp.set(n, 0, imp.emit(out_name(n), "where", {pos, x, neg}));
}

ValPtr hard_sigmoid_of(I& imp, const ValPtr& x, double alpha, double beta, const std::string& base) {
  auto a = imp.emit(base + ".lin", "affine", {x}, {{"mul", alpha}, {"add", beta}});
  return imp.emit(base, "clamp", {a}, {{"min", 0.0}, {"max", 1.0}});
}

void hard_sigmoid(I& imp, const NodeP& n) {
  imp.set(n, 0, hard_sigmoid_of(imp, imp.need(n, 0), I::attr_f(n, "alpha", 0.2), I::attr_f(n, "beta", 0.5), out_name(n)));
}

void hard_swish(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  auto hs = hard_sigmoid_of(imp, x, 1.0 / 6.0, 0.5, out_name(n, "gate"));
  imp.set(n, 0, imp.emit(out_name(n), "mul", {x, hs}));
}

void logical_not(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  imp.set(n, 0, imp.emit(out_name(n), "eq", {x, scalar(imp, 0, BP_DTYPE_BOOL, out_name(n, "false"))}));
}
void logical_and(I& imp, const NodeP& n) {
  auto a = imp.need(n, 0), b = imp.need(n, 1);
  imp.set(n, 0, imp.emit(out_name(n), "where", {a, b, scalar(imp, 0, BP_DTYPE_BOOL, out_name(n, "false"))}));
}
void logical_or(I& imp, const NodeP& n) {
  auto a = imp.need(n, 0), b = imp.need(n, 1);
  imp.set(n, 0, imp.emit(out_name(n), "where", {a, scalar(imp, 1, BP_DTYPE_BOOL, out_name(n, "true")), b}));
}
void is_nan(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  imp.set(n, 0, imp.emit(out_name(n), "ne", {x, x}));
}

void where(I& imp, const NodeP& n) {
  imp.set(n, 0, imp.emit(out_name(n), "where", {imp.need(n, 0), imp.need(n, 1), imp.need(n, 2)}));
}

// ---------------------------------------------------------------------------
// Convolution, pooling, normalisation

struct Window {
  std::vector<int64_t> kernel, stride, dilation, pads;  // pads: top, left, bottom, right
};

// ONNX's spatial attributes of a 2-D Conv/Pool, with auto_pad resolved.
Window window_of(I& imp, const NodeP& n, const Shape& x, std::vector<int64_t> kernel) {
  Window w;
  w.kernel = std::move(kernel);
  w.stride = I::attr_ints(n, "strides").value_or(std::vector<int64_t>{1, 1});
  w.dilation = I::attr_ints(n, "dilations").value_or(std::vector<int64_t>{1, 1});
  w.pads = I::attr_ints(n, "pads").value_or(std::vector<int64_t>{0, 0, 0, 0});
  if (w.kernel.size() != 2 || w.stride.size() != 2 || w.dilation.size() != 2 || w.pads.size() != 4)
    fail(imp, n, "only 2-D windows are supported (kernel, strides, dilations of 2 values, pads of 4)", BP_ERR_UNIMPLEMENTED);
  const std::string ap = I::attr_s(n, "auto_pad", "NOTSET");
  if (ap == "VALID") {
    w.pads = {0, 0, 0, 0};
  } else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    for (int i = 0; i < 2; ++i) {
      const int64_t in = x[static_cast<size_t>(2 + i)], s = w.stride[static_cast<size_t>(i)];
      const int64_t kk = w.kernel[static_cast<size_t>(i)], dd = w.dilation[static_cast<size_t>(i)];
      // Values from the model: bounded before the arithmetic below.
      if (s < 1 || s > (int64_t{1} << 31) || kk < 1 || kk > (int64_t{1} << 31) || dd < 1 || dd > (int64_t{1} << 31) ||
          in > (int64_t{1} << 40))
        fail(imp, n, "auto_pad with strides, kernel or dilations out of range");
      const int64_t span = w.dilation[static_cast<size_t>(i)] * (w.kernel[static_cast<size_t>(i)] - 1) + 1;
      const int64_t out = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (out - 1) * s + span - in);
      const int64_t small = total / 2, big = total - small;
      w.pads[static_cast<size_t>(i)] = ap == "SAME_UPPER" ? small : big;
      w.pads[static_cast<size_t>(i + 2)] = ap == "SAME_UPPER" ? big : small;
    }
  } else if (ap != "NOTSET") {
    fail(imp, n, "unknown auto_pad '" + ap + "'");
  }
  return w;
}

// Conv (2-D), with a BatchNormalization right after it folded into its
// weights and bias when both are constants and nothing else reads the Conv.
void conv(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0), w = imp.need(n, 1);
  auto b = imp.get(n, 2);
  if (rank_of(x) != 4 || rank_of(w) != 4)
    fail(imp, n, "only 2-D convolutions (4-D x and w) are supported; x is " + shape_str(x->type.shape), BP_ERR_UNIMPLEMENTED);
  const Window win = window_of(imp, n, x->type.shape, {w->type.shape[2], w->type.shape[3]});
  Json p{{"stride", win.stride}, {"padding", win.pads}, {"dilation", win.dilation}, {"groups", I::attr_i(n, "group", 1)}};

  const NodeP* bn = imp.next();
  const bool fold = imp.options().fold_batch_norm && bn && bn->op_type() == "BatchNormalization" && bn->input_size() >= 5 &&
                    bn->input(0) == n.output(0) && imp.uses(n.output(0)) == 1 && I::attr_i(*bn, "training_mode", 0) == 0 &&
                    w->value && (!b || b->value) && is_float(w->type.dtype);
  if (fold) {
    std::vector<ValPtr> stats;
    for (int k = 1; k < 5; ++k) stats.push_back(imp.get(*bn, k));
    bool known = true;
    for (const auto& s : stats) known = known && s && s->value && s->value->numel() == w->type.shape[0];
    if (known && !(bn->output_size() > 1 && std::any_of(bn->output().begin() + 1, bn->output().end(),
                                                        [&](const std::string& o) { return !o.empty() && imp.uses(o); }))) {
      const double eps = I::attr_f(*bn, "epsilon", 1e-5);
      const int64_t O = w->type.shape[0], per = w->value->numel() / std::max<int64_t>(O, 1);
      HostTensor w2(w->type.dtype, w->type.shape), b2(w->type.dtype, {O});
      for (int64_t o = 0; o < O; ++o) {
        const double scale = stats[0]->value->get(o) / std::sqrt(stats[3]->value->get(o) + eps);
        for (int64_t k = 0; k < per; ++k) w2.set(o * per + k, w->value->get(o * per + k) * scale);
        const double bias = b ? b->value->get(o) : 0.0;
        b2.set(o, (bias - stats[2]->value->get(o)) * scale + stats[1]->value->get(o));
      }
      auto wv = imp.constant(std::move(w2), out_name(n, "w"));
      auto bv = imp.constant(std::move(b2), out_name(n, "b"));
      auto y = imp.emit(out_name(*bn), "conv2d", {x, wv, bv}, p);
      imp.set(*bn, 0, y);
      imp.skip_next();
      imp.count_folded_bn();
      return;
    }
  }
  imp.set(n, 0, imp.emit(out_name(n), "conv2d", {x, w, b}, p));
}

void batch_norm(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  if (I::attr_i(n, "training_mode", 0)) fail(imp, n, "training_mode is set; only inference is supported", BP_ERR_UNIMPLEMENTED);
  for (int k = 1; k < n.output_size(); ++k)
    if (!n.output(k).empty() && imp.uses(n.output(k)))
      fail(imp, n, "output " + std::to_string(k) + " (running statistics) is used; only inference is supported",
           BP_ERR_UNIMPLEMENTED);
  if (rank_of(x) < 2) fail(imp, n, "x must have a channel dim (rank >= 2)");
  const int64_t C = x->type.shape[1];
  const auto& scale = imp.known(n, 1, "scale");
  const auto& bias = imp.known(n, 2, "B");
  const auto& mean = imp.known(n, 3, "input_mean");
  const auto& var = imp.known(n, 4, "input_var");
  for (const HostTensor* t : {&scale, &bias, &mean, &var})
    if (t->numel() != C) fail(imp, n, "statistics must have C = " + std::to_string(C) + " values");
  const double eps = I::attr_f(n, "epsilon", 1e-5);
  Shape cs{C};
  for (int64_t d = 2; d < rank_of(x); ++d) cs.push_back(1);
  HostTensor a(x->type.dtype, cs), c(x->type.dtype, cs);
  for (int64_t i = 0; i < C; ++i) {
    const double s = scale.get(i) / std::sqrt(var.get(i) + eps);
    a.set(i, s);
    c.set(i, bias.get(i) - mean.get(i) * s);
  }
  auto y = imp.emit(out_name(n, "scaled"), "mul", {x, imp.constant(std::move(a), out_name(n, "scale"))});
  imp.set(n, 0, imp.emit(out_name(n), "add", {y, imp.constant(std::move(c), out_name(n, "shift"))}));
}

Handler pool(const std::string& op) {
  return [op](I& imp, const NodeP& n) {
    auto x = imp.need(n, 0);
    if (rank_of(x) != 4) fail(imp, n, "only 2-D pooling (4-D x) is supported; x is " + shape_str(x->type.shape), BP_ERR_UNIMPLEMENTED);
    if (n.output_size() > 1 && !n.output(1).empty() && imp.uses(n.output(1)))
      fail(imp, n, "the Indices output is not supported", BP_ERR_UNIMPLEMENTED);
    if (I::attr_i(n, "storage_order", 0) != 0) fail(imp, n, "storage_order 1 is not supported", BP_ERR_UNIMPLEMENTED);
    auto k = I::attr_ints(n, "kernel_shape");
    if (!k) fail(imp, n, "kernel_shape is required");
    const Window win = window_of(imp, n, x->type.shape, *k);
    Json p{{"kernel_size", win.kernel}, {"stride", win.stride}, {"padding", win.pads}, {"dilation", win.dilation},
           {"ceil_mode", I::attr_i(n, "ceil_mode", 0) != 0}};
    if (op == "avg_pool2d") p["count_include_pad"] = I::attr_i(n, "count_include_pad", 0) != 0;
    imp.set(n, 0, imp.emit(out_name(n), op, {x}, p));
  };
}

Handler global_pool(const std::string& op) {
  return [op](I& imp, const NodeP& n) {
    auto x = imp.need(n, 0);
    if (rank_of(x) < 3) fail(imp, n, "x must have spatial dims (rank >= 3)");
    std::vector<int64_t> dims;
    for (int64_t d = 2; d < rank_of(x); ++d) dims.push_back(d);
    imp.set(n, 0, imp.emit(out_name(n), op, {x}, {{"dims", dims}, {"keepdim", true}}));
  };
}

void layer_norm(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0), scale = imp.need(n, 1);
  auto bias = imp.get(n, 2);
  for (int k = 1; k < n.output_size(); ++k)
    if (!n.output(k).empty() && imp.uses(n.output(k)))
      fail(imp, n, "output " + std::to_string(k) + " (mean or inverse deviation) is not supported", BP_ERR_UNIMPLEMENTED);
  const int64_t r = rank_of(x);
  const int64_t axis = norm_axis(imp, n, I::attr_i(n, "axis", -1), r);
  std::vector<int64_t> dims;
  for (int64_t d = axis; d < r; ++d) dims.push_back(d);
  const Shape tail(x->type.shape.begin() + axis, x->type.shape.end());
  // Scale and B broadcast in ONNX; Backplane wants the trailing shape.
  auto fit = [&](ValPtr v, const char* what) -> ValPtr {
    if (!v || v->type.shape == tail) return v;
    return imp.emit(out_name(n, what), "broadcast_to", {v}, {{"shape", tail}});
  };
  imp.set(n, 0, imp.emit(out_name(n), "layer_norm", {x, fit(scale, "scale"), fit(bias, "bias")},
                         {{"dims", dims}, {"eps", I::attr_f(n, "epsilon", 1e-5)}}));
}

// Softmax and LogSoftmax: opset 13 normalises along `axis`; before it the
// input was flattened to 2-D at `axis` and normalised along the second dim.
Handler softmax(const std::string& op) {
  return [op](I& imp, const NodeP& n) {
    auto x = imp.need(n, 0);
    const int64_t r = rank_of(x);
    if (imp.opset() >= 13 || r == 0) {
      imp.set(n, 0, imp.emit(out_name(n), op, {x}, {{"dim", I::attr_i(n, "axis", -1)}}));
      return;
    }
    const int64_t axis = norm_axis(imp, n, I::attr_i(n, "axis", 1), r);
    if (axis == r - 1) return imp.set(n, 0, imp.emit(out_name(n), op, {x}, {{"dim", -1}}));
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < r; ++d) (d < axis ? outer : inner) *= x->type.shape[static_cast<size_t>(d)];
    auto flat = imp.emit(out_name(n, "2d"), "reshape", {x}, {{"shape", {outer, inner}}});
    auto y = imp.emit(out_name(n, "norm"), op, {flat}, {{"dim", 1}});
    imp.set(n, 0, imp.emit(out_name(n), "reshape", {y}, {{"shape", x->type.shape}}));
  };
}

// ---------------------------------------------------------------------------
// Linear algebra

void matmul(I& imp, const NodeP& n) { imp.set(n, 0, imp.emit(out_name(n), "matmul", {imp.need(n, 0), imp.need(n, 1)})); }

void gemm(I& imp, const NodeP& n) {
  auto a = imp.need(n, 0), b = imp.need(n, 1);
  auto c = imp.get(n, 2);
  if (rank_of(a) != 2 || rank_of(b) != 2) fail(imp, n, "A and B must be 2-D");
  if (I::attr_i(n, "transA", 0)) a = imp.emit(out_name(n, "at"), "transpose", {a}, {{"dim0", 0}, {"dim1", 1}});
  // A transposed view, never a transposed copy: a constant weight keeps its
  // [N, K] storage, which is the form a one-row product reads fastest (one
  // contiguous dot product per output), and nothing is copied at import.
  if (I::attr_i(n, "transB", 0)) b = imp.emit(out_name(n, "bt"), "transpose", {b}, {{"dim0", 0}, {"dim1", 1}});
  const double alpha = I::attr_f(n, "alpha", 1.0), beta = I::attr_f(n, "beta", 1.0);
  const bool more = alpha != 1.0 || (c && beta != 0.0);
  auto y = imp.emit(more ? out_name(n, "ab") : out_name(n), "matmul", {a, b});
  if (alpha != 1.0) y = imp.emit(c && beta != 0.0 ? out_name(n, "scaled") : out_name(n), "affine", {y}, {{"mul", alpha}});
  if (c && beta != 0.0) {
    if (beta != 1.0) c = imp.emit(out_name(n, "c"), "affine", {c}, {{"mul", beta}});
    y = imp.emit(out_name(n), "add", {y, c});
  }
  imp.set(n, 0, y);
}

// ---------------------------------------------------------------------------
// Shapes and layout

void reshape(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  auto shape = I::ints_of(imp.known(n, 1, "shape"));
  const bool allowzero = I::attr_i(n, "allowzero", 0) != 0;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == 0 && !allowzero) {
      if (i >= x->type.shape.size()) fail(imp, n, "shape entry " + std::to_string(i) + " is 0 (copy) past x's rank");
      shape[i] = x->type.shape[i];
    }
  imp.set(n, 0, imp.emit(out_name(n), "reshape", {x}, {{"shape", shape}}));
}

void flatten(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  const int64_t r = rank_of(x);
  int64_t axis = I::attr_i(n, "axis", 1);
  if (axis < -r || axis > r) fail(imp, n, "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(r));
  if (axis < 0) axis += r;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < r; ++d) (d < axis ? outer : inner) *= x->type.shape[static_cast<size_t>(d)];
  imp.set(n, 0, imp.emit(out_name(n), "reshape", {x}, {{"shape", {outer, inner}}}));
}

void transpose(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  std::vector<int64_t> perm;
  if (auto p = I::attr_ints(n, "perm")) perm = *p;
  else
    for (int64_t d = rank_of(x) - 1; d >= 0; --d) perm.push_back(d);
  imp.set(n, 0, imp.emit(out_name(n), "permute", {x}, {{"dims", perm}}));
}

void squeeze(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  auto axes = axes_of(imp, n, 1);
  Json p = Json::object();
  if (axes) p["dims"] = *axes;
  imp.set(n, 0, imp.emit(out_name(n), "squeeze", {x}, p));
}

void unsqueeze(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  auto axes = axes_of(imp, n, 1);
  if (!axes) fail(imp, n, "axes are required");
  const int64_t r = rank_of(x) + static_cast<int64_t>(axes->size());
  std::vector<bool> ones(static_cast<size_t>(r), false);
  for (auto a : *axes) {
    const int64_t d = norm_axis(imp, n, a, r, "axis");
    if (ones[static_cast<size_t>(d)]) fail(imp, n, "axis " + std::to_string(a) + " given twice");
    ones[static_cast<size_t>(d)] = true;
  }
  Shape s;
  size_t k = 0;
  for (int64_t d = 0; d < r; ++d) s.push_back(ones[static_cast<size_t>(d)] ? 1 : x->type.shape[k++]);
  imp.set(n, 0, imp.emit(out_name(n), "reshape", {x}, {{"shape", s}}));
}

void concat(I& imp, const NodeP& n) {
  std::vector<ValPtr> ins;
  for (int k = 0; k < n.input_size(); ++k) ins.push_back(imp.need(n, k));
  if (ins.size() == 1) return imp.set(n, 0, ins[0]);
  imp.set(n, 0, imp.emit(out_name(n), "concat", ins, {{"dim", I::attr_i(n, "axis", 0)}}));
}

void split(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  const int64_t axis = norm_axis(imp, n, I::attr_i(n, "axis", 0), rank_of(x));
  const int64_t size = x->type.shape[static_cast<size_t>(axis)];
  std::vector<int64_t> parts;
  if (auto s = I::attr_ints(n, "split")) parts = *s;
  else if (imp.get(n, 1)) parts = I::ints_of(imp.known(n, 1, "split"));
  else {
    const int64_t count = I::attr(n, "num_outputs") ? I::attr_i(n, "num_outputs", 1) : n.output_size();
    if (count < 1) fail(imp, n, "needs at least one output");
    const int64_t each = (size + count - 1) / count;
    for (int64_t k = 0, left = size; k < count; ++k, left -= each) parts.push_back(std::max<int64_t>(0, std::min(each, left)));
  }
  if (static_cast<int>(parts.size()) != n.output_size())
    fail(imp, n, std::to_string(parts.size()) + " parts for " + std::to_string(n.output_size()) + " outputs");
  int64_t total = 0;
  for (auto p : parts) {
    if (p < 0 || p > size - total) fail(imp, n, "the parts do not add up to the axis' size " + std::to_string(size));
    total += p;
  }
  if (total != size) fail(imp, n, "the parts do not add up to the axis' size " + std::to_string(size));
  int64_t at = 0;
  for (int k = 0; k < n.output_size(); ++k) {
    const int64_t len = parts[static_cast<size_t>(k)];
    if (!n.output(k).empty())
      imp.set(n, k, imp.emit(n.output(k), "slice", {x}, {{"dim", axis}, {"start", at}, {"end", at + len}}));
    at += len;
  }
}

void slice(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  const auto starts = I::ints_of(imp.known(n, 1, "starts"));
  const auto ends = I::ints_of(imp.known(n, 2, "ends"));
  std::vector<int64_t> axes, steps;
  if (imp.get(n, 3)) axes = I::ints_of(imp.known(n, 3, "axes"));
  else
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (imp.get(n, 4)) steps = I::ints_of(imp.known(n, 4, "steps"));
  else steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    fail(imp, n, "starts, ends, axes and steps must have one value per sliced axis");
  ValPtr y = x;
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t d = norm_axis(imp, n, axes[i], rank_of(x));
    const int64_t len = x->type.shape[static_cast<size_t>(d)], step = steps[i];
    if (step == 0) fail(imp, n, "step 0");
    // ONNX's clamping, resolved here so the op gets in-range values.
    auto clampv = [](int64_t v, int64_t lo, int64_t hi) { return std::max(lo, std::min(v, hi)); };
    int64_t s = starts[i] < 0 ? starts[i] + len : starts[i];
    int64_t e = ends[i] < 0 ? ends[i] + len : ends[i];
    Json p{{"dim", d}, {"step", step}};
    if (step > 0) {
      p["start"] = clampv(s, 0, len);
      p["end"] = clampv(e, 0, len);
    } else if (len == 0) {
      p["start"] = 0;
      p["end"] = 0;
    } else {
      p["start"] = clampv(s, 0, len - 1);
      e = clampv(e, -1, len - 1);
      if (e >= 0) p["end"] = e;  // -1: through the first element (end left out)
    }
    if (step == 1 && p["start"] == 0 && p["end"] == len) continue;
    y = imp.emit(i + 1 == starts.size() ? out_name(n) : out_name(n, std::to_string(i)), "slice", {y}, p);
  }
  imp.set(n, 0, y);
}

ValPtr as_i64(I& imp, const NodeP& n, const ValPtr& v, const std::string& base) {
  if (v->type.dtype == BP_DTYPE_I64) return v;
  if (v->type.dtype != BP_DTYPE_I32) fail(imp, n, "indices must be int32 or int64");
  return imp.emit(base, "cast", {v}, {{"dtype", "i64"}});
}

void gather(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  auto idx = as_i64(imp, n, imp.need(n, 1), out_name(n, "idx"));
  imp.set(n, 0, imp.emit(out_name(n), "index_select", {x, idx}, {{"dim", I::attr_i(n, "axis", 0)}}));
}

void gather_elements(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  auto idx = as_i64(imp, n, imp.need(n, 1), out_name(n, "idx"));
  imp.set(n, 0, imp.emit(out_name(n), "gather", {x, idx}, {{"dim", I::attr_i(n, "axis", 0)}}));
}

void expand(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  const auto want = I::ints_of(imp.known(n, 1, "shape"));
  // Bidirectional broadcast of x's shape and `shape`.
  const auto& xs = x->type.shape;
  const size_t r = std::max(xs.size(), want.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t a = i + xs.size() >= r ? xs[i + xs.size() - r] : 1;
    const int64_t b = i + want.size() >= r ? want[i + want.size() - r] : 1;
    if (a != b && a != 1 && b != 1) fail(imp, n, "shape " + shape_str(xs) + " does not broadcast to " + shape_str(want));
    out[i] = a == 1 ? b : a;
  }
  if (out == xs) return imp.set(n, 0, x);
  imp.set(n, 0, imp.emit(out_name(n), "broadcast_to", {x}, {{"shape", out}}));
}

void tile(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  const auto reps = I::ints_of(imp.known(n, 1, "repeats"));
  const int64_t r = rank_of(x);
  if (static_cast<int64_t>(reps.size()) != r) fail(imp, n, "repeats needs one value per dim of x");
  if (2 * r > BP_MAX_RANK) fail(imp, n, "rank above 4 is not supported", BP_ERR_UNIMPLEMENTED);
  // [a, b] tiled [p, q]: [1, a, 1, b] broadcast to [p, a, q, b], then [p·a, q·b].
  Shape split, wide, out;
  for (int64_t d = 0; d < r; ++d) {
    const int64_t s = x->type.shape[static_cast<size_t>(d)], k = reps[static_cast<size_t>(d)];
    int64_t ks = 0;
    if (k < 0 || __builtin_mul_overflow(k, s, &ks)) fail(imp, n, "repeat " + std::to_string(k) + " is negative or too large");
    split.insert(split.end(), {1, s});
    wide.insert(wide.end(), {k, s});
    out.push_back(ks);
  }
  auto a = imp.emit(out_name(n, "split"), "reshape", {x}, {{"shape", split}});
  auto b = imp.emit(out_name(n, "wide"), "broadcast_to", {a}, {{"shape", wide}});
  imp.set(n, 0, imp.emit(out_name(n), "reshape", {b}, {{"shape", out}}));
}

// ---------------------------------------------------------------------------
// Reductions

Handler reduce(const std::string& op, int axes_input_from, const std::string& pre = "", const std::string& post = "") {
  return [=](I& imp, const NodeP& n) {
    auto x = imp.need(n, 0);
    std::optional<std::vector<int64_t>> axes;
    if (imp.opset() < axes_input_from) axes = I::attr_ints(n, "axes");
    else if (imp.get(n, 1)) axes = I::ints_of(imp.known(n, 1, "axes"));
    if (axes && axes->empty()) axes.reset();
    if (!axes && I::attr_i(n, "noop_with_empty_axes", 0)) return imp.set(n, 0, x);
    Json p{{"keepdim", I::attr_i(n, "keepdims", 1) != 0}};
    if (axes) p["dims"] = *axes;
    if (rank_of(x) == 0) p.erase("dims");
    ValPtr v = x;
    if (!pre.empty()) v = imp.emit(out_name(n, pre), pre, {v});
    v = imp.emit(post.empty() ? out_name(n) : out_name(n, op), op, {v}, p);
    if (!post.empty()) v = imp.emit(out_name(n), post, {v});
    imp.set(n, 0, v);
  };
}

Handler arg_reduce(const std::string& op) {
  return [op](I& imp, const NodeP& n) {
    imp.set(n, 0, imp.emit(out_name(n), op, {imp.need(n, 0)},
                           {{"dim", I::attr_i(n, "axis", 0)}, {"keepdim", I::attr_i(n, "keepdims", 1) != 0},
                            {"select_last_index", I::attr_i(n, "select_last_index", 0) != 0}}));
  };
}

void cumsum(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  const auto axis = I::ints_of(imp.known(n, 1, "axis"));
  if (axis.size() != 1) fail(imp, n, "axis must hold one value");
  imp.set(n, 0, imp.emit(out_name(n), "cumsum", {x},
                         {{"dim", axis[0]}, {"exclusive", I::attr_i(n, "exclusive", 0) != 0},
                          {"reverse", I::attr_i(n, "reverse", 0) != 0}}));
}

void topk(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  const auto k = I::ints_of(imp.known(n, 1, "K"));
  if (k.size() != 1) fail(imp, n, "K must hold one value");
  auto t = imp.emit(out_name(n, "topk"), "topk", {x},
                    {{"k", k[0]}, {"dim", I::attr_i(n, "axis", -1)}, {"largest", I::attr_i(n, "largest", 1) != 0},
                     {"sorted", I::attr_i(n, "sorted", 1) != 0}});
  for (int s = 0; s < 2 && s < n.output_size(); ++s)
    if (!n.output(s).empty()) imp.set(n, s, imp.emit(n.output(s), "view", {t}, {{"slot", s}}));
}

void trilu(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  if (rank_of(x) < 2) fail(imp, n, "x must be at least 2-D");
  const int64_t k = imp.get(n, 1) ? I::ints_of(imp.known(n, 1, "k")).at(0) : 0;
  const bool upper = I::attr_i(n, "upper", 1) != 0;
  const int64_t R = x->type.shape[x->type.shape.size() - 2], C = x->type.shape.back();
  if (R != 0 && C > imp.options().fold_limit / R)
    fail(imp, n, "a mask of " + shape_str({R, C}) + " is above ImportOptions::fold_limit", BP_ERR_UNIMPLEMENTED);
  HostTensor mask(BP_DTYPE_BOOL, {R, C});
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) mask.set_int(i * C + j, upper ? (j - i >= k) : (j - i <= k));
  auto m = imp.constant(std::move(mask), out_name(n, "mask"));
  imp.set(n, 0, imp.emit(out_name(n), "where", {m, x, scalar(imp, 0, x->type.dtype, out_name(n, "zero"))}));
}

// ---------------------------------------------------------------------------
// Data known at import

void constant_op(I& imp, const NodeP& n) {
  if (n.attribute_size() != 1) fail(imp, n, "takes exactly one attribute");
  const auto& a = n.attribute(0);
  const std::string& name = a.name();
  if (name == "value") {
    ::onnx::TensorProto t = a.t();
    return bind_constant(imp, n, tensor_from_proto(t, {}, imp.where(n), false));
  }
  if (name == "value_float") return bind_constant(imp, n, HostTensor::from_doubles(BP_DTYPE_F32, {}, {a.f()}));
  if (name == "value_floats") {
    std::vector<double> v(a.floats().begin(), a.floats().end());
    return bind_constant(imp, n, HostTensor::from_doubles(BP_DTYPE_F32, {static_cast<int64_t>(v.size())}, v));
  }
  if (name == "value_int") return bind_constant(imp, n, i64_tensor({a.i()}, true));
  if (name == "value_ints") return bind_constant(imp, n, i64_tensor(std::vector<int64_t>(a.ints().begin(), a.ints().end())));
  fail(imp, n, "attribute '" + name + "' is not supported", BP_ERR_UNIMPLEMENTED);
}

void shape_op(I& imp, const NodeP& n) {
  auto x = imp.need(n, 0);
  const int64_t r = rank_of(x);
  int64_t s = I::attr_i(n, "start", 0), e = I::attr_i(n, "end", r);
  if (s < 0) s += r;
  if (e < 0) e += r;
  s = std::clamp<int64_t>(s, 0, r);
  e = std::clamp<int64_t>(e, 0, r);
  std::vector<int64_t> v;
  for (int64_t d = s; d < e; ++d) v.push_back(x->type.shape[static_cast<size_t>(d)]);
  bind_constant(imp, n, i64_tensor(v));
}

void size_op(I& imp, const NodeP& n) { bind_constant(imp, n, i64_tensor({I::numel(imp.need(n, 0)->type.shape)}, true)); }

void constant_of_shape(I& imp, const NodeP& n) {
  const auto shape = I::ints_of(imp.known(n, 0, "shape"));
  HostTensor one = HostTensor::from_doubles(BP_DTYPE_F32, {}, {0.0});
  if (const auto* a = I::attr(n, "value")) {
    ::onnx::TensorProto t = a->t();
    HostTensor v = tensor_from_proto(t, {}, imp.where(n), false);
    if (v.numel() != 1) fail(imp, n, "value must hold one element");
    one = HostTensor(v.dtype, {});
    one.bytes = v.bytes;
  }
  for (auto d : shape)
    if (d < 0) fail(imp, n, "negative dim in shape");
  const int64_t count = I::numel(shape);
  if (count <= 4096) {
    HostTensor t(one.dtype, shape);
    for (size_t at = 0; at < t.bytes.size(); at += one.bytes.size()) std::memcpy(t.bytes.data() + at, one.bytes.data(), one.bytes.size());
    return bind_constant(imp, n, std::move(t));
  }
  // Large: one element broadcast (a view, nothing filled).
  auto c = imp.constant(std::move(one), out_name(n, "value"));
  auto r = imp.emit(out_name(n, "1"), "reshape", {c}, {{"shape", Shape(shape.size(), 1)}});
  imp.set(n, 0, imp.emit(out_name(n), "broadcast_to", {r}, {{"shape", shape}}));
}

void range(I& imp, const NodeP& n) {
  const auto& s = imp.known(n, 0, "start");
  const auto& l = imp.known(n, 1, "limit");
  const auto& d = imp.known(n, 2, "delta");
  if (s.numel() != 1 || l.numel() != 1 || d.numel() != 1) fail(imp, n, "start, limit and delta must be scalars");
  const double start = s.get(0), limit = l.get(0), delta = d.get(0);
  if (delta == 0) fail(imp, n, "delta 0");
  const double count = std::max(0.0, std::ceil((limit - start) / delta));
  if (!(count <= static_cast<double>(imp.options().fold_limit)))
    fail(imp, n, "more than " + std::to_string(imp.options().fold_limit) + " elements (ImportOptions::fold_limit)");
  HostTensor t(s.dtype, {static_cast<int64_t>(count)});
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (is_float(t.dtype)) t.set(i, start + static_cast<double>(i) * delta);
    else t.set_int(i, static_cast<int64_t>(static_cast<uint64_t>(s.get_int(0)) + static_cast<uint64_t>(i) * static_cast<uint64_t>(d.get_int(0))));
  }
  bind_constant(imp, n, std::move(t));
}

}  // namespace

const std::map<std::string, Handler>& handlers() {
  static const std::map<std::string, Handler> table = [] {
    std::map<std::string, Handler> t;
    for (const auto& [onnx_op, op] : std::vector<std::pair<std::string, std::string>>{
             {"Relu", "relu"}, {"Sigmoid", "sigmoid"}, {"Tanh", "tanh"}, {"Exp", "exp"}, {"Log", "log"},
             {"Sqrt", "sqrt"}, {"Neg", "neg"}, {"Abs", "abs"}, {"Erf", "erf"}, {"Floor", "floor"}, {"Ceil", "ceil"},
             {"Round", "round"}, {"Sin", "sin"}, {"Cos", "cos"}, {"Reciprocal", "recip"}, {"Sign", "sign"},
             {"Softplus", "softplus"}})
      t[onnx_op] = unary(op);
    for (const auto& [onnx_op, op] : std::vector<std::pair<std::string, std::string>>{
             {"Add", "add"}, {"Sub", "sub"}, {"Mul", "mul"}, {"Div", "div"}, {"Equal", "eq"}, {"Less", "lt"},
             {"Greater", "gt"}, {"LessOrEqual", "le"}, {"GreaterOrEqual", "ge"}, {"Xor", "ne"}})
      t[onnx_op] = binary(op);
    t["Max"] = variadic("maximum");
    t["Min"] = variadic("minimum");
    t["Sum"] = variadic("add");
    t["Mean"] = variadic("add", true);
    t["Pow"] = pow_op;
    t["Identity"] = identity;
    t["Dropout"] = dropout;
    t["Cast"] = cast;
    t["Clip"] = clip;
    t["LeakyRelu"] = leaky_relu;
    t["Elu"] = elu;
    t["HardSigmoid"] = hard_sigmoid;
    t["HardSwish"] = hard_swish;
    t["Not"] = logical_not;
    t["And"] = logical_and;
    t["Or"] = logical_or;
    t["IsNaN"] = is_nan;
    t["Where"] = where;
    t["Conv"] = conv;
    t["BatchNormalization"] = batch_norm;
    t["MaxPool"] = pool("max_pool2d");
    t["AveragePool"] = pool("avg_pool2d");
    t["GlobalAveragePool"] = global_pool("mean");
    t["GlobalMaxPool"] = global_pool("max");
    t["LayerNormalization"] = layer_norm;
    t["Softmax"] = softmax("softmax");
    t["LogSoftmax"] = softmax("log_softmax");
    t["MatMul"] = matmul;
    t["Gemm"] = gemm;
    t["Reshape"] = reshape;
    t["Flatten"] = flatten;
    t["Transpose"] = transpose;
    t["Squeeze"] = squeeze;
    t["Unsqueeze"] = unsqueeze;
    t["Concat"] = concat;
    t["Split"] = split;
    t["Slice"] = slice;
    t["Gather"] = gather;
    t["GatherElements"] = gather_elements;
    t["Expand"] = expand;
    t["Tile"] = tile;
    t["ReduceSum"] = reduce("sum", 13);
    t["ReduceMean"] = reduce("mean", 18);
    t["ReduceMax"] = reduce("max", 18);
    t["ReduceMin"] = reduce("min", 18);
    t["ReduceProd"] = reduce("prod", 18);
    t["ReduceSumSquare"] = reduce("sum", 18, "sqr");
    t["ReduceL2"] = reduce("sum", 18, "sqr", "sqrt");
    t["ArgMax"] = arg_reduce("argmax");
    t["ArgMin"] = arg_reduce("argmin");
    t["CumSum"] = cumsum;
    t["TopK"] = topk;
    t["Trilu"] = trilu;
    t["Constant"] = constant_op;
    t["Shape"] = shape_op;
    t["Size"] = size_op;
    t["ConstantOfShape"] = constant_of_shape;
    t["Range"] = range;
    return t;
  }();
  return table;
}

}  // namespace backplane::onnx::detail
