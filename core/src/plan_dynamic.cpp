// Dynamic dims (Graph inputs with named dims): a plan holds one
// specialization per set of sizes it has seen. A new set is compiled from
// the graph at those sizes (lowered, placed, given buffers), taking the
// constants' device buffers the first specialization made; a set seen
// before is switched to without compiling. Tensors bound to the plan
// (set_input(Tensor), bind_output) are bound again on each specialization
// as it becomes current.
#include "plan_impl.hpp"

namespace backplane {

void Plan::set_dims(const std::map<std::string, int64_t>& dims) {
  if (!dyn_) {
    if (dims.empty()) return;
    throw Error("set_dims: the plan's graph has no dynamic dims (it names '" + dims.begin()->first + "')");
  }
  PlanDynamic& d = *dyn_;
  std::vector<int64_t> want = d.current.empty() ? std::vector<int64_t>(d.names.size(), 1) : d.current;
  for (const auto& [name, size] : dims) {
    auto it = std::find(d.names.begin(), d.names.end(), name);
    if (it == d.names.end()) throw Error("set_dims: '" + name + "' is no dynamic dim of the plan's graph");
    if (size < 0) throw Error("set_dims: dynamic dim '" + name + "' given the negative size " + std::to_string(size));
    want[static_cast<size_t>(it - d.names.begin())] = size;
  }
  if (impl_ && want == d.current) return;
  auto found = d.specs.find(want);
  std::shared_ptr<Impl> spec;
  if (found != d.specs.end()) {
    spec = found->second;
  } else {
    std::map<std::string, int64_t> sizes;
    for (size_t i = 0; i < d.names.size(); ++i) sizes[d.names[i]] = want[i];
    Plan built;
    try {
      Runtime rt(d.runtime);
      rt.build_plan(built, d.graph.specialized(sizes), d.devices, d.options, &d);
    } catch (const Error& e) {
      throw Error("the graph at " + d.sizes(want) + ": " + e.what(), e.code());
    }
    spec = built.impl_;
    if (d.specs.size() >= PlanDynamic::kMaxSpecializations) {
      // The least recently used, never the current one.
      auto victim = d.specs.end();
      for (auto it = d.specs.begin(); it != d.specs.end(); ++it)
        if (it->first != d.current && (victim == d.specs.end() || d.last_used[it->first] < d.last_used[victim->first]))
          victim = it;
      if (victim != d.specs.end()) {
        d.applied.erase(victim->second.get());
        d.last_used.erase(victim->first);
        d.specs.erase(victim);  // a run in flight on it keeps it until it ends
      }
    }
    d.specs[want] = spec;
  }
  d.last_used[want] = ++d.uses;
  auto applied = d.applied.find(spec.get());
  if (applied == d.applied.end() || applied->second != d.version) {
    // What the plan holds bound, bound again on this specialization; a
    // binding whose shape it does not have is left out and said in
    // describe().
    {
      std::lock_guard<Gate> lk(spec->mu);
      for (const auto& [name, t] : d.bound_inputs) {
        try {
          spec->set_input(name, t);
        } catch (const Error& e) {
          spec->input_note[static_cast<size_t>(spec->input_index(name))] =
              std::string("not bound at these sizes (") + e.what() + ")";
        }
      }
    }
    for (const auto& [name, t] : d.bound_outputs) {
      Plan tmp;
      tmp.impl_ = spec;
      try {
        tmp.bind_output(name, t);
      } catch (const Error& e) {
        std::lock_guard<Gate> lk(spec->mu);
        spec->output_note[name] = std::string("not bound at these sizes (") + e.what() + ")";
      }
    }
    d.applied[spec.get()] = d.version;
  }
  // Inputs set from host data at the old sizes whose shape is the same at
  // the new ones go with the plan (set_input calls in any order, then
  // execute); the rest are set again.
  if (impl_ && impl_ != spec) {
    Impl& from = *impl_;
    std::lock_guard<Gate> lk1(from.mu);
    std::lock_guard<Gate> lk2(spec->mu);
    for (size_t i = 0; i < from.inputs.size(); ++i) {
      const auto& [name, vid] = from.inputs[i];
      const Value& v = from.values[vid];
      const int c = from.vbufs[v.root].cell;
      if (!from.input_set[i] || from.cells[c] != from.own[c] || d.bound_inputs.count(name)) continue;
      const int j = spec->input_index(name);
      const Value& w = spec->values[spec->inputs[static_cast<size_t>(j)].second];
      if (w.dtype != v.dtype || w.shape != v.shape) continue;
      HostTensor t(v.dtype, v.shape);
      {
        Cell& cell = from.cell_of(v);
        std::shared_lock<std::shared_mutex> rl(cell.mu);
        detail::gather(cell, from.offset_of(v), v.layout, dtype_size(v.dtype), t.data());
      }
      spec->set_input(name, t);
    }
  }
  d.current = want;
  impl_ = std::move(spec);
}

std::map<std::string, int64_t> Plan::dims() const {
  std::map<std::string, int64_t> out;
  if (!dyn_) return out;
  for (size_t i = 0; i < dyn_->names.size() && i < dyn_->current.size(); ++i) out[dyn_->names[i]] = dyn_->current[i];
  return out;
}

size_t Plan::specializations() const {
  if (dyn_) return dyn_->specs.size();
  return impl_ ? 1 : 0;
}

namespace {

// The sizes an input of `shape` gives the dynamic dims it names, into `want`
// (checked against what `given` already holds from other inputs).
void sizes_from(const PlanDynamic& d, const std::string& name, const Shape& shape, std::vector<int64_t>& want,
                std::map<std::string, std::string>* given) {
  for (const auto& in : d.graph.inputs()) {
    if (in.name != name || in.dim_names.empty() || in.dim_names.size() != shape.size()) continue;
    for (size_t i = 0; i < shape.size(); ++i) {
      const std::string& dim = in.dim_names[i];
      if (dim.empty()) continue;
      const size_t k = static_cast<size_t>(std::find(d.names.begin(), d.names.end(), dim) - d.names.begin());
      if (given) {
        auto [it, fresh] = given->emplace(dim, name);
        if (!fresh && want[k] != shape[i])
          throw Error("inputs '" + it->second + "' and '" + name + "' give dynamic dim '" + dim + "' the sizes " +
                      std::to_string(want[k]) + " and " + std::to_string(shape[i]));
      }
      want[k] = shape[i];
    }
  }
}

}  // namespace

void Plan::follow_input(const std::string& name, const Shape& shape) {
  if (!dyn_) return;
  std::vector<int64_t> want = dyn_->current;
  sizes_from(*dyn_, name, shape, want, nullptr);
  if (want == dyn_->current) return;
  std::map<std::string, int64_t> m;
  for (size_t i = 0; i < want.size(); ++i) m[dyn_->names[i]] = want[i];
  set_dims(m);
}

void Plan::follow_inputs(const std::map<std::string, HostTensor>& inputs) {
  if (!dyn_) return;
  std::vector<int64_t> want = dyn_->current;
  std::map<std::string, std::string> given;
  for (const auto& [name, t] : inputs) sizes_from(*dyn_, name, t.shape, want, &given);
  if (want == dyn_->current) return;
  std::map<std::string, int64_t> m;
  for (size_t i = 0; i < want.size(); ++i) m[dyn_->names[i]] = want[i];
  set_dims(m);
}

}  // namespace backplane
