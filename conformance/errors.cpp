// Error cases: bad params, bad shapes, bad dtypes and bad data must raise a
// backplane::Error naming the op or the node, from compile or from the run,
// never crash; a plan whose run failed on bad data must still run on good
// data afterwards.
#include "conformance/conformance.hpp"

#include <cmath>
#include <map>
#include <set>

namespace backplane::conformance {

namespace {

const KernelInfo* pick(const std::vector<KernelInfo>& ks, const std::string& op,
                       const std::function<bool(const KernelInfo&)>& pred = nullptr) {
  const KernelInfo* best = nullptr;
  for (const auto& k : ks) {
    if (k.op != op || (pred && !pred(k))) continue;
    // f32 first, then i32, then the first claimed.
    auto rank = [](const KernelInfo& x) { return x.dtypes.back() == BP_DTYPE_F32 ? 0 : x.dtypes.back() == BP_DTYPE_I32 ? 1 : 2; };
    if (!best || rank(k) < rank(*best)) best = &k;
  }
  return best;
}

HostTensor tensor(bp_dtype d, Shape shape, const std::vector<double>& values) {
  HostTensor t = make_tensor(d, std::move(shape));
  for (int64_t k = 0; k < shape_numel(t.shape); ++k) {
    const double v = values.empty() ? static_cast<double>(k % 3) : values[static_cast<size_t>(k) % values.size()];
    if (is_float(d)) store_f64(t, k, v); else store_i64(t, k, static_cast<int64_t>(v));
  }
  return t;
}

struct Builder {
  std::vector<ErrorCase>* out;
  ErrorCase e;

  Builder(std::vector<ErrorCase>* o, const std::string& op, const KernelInfo* k, std::string label) : out(o) {
    e.op = op;
    e.dtype_key = k ? dtype_key(k->dtypes, k->variadic) : "-";
    e.label = std::move(label);
  }
  Builder& input(const std::string& name, HostTensor t) {
    e.graph.input(name, t.dtype, t.shape);
    e.inputs[name] = std::move(t);
    return *this;
  }
  Builder& node(const std::string& name, const std::string& op, std::vector<std::string> in, Json p = Json::object()) {
    e.graph.node(name, op, std::move(in), std::move(p));
    return *this;
  }
  Builder& output(const std::string& name) {
    e.graph.output(name);
    return *this;
  }
  Builder& mention(std::vector<std::string> m) {
    e.mention = std::move(m);
    return *this;
  }
  void done() { out->push_back(std::move(e)); }
};

bp_dtype float_of(const KernelInfo* k) { return k && is_float(k->dtypes.back()) ? k->dtypes.back() : BP_DTYPE_F32; }

// A minimal valid node for `k` whose inputs are all dense f-like tensors, to
// which a bogus param is added. Only for ops whose inputs share a shape.
void unknown_param_case(std::vector<ErrorCase>& out, const KernelInfo& k) {
  static const std::map<std::string, Json> required = {
      {"argmax", {{"dim", 0}}},   {"argmin", {{"dim", 0}}},  {"softmax", {{"dim", 0}}},  {"log_softmax", {{"dim", 0}}},
      {"cumsum", {{"dim", 0}}},   {"gather", {{"dim", 0}}},  {"index_select", {{"dim", 0}}}, {"concat", {{"dim", 0}}}, {"slice_update", {{"dim", 0}}},
      {"layer_norm", {{"dims", {-1}}}}, {"topk", {{"k", 1}}}, {"cast", {{"dtype", "f32"}}}};
  const std::string& op = k.op;
  if (op == "matmul" || op == "conv2d" || op == "selective_scan" || op == "max_pool2d" || op == "avg_pool2d")
    return;  // shapes of their own; covered below
  if (op.find('.') != std::string::npos) return;  // vendor ops police their own params
  Json p = required.count(op) ? required.at(op) : Json::object();
  if (op == "cast") p["dtype"] = std::string(dtype_name(k.dtypes.back()));
  p["no_such_param"] = 1;
  const std::string node = "bad_" + op;
  Builder b(&out, op, &k, "unknown param name");
  std::vector<std::string> ins;
  const size_t n_in = k.dtypes.size() - 1;
  for (size_t i = 0; i < n_in; ++i) {
    const std::string name = "in" + std::to_string(i);
    if (op == "layer_norm" && i > 0) {
      ins.emplace_back("");
      continue;
    }
    b.input(name, tensor(k.dtypes[i], {3}, {0, 1, 1}));
    ins.push_back(name);
  }
  b.node(node, op, ins, p);
  if (k.bundle_slots > 0) {
    b.node("y", "view", {node}, {{"slot", 0}}).output("y");
  } else {
    b.output(node);
  }
  b.mention({node, op}).done();
}

}  // namespace

std::vector<ErrorCase> error_cases_for(const std::vector<KernelInfo>& ks) {
  std::vector<ErrorCase> out;
  std::set<std::string> seen;
  for (const auto& k : ks)
    if (seen.insert(k.op).second) unknown_param_case(out, k);

  if (auto k = pick(ks, "sum")) {
    const bp_dtype d = k->dtypes.back();
    Builder(&out, "sum", k, "dims: [] is an error")
        .input("x", tensor(d, {2, 3}, {}))
        .node("bad_sum", "sum", {"x"}, {{"dims", Json::array()}})
        .output("bad_sum")
        .mention({"bad_sum", "sum"})
        .done();
  }
  if (auto k = pick(ks, "var_mean")) {
    const bp_dtype d = k->dtypes.back();
    Builder(&out, "var_mean", k, "dims: [] is an error")
        .input("x", tensor(d, {2, 3}, {}))
        .node("bad_var_mean", "var_mean", {"x"}, {{"dims", Json::array()}})
        .node("y", "view", {"bad_var_mean"}, {{"slot", 0}})
        .output("y")
        .mention({"bad_var_mean", "var_mean"})
        .done();
  }
  if (auto k = pick(ks, "contiguous")) {
    const bp_dtype d = k->dtypes.back();
    Builder(&out, "contiguous", k, "squeeze of a dim whose size is not 1")
        .input("x", tensor(d, {2, 3}, {}))
        .node("bad_squeeze", "squeeze", {"x"}, {{"dims", {0}}})
        .node("y", "contiguous", {"bad_squeeze"})
        .output("y")
        .mention({"bad_squeeze", "squeeze"})
        .done();
    Builder(&out, "contiguous", k, "slice with step 0")
        .input("x", tensor(d, {4, 3}, {}))
        .node("bad_slice", "slice", {"x"}, {{"dim", 0}, {"start", 0}, {"end", 2}, {"step", 0}})
        .node("y", "contiguous", {"bad_slice"})
        .output("y")
        .mention({"bad_slice", "slice"})
        .done();
    Builder(&out, "contiguous", k, "reshape with two -1")
        .input("x", tensor(d, {4, 3}, {}))
        .node("bad_reshape", "reshape", {"x"}, {{"shape", {-1, -1}}})
        .node("y", "contiguous", {"bad_reshape"})
        .output("y")
        .mention({"bad_reshape", "reshape"})
        .done();
    Builder(&out, "contiguous", k, "reshape to a different element count")
        .input("x", tensor(d, {4, 3}, {}))
        .node("bad_reshape", "reshape", {"x"}, {{"shape", {5, 2}}})
        .node("y", "contiguous", {"bad_reshape"})
        .output("y")
        .mention({"bad_reshape", "reshape"})
        .done();
    Builder(&out, "contiguous", k, "permute that repeats a dim")
        .input("x", tensor(d, {4, 3}, {}))
        .node("bad_permute", "permute", {"x"}, {{"dims", {0, 0}}})
        .node("y", "contiguous", {"bad_permute"})
        .output("y")
        .mention({"bad_permute", "permute"})
        .done();
    Builder(&out, "contiguous", k, "broadcast_to an incompatible shape")
        .input("x", tensor(d, {4, 3}, {}))
        .node("bad_broadcast", "broadcast_to", {"x"}, {{"shape", {4, 5}}})
        .node("y", "contiguous", {"bad_broadcast"})
        .output("y")
        .mention({"bad_broadcast", "broadcast_to"})
        .done();
    Builder(&out, "(graph)", k, "unknown op")
        .input("x", tensor(d, {2}, {}))
        .node("bad_node", "no_such_op", {"x"})
        .output("bad_node")
        .mention({"bad_node", "no_such_op"})
        .done();
    Builder(&out, "(graph)", k, "node reading an unknown value")
        .input("x", tensor(d, {2}, {}))
        .node("bad_node", "contiguous", {"missing_value"})
        .output("bad_node")
        .mention({"bad_node", "missing_value"})
        .done();
  }
  if (auto k = pick(ks, "add")) {
    const bp_dtype d = k->dtypes.back();
    const bp_dtype e = d == BP_DTYPE_F16 ? BP_DTYPE_F32 : BP_DTYPE_F16;
    Builder(&out, "add", k, "a and b of different dtypes (no implicit promotion)")
        .input("a", tensor(d, {3}, {}))
        .input("b", tensor(e, {3}, {}))
        .node("bad_add", "add", {"a", "b"})
        .output("bad_add")
        .mention({"bad_add", "add"})
        .done();
    Builder(&out, "add", k, "shapes that do not broadcast")
        .input("a", tensor(d, {3, 4}, {}))
        .input("b", tensor(d, {5}, {}))
        .node("bad_add", "add", {"a", "b"})
        .output("bad_add")
        .mention({"bad_add", "add"})
        .done();
  }
  if (auto k = pick(ks, "gather", [](const KernelInfo& k) { return k.dtypes.size() == 3; })) {
    const bp_dtype d = k->dtypes.back();
    for (double bad : {4.0, -5.0}) {
      ErrorCase e;
      e.op = "gather";
      e.dtype_key = dtype_key(k->dtypes, k->variadic);
      e.label = "index " + value_str(bad) + " out of range";
      e.graph.input("x", d, {3, 4});
      e.graph.input("index", BP_DTYPE_I64, {3, 4});
      e.graph.node("y", "gather", {"x", "index"}, {{"dim", 1}});
      e.graph.output("y");
      e.inputs = {{"x", tensor(d, {3, 4}, {1, 2, 3, 4, 5})}, {"index", tensor(BP_DTYPE_I64, {3, 4}, {0, 1, bad, 3, -1})}};
      e.mention = {"gather"};
      e.recover_inputs = {{"x", e.inputs["x"]}, {"index", tensor(BP_DTYPE_I64, {3, 4}, {0, 1, -4, 3, -1})}};
      e.recover_expected = reference("gather", {&e.recover_inputs["x"], &e.recover_inputs["index"]}, {{"dim", 1}})[0];
      out.push_back(std::move(e));
    }
    Builder(&out, "gather", k, "i32 index (indices are i64)")
        .input("x", tensor(d, {3, 4}, {}))
        .input("index", tensor(BP_DTYPE_I32, {3, 4}, {0}))
        .node("bad_gather", "gather", {"x", "index"}, {{"dim", 1}})
        .output("bad_gather")
        .mention({"bad_gather", "gather"})
        .done();
    Builder(&out, "gather", k, "dim is required")
        .input("x", tensor(d, {3, 4}, {}))
        .input("index", tensor(BP_DTYPE_I64, {3, 4}, {0}))
        .node("bad_gather", "gather", {"x", "index"})
        .output("bad_gather")
        .mention({"bad_gather", "gather"})
        .done();
  }
  if (auto k = pick(ks, "index_select", [](const KernelInfo& k) { return k.dtypes.size() == 3; })) {
    const bp_dtype d = k->dtypes.back();
    ErrorCase e;
    e.op = "index_select";
    e.dtype_key = dtype_key(k->dtypes, k->variadic);
    e.label = "index out of range";
    e.graph.input("x", d, {3, 4});
    e.graph.input("index", BP_DTYPE_I64, {3});
    e.graph.node("y", "index_select", {"x", "index"}, {{"dim", 1}});
    e.graph.output("y");
    e.inputs = {{"x", tensor(d, {3, 4}, {1, 2, 3})}, {"index", tensor(BP_DTYPE_I64, {3}, {0, 5, 1})}};
    e.mention = {"index_select"};
    e.recover_inputs = {{"x", e.inputs["x"]}, {"index", tensor(BP_DTYPE_I64, {3}, {0, -1, 1})}};
    e.recover_expected = reference("index_select", {&e.recover_inputs["x"], &e.recover_inputs["index"]}, {{"dim", 1}})[0];
    out.push_back(std::move(e));
  }
  // A start one row past the room left (the off-by-one a cache append makes
  // at max_seq), then -1: both refused, naming the op; then a start at the
  // last row that fits.
  if (auto k = pick(ks, "slice_update", [](const KernelInfo& k) { return k.dtypes.size() == 4; })) {
    const bp_dtype d = k->dtypes.back();
    for (double bad_start : {3.0, -1.0}) {
      ErrorCase e;
      e.op = "slice_update";
      e.dtype_key = dtype_key(k->dtypes, k->variadic);
      e.label = "start " + std::to_string(static_cast<int>(bad_start)) + " out of range";
      e.graph.input("x", d, {4, 3});
      e.graph.input("update", d, {2, 3});
      e.graph.input("start", BP_DTYPE_I64, {1});
      e.graph.node("y", "slice_update", {"x", "update", "start"}, {{"dim", 0}});
      e.graph.output("y");
      e.inputs = {{"x", tensor(d, {4, 3}, {1, 2, 3})},
                  {"update", tensor(d, {2, 3}, {0, 1})},
                  {"start", tensor(BP_DTYPE_I64, {1}, {bad_start})}};
      e.mention = {"slice_update"};
      e.recover_inputs = {{"x", e.inputs["x"]}, {"update", e.inputs["update"]}, {"start", tensor(BP_DTYPE_I64, {1}, {2})}};
      e.recover_expected = reference(
          "slice_update", {&e.recover_inputs["x"], &e.recover_inputs["update"], &e.recover_inputs["start"]},
          {{"dim", 0}})[0];
      out.push_back(std::move(e));
    }
  }
  if (auto k = pick(ks, "div", [](const KernelInfo& k) { return is_int(k.dtypes.back()); })) {
    const bp_dtype d = k->dtypes.back();
    ErrorCase e;
    e.op = "div";
    e.dtype_key = dtype_key(k->dtypes, k->variadic);
    e.label = "integer division by zero";
    e.graph.input("a", d, {4});
    e.graph.input("b", d, {4});
    e.graph.node("y", "div", {"a", "b"});
    e.graph.output("y");
    e.inputs = {{"a", tensor(d, {4}, {7, 8, 9, 10})}, {"b", tensor(d, {4}, {2, 0, 3, 1})}};
    e.mention = {"div"};
    e.recover_inputs = {{"a", e.inputs["a"]}, {"b", tensor(d, {4}, {2, 4, 3, 1})}};
    e.recover_expected = reference("div", {&e.recover_inputs["a"], &e.recover_inputs["b"]}, Json::object())[0];
    out.push_back(std::move(e));
  }
  // float -> int casts of NaN, infinity and out-of-range values: per target
  // dtype, one source (f32 where claimed).
  std::map<bp_dtype, const KernelInfo*> cast_by_target;
  for (const auto& k : ks) {
    if (k.op != "cast" || k.dtypes.size() != 2 || !is_float(k.dtypes[0]) || !is_int(k.dtypes[1])) continue;
    auto& slot = cast_by_target[k.dtypes[1]];
    if (!slot || k.dtypes[0] == BP_DTYPE_F32) slot = &k;
  }
  for (const auto& [to, kp] : cast_by_target) {
    const KernelInfo& k = *kp;
    const bp_dtype from = k.dtypes[0];
    const double big = to == BP_DTYPE_I64 ? 1e19 : to == BP_DTYPE_I32 ? 1e10 : 70000.0;
    const double over = from == BP_DTYPE_F16 && big > 6e4 ? kInf : big;
    for (double bad : {kNaN, kInf, -kInf, over}) {
      ErrorCase e;
      e.op = "cast";
      e.dtype_key = dtype_key(k.dtypes, k.variadic);
      e.label = "cast of " + value_str(bad) + " to " + std::string(dtype_name(to));
      e.graph.input("x", from, {3});
      e.graph.node("y", "cast", {"x"}, {{"dtype", std::string(dtype_name(to))}});
      e.graph.output("y");
      e.inputs = {{"x", tensor(from, {3}, {1.5, bad, 2.0})}};
      e.mention = {"cast"};
      e.recover_inputs = {{"x", tensor(from, {3}, {1.5, 3.75, 2.0})}};
      e.recover_expected = reference("cast", {&e.recover_inputs["x"]}, {{"dtype", std::string(dtype_name(to))}})[0];
      out.push_back(std::move(e));
    }
  }
  for (const char* op : {"max", "min"}) {
    if (auto k = pick(ks, op)) {
      Builder(&out, op, k, "reduction over an empty axis")
          .input("x", tensor(k->dtypes.back(), {0, 3}, {}))
          .node(std::string("bad_") + op, op, {"x"}, {{"dims", {0}}})
          .output(std::string("bad_") + op)
          .mention({std::string("bad_") + op, op})
          .done();
    }
  }
  for (const char* op : {"argmax", "argmin"}) {
    if (auto k = pick(ks, op)) {
      Builder(&out, op, k, "reduction over an empty axis")
          .input("x", tensor(k->dtypes[0], {0, 3}, {}))
          .node(std::string("bad_") + op, op, {"x"}, {{"dim", 0}})
          .output(std::string("bad_") + op)
          .mention({std::string("bad_") + op, op})
          .done();
    }
  }
  if (auto k = pick(ks, "matmul")) {
    const bp_dtype d = k->dtypes.back();
    Builder(&out, "matmul", k, "inner dims differ")
        .input("a", tensor(d, {2, 3}, {}))
        .input("b", tensor(d, {4, 5}, {}))
        .node("bad_matmul", "matmul", {"a", "b"})
        .output("bad_matmul")
        .mention({"bad_matmul", "matmul"})
        .done();
    Builder(&out, "matmul", k, "rank-0 operand")
        .input("a", tensor(d, {}, {}))
        .input("b", tensor(d, {4, 5}, {}))
        .node("bad_matmul", "matmul", {"a", "b"})
        .output("bad_matmul")
        .mention({"bad_matmul", "matmul"})
        .done();
  }
  if (auto k = pick(ks, "softmax")) {
    const bp_dtype d = k->dtypes.back();
    Builder(&out, "softmax", k, "dim is required")
        .input("x", tensor(d, {2, 3}, {}))
        .node("bad_softmax", "softmax", {"x"})
        .output("bad_softmax")
        .mention({"bad_softmax", "softmax"})
        .done();
    Builder(&out, "softmax", k, "dim of the wrong type")
        .input("x", tensor(d, {2, 3}, {}))
        .node("bad_softmax", "softmax", {"x"}, {{"dim", "last"}})
        .output("bad_softmax")
        .mention({"bad_softmax", "softmax"})
        .done();
    Builder(&out, "softmax", k, "dim out of range")
        .input("x", tensor(d, {2, 3}, {}))
        .node("bad_softmax", "softmax", {"x"}, {{"dim", 2}})
        .output("bad_softmax")
        .mention({"bad_softmax", "softmax"})
        .done();
  }
  if (auto k = pick(ks, "cumsum")) {
    Builder(&out, "cumsum", k, "dim out of range")
        .input("x", tensor(k->dtypes.back(), {2, 3}, {}))
        .node("bad_cumsum", "cumsum", {"x"}, {{"dim", -3}})
        .output("bad_cumsum")
        .mention({"bad_cumsum", "cumsum"})
        .done();
  }
  if (auto k = pick(ks, "topk")) {
    const bp_dtype d = k->dtypes.back();
    Builder(&out, "topk", k, "k larger than the dim")
        .input("x", tensor(d, {2, 3}, {}))
        .node("bad_topk", "topk", {"x"}, {{"k", 4}})
        .node("y", "view", {"bad_topk"}, {{"slot", 0}})
        .output("y")
        .mention({"bad_topk", "topk"})
        .done();
    Builder(&out, "topk", k, "a bundle as a graph output")
        .input("x", tensor(d, {2, 3}, {}))
        .node("bad_topk", "topk", {"x"}, {{"k", 1}})
        .output("bad_topk")
        .mention({"bad_topk", "topk"})
        .done();
    Builder(&out, "topk", k, "view of a slot the bundle lacks")
        .input("x", tensor(d, {2, 3}, {}))
        .node("t", "topk", {"x"}, {{"k", 1}})
        .node("bad_view", "view", {"t"}, {{"slot", 2}})
        .output("bad_view")
        .mention({"bad_view", "view"})
        .done();
  }
  if (auto k = pick(ks, "concat")) {
    const bp_dtype d = k->dtypes.back();
    Builder(&out, "concat", k, "shapes differ outside dim")
        .input("a", tensor(d, {2, 3}, {}))
        .input("b", tensor(d, {3, 4}, {}))
        .node("bad_concat", "concat", {"a", "b"}, {{"dim", 0}})
        .output("bad_concat")
        .mention({"bad_concat", "concat"})
        .done();
  }
  if (auto k = pick(ks, "where")) {
    const bp_dtype d = k->dtypes.back();
    const bp_dtype c = d == BP_DTYPE_F32 ? BP_DTYPE_I32 : BP_DTYPE_F32;
    Builder(&out, "where", k, "condition that is not bool")
        .input("cond", tensor(c, {3}, {1, 0, 1}))
        .input("a", tensor(d, {3}, {}))
        .input("b", tensor(d, {3}, {}))
        .node("bad_where", "where", {"cond", "a", "b"})
        .output("bad_where")
        .mention({"bad_where", "where"})
        .done();
  }
  if (auto k = pick(ks, "conv2d")) {
    const bp_dtype d = float_of(k);
    Builder(&out, "conv2d", k, "channels of x and w differ")
        .input("x", tensor(d, {1, 3, 5, 5}, {}))
        .input("w", tensor(d, {2, 4, 3, 3}, {}))
        .node("bad_conv", "conv2d", {"x", "w", ""})
        .output("bad_conv")
        .mention({"bad_conv", "conv2d"})
        .done();
    Builder(&out, "conv2d", k, "padding with 3 values")
        .input("x", tensor(d, {1, 3, 5, 5}, {}))
        .input("w", tensor(d, {2, 3, 3, 3}, {}))
        .node("bad_conv", "conv2d", {"x", "w", ""}, {{"padding", {1, 1, 1}}})
        .output("bad_conv")
        .mention({"bad_conv", "conv2d"})
        .done();
  }
  for (const char* pool : {"max_pool2d", "avg_pool2d"}) {
    const KernelInfo* k = pick(ks, pool);
    if (!k) continue;
    const bp_dtype d = float_of(k);
    const std::string op = pool;
    // Each: params (or x) that inference must refuse, and a word the message must hold.
    struct Bad {
      const char* label;
      Shape x;
      Json params;
      const char* says;
    };
    std::vector<Bad> bad = {
        {"kernel_size missing", {1, 1, 4, 4}, {{"stride", 1}}, "kernel_size"},
        {"kernel_size 0", {1, 1, 4, 4}, {{"kernel_size", 0}}, "kernel_size"},
        {"kernel_size with 3 values", {1, 1, 4, 4}, {{"kernel_size", {2, 2, 2}}}, "kernel_size"},
        {"stride 0", {1, 1, 4, 4}, {{"kernel_size", 2}, {"stride", {1, 0}}}, "stride"},
        {"negative padding", {1, 1, 4, 4}, {{"kernel_size", 2}, {"padding", -1}}, "padding"},
        {"padding with 3 values", {1, 1, 4, 4}, {{"kernel_size", 2}, {"padding", {1, 1, 1}}}, "padding"},
        {"dilation 0", {1, 1, 4, 4}, {{"kernel_size", 2}, {"dilation", 0}}, "dilation"},
        {"kernel beyond int32", {1, 1, 4, 4}, {{"kernel_size", int64_t{1} << 31}}, "int32"},
        {"padding beyond int32", {1, 1, 4, 4}, {{"kernel_size", 2}, {"padding", {0, int64_t{1} << 31}}}, "int32"},
        {"kernel span larger than the padded input", {1, 1, 4, 5}, {{"kernel_size", {2, 3}}, {"dilation", 4}, {"padding", {0, 1}}},
         "padded input"},
        {"ceil_mode that is not a bool", {1, 1, 4, 4}, {{"kernel_size", 2}, {"ceil_mode", 1}}, "ceil_mode"},
        {"x of rank 3", {1, 4, 4}, {{"kernel_size", 2}}, "rank"},
        {"unknown param", {1, 1, 4, 4}, {{"kernel_size", 2}, {"no_such_param", 1}}, "no_such_param"},
    };
    if (op == "max_pool2d")
      bad.push_back({"count_include_pad (avg_pool2d's only)", {1, 1, 4, 4}, {{"kernel_size", 2}, {"count_include_pad", true}},
                     "count_include_pad"});
    else
      bad.push_back({"count_include_pad that is not a bool", {1, 1, 4, 4}, {{"kernel_size", 2}, {"count_include_pad", 0}},
                     "count_include_pad"});
    for (const auto& b : bad)
      Builder(&out, op, k, b.label)
          .input("x", tensor(d, b.x, {}))
          .node("bad_pool", op, {"x"}, b.params)
          .output("bad_pool")
          .mention({"bad_pool", op, b.says})
          .done();
    Builder(&out, op, k, "an integer x")
        .input("x", tensor(BP_DTYPE_I32, {1, 1, 4, 4}, {}))
        .node("bad_pool", op, {"x"}, {{"kernel_size", 2}})
        .output("bad_pool")
        .mention({"bad_pool", op, "float"})
        .done();
  }
  if (auto k = pick(ks, "layer_norm")) {
    const bp_dtype d = float_of(k);
    Builder(&out, "layer_norm", k, "weight of the wrong shape")
        .input("x", tensor(d, {2, 3}, {}))
        .input("w", tensor(d, {4}, {}))
        .node("bad_ln", "layer_norm", {"x", "w", ""}, {{"dims", {-1}}})
        .output("bad_ln")
        .mention({"bad_ln", "layer_norm"})
        .done();
    Builder(&out, "layer_norm", k, "dims that are not trailing")
        .input("x", tensor(d, {2, 3}, {}))
        .node("bad_ln", "layer_norm", {"x", "", ""}, {{"dims", {0}}})
        .output("bad_ln")
        .mention({"bad_ln", "layer_norm"})
        .done();
  }
  if (auto k = pick(ks, "selective_scan")) {
    const bp_dtype d = float_of(k);
    Builder(&out, "selective_scan", k, "a of the wrong shape")
        .input("u", tensor(d, {1, 2, 3}, {}))
        .input("delta", tensor(d, {1, 2, 3}, {}))
        .input("a", tensor(d, {4, 2}, {}))
        .input("b", tensor(d, {1, 2, 2}, {}))
        .input("c", tensor(d, {1, 2, 2}, {}))
        .node("bad_scan", "selective_scan", {"u", "delta", "a", "b", "c"})
        .node("y", "view", {"bad_scan"}, {{"slot", 0}})
        .output("y")
        .mention({"bad_scan", "selective_scan"})
        .done();
  }
  return out;
}

}  // namespace backplane::conformance
