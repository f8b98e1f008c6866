// The standard op table (docs/ops.md): every op's inputs, params, outputs
// and inference function; and the core's entry points over it.
#include "ops_spec.hpp"

namespace backplane::detail {

namespace spec {

// ---- the table ---------------------------------------------------------------------------------

const char* const kElementwise = "Elementwise";
const char* const kLayout = "Layout ops and views";
const char* const kReduce = "Reductions and normalisation";
const char* const kLinalg = "Linear algebra, convolution, indexing";
const char* const kMulti = "Multi-output ops (bundles)";

OutputSpec out(std::string name, OutDtype d, std::string shape, int like = 0) {
  return {std::move(name), d, like, std::move(shape)};
}

std::vector<OpSpec> build_table() {
  std::vector<OpSpec> t;
  auto general = [&](std::string name, const char* family, std::string summary, std::vector<InputSpec> ins,
                     std::vector<ParamSpec> params, std::vector<OutputSpec> outs, bp_params_kind kind,
                     InferFn f, OpClass cls = OpClass::Kernel, Canon canon = Canon::None) {
    OpSpec s;
    s.name = std::move(name);
    s.family = family;
    s.summary = std::move(summary);
    s.inputs = std::move(ins);
    s.params = std::move(params);
    s.outputs = std::move(outs);
    s.cls = cls;
    s.canon = canon;
    s.params_kind = kind;
    s.infer = f;
    t.push_back(std::move(s));
  };
  // Elementwise ops: the host broadcasts their inputs to the output's shape.
  auto elementwise = [&](std::string name, std::string summary, std::vector<InputSpec> ins,
                         std::vector<ParamSpec> params, bp_params_kind kind, InferFn f,
                         OutputSpec o = out("y", OutDtype::Like, "shape of x")) {
    general(std::move(name), kElementwise, std::move(summary), std::move(ins), std::move(params),
            {std::move(o)}, kind, f, OpClass::Kernel, Canon::Broadcast);
  };

  // ---- elementwise
  for (const auto& [n, what] : std::vector<std::pair<const char*, const char*>>{
           {"neg", "-x; integers wrap (neg of i8 -128 is -128)"},
           {"abs", "|x|; integers wrap (abs of i8 -128 is -128)"},
           {"sign", "-1, 0 or 1 (float: -0 stays -0, NaN stays NaN)"}})
    elementwise(n, what, {input("x", kFloatInt)}, {}, BP_PARAMS_NONE, same_shape);
  for (const auto& [n, what] : std::vector<std::pair<const char*, const char*>>{
           {"sqr", "x·x"},
           {"sqrt", "√x; NaN below 0"},
           {"rsqrt", "1/√x; inf at 0, NaN below 0"},
           {"recip", "1/x; ±inf at ±0"},
           {"exp", "e^x"},
           {"log", "ln x; -inf at 0, NaN below 0"},
           {"sin", "sin x"},
           {"cos", "cos x"},
           {"tanh", "tanh x"},
           {"erf", "the error function"},
           {"floor", "rounds down"},
           {"ceil", "rounds up"},
           {"round", "rounds to the nearest integer, half to even"},
           {"relu", "max(x, 0); NaN stays NaN; relu(-0) may be either zero (PyTorch and both plugins give -0)"},
           {"sigmoid", "1/(1 + exp(-x))"},
           {"silu", "x·sigmoid(x)"},
           {"softplus", "max(x, 0) + log1p(exp(-|x|))"}})
    elementwise(n, what, {input("x", kFloat)}, {}, BP_PARAMS_NONE, same_shape);
  elementwise("gelu", "x·Φ(x) = 0.5x(1 + erf(x/√2)); with \"tanh\": 0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))",
              {input("x", kFloat)}, {param("approximate", Kind::Enum).one_of({"none", "tanh"}).def("none")},
              BP_PARAMS_GELU, gelu);
  elementwise(
      "clamp",
      "max(x, min), then min(·, max): min > max gives max; NaN stays NaN; integer bounds must be integers "
      "that fit x's dtype",
      {input("x", kFloatInt)},
      {param("min", Kind::Number).optional("no lower bound"),
       param("max", Kind::Number).optional("no upper bound")},
      BP_PARAMS_CLAMP, clamp);
  elementwise("affine", "mul·x + add", {input("x", kFloat)},
              {param("mul", Kind::Number).def(1.0), param("add", Kind::Number).def(0.0)}, BP_PARAMS_AFFINE,
              affine);
  elementwise("cast",
              "converts: float→int truncates toward zero (NaN, ±inf or out of range: an error for the run); "
              "int→int wraps; →bool is x ≠ 0; to f16/bf16 rounds to nearest even",
              {input("x", kAll)}, {param("dtype", Kind::DType)}, BP_PARAMS_CAST, cast,
              out("y", OutDtype::CastParam, "shape of x"));
  const std::string ab = "broadcast of a and b";
  for (const auto& [n, what] : std::vector<std::pair<const char*, const char*>>{
           {"add", "a + b; integers wrap"},
           {"sub", "a - b; integers wrap"},
           {"mul", "a·b; integers wrap"},
           {"div",
            "a / b; integers truncate toward zero, division by 0 is an error for the run, MIN / -1 wraps"},
           {"maximum", "the larger; NaN if either is NaN"},
           {"minimum", "the smaller; NaN if either is NaN"}})
    elementwise(n, what, {input("a", kFloatInt), like("b", 0)}, {}, BP_PARAMS_NONE, broadcast_all,
                out("y", OutDtype::Like, ab));
  elementwise("pow", "a^b (C's pow)", {input("a", kFloat), like("b", 0)}, {}, BP_PARAMS_NONE, broadcast_all,
              out("y", OutDtype::Like, ab));
  for (const auto& [n, what] :
       std::vector<std::pair<const char*, const char*>>{{"eq", "a = b"},
                                                        {"ne", "a ≠ b; true when either is NaN"},
                                                        {"lt", "a < b"},
                                                        {"le", "a ≤ b"},
                                                        {"gt", "a > b"},
                                                        {"ge", "a ≥ b"}})
    elementwise(n, std::string(what) + (std::string(n) == "ne" ? "" : "; false when either is NaN"),
                {input("a", kAll), like("b", 0)}, {}, BP_PARAMS_NONE, broadcast_all,
                out("y", OutDtype::Bool, ab));
  elementwise("where", "cond ? a : b", {input("cond", kBool), input("a", kAll), like("b", 1)}, {},
              BP_PARAMS_NONE, broadcast_all, out("y", OutDtype::Like, "broadcast of cond, a and b", 1));
  elementwise("fused_elementwise",
              "a chain of the elementwise ops above as one kernel, each instruction as its op on one element "
              "of x0's dtype (see below)",
              {input("x", kFloat | kBool).repeats_mixed().shaped("x0 float; the others x0's dtype or bool")},
              {param("program", Kind::Program)
                   .says("registers 0..n-1 are the inputs, instruction k writes n+k, y is the last; at most "
                         "64 instructions")},
              BP_PARAMS_FUSED, fused_elementwise, out("y", OutDtype::Like, "broadcast of the inputs"));

  // ---- layout ops: views of their input's bytes (no kernel)
  general("reshape", kLayout, "a view when the strides allow one, else a dense copy; 0 is a real size",
          {input("x")},
          {param("shape", Kind::Ints).range(-1).says("the new shape; one entry may be -1 (inferred)")},
          {out("y", OutDtype::Like, "`shape`, its -1 inferred")}, BP_PARAMS_NONE, reshape, OpClass::Reshape);
  general("permute", kLayout, "reorders the dims: y.shape[i] = x.shape[dims[i]]", {input("x")},
          {param("dims", Kind::Dims).says("a permutation of every dim of x")},
          {out("y", OutDtype::Like, "x.shape permuted")}, BP_PARAMS_NONE, permute, OpClass::View);
  general("transpose", kLayout, "swaps two dims", {input("x")},
          {param("dim0", Kind::Dim), param("dim1", Kind::Dim)},
          {out("y", OutDtype::Like, "x.shape with dim0 and dim1 swapped")}, BP_PARAMS_NONE, transpose,
          OpClass::View);
  general("broadcast_to", kLayout, "NumPy broadcast to `shape` (stride 0 on stretched dims)", {input("x")},
          {param("shape", Kind::Ints).range(0)}, {out("y", OutDtype::Like, "`shape`")}, BP_PARAMS_NONE,
          broadcast_to, OpClass::View);
  general(
      "slice", kLayout,
      "x[start:end:step] along dim, with NumPy's clamping of start and end; a negative step walks backwards",
      {input("x").at_least_rank(1)},
      {param("dim", Kind::Dim), param("start", Kind::Int).optional("the first element in step's direction"),
       param("end", Kind::Int).optional("past the last element in step's direction"),
       param("step", Kind::Int).not_zero().def(1)},
      {out("y", OutDtype::Like, "x.shape with dim's size the slice's length")}, BP_PARAMS_NONE, slice,
      OpClass::View);
  general("squeeze", kLayout, "removes size-1 dims; naming a dim whose size is not 1 is an error",
          {input("x")}, {param("dims", Kind::Dims).optional("every size-1 dim")},
          {out("y", OutDtype::Like, "x.shape without dims")}, BP_PARAMS_NONE, squeeze, OpClass::View);
  general("unsqueeze", kLayout, "inserts a size-1 dim", {input("x")},
          {param("dim", Kind::Dim).of_output().says("counts against the output's rank (x's rank + 1)")},
          {out("y", OutDtype::Like, "x.shape with 1 inserted at dim")}, BP_PARAMS_NONE, unsqueeze,
          OpClass::View);
  general("contiguous", kLayout, "a dense copy of any strided layout (a device kernel)", {input("x")}, {},
          {out("y", OutDtype::Like, "shape of x")}, BP_PARAMS_NONE, same_shape, OpClass::Kernel,
          Canon::Broadcast);
  general("view", kLayout, "slot `slot` of a bundle, in place (no copy)", {input("bundle").bundled()},
          {param("slot", Kind::Int).range(0)}, {out("y", OutDtype::Slot, "")}, BP_PARAMS_NONE, slot_view,
          OpClass::Slot);
  general("view_owned", kLayout, "a dense copy of slot `slot` of a bundle", {input("bundle").bundled()},
          {param("slot", Kind::Int).range(0)}, {out("y", OutDtype::Slot, "")}, BP_PARAMS_NONE, slot_view,
          OpClass::SlotCopy);

  // ---- reductions and normalisation
  const std::string ambiguous = "dims: [] is ambiguous; leave 'dims' out to reduce over every dim";
  const std::string reduced = "x.shape without dims (size 1 with keepdim)";
  for (const auto& [n, what, set] : std::vector<std::tuple<const char*, const char*, unsigned>>{
           {"sum", "Σ; 0 over an empty dim; integers wrap", kFloatInt},
           {"prod", "Π; 1 over an empty dim; integers wrap", kFloatInt},
           {"max", "the largest; NaN if any is NaN; an empty dim is an error", kFloatInt},
           {"min", "the smallest; NaN if any is NaN; an empty dim is an error", kFloatInt},
           {"mean", "Σ / n; NaN over an empty dim", kFloat}})
    general(n, kReduce, what, {input("x", set)},
            {param("dims", Kind::Dims).optional("every dim").empty_error(ambiguous),
             param("keepdim", Kind::Bool).def(false)},
            {out("y", OutDtype::Like, reduced)}, BP_PARAMS_REDUCE, reduce);
  for (const char* n : {"argmax", "argmin"})
    general(
        n, kReduce,
        std::string("index of the ") + (std::string(n) == "argmax" ? "largest" : "smallest") +
            " along dim: the first of ties (the last with select_last_index), the first NaN if any; an empty "
            "dim is an error",
        {input("x", kFloatInt)},
        {param("dim", Kind::Dim).scalar_ok(), param("keepdim", Kind::Bool).def(false),
         param("select_last_index", Kind::Bool).def(false)},
        {out("y", OutDtype::I64, "x.shape without dim (size 1 with keepdim)")}, BP_PARAMS_ARG_REDUCE,
        arg_reduce);
  general("softmax", kReduce, "exp(x - max) / Σ exp(x - max) along dim", {input("x", kFloat)},
          {param("dim", Kind::Dim).scalar_ok()}, {out("y", OutDtype::Like, "shape of x")}, BP_PARAMS_DIM,
          dim_op);
  general("log_softmax", kReduce, "x - max - log Σ exp(x - max) along dim", {input("x", kFloat)},
          {param("dim", Kind::Dim).scalar_ok()}, {out("y", OutDtype::Like, "shape of x")}, BP_PARAMS_DIM,
          dim_op);
  general("cumsum", kReduce,
          "running sum along dim; exclusive: the sum of the elements before; reverse: from the end; integers "
          "wrap",
          {input("x", kFloatInt)},
          {param("dim", Kind::Dim).scalar_ok(), param("exclusive", Kind::Bool).def(false),
           param("reverse", Kind::Bool).def(false)},
          {out("y", OutDtype::Like, "shape of x")}, BP_PARAMS_DIM, dim_op);
  general("layer_norm", kReduce,
          "(x - mean) / √(var + eps) · weight + bias over the trailing dims (biased variance)",
          {input("x", kFloat), like("weight", 0).opt().shaped("x.shape[-len(dims):]"),
           like("bias", 0).opt().shaped("x.shape[-len(dims):]")},
          {param("dims", Kind::Dims).empty_error("dims must not be empty").says("the trailing dims of x"),
           param("eps", Kind::Number).def(1e-5)},
          {out("y", OutDtype::Like, "shape of x")}, BP_PARAMS_LAYER_NORM, layer_norm);

  // ---- linear algebra, convolution, indexing
  general(
      "matmul", kLinalg,
      "NumPy matmul: a 1-D a is [1, K] and a 1-D b is [K, 1] (the added dim dropped from the result); batch "
      "dims broadcast (a 0 against a 1 is 0)",
      {input("a", kFloatInt).at_least_rank(1), like("b", 0).at_least_rank(1)}, {},
      {out("y", OutDtype::Like, "[...batch, M, N]")}, BP_PARAMS_NONE, matmul, OpClass::Kernel, Canon::Matmul);
  general("scaled_dot_product_attention", kLinalg,
          "softmax(q·kᵀ·scale + mask, along the keys) · v per batch: q [..., Sq, D], k [..., Sk, D], v [..., "
          "Sk, Dv] with the same batch dims; mask (optional, additive) broadcasts to [..., Sq, Sk]; scale "
          "defaults to 1/√D; causal: query i sees keys j ≤ i + Sk - Sq; a row whose keys are all masked gives "
          "NaN, Sk = 0 gives zeros. Rounds differently from the composed ops (Compound tolerance)",
          {input("q", kFloat).at_least_rank(2), like("k", 0).at_least_rank(2), like("v", 0).at_least_rank(2),
           like("mask", 0).opt()},
          {param("scale", Kind::Number).optional("1/√D"), param("causal", Kind::Bool).def(false)},
          {out("y", OutDtype::Like, "[...batch, Sq, Dv]")}, BP_PARAMS_ATTENTION, attention);
  general("conv2d", kLinalg,
          "2-D cross-correlation (PyTorch's conv2d), zero padding; H' = (H + top + bottom - dilation·(kH - "
          "1) - 1) "
          "/ stride + 1",
          {input("x", kFloat).of_rank(4, "[N, C, H, W]"), like("w", 0).of_rank(4, "[O, C/groups, kH, kW]"),
           like("bias", 0).opt().of_rank(1, "[O]")},
          {param("stride", Kind::Pair).range(1).def(1), param("padding", Kind::Padding).range(0).def(0),
           param("dilation", Kind::Pair).range(1).def(1), param("groups", Kind::Int).range(1).def(1)},
          {out("y", OutDtype::Like, "[N, O, H', W']")}, BP_PARAMS_CONV2D, conv2d);
  for (const char* n : {"max_pool2d", "avg_pool2d"}) {
    const bool avg = std::string(n) == "avg_pool2d";
    std::vector<ParamSpec> ps = {param("kernel_size", Kind::Pair).range(1),
                                 param("stride", Kind::Pair).range(1).optional("kernel_size"),
                                 param("padding", Kind::Padding).range(0).def(0),
                                 param("dilation", Kind::Pair).range(1).def(1),
                                 param("ceil_mode", Kind::Bool).def(false)};
    if (avg) ps.push_back(param("count_include_pad", Kind::Bool).def(true));
    general(n, kLinalg,
            avg ? "the mean of each kH x kW window (dilated) of each plane; divisor: the window's positions inside "
                  "the padded input with count_include_pad, else inside x (0 gives NaN); H' as max_pool2d's"
                : "the largest element of each kH x kW window (dilated) of each plane; padding is -inf, NaN "
                  "propagates; H' = floor (ceil with ceil_mode) of (H + top + bottom - dilation·(kH - 1) - 1) / "
                  "stride, + 1; with ceil_mode a last window starting past H + top is dropped",
            {input("x", kFloat).of_rank(4, "[N, C, H, W]")}, std::move(ps),
            {out("y", OutDtype::Like, "[N, C, H', W']")}, BP_PARAMS_POOL2D, pool2d);
  }
  general("gather", kLinalg,
          "y[i][j]... = x[...][index[i][j]...][...] along dim (torch.gather, ONNX GatherElements); negative "
          "indices count from the end, out of range is an error for the run",
          {input("x", kAll), input("index", kI64)}, {param("dim", Kind::Dim).scalar_ok()},
          {out("y", OutDtype::Like, "shape of index")}, BP_PARAMS_DIM, gather);
  general(
      "index_select", kLinalg,
      "picks entries of dim by index (ONNX Gather); negative indices count from the end, out of range is an "
      "error for the run",
      {input("x", kAll).at_least_rank(1), input("index", kI64)}, {param("dim", Kind::Dim)},
      {out("y", OutDtype::Like, "x.shape[:dim] + index.shape + x.shape[dim+1:]")}, BP_PARAMS_DIM,
      index_select);
  general("concat", kLinalg, "joins along dim; the other dims must agree",
          {input("x", kAll).repeats().at_least_rank(1)}, {param("dim", Kind::Dim)},
          {out("y", OutDtype::Like, "x0.shape with dim's sizes summed")}, BP_PARAMS_DIM, concat);
  general("slice_update", kLinalg,
          "x with the rows [start, start + update.shape[dim]) along dim replaced by update (a KV cache's "
          "append); start is a one-element i64 tensor read at run time, 0 <= start <= x.shape[dim] - "
          "update.shape[dim] (else an error for the run); in place, moving only update's bytes, when the "
          "output is bound to the Tensor x is read from",
          {input("x", kAll).at_least_rank(1), like("update", 0), input("start", kI64)},
          {param("dim", Kind::Dim)}, {out("y", OutDtype::Like, "shape of x")}, BP_PARAMS_DIM, slice_update);

  // ---- multi-output ops: one bundled output, read through view / view_owned
  general(
      "topk", kMulti,
      "the k largest (smallest with largest: false) along dim; NaN ranks above every number; ties: the lower "
      "index first; sorted: false may return any order",
      {input("x", kFloatInt).at_least_rank(1)},
      {param("k", Kind::Int).range(0).says("at most dim's size"), param("dim", Kind::Dim).def(-1),
       param("largest", Kind::Bool).def(true), param("sorted", Kind::Bool).def(true)},
      {out("values", OutDtype::Like, "x.shape with dim's size k"),
       out("indices", OutDtype::I64, "x.shape with dim's size k")},
      BP_PARAMS_TOPK, topk);
  general("var_mean", kMulti,
          "variance Σ(x - mean)² / max(0, n - correction) and mean over dims; NaN over an empty dim",
          {input("x", kFloat)},
          {param("dims", Kind::Dims).optional("every dim").empty_error(ambiguous),
           param("correction", Kind::Number).def(1.0), param("keepdim", Kind::Bool).def(false)},
          {out("var", OutDtype::Like, reduced), out("mean", OutDtype::Like, reduced)}, BP_PARAMS_VAR_MEAN,
          var_mean);
  general("selective_scan", kMulti,
          "Mamba's S6 recurrence: state h [B, D, N] from 0; per step t: d = delta (softplus(delta) with "
          "delta_softplus), h = exp(d·a)·h + d·b·u, y = Σ_j h·c; last_state = h after the last step",
          {input("u", kFloat).of_rank(3, "[B, L, D]"), like("delta", 0).of_rank(3, "[B, L, D]"),
           like("a", 0).of_rank(2, "[D, N]"), like("b", 0).of_rank(3, "[B, L, N]"),
           like("c", 0).of_rank(3, "[B, L, N]")},
          {param("delta_softplus", Kind::Bool).def(false)},
          {out("y", OutDtype::Like, "[B, L, D]"), out("last_state", OutDtype::Like, "[B, D, N]")},
          BP_PARAMS_SELECTIVE_SCAN, selective_scan);
  return t;
}

const std::vector<OpSpec>& table() {
  static const std::vector<OpSpec> t = build_table();
  return t;
}

const std::unordered_map<std::string, const OpSpec*>& index() {
  static const std::unordered_map<std::string, const OpSpec*> m = [] {
    std::unordered_map<std::string, const OpSpec*> r;
    for (const auto& s : table()) r[s.name] = &s;
    return r;
  }();
  return m;
}

const OpSpec* find_op(const std::string& op) {
  const auto it = index().find(op);
  return it == index().end() ? nullptr : it->second;
}

}  // namespace spec

int64_t normalize_dim(int64_t dim, int64_t rank, const std::string& what) {
  if (dim < -rank || dim >= rank)
    throw Error(what + ": dim " + std::to_string(dim) + " out of range for rank " + std::to_string(rank));
  return dim < 0 ? dim + rank : dim;
}

bool is_known_op(const std::string& op) { return find_op(op) != nullptr; }
bool is_variadic_op(const std::string& op) {
  const OpSpec* s = find_op(op);
  return s && s->variadic();
}

bool own_typed_repeat(const std::string& op, size_t i, bp_dtype dtype) {
  const OpSpec* s = find_op(op);
  if (!s || !s->variadic() || i < s->inputs.size()) return false;
  const InputSpec& last = s->inputs.back();
  return last.each_own && in_set(dtype, last.dtypes);
}

OptionalInputs optional_inputs(const std::string& op) {
  const OpSpec* s = find_op(op);
  if (!s || s->variadic() || s->required_inputs() == s->inputs.size()) return {};
  return {s->required_inputs(), s->inputs.size()};
}
bool is_custom_op(const std::string& op) { return op.find('.') != std::string::npos; }

std::vector<std::string> known_ops() {
  std::vector<std::string> v;
  for (const auto& s : table()) v.push_back(s.name);
  std::sort(v.begin(), v.end());
  return v;
}

InferredNode infer_node(const Node& node, const std::vector<const ValueType*>& inputs) {
  const OpSpec* op = find_op(node.op);
  if (!op) throw Error("node '" + node.name + "': unknown op '" + node.op + "'");
  Args a(node, *op, inputs);
  a.read();
  InferredNode r;
  r.cls = op->cls;
  r.canon = op->canon;
  r.params = params_of(op->params_kind);
  op->infer(a, r);
  // Output dtypes from the table.
  auto dtype_of = [&](const OutputSpec& o, bp_dtype current) {
    switch (o.dtype) {
      case OutDtype::Like:
        return a.x(static_cast<size_t>(o.like)).dtype;
      case OutDtype::Bool:
        return BP_DTYPE_BOOL;
      case OutDtype::I64:
        return BP_DTYPE_I64;
      case OutDtype::CastParam:
        return r.params.u.cast.dtype;
      case OutDtype::Slot:
        return current;
    }
    return current;
  };
  if (op->outputs.size() > 1) {
    for (size_t i = 0; i < r.out.slots.size(); ++i)
      r.out.slots[i].first = dtype_of(op->outputs[i], r.out.slots[i].first);
    r.out.dtype = r.out.slots[0].first;
    r.out.shape = r.out.slots[0].second;
  } else {
    r.out.dtype = dtype_of(op->outputs[0], r.out.dtype);
  }
  // Every result the core will hold: rank <= 8, element counts within 2^62.
  std::vector<const Shape*> shapes{&r.out.shape};
  for (const auto& s : r.out.slots) shapes.push_back(&s.second);
  for (const Shape* s : shapes) {
    if (s->size() > BP_MAX_RANK) a.fail("result rank exceeds 8");
    check_counts(a, *s);
  }
  return r;
}

}  // namespace backplane::detail
