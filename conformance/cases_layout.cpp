// Cases for the Contiguize kernel (`contiguous`) and, through it, for the
// view ops the core resolves without a kernel: reshape, permute, transpose,
// broadcast_to, slice (NumPy clamping, negative steps), squeeze, unsqueeze.
#include "conformance/cases.hpp"

namespace backplane::conformance {

namespace {

Fill move_fill(bp_dtype d) {
  if (is_float(d)) return with_specials(fill_uniform(-10, 10), {kNaN, kInf, -kInf, -0.0}, 0.05);
  return fill_full_range();
}

struct Chain {
  Shape source;
  std::vector<ViewStep> views;
  const char* note;
};

Json sl(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) {
  Json p = {{"dim", dim}, {"step", step}};
  if (start) p["start"] = *start;
  if (end) p["end"] = *end;
  return p;
}

std::vector<Chain> view_chains() {
  return {
      {{2, 3, 1, 2, 1, 3, 2, 2}, {{"permute", {{"dims", {7, 0, 6, 1, 5, 2, 4, 3}}}}}, "rank-8 permute"},
      {{4, 6}, {{"reshape", {{"shape", {2, 2, 6}}}}}, "reshape as a view"},
      {{6, 4}, {{"transpose", {{"dim0", 0}, {"dim1", 1}}}, {"reshape", {{"shape", {24}}}}}, "reshape needing a copy"},
      {{6, 4}, {{"transpose", {{"dim0", 1}, {"dim1", 0}}}, {"reshape", {{"shape", {2, -1, 3}}}}}, "reshape with -1"},
      {{1, 5, 1, 3}, {{"squeeze", Json::object()}}, "squeeze all"},
      {{1, 5, 1, 3}, {{"squeeze", {{"dims", {-2}}}}}, "squeeze one"},
      {{5, 3}, {{"unsqueeze", {{"dim", -1}}}, {"broadcast_to", {{"shape", {5, 3, 4}}}}}, "unsqueeze + broadcast"},
      {{5, 3}, {{"unsqueeze", {{"dim", 0}}}, {"transpose", {{"dim0", 0}, {"dim1", 2}}}}, "unsqueeze + transpose"},
      {{9, 4}, {{"slice", sl(0, -100, 100, 1)}}, "slice clamped to the whole dim"},
      {{9, 4}, {{"slice", sl(0, -3, std::nullopt, 1)}}, "slice negative start"},
      {{9, 4}, {{"slice", sl(0, 1, -1, 3)}}, "slice negative end, step 3"},
      {{9, 4}, {{"slice", sl(0, 100, std::nullopt, -3)}}, "slice step -3 clamped start"},
      {{9, 4}, {{"slice", sl(-1, 5, 2, 1)}}, "empty slice"},
      {{9, 4}, {{"slice", sl(-1, 2, 0, -1)}}, "negative step with end"},
      {{3, 1, 4}, {{"broadcast_to", {{"shape", {2, 3, 5, 4}}}}, {"slice", sl(2, 1, 4, 2)}, {"permute", {{"dims", {3, 1, 0, 2}}}}},
       "broadcast, slice, permute"},
      {{8, 6}, {{"slice", sl(0, 7, std::nullopt, -2)}, {"slice", sl(1, 1, 5, 1)}, {"transpose", {{"dim0", 0}, {"dim1", 1}}}},
       "negative step, slice, transpose"},
  };
}

void contiguous_cases(CaseContext& ctx) {
  const KernelSpec& k = ctx.kernel;
  if (!(k.declared_inputs() == 1 && k.in(0) == k.out()))
    throw NoCases("contiguous " + k.key() + ": contiguous maps x to like x (docs/ops.md)");
  const bp_dtype d = k.out();
  for (const auto& shape : elementwise_shapes(ctx.large)) {
    OpSpec s;
    s.op = "contiguous";
    s.tol = TolClass::Exact;
    s.inputs = {{"x", d, shape, move_fill(d)}};
    ctx.add(s);
  }
  for (const auto& c : view_chains()) {
    OpSpec s;
    s.op = "contiguous";
    s.tol = TolClass::Exact;
    s.layouts = {LayoutKind::Views};
    s.note = c.note;
    // The logical shape is what the chain yields on the source.
    HostTensor probe = make_tensor(BP_DTYPE_U8, c.source);
    for (const auto& v : c.views) probe = reference_view(v.op, probe, v.params);
    InputSpec in{"x", d, probe.shape, move_fill(d)};
    in.source_shape = c.source;
    in.views = c.views;
    s.inputs = {in};
    ctx.add(s);
  }
}

}  // namespace

void register_layout_cases() { register_op_cases("contiguous", contiguous_cases); }

}  // namespace backplane::conformance
