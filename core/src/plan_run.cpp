// Running a plan: inputs set, bound or copied in; execute() locks the
// plan's cells, calls kernels, moves transfers and synchronizes each
// device's run; outputs read back; submitted (asynchronous) runs.
#include "plan_impl.hpp"
#include "thread_pool.hpp"

namespace backplane {

namespace {

// Holds the plan's locks for one run, in the global (address) order.
class RunLocks {
 public:
  explicit RunLocks(const std::vector<std::pair<Cell*, bool>>& order) : order_(order) {
    for (auto& [c, w] : order_) {
      if (w)
        c->mu.lock();
      else
        c->mu.lock_shared();
      ++held_;
    }
  }
  ~RunLocks() {
    for (size_t i = held_; i-- > 0;) {
      auto& [c, w] = order_[i];
      if (w)
        c->mu.unlock();
      else
        c->mu.unlock_shared();
    }
  }
  RunLocks(const RunLocks&) = delete;
  RunLocks& operator=(const RunLocks&) = delete;

 private:
  const std::vector<std::pair<Cell*, bool>>& order_;
  size_t held_ = 0;
};

}  // namespace

Plan::Plan() = default;
Plan::Plan(Plan&&) noexcept = default;
Plan& Plan::operator=(Plan&&) noexcept = default;
Plan::~Plan() = default;

const Value& Plan::Impl::output_value(const std::string& name) const {
  if (std::find(outputs.begin(), outputs.end(), name) == outputs.end()) {
    if (!by_name.count(name)) throw Error("plan has no value named '" + name + "'");
    throw Error("bind_output: '" + name + "' is not a graph output");
  }
  return value(name);
}

int Plan::Impl::input_index(const std::string& name) const {
  auto it = std::find_if(inputs.begin(), inputs.end(), [&](auto& e) { return e.first == name; });
  if (it == inputs.end()) {
    if (by_name.count(name)) throw Error("'" + name + "' is not a (non-constant) input of the graph");
    throw Error("the graph has no (non-constant) input named '" + name + "'");
  }
  return static_cast<int>(it - inputs.begin());
}

// Cell slot `c` now reads/writes `cell`, whose elements start `at` bytes in
// (own[c] and 0 restore the plan's buffer).
void Plan::Impl::bind_cell(int c, std::shared_ptr<Cell> cell, uint64_t at) {
  if (cells[c] == cell && base[c] == at) return;
  cells[c] = std::move(cell);
  base[c] = at;
  refill(c);
}

void Plan::Impl::set_input(const std::string& name, const void* data, uint64_t bytes) {
  const int i = input_index(name);
  const auto& v = values[inputs[i].second];
  const uint64_t want = v.bytes();
  if (bytes != want)
    throw Error("input '" + name + "': got " + std::to_string(bytes) + " bytes; " + std::string(dtype_name(v.dtype)) +
                shape_str(v.shape) + " needs " + std::to_string(want));
  if (bytes && !data) throw Error("input '" + name + "': null data pointer");
  const int c = vbufs[v.root].cell;
  bind_cell(c, own[c], 0);
  Cell& cell = *cells[c];
  std::unique_lock<std::shared_mutex> lk(cell.mu);
  cell.write(v.byte_offset, data, want);
  input_set[i] = 1;
  input_note[i].clear();
}

void Plan::Impl::set_input(const std::string& name, const HostTensor& t) {
  const int i = input_index(name);
  const auto& v = values[inputs[i].second];
  if (t.dtype != v.dtype || t.shape != v.shape)
    throw Error("input '" + name + "': expected " + std::string(dtype_name(v.dtype)) + shape_str(v.shape) +
                ", got " + std::string(dtype_name(t.dtype)) + shape_str(t.shape));
  const uint64_t want = v.bytes();
  if (t.nbytes() != want)
    throw Error("input '" + name + "': the tensor holds " + std::to_string(t.nbytes()) + " bytes; " +
                std::string(dtype_name(v.dtype)) + shape_str(v.shape) + " needs " + std::to_string(want));
  set_input(name, t.data(), want);
}

int Plan::Impl::input_of_cell(int c) const {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (vbufs[values[inputs[i].second].root].cell == c) return static_cast<int>(i);
  return -1;
}

int Plan::Impl::updated_input(int out_cell) const {
  for (size_t s = 0; s < steps.size(); ++s) {
    const Step& st = steps[s];
    if (st.transfer || st.op != "slice_update" || vbufs[values[st.output].root].cell != out_cell) continue;
    const int x = st.inputs[0];
    const int xc = vbufs[values[x].root].cell;
    const int i = input_of_cell(xc);
    if (i < 0 || inputs[static_cast<size_t>(i)].second != x) return -1;
    // Its only reader: a later step would read the updated rows.
    for (size_t r = 0; r < steps.size(); ++r) {
      const Step& o = steps[r];
      if (o.transfer) {
        if (vbufs[values[o.src_value].root].cell == xc) return -1;
        continue;
      }
      for (size_t k = 0; k < o.inputs.size(); ++k)
        if (o.inputs[k] >= 0 && vbufs[values[o.inputs[k]].root].cell == xc && (r != s || k != 0)) return -1;
    }
    return i;
  }
  return -1;
}

bool Plan::Impl::updates_in_place(const Step& st) const {
  if (st.transfer || st.op != "slice_update") return false;
  const int oc = vbufs[values[st.output].root].cell, xc = vbufs[values[st.inputs[0]].root].cell;
  return oc != xc && cells[oc] == cells[xc] && base[oc] == base[xc];
}

std::string Plan::Impl::in_place_obstacle(const Value& v, int c, const Tensor& t, bool output) const {
  const auto& ti = detail::tensor_impl(t);
  const char* role = output ? "output" : "input";
  const Device* here = own[c]->owner;
  if (ti->cell->owner != here)
    return "it is on " + ti->cell->owner->name() + ", the " + role + " on " + here->name();
  if (!t.is_contiguous()) return "it is not dense, row-major from its first element";
  if (v.byte_offset != 0 || !v.layout.is_contiguous() || (output && vbufs[v.root].size > v.bytes()))
    return "the " + std::string(role) + " is a view of a larger buffer of the plan" +
           (output ? "; bind a value a node writes whole" : "");
  if (ti->byte_offset % std::max<uint64_t>(dtype_size(v.dtype), 1) != 0)
    return "its bytes are not aligned to its " + std::to_string(dtype_size(v.dtype)) + "-byte elements";
  if (ti->cell->size < ti->byte_offset || ti->cell->size - ti->byte_offset < vbufs[v.root].size)
    return "it holds " + std::to_string(ti->cell->size - std::min(ti->cell->size, ti->byte_offset)) +
           " bytes; the " + role + " needs " + std::to_string(vbufs[v.root].size);
  if (aliased[v.root]) return "another device of the plan reads this " + std::string(role) + "'s buffer in place";
  for (size_t k = 0; k < cells.size(); ++k) {
    if (static_cast<int>(k) == c && own[k] != ti->cell) continue;
    // An input may share a Tensor with other inputs (all only read it);
    // never with a buffer of the plan or with anything the run writes.
    if (own[k] == ti->cell) return "it is a buffer of this plan";
    if (cells[k] == ti->cell && (output || cell_mode[k] == 2)) {
      // A slice_update's output and its x: one Tensor, updated in place.
      const int out_cell = output ? c : static_cast<int>(k), in_cell = output ? static_cast<int>(k) : c;
      if (base[k] == ti->byte_offset && input_of_cell(in_cell) >= 0 && updated_input(out_cell) == input_of_cell(in_cell))
        continue;
      for (const auto& out : outputs)
        if (vbufs[value(out).root].cell == static_cast<int>(k)) return "it is bound as this plan's output '" + out + "'";
      for (const auto& [in, vi] : inputs)
        if (vbufs[values[vi].root].cell == static_cast<int>(k)) return "it is bound as this plan's input '" + in + "'";
      return "it is bound to this plan";
    }
  }
  return "";
}

void Plan::Impl::set_input(const std::string& name, const Tensor& t) {
  const int i = input_index(name);
  const auto& v = values[inputs[i].second];
  if (!t) throw Error("input '" + name + "': an empty Tensor");
  const auto& ti = detail::tensor_impl(t);
  if (ti->dtype != v.dtype || ti->layout.shape() != v.shape)
    throw Error("input '" + name + "': expected " + std::string(dtype_name(v.dtype)) + shape_str(v.shape) +
                ", got a Tensor " + std::string(dtype_name(ti->dtype)) + shape_str(ti->layout.shape()));
  const int c = vbufs[v.root].cell;
  const std::string here = own[c]->owner->name();
  // In place when the kernels can read the Tensor exactly where they would
  // read the plan's own buffer.
  const std::string why_not = in_place_obstacle(v, c, t, false);
  const std::string shape = std::string(dtype_name(v.dtype)) + shape_str(v.shape);
  if (why_not.empty()) {
    bind_cell(c, ti->cell, ti->byte_offset);
    input_set[i] = 1;
    input_note[i] = ti->cell->host_memory ? "the application's memory, imported by " + here + ", read in place (no copy)"
                                          : "a Tensor on " + here + ", read in place (no copy)";
    return;
  }
  // A copy: into the plan's own buffer, densely (through host memory; the
  // two buffers locked one after the other, never together).
  bind_cell(c, own[c], 0);
  const uint64_t want = v.bytes();
  std::vector<std::byte> staging(want);
  {
    std::shared_lock<std::shared_mutex> lk(ti->cell->mu);
    detail::gather(*ti->cell, ti->byte_offset, ti->layout, dtype_size(v.dtype), staging.data());
  }
  {
    Cell& dst = *cells[c];
    std::unique_lock<std::shared_mutex> lk(dst.mu);
    dst.write(v.byte_offset, staging.data(), want);
  }
  input_set[i] = 1;
  input_note[i] = "a Tensor copied in (" + bytes_str(want) + ": " + why_not + ")";
}

// A dynamic plan's record of what is bound, replayed on its other
// specializations (plan_dynamic.cpp).
namespace {
void forget_input_binding(PlanDynamic* d, const std::string& name) {
  if (d && d->bound_inputs.erase(name)) ++d->version;
}
}  // namespace

void Plan::set_input(const std::string& name, const HostTensor& t) {
  if (!impl_) throw Error("set_input on an empty plan");
  follow_input(name, t.shape);
  {
    std::lock_guard<Gate> lk(impl_->mu);
    impl_->set_input(name, t);
  }
  forget_input_binding(dyn_.get(), name);
}

void Plan::set_input(const std::string& name, const Tensor& t) {
  if (!impl_) throw Error("set_input on an empty plan");
  if (t) follow_input(name, detail::tensor_impl(t)->layout.shape());
  {
    std::lock_guard<Gate> lk(impl_->mu);
    impl_->set_input(name, t);
  }
  if (dyn_) {
    dyn_->bound_inputs[name] = t;
    dyn_->applied[impl_.get()] = ++dyn_->version;
  }
}

void Plan::set_input(const std::string& name, const void* data, uint64_t bytes) {
  if (!impl_) throw Error("set_input on an empty plan");
  {
    std::lock_guard<Gate> lk(impl_->mu);
    impl_->set_input(name, data, bytes);
  }
  forget_input_binding(dyn_.get(), name);
}

Device& Plan::input_device(const std::string& name) const {
  if (!impl_) throw Error("input_device on an empty plan");
  std::lock_guard<Gate> lk(impl_->mu);
  const int i = impl_->input_index(name);
  return *impl_->own[impl_->vbufs[impl_->values[impl_->inputs[i].second].root].cell]->owner;
}

Tensor Plan::output_tensor(const std::string& name) const {
  if (!impl_) throw Error("output_tensor on an empty plan");
  std::lock_guard<Gate> lk(impl_->mu);
  const Value& v = impl_->readable(name);
  auto ti = std::make_shared<Tensor::Impl>();
  ti->cell = impl_->cells[impl_->vbufs[v.root].cell];
  ti->dtype = v.dtype;
  ti->layout = v.layout;
  ti->byte_offset = impl_->offset_of(v);
  return detail::make_tensor(std::move(ti));
}

void Plan::output_into(const std::string& name, void* dst, uint64_t bytes) const {
  if (!impl_) throw Error("output_into on an empty plan");
  std::lock_guard<Gate> lk(impl_->mu);
  const Value& v = impl_->readable(name);
  if (bytes != v.bytes())
    throw Error("output '" + name + "': the destination holds " + std::to_string(bytes) + " bytes; " +
                std::string(dtype_name(v.dtype)) + shape_str(v.shape) + " needs " + std::to_string(v.bytes()));
  if (bytes && !dst) throw Error("output '" + name + "': null destination");
  Cell& c = impl_->cell_of(v);
  std::shared_lock<std::shared_mutex> lk2(c.mu);
  detail::gather(c, impl_->offset_of(v), v.layout, dtype_size(v.dtype), dst);
}

void Plan::bind_output(const std::string& name, const Tensor& t) {
  if (!impl_) throw Error("bind_output on an empty plan");
  std::lock_guard<Gate> lk(impl_->mu);
  auto& p = *impl_;
  const Value& v = p.output_value(name);
  const int c = p.vbufs[v.root].cell;
  if (!t) {
    p.bind_cell(c, p.own[c], 0);
    p.output_note.erase(name);
    if (dyn_ && dyn_->bound_outputs.erase(name)) dyn_->applied[impl_.get()] = ++dyn_->version;
    return;
  }
  const auto& ti = detail::tensor_impl(t);
  const std::string what = "bind_output '" + name + "': ";
  if (!v.slots.empty()) throw Error(what + "a bundle; bind its slots' views instead");
  if (ti->dtype != v.dtype || ti->layout.shape() != v.shape)
    throw Error(what + "expected " + std::string(dtype_name(v.dtype)) + shape_str(v.shape) + ", got " +
                std::string(dtype_name(ti->dtype)) + shape_str(ti->layout.shape()));
  const Cell& mine = *p.own[c];
  const std::string why_not = p.in_place_obstacle(v, c, t, true);
  if (!why_not.empty()) throw Error(what + why_not);
  p.bind_cell(c, ti->cell, ti->byte_offset);
  p.output_note[name] = "written in place into a bound buffer on " + mine.owner->name() +
                        (ti->cell->host_memory ? " (the application's memory, imported: no copy)" : "");
  if (dyn_) {
    dyn_->bound_outputs[name] = t;
    dyn_->applied[impl_.get()] = ++dyn_->version;
  }
}

void Plan::bind_output(const std::string& name, void* data, uint64_t bytes, std::shared_ptr<void> owner) {
  if (!impl_) throw Error("bind_output on an empty plan");
  Device* dev = nullptr;
  bp_dtype dt = BP_DTYPE_INVALID;
  Shape shape;
  {
    std::lock_guard<Gate> lk(impl_->mu);
    const Value& v = impl_->output_value(name);
    dev = impl_->own[impl_->vbufs[v.root].cell]->owner;
    dt = v.dtype;
    shape = v.shape;
  }
  const std::string what = "bind_output '" + name + "': ";
  Tensor t;
  try {
    t = detail::wrap_host(impl_->runtime, data, bytes, dt, Layout::contiguous(shape), *dev, std::move(owner));
  } catch (const Error& e) {
    throw Error(what + e.what(), e.code());
  }
  bind_output(name, t);
}

void Plan::execute() {
  if (!impl_) throw Error("execute on an empty plan");
  std::lock_guard<Gate> lk(impl_->mu);
  try {
    impl_->execute();
  } catch (const std::bad_alloc&) {
    throw Error("running the plan: out of host memory", BP_ERR_OUT_OF_MEMORY);
  }
}

// One preparing run (BP_RUN_PREPARE) per device whose plugin offers it,
// calling its kernels with the plan's own arguments; nothing runs. An error
// here is dropped: the real run meets it again and names its node.
void Plan::Impl::prepare() {
  for (size_t d = 0; d < devs.size(); ++d) {
    const Plugin& plugin = *devs[d].plugin;
    const bp_plugin_api* api = plugin.api();
    if (!prepares_calls(api)) continue;
    bp_run* run = nullptr;
    if (bp_error* err = api->begin(plugin.ctx(), devs[d].handle, BP_RUN_PREPARE, &run)) {
      plugin.take_error(err);
      continue;
    }
    for (const Step& st : steps) {
      if (st.transfer || static_cast<size_t>(st.dev) != d) continue;
      auto ctx = devs[d].ctx;
      ctx.kernel_index = static_cast<uint32_t>(st.kernel);
      ctx.run = run;
      ctx.input_flags = st.in_flags.data();
      if (bp_error* err = st.fn(&ctx, st.in_st.data(), st.in_st.size(), &st.out_st, 1, st.layouts.data(), &st.params))
        plugin.take_error(err);
    }
    if (bp_error* err = api->synchronize(plugin.ctx(), devs[d].handle, run, nullptr, 0)) plugin.take_error(err);
  }
}

void Plan::Impl::execute() {
  auto& p = *this;
  for (size_t i = 0; i < p.inputs.size(); ++i)
    if (!p.input_set[i])
      throw Error("input '" + p.inputs[i].first + "' was never set (Plan::set_input or run)",
                  BP_ERR_INVALID_ARGUMENT);
  RunLocks locks(p.lock_order);
  // Each device's open run (begin() .. synchronize()), if any.
  std::vector<char> pending(p.devs.size(), 0);
  std::vector<bp_run*> runs(p.devs.size(), nullptr);
  p.calls.resize(p.devs.size());
  p.sync_seconds.assign(p.devs.size(), 0.0);
  // This run's device times only (a call not measured now shows none).
  if (p.profile) std::fill(p.step_device_seconds.begin(), p.step_device_seconds.end(), -1.0);
  // `what` names the step for an error; nullptr: the run on that device
  // (the text is built only when there is an error).
  // A profiled run asks each device that can (BP_RUN_TIMED) for its own
  // time of every kernel call of the run.
  auto timed = [&](size_t d) { return p.profile && times_calls(p.devs[d].plugin->api()); };
  auto sync = [&](size_t d, const std::string* what) {
    pending[d] = 0;
    const Plugin& plugin = *p.devs[d].plugin;
    auto* api = plugin.api();
    if (!api->synchronize) return;
    const bool with_times = timed(d) && !p.calls[d].empty();
    std::vector<uint64_t> ns(with_times ? p.calls[d].size() : 0, UINT64_MAX);
    const auto t0 = p.profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    bp_run* run = runs[d];
    runs[d] = nullptr;
    bp_error* err = api->synchronize(plugin.ctx(), p.devs[d].handle, run, with_times ? ns.data() : nullptr, ns.size());
    if (p.profile) p.sync_seconds[d] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!err) {
      for (size_t i = 0; i < ns.size(); ++i)
        if (ns[i] != UINT64_MAX)
          p.step_device_seconds[static_cast<size_t>(p.calls[d][i])] = static_cast<double>(ns[i]) * 1e-9;
      return;
    }
    // The plugin may say which kernel call's work failed; name its step as
    // for an error the kernel returned itself.
    const auto code = api->error_code(plugin.ctx(), err);
    std::string where = what ? *what : "running the plan on device '" + p.devs[d].device->name() + "'";
    if (api->error_call_index) {
      const int64_t i = api->error_call_index(plugin.ctx(), err);
      if (i >= 0 && static_cast<uint64_t>(i) < p.calls[d].size())
        where = p.steps[static_cast<size_t>(p.calls[d][static_cast<size_t>(i)])].what;
    }
    throw Error(where + ": " + plugin.take_error(err), code);
  };
  auto sync_for_run = [&](size_t d) { sync(d, nullptr); };
  // On an error, end every open run (keeping the first error) before throwing.
  auto drain = [&]() {
    for (size_t d = 0; d < p.devs.size(); ++d)
      if (pending[d] && p.devs[d].plugin->api()->synchronize) {
        pending[d] = 0;
        const Plugin& plugin = *p.devs[d].plugin;
        plugin.take_error(plugin.api()->synchronize(plugin.ctx(), p.devs[d].handle, runs[d], nullptr, 0));
        runs[d] = nullptr;
      }
  };
  using Clock = std::chrono::steady_clock;
  try {
    for (size_t s = 0; s < p.steps.size(); ++s) {
      const Step& st = p.steps[s];
      Clock::time_point started;
      if (st.transfer) {
        if (st.bytes == 0) continue;
        // The source must be complete; the destination's queued work must
        // not see its buffer change under it.
        if (pending[st.src_dev]) sync_for_run(st.src_dev);
        if (st.zero_copy) continue;
        if (pending[st.dev]) sync_for_run(st.dev);
        if (p.profile) started = Clock::now();
        const Value& sv = p.values[st.src_value];
        const Value& dv = p.values[st.output];
        Cell& src = p.cell_of(sv);
        Cell& dst = p.cell_of(dv);
        const uint64_t src_off = st.src_offset + p.base[p.vbufs[sv.root].cell];
        const uint64_t dst_off = st.dst_offset + p.base[p.vbufs[dv.root].cell];
        if (src.host_ptr) {
          dst.write(dst_off, static_cast<const char*>(src.host_ptr) + src_off, st.bytes);
        } else if (dst.host_ptr) {
          src.read(src_off, static_cast<char*>(dst.host_ptr) + dst_off, st.bytes);
        } else {
          std::vector<char> staging(st.bytes);
          src.read(src_off, staging.data(), st.bytes);
          dst.write(dst_off, staging.data(), st.bytes);
        }
        if (p.profile) p.step_seconds[s] = std::chrono::duration<double>(Clock::now() - started).count();
        continue;
      }
      const PlanDevice& d = p.devs[st.dev];
      const bp_plugin_api* api = d.plugin->api();
      if (!pending[st.dev]) {
        if (api->begin)
          d.plugin->check(api->begin(d.plugin->ctx(), d.handle, timed(st.dev) ? uint32_t{BP_RUN_TIMED} : 0u, &runs[st.dev]),
                          "device '" + d.device->name() + "': begin");
        pending[st.dev] = 1;
        p.calls[st.dev].clear();
      }
      p.calls[st.dev].push_back(static_cast<int>(s));
      if (p.poison) {
        const Value& out = p.values[st.output];
        Cell& c = p.cell_of(out);
        uint64_t bytes = 0;
        if (out.slots.empty()) {
          bytes = static_cast<uint64_t>(out.layout.numel()) * dtype_size(out.dtype);
        } else {
          const auto& last = out.slots.back();
          bytes = last.byte_offset +
                  static_cast<uint64_t>(Layout::contiguous(last.shape).numel()) * dtype_size(last.dtype);
        }
        std::vector<unsigned char> junk(bytes, 0xFF);
        c.write(p.offset_of(out), junk.data(), bytes);
      }
      auto ctx = d.ctx;
      ctx.kernel_index = static_cast<uint32_t>(st.kernel);
      ctx.run = runs[st.dev];
      ctx.input_flags = st.in_flags.data();
      if (p.profile) started = Clock::now();
      bp_error* err =
          st.fn(&ctx, st.in_st.data(), st.in_st.size(), &st.out_st, 1, st.layouts.data(), &st.params);
      if (p.profile) p.step_seconds[s] = std::chrono::duration<double>(Clock::now() - started).count();
      if (err) {
        const auto code = api->error_code(d.plugin->ctx(), err);
        const std::string msg = d.plugin->take_error(err);
        throw Error(st.what + ": " + msg, code);
      }
      // With poisoning on an asynchronous device, each step is submitted on
      // its own so the poison lands right before the kernel that must overwrite it.
      if (p.poison && api->synchronize) sync(st.dev, &st.what);
    }
    for (size_t d = 0; d < p.devs.size(); ++d)
      if (pending[d]) sync_for_run(d);
  } catch (...) {
    drain();
    throw;
  }
}

HostTensor Plan::output(const std::string& name) const {
  if (!impl_) throw Error("output on an empty plan");
  std::lock_guard<Gate> lk(impl_->mu);
  return impl_->output(name);
}

const Value& Plan::Impl::readable(const std::string& name) const {
  if (std::find(outputs.begin(), outputs.end(), name) == outputs.end() &&
      std::find(kept.begin(), kept.end(), name) == kept.end()) {
    if (!by_name.count(name) && !graph_names.count(name)) throw Error("plan has no value named '" + name + "'");
    if (!by_name.count(name))
      throw Error("'" + name + "' is not a graph output, and the optimizer merged it into another node (" +
                  "--explain says which); name it in CompileOptions::keep (or make it an output) to read it");
    throw Error("'" + name +
                "' is not a graph output: its buffer may hold another value by now; name it in " +
                "CompileOptions::keep (or make it an output) to read it");
  }
  const Value& v = value(name);
  if (!v.slots.empty()) throw Error("'" + name + "' is a bundle; read its slots through 'view'");
  return v;
}

HostTensor Plan::Impl::output(const std::string& name) const {
  const Value& v = readable(name);
  HostTensor t(v.dtype, v.shape);
  Cell& c = cell_of(v);
  std::shared_lock<std::shared_mutex> lk(c.mu);
  detail::gather(c, offset_of(v), v.layout, dtype_size(v.dtype), t.data());
  return t;
}

std::map<std::string, HostTensor> Plan::run(const std::map<std::string, HostTensor>& inputs) {
  if (!impl_) throw Error("run on an empty plan");
  follow_inputs(inputs);
  std::lock_guard<Gate> lk(impl_->mu);
  // Every input, except those bound to a device Tensor read in place (set
  // once, e.g. weights, they serve every run).
  for (const auto& [name, v] : impl_->inputs) {
    const int c = impl_->vbufs[impl_->values[v].root].cell;
    if (!inputs.count(name) && impl_->cells[c] == impl_->own[c])
      throw Error("input '" + name + "' was not given (nor bound to a Tensor with set_input)");
  }
  try {
    for (const auto& [name, t] : inputs) impl_->set_input(name, t);
    impl_->execute();
    std::map<std::string, HostTensor> out;
    for (const auto& name : impl_->outputs) out[name] = impl_->output(name);
    return out;
  } catch (const std::bad_alloc&) {
    throw Error("running the plan: out of host memory", BP_ERR_OUT_OF_MEMORY);
  }
}

// ---- Asynchronous runs ------------------------------------------------------

// The outcome of a submitted run: set once by the plan's Submitter thread.
// Waiters watch `done` for as long as the pool's workers spin, then sleep
// (so submit().wait() costs about what run() does).
struct Completion::State {
  std::atomic<bool> done{false};
  std::mutex m;
  std::condition_variable cv;
  std::exception_ptr error;
  bool has_outputs = false;
  std::map<std::string, HostTensor> outputs;

  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lk(m);
      error = std::move(e);
      done.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }
  void wait_done() {
    if (detail::spin_until([&] { return done.load(std::memory_order_acquire); }, /*yielding=*/true)) return;
    std::unique_lock<std::mutex> lk(m);
    cv.wait(lk, [&] { return done.load(std::memory_order_acquire); });
  }
};

namespace detail::plan {

Submitter::Submitter() : t_([this] { loop(); }) {}

Submitter::~Submitter() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_ = true;
  }
  cv_.notify_all();
  t_.join();
}

void Submitter::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lk(m_);
    q_.push_back(std::move(job));
    queued_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_one();
}

void Submitter::loop() {
  for (;;) {
    // Watch for the next run briefly, then sleep.
    spin_until([&] { return queued_.load(std::memory_order_acquire) != 0; }, /*yielding=*/true);
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stopping, nothing left
      job = std::move(q_.front());
      q_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    job();  // never throws: the job keeps its error in its Completion
  }
}

}  // namespace detail::plan

Completion::~Completion() {
  if (state_) state_->wait_done();
}

Completion& Completion::operator=(Completion&& o) noexcept {
  if (this != &o) {
    if (state_) state_->wait_done();
    state_ = std::move(o.state_);
    keep_ = std::move(o.keep_);
  }
  return *this;
}

void Completion::wait() {
  if (!state_) throw Error("wait on an empty Completion");
  state_->wait_done();
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Completion::poll() const {
  if (!state_) throw Error("poll on an empty Completion");
  return state_->done.load(std::memory_order_acquire);
}

std::exception_ptr Completion::error() {
  if (!state_) throw Error("error on an empty Completion");
  state_->wait_done();
  return state_->error;
}

const std::map<std::string, HostTensor>& Completion::outputs() {
  wait();
  if (!state_->has_outputs)
    throw Error("this run's outputs were not kept: submit(inputs) and submit_keeping_outputs() keep them (after "
                "submit(), read them with Plan::output while no other run is submitted)");
  return state_->outputs;
}

Completion Plan::submit() { return submit_impl(nullptr, false); }

Completion Plan::submit(const std::map<std::string, HostTensor>& inputs) { return submit_impl(&inputs, true); }

Completion Plan::submit_keeping_outputs() { return submit_impl(nullptr, true); }

Completion Plan::submit_impl(const std::map<std::string, HostTensor>* inputs, bool keep_outputs) {
  if (!impl_) throw Error("submit on an empty plan");
  if (inputs) follow_inputs(*inputs);
  Impl* impl = impl_.get();
  {
    std::lock_guard<std::mutex> lk(impl->submitter_mu);
    if (!impl->submitter) impl->submitter = std::make_unique<detail::plan::Submitter>();
  }
  // Taken here, released by the run when it ends: calls made after submit()
  // returns see the plan as the run leaves it.
  impl->mu.lock();
  Completion c;
  try {
    if (inputs) {
      // Like run(): every input given (or bound to a Tensor), the outputs
      // read before the plan is released, so another submission cannot
      // overwrite them first.
      for (const auto& [name, v] : impl->inputs) {
        const int cell = impl->vbufs[impl->values[v].root].cell;
        if (!inputs->count(name) && impl->cells[cell] == impl->own[cell])
          throw Error("input '" + name + "' was not given (nor bound to a Tensor with set_input)");
      }
      for (const auto& [name, t] : *inputs) impl->set_input(name, t);
    }
    auto state = std::make_shared<Completion::State>();
    state->has_outputs = keep_outputs;
    c.state_ = state;
    c.keep_ = impl_;  // the plan lives until the Completion goes (never on the run's thread)
    impl->submitter->post([impl, state] {
      std::exception_ptr error;
      try {
        try {
          impl->execute();
          if (state->has_outputs)
            for (const auto& name : impl->outputs) state->outputs[name] = impl->output(name);
        } catch (const std::bad_alloc&) {
          throw Error("running the plan: out of host memory", BP_ERR_OUT_OF_MEMORY);
        }
      } catch (...) {
        error = std::current_exception();
      }
      impl->mu.unlock();
      state->finish(error);
    });
  } catch (...) {
    // Nothing was started (an input refused, or no memory for the job).
    impl->mu.unlock();
    throw;
  }
  return c;
}

}  // namespace backplane
