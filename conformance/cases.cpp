#include "conformance/cases.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>

namespace backplane::conformance {

// ---------------------------------------------------------------------------
// KernelSpec

KernelSpec KernelSpec::from(const KernelInfo& k) {
  KernelSpec s;
  s.op = k.op;
  s.dtypes = k.dtypes;
  s.layouts = k.layouts;
  s.bundle_slots = k.bundle_slots;
  s.variadic = k.variadic;
  return s;
}

bp_dtype KernelSpec::in(size_t i) const {
  const size_t n = declared_inputs();
  if (n == 0) return BP_DTYPE_INVALID;
  return dtypes[std::min(i, n - 1)];
}

bp_layout_capability KernelSpec::layout(size_t i) const {
  if (layouts.empty()) return BP_LAYOUT_CONTIGUOUS;
  return layouts[std::min(i, layouts.size() - 1)];
}

std::string dtype_key(const std::vector<bp_dtype>& dtypes, bool variadic) {
  std::string s;
  for (size_t k = 0; k + 1 < dtypes.size(); ++k) {
    if (k) s += ",";
    s += dtype_name(dtypes[k]);
    if (variadic && k + 2 == dtypes.size()) s += "...";
  }
  return s + "->" + (dtypes.empty() ? std::string("?") : std::string(dtype_name(dtypes.back())));
}

std::string KernelSpec::key() const { return dtype_key(dtypes, variadic); }

const char* layout_name(LayoutKind k) {
  switch (k) {
    case LayoutKind::Contiguous: return "contiguous";
    case LayoutKind::Broadcast: return "broadcast";
    case LayoutKind::Transposed: return "transposed";
    case LayoutKind::Sliced: return "sliced";
    case LayoutKind::NegStep: return "negstep";
    case LayoutKind::Views: return "views";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Registry

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, CaseGenerator> generators;
};

Registry& registry() {
  static Registry r;
  return r;
}

bool g_registering_builtins = false;

void ensure_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_registering_builtins = true;
    register_elementwise_cases();
    register_reduction_cases();
    register_linalg_cases();
    register_bundle_cases();
    register_layout_cases();
    g_registering_builtins = false;
  });
}

}  // namespace

void register_op_cases(const std::string& op, CaseGenerator generator) {
  // Built-ins register first, so a caller's generator replaces a built-in.
  if (!g_registering_builtins) ensure_builtins();
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.generators[op] = std::move(generator);
}

const CaseGenerator* find_op_cases(const std::string& op) {
  ensure_builtins();
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.generators.find(op);
  return it == r.generators.end() ? nullptr : &it->second;
}

std::vector<std::string> registered_ops() {
  ensure_builtins();
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> ops;
  for (const auto& [op, g] : r.generators) ops.push_back(op);
  return ops;
}

// ---------------------------------------------------------------------------
// Fills

namespace {

void fill_bool_values(HostTensor& t, Rng& rng) {
  for (int64_t k = 0; k < shape_numel(t.shape); ++k) store_i64(t, k, static_cast<int64_t>(rng() & 1u));
}

int64_t uniform_int(Rng& rng, int64_t lo, int64_t hi) {
  if (lo == std::numeric_limits<int64_t>::min() && hi == std::numeric_limits<int64_t>::max())
    return static_cast<int64_t>(rng());
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

}  // namespace

Fill fill_uniform(double lo, double hi) {
  return [lo, hi](HostTensor& t, Rng& rng) {
    if (t.dtype == BP_DTYPE_BOOL) return fill_bool_values(t, rng);
    const int64_t n = shape_numel(t.shape);
    if (is_float(t.dtype)) {
      std::uniform_real_distribution<double> u(lo, hi);
      for (int64_t k = 0; k < n; ++k) store_f64(t, k, u(rng));
      return;
    }
    const int64_t a = std::max(static_cast<int64_t>(std::ceil(lo)), int_min(t.dtype));
    const int64_t b = std::min(static_cast<int64_t>(std::floor(hi)), int_max(t.dtype));
    for (int64_t k = 0; k < n; ++k) store_i64(t, k, uniform_int(rng, a, std::max(a, b)));
  };
}

Fill fill_ints(int64_t lo, int64_t hi) {
  return [lo, hi](HostTensor& t, Rng& rng) {
    if (t.dtype == BP_DTYPE_BOOL) return fill_bool_values(t, rng);
    const int64_t n = shape_numel(t.shape);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t v = uniform_int(rng, lo, hi);
      if (is_float(t.dtype)) store_f64(t, k, static_cast<double>(v)); else store_i64(t, k, v);
    }
  };
}

Fill fill_full_range() {
  return [](HostTensor& t, Rng& rng) {
    if (t.dtype == BP_DTYPE_BOOL) return fill_bool_values(t, rng);
    if (is_float(t.dtype)) return fill_uniform(-100, 100)(t, rng);
    const int64_t n = shape_numel(t.shape);
    for (int64_t k = 0; k < n; ++k) store_i64(t, k, uniform_int(rng, int_min(t.dtype), int_max(t.dtype)));
  };
}

Fill fill_bools() {
  return [](HostTensor& t, Rng& rng) {
    const int64_t n = shape_numel(t.shape);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t v = static_cast<int64_t>(rng() & 1u);
      if (is_float(t.dtype)) store_f64(t, k, static_cast<double>(v)); else store_i64(t, k, v);
    }
  };
}

Fill fill_discrete(std::vector<double> values) {
  return [values](HostTensor& t, Rng& rng) {
    if (t.dtype == BP_DTYPE_BOOL) return fill_bool_values(t, rng);
    const int64_t n = shape_numel(t.shape);
    std::uniform_int_distribution<size_t> pick(0, values.size() - 1);
    for (int64_t k = 0; k < n; ++k) {
      const double v = values[pick(rng)];
      if (is_float(t.dtype)) {
        store_f64(t, k, v);
      } else {
        store_i64(t, k, std::clamp(static_cast<int64_t>(v), int_min(t.dtype), int_max(t.dtype)));
      }
    }
  };
}

Fill fill_nonzero(double lo, double hi) {
  return [lo, hi](HostTensor& t, Rng& rng) {
    if (t.dtype == BP_DTYPE_BOOL) {
      for (int64_t k = 0; k < shape_numel(t.shape); ++k) store_i64(t, k, 1);
      return;
    }
    const int64_t n = shape_numel(t.shape);
    const bool is_unsigned = t.dtype == BP_DTYPE_U8;
    for (int64_t k = 0; k < n; ++k) {
      const bool neg = !is_unsigned && (rng() & 1u);
      if (is_float(t.dtype)) {
        const double m = std::uniform_real_distribution<double>(lo, hi)(rng);
        store_f64(t, k, neg ? -m : m);
      } else {
        const int64_t a = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(lo)));
        const int64_t b = std::max(a, std::min(static_cast<int64_t>(std::floor(hi)), int_max(t.dtype)));
        const int64_t m = uniform_int(rng, a, b);
        store_i64(t, k, neg ? -m : m);
      }
    }
  };
}

Fill with_specials(Fill base, std::vector<double> specials, double fraction) {
  return [base, specials, fraction](HostTensor& t, Rng& rng) {
    base(t, rng);
    if (!is_float(t.dtype) || specials.empty()) return;
    const int64_t n = shape_numel(t.shape);
    int64_t count = static_cast<int64_t>(std::llround(static_cast<double>(n) * fraction));
    if (n >= 4) count = std::max<int64_t>(count, 1);
    std::uniform_int_distribution<int64_t> pos(0, std::max<int64_t>(n - 1, 0));
    std::uniform_int_distribution<size_t> pick(0, specials.size() - 1);
    for (int64_t c = 0; c < count && n > 0; ++c) store_f64(t, pos(rng), specials[pick(rng)]);
  };
}

const std::vector<bp_dtype>& float_dtypes() {
  static const std::vector<bp_dtype> v = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64};
  return v;
}
const std::vector<bp_dtype>& int_dtypes() {
  static const std::vector<bp_dtype> v = {BP_DTYPE_I8, BP_DTYPE_I16, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8};
  return v;
}
const std::vector<bp_dtype>& all_dtypes() {
  static const std::vector<bp_dtype> v = {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64, BP_DTYPE_I8,
                                          BP_DTYPE_I16, BP_DTYPE_I32,  BP_DTYPE_I64,  BP_DTYPE_U8,  BP_DTYPE_BOOL};
  return v;
}
bool in_set(bp_dtype d, const std::vector<bp_dtype>& set) { return std::find(set.begin(), set.end(), d) != set.end(); }

std::vector<Shape> elementwise_shapes(bool large) {
  std::vector<Shape> s = {{},        {0},       {1},          {5},
                          {7, 13},   {3, 0, 4}, {1, 1, 1},    {2, 3, 4},
                          {6, 1},    {2, 1, 3, 1, 2},         {2, 1, 2, 1, 2, 1, 2, 3}};
  if (large) s.push_back({255, 257});
  return s;
}

// ---------------------------------------------------------------------------
// Layout realisation

namespace {

struct Realised {
  Shape source;
  std::vector<ViewStep> views;
};

Json slice_params(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) {
  Json p = {{"dim", dim}, {"step", step}};
  if (start) p["start"] = *start;
  if (end) p["end"] = *end;
  return p;
}

// How input `which` of logical shape `shape` is fed for layout `kind`;
// nullopt when the layout does not apply (rank too small, nothing to
// broadcast).
std::optional<Realised> realise(LayoutKind kind, const Shape& shape, size_t which) {
  const auto r = static_cast<int64_t>(shape.size());
  Realised out;
  out.source = shape;
  switch (kind) {
    case LayoutKind::Contiguous:
    case LayoutKind::Views:
      return out;
    case LayoutKind::Transposed: {
      if (r < 2) return std::nullopt;
      if (r == 2 || which % 2 == 1) {
        // Swap the last two dims (negative dims on purpose).
        std::swap(out.source[static_cast<size_t>(r - 2)], out.source[static_cast<size_t>(r - 1)]);
        out.views.push_back({"transpose", {{"dim0", -1}, {"dim1", -2}}});
      } else {
        // Reverse every dim: the innermost dim has the largest stride.
        std::reverse(out.source.begin(), out.source.end());
        std::vector<int64_t> dims(static_cast<size_t>(r));
        for (int64_t k = 0; k < r; ++k) dims[static_cast<size_t>(k)] = r - 1 - k;
        out.views.push_back({"permute", {{"dims", dims}}});
      }
      return out;
    }
    case LayoutKind::Sliced: {
      if (r < 1) return std::nullopt;
      // Last dim: start 1, two extra elements after the end; dim 0: start 2.
      const int64_t n = shape.back();
      out.source.back() = n + 3;
      out.views.push_back({"slice", slice_params(r - 1, 1, 1 + n, 1)});
      if (r >= 2) {
        out.source[0] = shape[0] + 2;
        out.views.push_back({"slice", slice_params(0, 2, std::nullopt, 1)});
      }
      return out;
    }
    case LayoutKind::NegStep: {
      if (r < 1) return std::nullopt;
      const int64_t n0 = shape[0];
      if (n0 >= 1) {
        out.source[0] = 2 * n0;  // every other element, from the last one back
        out.views.push_back({"slice", slice_params(0, 2 * n0 - 1, std::nullopt, -2)});
      } else {
        out.views.push_back({"slice", slice_params(0, std::nullopt, std::nullopt, -1)});
      }
      if (r >= 2) out.views.push_back({"slice", slice_params(-1, std::nullopt, std::nullopt, -1)});
      return out;
    }
    case LayoutKind::Broadcast: {
      if (r < 1) return std::nullopt;
      for (size_t parity : {which % 2, (which + 1) % 2}) {
        Shape src = shape;
        for (size_t k = 0; k < src.size(); ++k)
          if ((k + parity) % 2 == 0) src[k] = 1;
        if (src == shape) continue;
        // A leading stretched dim is dropped: broadcast_to also adds rank.
        if (src.size() >= 2 && src[0] == 1) src.erase(src.begin());
        out.source = src;
        out.views.push_back({"broadcast_to", {{"shape", shape}}});
        return out;
      }
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::string shapes_label(const std::vector<HostTensor>& logical, const std::vector<InputSpec>& inputs) {
  std::string s;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (k) s += ",";
    s += inputs[k].absent ? std::string("null") : shape_str(logical[k].shape);
  }
  return s;
}

}  // namespace

void CaseContext::add(const OpSpec& spec) {
  for (LayoutKind lk : spec.layouts) {
    std::vector<Realised> real(spec.inputs.size());
    bool any_view = false;
    for (size_t i = 0; i < spec.inputs.size(); ++i) {
      const InputSpec& in = spec.inputs[i];
      real[i].source = in.shape;
      if (in.absent) continue;
      if (lk == LayoutKind::Views) {
        if (in.source_shape) {
          real[i] = Realised{*in.source_shape, in.views};
          any_view = true;
        }
        continue;
      }
      const bool can_view = in.allow_views && (kernel.layout(i) == BP_LAYOUT_STRIDED ||
                                               (device_has && device_has("contiguous", {in.dtype, in.dtype})));
      if (lk == LayoutKind::Contiguous || !can_view) continue;
      if (auto r = realise(lk, in.shape, i)) {
        real[i] = *r;
        any_view = any_view || !r->views.empty();
      }
    }
    if (lk != LayoutKind::Contiguous && !any_view) continue;

    Case c;
    c.op = spec.op;
    c.dtype_key = kernel.key();
    c.layout = layout_name(lk);
    c.tol = spec.tol;
    std::vector<HostTensor> logical(spec.inputs.size());
    std::vector<const HostTensor*> ptrs(spec.inputs.size(), nullptr);
    std::vector<std::string> node_inputs;
    for (size_t i = 0; i < spec.inputs.size(); ++i) {
      const InputSpec& in = spec.inputs[i];
      if (in.absent) {
        node_inputs.emplace_back("");
        continue;
      }
      HostTensor src = make_tensor(in.dtype, real[i].source);
      if (in.fill) in.fill(src, r());
      c.work += shape_numel(src.shape);
      c.graph.input(in.name, in.dtype, src.shape);
      HostTensor cur = src;
      std::string cur_name = in.name;
      for (size_t v = 0; v < real[i].views.size(); ++v) {
        const ViewStep& step = real[i].views[v];
        cur = reference_view(step.op, cur, step.params);
        const std::string name = in.name + "_" + step.op + std::to_string(v);
        c.graph.node(name, step.op, {cur_name}, step.params);
        cur_name = name;
      }
      c.inputs[in.name] = std::move(src);
      logical[i] = std::move(cur);
      ptrs[i] = &logical[i];
      node_inputs.push_back(cur_name);
    }

    std::vector<RefTensor> want;
    try {
      want = spec.reference ? spec.reference(ptrs, spec.params) : reference(spec.op, ptrs, spec.params);
    } catch (const ReferenceError& e) {
      throw std::logic_error("case generator built an invalid " + spec.op + " case: " + e.what());
    }
    c.label = spec.op + "(" + shapes_label(logical, spec.inputs) + ")";
    if (!spec.params.empty()) c.label += " " + spec.params.dump();
    if (!spec.note.empty()) c.label += " " + spec.note;

    c.graph.node("y", spec.op, node_inputs, spec.params);
    if (want.size() > 1 || kernel.bundle_slots > 0) {
      if (kernel.bundle_slots != want.size())
        throw NoCases("the kernel declares " + std::to_string(kernel.bundle_slots) + " bundle slots, docs/ops.md gives " +
                      std::to_string(want.size()));
      // Every slot is read twice: through a zero-copy view and a copy (the
      // copy where the device has a contiguous kernel for the slot's dtype).
      for (size_t s = 0; s < want.size(); ++s) {
        const std::string v = "slot" + std::to_string(s) + "_view", o = "slot" + std::to_string(s) + "_owned";
        const bp_dtype sd = want[s].dtype;
        c.graph.node(v, "view", {"y"}, {{"slot", s}});
        c.graph.output(v);
        c.expected.push_back({v, want[s]});
        if (!device_has || device_has("contiguous", {sd, sd})) {
          c.graph.node(o, "view_owned", {"y"}, {{"slot", s}});
          c.graph.output(o);
          c.expected.push_back({o, want[s]});
        }
        c.work += want[s].numel();
      }
      if (spec.unordered) {
        c.unordered_pairs = {{"slot0_view", "slot1_view"}};
        if (c.graph.outputs().size() == 4) c.unordered_pairs.push_back({"slot0_owned", "slot1_owned"});
        c.unordered_dim = spec.unordered_dim;
      }
    } else {
      c.graph.output("y");
      c.work += want[0].numel();
      c.expected.push_back({"y", std::move(want[0])});
    }
    out->push_back(std::move(c));
  }
}

}  // namespace backplane::conformance
