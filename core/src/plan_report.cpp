// What a compiled plan says about itself: its steps, transfers,
// placement, profile and buffers.
#include "plan_impl.hpp"

namespace backplane {

std::vector<std::string> Plan::describe() const {
  std::vector<std::string> out;
  if (!impl_) return out;
  if (dyn_)
    out.push_back("dynamic dims " + dyn_->sizes(dyn_->current) + ": specialized per size (" +
                  std::to_string(dyn_->specs.size()) +
                  " compiled; a size seen before is switched to without compiling, a new one is lowered, placed "
                  "and given buffers, sharing the constants' buffers)");
  std::lock_guard<Gate> lk(impl_->mu);
  for (size_t i = 0; i < impl_->inputs.size(); ++i) {
    const auto& [name, vid] = impl_->inputs[i];
    const Value& v = impl_->values[vid];
    const std::string& dev = impl_->own[impl_->vbufs[v.root].cell]->owner->name();
    const std::string& note = impl_->input_note[i];
    out.push_back("input '" + name + "' " + std::string(dtype_name(v.dtype)) + shape_str(v.shape) + " on " + dev +
                  ": " + (note.empty() ? "host data copied in by set_input (" + bytes_str(v.bytes()) + ")" : note));
  }
  for (const auto& st : impl_->steps) {
    if (!st.transfer) {
      out.push_back(impl_->updates_in_place(st)
                        ? st.what + ": in place (x is the output's buffer; moves " +
                              bytes_str(impl_->values[st.inputs[1]].bytes()) + ")"
                        : st.what);
      continue;
    }
    const std::string& to = impl_->devs[st.dev].device->name();
    const std::string& from = impl_->devs[st.src_dev].device->name();
    out.push_back(st.what + ": " +
                  (st.zero_copy
                       ? "zero-copy (" + to + " reads " + from + "'s memory in place)"
                       : bytes_str(st.bytes) +
                             (st.import_refused ? " (the destination refused to import the memory)" : "")));
  }
  for (const auto& [name, note] : impl_->output_note) out.push_back("output '" + name + "': " + note);
  return out;
}

std::vector<Plan::Transfer> Plan::transfers() const {
  std::vector<Transfer> out;
  if (!impl_) return out;
  for (const auto& st : impl_->steps) {
    if (!st.transfer) continue;
    const Value& v = impl_->values[st.src_value];
    out.push_back({v.name, impl_->devs[st.src_dev].device->name(), impl_->devs[st.dev].device->name(),
                   st.zero_copy ? 0 : st.bytes, st.zero_copy});
  }
  return out;
}

std::vector<Plan::StepTime> Plan::profile() const {
  std::vector<StepTime> out;
  if (!impl_ || !impl_->profile) return out;
  std::lock_guard<Gate> lk(impl_->mu);
  for (size_t s = 0; s < impl_->steps.size(); ++s) {
    const Step& st = impl_->steps[s];
    out.push_back({st.what, impl_->devs[st.dev].device->name(), st.transfer, impl_->step_seconds[s], st.node, st.op,
                   impl_->step_device_seconds[s]});
  }
  for (size_t d = 0; d < impl_->devs.size(); ++d)
    if (impl_->devs[d].plugin->api()->synchronize && d < impl_->sync_seconds.size())
      out.push_back({"synchronize " + impl_->devs[d].device->name(), impl_->devs[d].device->name(), false,
                     impl_->sync_seconds[d], "", "", -1.0});
  return out;
}

std::string Plan::profile_table() const {
  const auto rows = profile();
  if (!impl_ || !impl_->profile) return "no profile: compile with CompileOptions::profile\n";
  double total = 0;
  for (const auto& r : rows) total += r.seconds;
  std::string s;
  char buf[64];
  for (const auto& r : rows) {
    std::snprintf(buf, sizeof buf, "%12.3f us  %5.1f%%  ", r.seconds * 1e6, total > 0 ? 100.0 * r.seconds / total : 0.0);
    s += std::string(buf) + r.what;
    if (r.device_seconds >= 0) {
      std::snprintf(buf, sizeof buf, "  [on the device %.3f us]", r.device_seconds * 1e6);
      s += buf;
    }
    s += "\n";
  }
  std::snprintf(buf, sizeof buf, "%12.3f us  total\n", total * 1e6);
  s += buf;
  return s;
}

Json Plan::profile_json() const {
  Json steps = Json::array();
  double total = 0;
  for (const auto& r : profile()) {
    total += r.seconds;
    steps.push_back({{"what", r.what}, {"device", r.device}, {"kind", r.transfer ? "transfer" : r.node.empty() ? "synchronize" : "kernel"},
                     {"node", r.node}, {"op", r.op}, {"seconds", r.seconds}});
    if (r.device_seconds >= 0) steps.back()["device_seconds"] = r.device_seconds;
  }
  return Json{{"steps", steps}, {"total_seconds", total}};
}

Plan::CompileStats Plan::compile_stats() const { return impl_ ? impl_->stats : CompileStats{}; }

std::vector<Plan::Placement> Plan::placement() const {
  return impl_ ? impl_->placement : std::vector<Placement>{};
}

std::vector<std::string> Plan::devices() const {
  std::vector<std::string> out;
  if (impl_)
    for (const auto& d : impl_->devs) out.push_back(d.device->name());
  return out;
}

std::string Plan::explain() const {
  if (!impl_) return "empty plan\n";
  const auto& p = *impl_;
  std::string s = "devices:";
  for (const auto& d : p.devs) s += " " + d.device->name();
  s += "\n";
  size_t w = 4;
  for (const auto& pl : p.placement) w = std::max(w, pl.node.size() + pl.op.size() + 3);
  for (const auto& pl : p.placement) {
    std::string head = pl.node + " (" + pl.op + ")";
    head.resize(w, ' ');
    s += "  " + head + " -> " + pl.device + "  " + pl.reason + "\n";
  }
  uint64_t moved = 0;
  size_t n = 0;
  for (const auto& t : transfers()) {
    ++n;
    moved += t.bytes;
    s += "  transfer " + (t.value.empty() ? std::string("(intermediate)") : t.value) + ": " + t.from +
         " -> " + t.to + ", " + (t.zero_copy ? "zero-copy" : bytes_str(t.bytes)) + "\n";
  }
  for (const auto& [name, v] : p.inputs)
    s += "  input " + name + " lives on " + p.own[p.vbufs[p.values[v].root].cell]->owner->name() + "\n";
  for (const auto& note : p.notes) s += "  " + note + "\n";
  s += std::to_string(n) + " transfer" + (n == 1 ? "" : "s") + ", " + bytes_str(moved) + " moved per run\n";
  return s;
}

size_t Plan::buffer_count() const { return impl_ ? impl_->cells.size() : 0; }
uint64_t Plan::buffer_bytes() const {
  uint64_t n = 0;
  if (impl_)
    for (const auto& c : impl_->cells) n += c->size;
  return n;
}

std::pair<bp_dtype, Shape> Plan::value_type(const std::string& name) const {
  const Value& v = impl_->value(name);
  return {v.dtype, v.shape};
}

}  // namespace backplane
