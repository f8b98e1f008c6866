// The planner's last pass and the executor.
//
// compile(): lower() and place() (lowering.cpp, placement.cpp) decide what
// runs where; here each node becomes a step on its device, with a transfer
// step before it for every input that lives on another device (one per value
// and destination) and a device Contiguize step for every input its kernel
// needs dense. Buffers are then assigned by liveness per device (reusing
// those whose last reader has run), allocated once, and every
// bp_storage/bp_layout a kernel will see is built, so execute() only locks,
// calls kernels, moves transfers and synchronizes.
#include "pass_compositions.hpp"
#include "pass_fold.hpp"
#include "pass_fuse.hpp"
#include "pass_layout.hpp"
#include "pass_patterns.hpp"
#include "pass_attention.hpp"
#include "pass_simplify.hpp"
#include "plan_impl.hpp"

#include <set>

namespace backplane {

namespace {

// Builds a plan from a placed lowering; one per compile() call.
class Builder {
 public:
  Builder(Plan::Impl& p, const Lowered& l, uint64_t budget, PlanDynamic* dyn = nullptr)
      : p_(p), l_(l), budget_(budget), dyn_(dyn) {}

  // Steps and buffer sizes only: nothing allocated, nothing uploaded (the
  // unoptimized baseline of CompileStats).
  void plan_only() {
    plan_only_ = true;
    build();
  }

  void build() {
    // Values and their storage as lowered; vbuf i is root i.
    for (const auto& r : l_.roots) {
      VBuf vb;
      vb.size = r.size;
      vb.dev = dev_index(r.device);
      vb.pinned = r.producer < 0 || r.output;
      p_.vbufs.push_back(vb);
    }
    p_.values = l_.values;
    p_.by_name = l_.by_name;
    p_.inputs = l_.inputs;
    p_.input_set.assign(p_.inputs.size(), 0);
    p_.outputs = l_.outputs;
    p_.kept = l_.kept;
    p_.notes = l_.notes;
    for (const auto& n : l_.nodes) emit(n);
    // A zero-copy alias keeps the memory it imports alive as long as itself.
    // An asynchronous reader (Vulkan importing CPU memory) runs its work at
    // its synchronize(), after later steps of other devices: the memory is
    // then never shared, so no later step overwrites it first.
    for (size_t i = p_.vbufs.size(); i-- > 0;)
      if (p_.vbufs[i].alias_of >= 0) {
        auto& src = p_.vbufs[p_.vbufs[i].alias_of];
        src.last_use = std::max(src.last_use, p_.vbufs[i].last_use);
        if (p_.devs[p_.vbufs[i].dev].plugin->api()->synchronize) src.pinned = true;
      }
    // Only the dynamic plan's own graph constants are shared: they live as
    // long as the plan (a folded constant belongs to one specialization).
    std::set<const HostTensor*> own_constants;
    if (dyn_)
      for (const auto& in : dyn_->graph.inputs())
        if (in.constant) own_constants.insert(in.constant.get());
    for (auto& [v, t] : l_.constants) {
      const Value& val = p_.values[v];
      p_.vbufs[val.root].constant = true;
      if (dyn_ && val.byte_offset == 0 && own_constants.count(t)) const_of_root_[val.root] = t;
    }
    assign_cells();
    if (plan_only_) return;
    allocate();
    for (auto& [v, t] : l_.constants) {
      const Value& val = p_.values[v];
      if (shared_cells_.count(p_.vbufs[val.root].cell)) continue;  // written by an earlier specialization
      p_.cell_of(val).write(val.byte_offset, t->data(), t->nbytes());
      if (const_of_root_.count(val.root)) {
        const Cell& c = p_.cell_of(val);
        dyn_->constants[{t, c.owner, p_.vbufs[val.root].size}] = p_.cells[p_.vbufs[val.root].cell];
      }
    }
    finalize();
  }

 private:
  int dev_index(Device* d) {
    for (size_t i = 0; i < p_.devs.size(); ++i)
      if (p_.devs[i].device == d) return static_cast<int>(i);
    PlanDevice pd;
    pd.device = d;
    pd.plugin = &DeviceAccess::plugin(*d);
    if (!pd.plugin->loaded()) throw Error("device '" + d->name() + "': its plugin is not loaded");
    pd.handle = DeviceAccess::handle(*d);
    pd.align = std::max<uint64_t>(DeviceAccess::info(*d).buffer_alignment, 16);
    pd.host_addressable = DeviceAccess::info(*d).memory_kind != BP_MEMORY_DEVICE;
    p_.devs.push_back(pd);
    return static_cast<int>(p_.devs.size()) - 1;
  }

  int new_vbuf(uint64_t size, int dev, int def_step) {
    VBuf vb;
    vb.size = size;
    vb.dev = dev;
    vb.def_step = def_step;
    vb.last_use = def_step;
    p_.vbufs.push_back(vb);
    return static_cast<int>(p_.vbufs.size()) - 1;
  }

  int add_value(const Value& like, int vbuf, uint64_t byte_offset, Layout layout) {
    Value v;
    v.dtype = like.dtype;
    v.shape = like.shape;
    v.root = vbuf;
    v.byte_offset = byte_offset;
    v.layout = std::move(layout);
    p_.values.push_back(std::move(v));
    return static_cast<int>(p_.values.size()) - 1;
  }

  void use(int value, int step) {
    auto& vb = p_.vbufs[p_.values[value].root];
    vb.last_use = std::max(vb.last_use, step);
  }

  // Value `v` readable on device `dev`: itself, or the result of a transfer
  // step (one per value and destination).
  int on_device(int v, int dev) {
    const Value src = p_.values[v];
    const int from = p_.vbufs[src.root].dev;
    if (from == dev) return v;
    auto it = moved_.find({v, dev});
    if (it != moved_.end()) return it->second;
    const int step = static_cast<int>(p_.steps.size());
    const size_t es = dtype_size(src.dtype);
    Step st;
    st.transfer = true;
    st.dev = dev;
    st.src_dev = from;
    st.src_value = v;
    int out;
    if (src.layout.numel() == 0) {
      out = add_value(src, new_vbuf(0, dev, step), 0, Layout::contiguous(src.shape));
    } else {
      // The span of the source's bytes the value touches moves; its layout
      // is kept, shifted to the start of the span.
      const auto [lo, hi] = src.layout.extent();
      st.src_offset = src.byte_offset + static_cast<uint64_t>(lo) * es;
      st.bytes = static_cast<uint64_t>(hi - lo + 1) * es;
      const int vb = new_vbuf(st.bytes, dev, step);
      out = add_value(src, vb, 0, Layout(src.layout.shape(), src.layout.strides(), src.layout.offset() - lo));
      // Zero-copy when the destination can address the source's memory.
      const PlanDevice& a = p_.devs[from];
      const PlanDevice& b = p_.devs[dev];
      if (a.host_addressable && b.plugin->api()->buffer_import_host && st.src_offset % b.align == 0) {
        // (Whether the source buffer itself is aligned enough is known at
        // allocation; a refused import falls back to a copy there.)
        st.zero_copy = true;
        p_.vbufs[vb].alias_of = src.root;
        p_.vbufs[vb].alias_offset = st.src_offset;
        p_.vbufs[vb].pinned = true;
      }
    }
    st.output = out;
    const std::string name = src.name.empty() ? "an intermediate value" : "'" + src.name + "'";
    st.what =
        "transfer " + name + " from " + p_.devs[from].device->name() + " to " + p_.devs[dev].device->name();
    use(v, step);
    p_.steps.push_back(std::move(st));
    moved_[{v, dev}] = out;
    return out;
  }

  // A device Contiguize step copying `layout` of value `src` into a new dense buffer.
  int contiguize(int src, const Layout& layout, int dev, const std::string& why) {
    const PlanDevice& d = p_.devs[dev];
    const bp_dtype dt = p_.values[src].dtype;
    const int k = d.plugin->find_kernel("contiguous", {dt, dt});
    const int step = static_cast<int>(p_.steps.size());
    const Shape shape = layout.shape();
    uint64_t size = dtype_size(dt);
    for (auto x : shape) size *= static_cast<uint64_t>(x);
    Value like;
    like.dtype = dt;
    like.shape = shape;
    const int out = add_value(like, new_vbuf(size, dev, step), 0, Layout::contiguous(shape));
    Step st;
    st.dev = dev;
    st.what = why + " (contiguous copy on " + d.device->name() + ")";
    st.kernel = k;
    st.fn = d.plugin->api()->kernels[k].fn;
    st.inputs = {src};
    st.in_layouts = {layout};
    st.output = out;
    st.out_layout = Layout::contiguous(shape);
    st.op = "contiguous";
    st.params.struct_size = sizeof(bp_op_params);
    st.params.kind = BP_PARAMS_NONE;
    use(src, step);
    p_.steps.push_back(std::move(st));
    return out;
  }

  void emit(const LNode& n) {
    const detail::Candidate& c = n.candidates[n.chosen];
    const int dev = dev_index(c.device);
    const PlanDevice& d = p_.devs[dev];
    p_.placement.push_back({n.node, n.copy ? "contiguous copy" : n.op, c.device->name(), n.reason});
    std::vector<int> ids = n.inputs;
    std::vector<Layout> layouts = n.in_layouts;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0) continue;
      const int before = ids[i];
      ids[i] = on_device(ids[i], dev);
      if (ids[i] != before) {
        // The moved bytes start at the span's start: shift the kernel's view.
        const Value& a = p_.values[before];
        const Value& b = p_.values[ids[i]];
        const int64_t shift = b.layout.offset() - a.layout.offset();
        const Layout& l = layouts[i];
        layouts[i] = Layout(l.shape(), l.strides(), l.offset() + shift);
      }
      if (c.contiguize[i] && !layouts[i].is_contiguous()) {
        ids[i] = contiguize(ids[i], layouts[i], dev, n.where + " input " + std::to_string(i));
        layouts[i] = Layout::contiguous(layouts[i].shape());
      }
    }
    const int step = static_cast<int>(p_.steps.size());
    const bp_kernel_desc& desc = d.plugin->api()->kernels[c.kernel];
    Step st;
    st.dev = dev;
    st.what = n.copy ? n.where + " (contiguous copy on " + d.device->name() + ")"
                     : n.where + " [kernel " + kernel_signature(d.plugin->info().kernels[c.kernel]) + " on " +
                           d.device->name() + "]";
    st.kernel = c.kernel;
    st.fn = desc.fn;
    st.inputs = ids;
    st.in_layouts = std::move(layouts);
    st.output = n.output;
    st.out_layout = n.out_layout;
    st.params = n.params;
    st.custom_json = n.custom_json;
    st.program = n.program;
    st.node = n.node;
    st.op = n.copy ? "contiguous" : n.op;
    for (int id : ids)
      if (id >= 0) use(id, step);
    auto& vb = p_.vbufs[p_.values[n.output].root];
    vb.def_step = step;
    vb.last_use = std::max(vb.last_use, step);
    p_.steps.push_back(std::move(st));
  }

  // Greedy buffer reuse per device: a step's output takes a free cell of its
  // device whose values are all dead before this step (never one the step
  // also reads).
  void assign_cells() {
    std::vector<uint64_t> cell_size;
    std::vector<int> cell_dev;
    std::vector<int> cell_free_after;  // step index after which the cell is free; INT_MAX = pinned
    std::vector<std::vector<int>> by_step(p_.steps.size() + 1);
    for (size_t i = 0; i < p_.vbufs.size(); ++i) {
      auto& vb = p_.vbufs[i];
      if (vb.pinned || vb.def_step < 0) {
        vb.cell = static_cast<int>(cell_size.size());
        cell_size.push_back(vb.size);
        cell_dev.push_back(vb.dev);
        cell_free_after.push_back(INT_MAX);
      } else {
        by_step[vb.def_step].push_back(static_cast<int>(i));
      }
    }
    for (size_t s = 0; s < p_.steps.size(); ++s) {
      for (int i : by_step[s]) {
        auto& vb = p_.vbufs[i];
        int best = -1;
        for (size_t c = 0; c < cell_size.size(); ++c) {
          if (cell_dev[c] != vb.dev || cell_free_after[c] >= static_cast<int>(s)) continue;
          // Prefer the smallest cell that fits, else the largest to grow.
          if (best < 0) {
            best = static_cast<int>(c);
            continue;
          }
          const bool fits = cell_size[c] >= vb.size, best_fits = cell_size[best] >= vb.size;
          if ((fits && (!best_fits || cell_size[c] < cell_size[best])) ||
              (!fits && !best_fits && cell_size[c] > cell_size[best]))
            best = static_cast<int>(c);
        }
        if (best < 0) {
          best = static_cast<int>(cell_size.size());
          cell_size.push_back(0);
          cell_dev.push_back(vb.dev);
          cell_free_after.push_back(-1);
        }
        vb.cell = best;
        cell_size[best] = std::max(cell_size[best], vb.size);
        cell_free_after[best] = std::max(vb.last_use, static_cast<int>(s));
      }
    }
    // A dynamic plan's later specializations take the constants' buffers
    // the first one made (the same graph constant, device and size).
    std::map<int, std::shared_ptr<Cell>> shared;
    for (size_t i = 0; i < p_.vbufs.size(); ++i) {
      auto it = const_of_root_.find(static_cast<int>(i));
      if (it == const_of_root_.end() || !p_.vbufs[i].pinned) continue;
      auto hit = dyn_->constants.find({it->second, p_.devs[p_.vbufs[i].dev].device, p_.vbufs[i].size});
      if (hit != dyn_->constants.end()) shared[p_.vbufs[i].cell] = hit->second;
    }
    for (size_t c = 0; c < cell_size.size(); ++c) {
      if (auto it = shared.find(static_cast<int>(c)); it != shared.end()) {
        shared_cells_.insert(static_cast<int>(c));
        p_.stats.shared_constant_bytes += it->second->size;
        p_.cells.push_back(it->second);
        continue;
      }
      auto cell = std::make_shared<Cell>();
      const PlanDevice& d = p_.devs[cell_dev[c]];
      cell->runtime = p_.runtime;
      cell->owner = d.device;
      cell->plugin = d.plugin;
      cell->device = d.handle;
      cell->dev = cell_dev[c];
      cell->size = std::max<uint64_t>(cell_size[c], d.align);
      p_.cells.push_back(std::move(cell));
    }
  }

  // What a cell holds, for messages: its largest value and who makes it.
  std::string cell_label(size_t c) const {
    int best = -1;
    for (size_t i = 0; i < p_.vbufs.size(); ++i)
      if (p_.vbufs[i].cell == static_cast<int>(c) && (best < 0 || p_.vbufs[i].size > p_.vbufs[best].size))
        best = static_cast<int>(i);
    if (best < 0) return "a buffer";
    const VBuf& vb = p_.vbufs[best];
    if (vb.def_step >= 0) return p_.steps[vb.def_step].what;
    for (const auto& v : p_.values)
      if (v.root == best && !v.name.empty()) return "graph input '" + v.name + "'";
    return "a graph input";
  }

  // Before anything is allocated: each buffer within its device's limit,
  // the plan within the runtime's budget.
  void check_memory() {
    uint64_t total = 0;
    for (size_t c = 0; c < p_.cells.size(); ++c) {
      if (shared_cells_.count(static_cast<int>(c))) continue;  // allocated already
      const Cell& cell = *p_.cells[c];
      const PlanDevice& d = p_.devs[cell.dev];
      const uint64_t limit = DeviceAccess::info(*d.device).max_buffer_size;
      if (limit && cell.size > limit)
        throw Error(cell_label(c) + ": needs a buffer of " + bytes_str(cell.size) + "; device '" +
                        d.device->name() + "' allocates at most " + bytes_str(limit),
                    BP_ERR_OUT_OF_MEMORY);
      total += cell.size;
    }
    if (budget_ && total > budget_) {
      size_t largest = 0;
      for (size_t c = 1; c < p_.cells.size(); ++c)
        if (p_.cells[c]->size > p_.cells[largest]->size) largest = c;
      throw Error("the plan needs " + bytes_str(total) + " of device buffers, over the budget of " +
                      bytes_str(budget_) + " (max_memory_bytes); the largest buffer: " +
                      bytes_str(p_.cells[largest]->size) + " for " + cell_label(largest),
                  BP_ERR_OUT_OF_MEMORY);
    }
  }

  void allocate() {
    check_memory();
    std::vector<int> alias_of_cell(p_.cells.size(), -1);
    for (size_t i = 0; i < p_.vbufs.size(); ++i)
      if (p_.vbufs[i].alias_of >= 0) alias_of_cell[p_.vbufs[i].cell] = static_cast<int>(i);
    // Real buffers first, then the aliases that import their memory.
    for (int pass = 0; pass < 2; ++pass)
      for (size_t c = 0; c < p_.cells.size(); ++c) {
        if (shared_cells_.count(static_cast<int>(c))) continue;
        Cell& cell = *p_.cells[c];
        const PlanDevice& d = p_.devs[cell.dev];
        const int alias = alias_of_cell[c];
        if ((alias >= 0) != (pass == 1)) continue;
        bp_buffer b{};
        b.struct_size = sizeof b;
        if (alias >= 0) {
          const VBuf& vb = p_.vbufs[alias];
          const Cell& src = *p_.cells[p_.vbufs[vb.alias_of].cell];
          cell.size = vb.size;  // exactly the imported span
          char* ptr = src.host_ptr ? static_cast<char*>(src.host_ptr) + vb.alias_offset : nullptr;
          if (ptr && reinterpret_cast<uintptr_t>(ptr) % d.align == 0) {
            bp_error* err = d.plugin->api()->buffer_import_host(d.plugin->ctx(), cell.device, ptr, cell.size, &b);
            if (err == nullptr && b.host_ptr == ptr) {
              cell.handle = b.handle;
              cell.host_ptr = b.host_ptr;
              cell.imports = p_.cells[p_.vbufs[vb.alias_of].cell];
              continue;
            }
            d.plugin->take_error(err);
          }
          // The import was refused: fall back to a copy into a buffer of its own.
          if (b.handle) d.plugin->api()->buffer_free(d.plugin->ctx(), cell.device, b.handle);
          cell.size = std::max<uint64_t>(vb.size, d.align);
          b = bp_buffer{};
          b.struct_size = sizeof b;
          for (auto& st : p_.steps)
            if (st.transfer && st.output >= 0 && p_.values[st.output].root == alias) {
              st.zero_copy = false;
              st.import_refused = true;
            }
        }
        d.plugin->check(
            d.plugin->api()->buffer_allocate(d.plugin->ctx(), cell.device, cell.size, &b),
            "allocating " + std::to_string(cell.size) + " bytes on device '" + d.device->name() + "'");
        cell.handle = b.handle;
        cell.host_ptr = b.host_ptr;
      }
  }

  void finalize() {
    p_.own = p_.cells;
    p_.base.assign(p_.cells.size(), 0);
    p_.aliased.assign(p_.vbufs.size(), 0);
    for (const auto& vb : p_.vbufs)
      if (vb.alias_of >= 0) p_.aliased[vb.alias_of] = 1;
    p_.input_note.assign(p_.inputs.size(), "");
    for (auto& d : p_.devs) {
      d.ctx.struct_size = sizeof(bp_kernel_context);
      d.ctx.device = d.handle;
      d.ctx.plugin = d.plugin->ctx();
    }
    p_.refresh();
  }

  Plan::Impl& p_;
  const Lowered& l_;
  uint64_t budget_;
  bool plan_only_ = false;
  std::map<std::pair<int, int>, int> moved_;  // (value, device) -> transferred value
  PlanDynamic* dyn_ = nullptr;
  std::map<int, const HostTensor*> const_of_root_;  // vbuf -> the graph constant it holds whole
  std::set<int> shared_cells_;                     // cells taken from dyn_->constants
};

}  // namespace

void Plan::Impl::refresh() {
  auto& p = *this;
  p.cell_users.assign(p.cells.size(), {});
  p.cell_mode.assign(p.cells.size(), 0);
  auto need = [&](int cell, int m) { p.cell_mode[cell] = std::max(p.cell_mode[cell], m); };
  for (size_t s = 0; s < p.steps.size(); ++s) {
    Step& st = p.steps[s];
    if (st.transfer) {
      const Value& src = p.values[st.src_value];
      need(p.vbufs[src.root].cell, 1);
      if (!st.zero_copy) need(p.vbufs[p.values[st.output].root].cell, 2);
      st.dst_offset = p.values[st.output].byte_offset;
      continue;
    }
    st.in_st.resize(st.inputs.size());
    st.in_flags.assign(st.inputs.size(), 0);
    st.layouts.clear();
    for (size_t i = 0; i < st.inputs.size(); ++i) {
      if (st.inputs[i] < 0) {
        st.in_st[i] = bp_storage{};
        st.in_st[i].struct_size = sizeof(bp_storage);
        st.in_st[i].dtype = p.values[st.output].dtype;
        st.layouts.push_back(bp_layout{});
        continue;
      }
      const Value& v = p.values[st.inputs[i]];
      p.fill_storage(st.in_st[i], v);
      if (p.vbufs[v.root].constant) st.in_flags[i] |= BP_INPUT_CONSTANT;
      st.layouts.push_back(st.in_layouts[i].to_bp());
      const int c = p.vbufs[v.root].cell;
      need(c, 1);
      p.cell_users[c].push_back({static_cast<int>(s), static_cast<int>(i)});
    }
    const Value& out = p.values[st.output];
    st.slots.clear();
    for (const auto& sl : out.slots) {
      bp_bundle_slot b{};
      b.dtype = sl.dtype;
      b.layout = Layout::contiguous(sl.shape).to_bp();
      b.byte_offset = sl.byte_offset;
      st.slots.push_back(b);
    }
    fill_output(st);
    const int c = p.vbufs[out.root].cell;
    need(c, 2);
    p.cell_users[c].push_back({static_cast<int>(s), -1});
    st.layouts.push_back(st.slots.empty() ? st.out_layout.to_bp() : st.slots[0].layout);
    if (st.params.kind == BP_PARAMS_CUSTOM)
      st.params.u.custom.json = {st.custom_json.data(), st.custom_json.size()};
  }
  order_locks();
}

void Plan::Impl::fill_output(Step& st) const {
  fill_storage(st.out_st, values[st.output]);
  if (!st.slots.empty()) {
    st.out_st.n_slots = static_cast<uint32_t>(st.slots.size());
    st.out_st.slots = st.slots.data();
    st.out_st.dtype = st.slots[0].dtype;
  }
}

void Plan::Impl::refill(int cell) {
  for (const auto& [s, i] : cell_users[cell]) {
    Step& st = steps[static_cast<size_t>(s)];
    if (i < 0)
      fill_output(st);
    else
      fill_storage(st.in_st[static_cast<size_t>(i)], values[st.inputs[static_cast<size_t>(i)]]);
  }
  order_locks();
}

// One entry per distinct cell the run touches, ordered by address (the
// global lock order); a cell written anywhere is locked for writing.
void Plan::Impl::order_locks() {
  lock_order.clear();
  for (size_t c = 0; c < cells.size(); ++c)
    if (cell_mode[c]) lock_order.push_back({cells[c].get(), cell_mode[c] == 2});
  std::sort(lock_order.begin(), lock_order.end(), [](const auto& a, const auto& b) {
    return std::less<Cell*>()(a.first, b.first) || (a.first == b.first && a.second > b.second);
  });
  // Equal cells are adjacent, the written one first: keep that one.
  lock_order.erase(std::unique(lock_order.begin(), lock_order.end(),
                               [](const auto& a, const auto& b) { return a.first == b.first; }),
                   lock_order.end());
}

Plan Runtime::compile(const Graph& graph, Device& device, const CompileOptions& options) {
  return compile(graph, std::vector<Device*>{&device}, options);
}

Plan Runtime::compile(const Graph& graph, const std::vector<Device*>& devices,
                      const CompileOptions& options) {
  if (devices.empty()) throw Error("compile: the device list is empty");
  for (auto* d : devices) {
    if (!d) throw Error("compile: a null device in the list");
    if (!DeviceAccess::plugin(*d).loaded())
      throw Error("device '" + d->name() + "': its plugin is not loaded");
  }
  Plan plan;
  const std::vector<std::string> names = graph.dynamic_dims();
  if (names.empty()) {
    build_plan(plan, graph, devices, options, nullptr);
    return plan;
  }
  // Dynamic dims: the first specialization at the sizes options.dims gives
  // (1 for any it does not name).
  for (const auto& [name, size] : options.dims)
    if (std::find(names.begin(), names.end(), name) == names.end())
      throw Error("CompileOptions::dims names '" + name + "', which is no dynamic dim of the graph");
  auto dyn = std::make_shared<PlanDynamic>();
  dyn->runtime = impl_;
  dyn->graph = graph;
  dyn->devices = devices;
  dyn->options = options;
  dyn->names = names;
  std::map<std::string, int64_t> first;
  for (const auto& n : names) {
    auto it = options.dims.find(n);
    first[n] = it == options.dims.end() ? 1 : it->second;
  }
  plan.dyn_ = std::move(dyn);
  plan.set_dims(first);
  return plan;
}

void Runtime::build_plan(Plan& plan, const Graph& graph, const std::vector<Device*>& devices,
                         const CompileOptions& options, PlanDynamic* dyn) {
  // Check the whole graph's shapes first, so a bad graph is reported as such
  // before any device question (vendor ops need the device or a decomposition).
  bool has_vendor_op = false;
  for (const auto& n : graph.nodes()) has_vendor_op = has_vendor_op || detail::is_custom_op(n.op);
  if (!has_vendor_op) infer_graph(graph);
  try {
    const auto t0 = std::chrono::steady_clock::now();
    // Passes before lowering (CompileOptions::optimize): constants folded
    // first, so the later passes see the graph as it will run.
    // Built-in fused ops no device of the list runs become their composed
    // form, optimized or not.
    const std::optional<detail::AttentionResult> expanded = detail::expand_attention(graph, devices);
    const Graph& ga = expanded ? expanded->graph : graph;
    const std::optional<detail::FuseExpansion> programs = detail::expand_fused(ga, devices);
    const Graph& g0 = programs ? programs->graph : ga;
    std::optional<detail::FoldResult> folded;
    if (options.optimize) folded = detail::fold_constants(*this, g0, devices, options.keep);
    const Graph& g1 = folded ? folded->graph : g0;
    std::optional<detail::CompositionResult> comps;
    if (options.optimize) comps = detail::map_compositions(g1, options.keep);
    const Graph& g2 = comps ? comps->graph : g1;
    std::optional<detail::AttentionResult> fused;
    if (options.optimize) fused = detail::fuse_attention(g2, devices, options.keep, impl_->attention_cpu_min_bytes);
    const Graph& g = fused && fused->changed ? fused->graph : g2;
    detail::PatternResult patterns;
    detail::LayoutResult layouts;
    detail::SimplifyResult simplified;
    if (options.optimize) {
      if (options.vendor_kernels) {
        patterns = detail::substitute_patterns(*this, g, devices, options.keep);
        layouts = detail::propagate_layouts(*this, g, patterns.substituted ? patterns.nodes : g.nodes(), devices,
                                            options.keep, &patterns.types);
      }
      simplified = detail::simplify(g,
                                    layouts.rewritten       ? layouts.nodes
                                    : patterns.substituted ? patterns.nodes
                                                           : g.nodes(),
                                    options.keep);
    }
    const std::vector<Node>* nodes = simplified.changed() ? &simplified.nodes
                                     : layouts.rewritten  ? &layouts.nodes
                                     : patterns.substituted ? &patterns.nodes
                                                            : nullptr;
    // Last, elementwise chains as fused_elementwise nodes where the first
    // device claims the op.
    detail::FuseResult chains;
    if (options.optimize) {
      chains = detail::fuse_elementwise(g, nodes ? *nodes : g.nodes(), devices, options.keep);
      if (chains.fused) nodes = &chains.nodes;
    }
    Lowered l = detail::lower(*this, g, devices, options.keep, nodes, options.vendor_kernels);
    l.notes.insert(l.notes.begin(), chains.notes.begin(), chains.notes.end());
    l.notes.insert(l.notes.begin(), simplified.notes.begin(), simplified.notes.end());
    l.notes.insert(l.notes.begin(), layouts.notes.begin(), layouts.notes.end());
    l.notes.insert(l.notes.begin(), patterns.notes.begin(), patterns.notes.end());
    if (fused) l.notes.insert(l.notes.begin(), fused->notes.begin(), fused->notes.end());
    if (comps) l.notes.insert(l.notes.begin(), comps->notes.begin(), comps->notes.end());
    if (folded) l.notes.insert(l.notes.begin(), folded->notes.begin(), folded->notes.end());
    if (programs) l.notes.insert(l.notes.begin(), programs->notes.begin(), programs->notes.end());
    if (expanded) l.notes.insert(l.notes.begin(), expanded->notes.begin(), expanded->notes.end());
    detail::place(l);
    const auto t1 = std::chrono::steady_clock::now();
    plan.impl_ = std::make_shared<Plan::Impl>();
    auto& p = *plan.impl_;
    p.runtime = impl_;
    p.poison = options.poison_outputs;
    p.profile = options.profile;
    Builder(p, l, impl_->options.max_memory_bytes, dyn).build();
    for (const auto& in : graph.inputs()) p.graph_names.insert(in.name);
    for (const auto& n : graph.nodes()) p.graph_names.insert(n.name);
    p.step_seconds.assign(p.steps.size(), 0.0);
    p.step_device_seconds.assign(p.steps.size(), -1.0);
    p.stats.placement_seconds = std::chrono::duration<double>(t1 - t0).count();
    p.stats.build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    for (const auto& cell : p.cells) p.stats.buffer_bytes[cell->owner->name()] += cell->size;
    if (options.memory_baseline) {
      // The graph as written, lowered, placed and given buffers the same
      // way, but nothing allocated: what optimizing saved per device.
      const auto b0 = std::chrono::steady_clock::now();
      if (options.optimize) {
        Lowered l0 = detail::lower(*this, g0, devices, options.keep, nullptr, options.vendor_kernels);
        detail::place(l0);
        Plan::Impl dry;
        dry.runtime = impl_;
        Builder(dry, l0, 0).plan_only();
        for (const auto& cell : dry.cells) p.stats.unoptimized_buffer_bytes[cell->owner->name()] += cell->size;
      } else {
        p.stats.unoptimized_buffer_bytes = p.stats.buffer_bytes;
      }
      p.stats.baseline_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
    }
    for (auto& d : p.devs) d.ctx.host = &impl_->host;
    if (options.prepare) p.prepare();
  } catch (const std::bad_alloc&) {
    throw Error("compile: out of host memory (the graph's shapes need more than this machine has)",
                BP_ERR_OUT_OF_MEMORY);
  }
}

}  // namespace backplane
