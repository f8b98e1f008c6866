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
#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <shared_mutex>

#include "lowering.hpp"
#include "runtime_impl.hpp"
#include "tensor_impl.hpp"

namespace backplane {

using detail::LNode;
using detail::Lowered;
using detail::LValue;
using detail::SlotSpec;

namespace {

struct PlanDevice {
  Device* device = nullptr;
  Plugin* plugin = nullptr;
  bp_device* handle = nullptr;
  uint64_t align = 16;
  bool host_addressable = false;  // buffers have host_ptr (HOST or MAPPED memory)
  bp_kernel_context ctx{};
};

// The plan's lock: held by one call at a time, and by an asynchronous run
// (Plan::submit) from the submitting call until the run ends, so it can be
// released by another thread than the one that took it.
class Gate {
 public:
  void lock() {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return !held_; });
    held_ = true;
  }
  void unlock() {
    {
      std::lock_guard<std::mutex> lk(m_);
      held_ = false;
    }
    cv_.notify_one();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool held_ = false;
};

// A value of the plan is a lowered value whose `root` indexes the plan's
// vbufs (vbuf i is lowered root i; transfers and copies add more).
using Value = detail::LValue;

struct VBuf {
  uint64_t size = 0;
  int dev = 0;
  int def_step = -1;  // -1: graph input/constant (live from the start)
  int last_use = -1;
  bool pinned = false;  // graph inputs, constants, outputs, zero-copy aliases: never shared
  bool constant = false;  // a graph constant: written once when the plan is built
  int cell = -1;
  int alias_of = -1;          // zero-copy transfer: the vbuf whose memory this one imports
  uint64_t alias_offset = 0;  // bytes from that vbuf's start
};

struct Step {
  bool transfer = false;
  int dev = 0;  // the device that runs it (a transfer: the destination)
  std::string what;
  // Kernel steps.
  int kernel = -1;
  bp_kernel_fn fn = nullptr;
  std::vector<int> inputs;  // value ids, -1 = absent optional
  std::vector<Layout> in_layouts;
  int output = -1;
  Layout out_layout;
  bp_op_params params{};
  std::string custom_json;
  std::vector<bp_storage> in_st;
  std::vector<uint32_t> in_flags;  // BP_INPUT_* per input (kernel context)
  bp_storage out_st{};
  std::vector<bp_layout> layouts;
  std::vector<bp_bundle_slot> slots;
  // Transfer steps: bytes [src_offset, +bytes) of the source value's cell to
  // [dst_offset, ...) of the destination's.
  int src_dev = 0;
  int src_value = -1;
  uint64_t src_offset = 0, dst_offset = 0, bytes = 0;
  bool zero_copy = false;
  bool import_refused = false;  // planned zero-copy; the destination refused at allocation
  // Kernel steps: the graph node and op (profile).
  std::string node, op;
};

}  // namespace

struct Plan::Impl {
  // First member, so it is released last: the plugins that own the cells'
  // buffers stay loaded until the cells are freed.
  std::shared_ptr<Runtime::Impl> runtime;
  std::vector<PlanDevice> devs;
  bool poison = false;
  std::vector<Value> values;
  std::map<std::string, int> by_name;
  std::vector<VBuf> vbufs;
  std::vector<std::shared_ptr<Cell>> cells;
  std::vector<Step> steps;
  std::vector<std::pair<std::string, int>> inputs;  // non-constant graph inputs
  std::vector<std::string> outputs;
  std::vector<std::pair<Cell*, bool>> lock_order;  // (cell, write)
  std::vector<Plan::Placement> placement;
  std::vector<std::string> notes;
  bool profile = false;
  std::vector<double> step_seconds;
  // Per step, the device's own time for a kernel call (a BP_RUN_TIMED run's
  // synchronize); negative when the device did not measure it.
  std::vector<double> step_device_seconds;
  Plan::CompileStats stats;
  std::vector<std::string> kept;  // CompileOptions::keep
  std::vector<char> input_set;    // parallel to inputs
  // Per device: the steps whose kernels were called since its last begin(),
  // in call order (error_call_index names one of them). Reused by
  // every run, so execute() allocates nothing once warm.
  std::vector<std::vector<int>> calls;
  std::vector<double> sync_seconds;  // per device (profile)
  mutable Gate mu;                   // one call at a time; run() and submitted runs hold it throughout
  // Device tensors bound in place of the plan's own buffers: cells[c] is
  // own[c] or a Tensor's cell, whose elements start base[c] bytes in.
  std::vector<std::shared_ptr<Cell>> own;
  std::vector<uint64_t> base;
  std::vector<char> aliased;             // per vbuf: another device imports its memory in place
  std::vector<std::string> input_note;   // parallel to inputs: how the value was last set
  std::map<std::string, std::string> output_note;  // bound outputs

  void set_input(const std::string& name, const HostTensor& t);
  void set_input(const std::string& name, const void* data, uint64_t bytes);
  void set_input(const std::string& name, const Tensor& t);
  void execute();
  void prepare();
  HostTensor output(const std::string& name) const;
  const Value& readable(const std::string& name) const;
  int input_index(const std::string& name) const;
  // The graph output `name` (bind_output's error when it is none).
  const Value& output_value(const std::string& name) const;
  void bind_cell(int cell, std::shared_ptr<Cell> c, uint64_t at);
  void refresh();
  // Per cell slot: the kernel storages that name it (step, input index; -1
  // for the output) and how the run uses it (1 read, 2 written), so binding
  // one Tensor re-fills only its storages (refresh() at compile fills all).
  std::vector<std::vector<std::pair<int, int>>> cell_users;
  std::vector<int> cell_mode;
  void refill(int cell);
  void order_locks();
  void fill_output(Step& st) const;
  // Why the kernels cannot use Tensor `t` in place of cell slot `c` holding
  // value `v` (an input, or an output when `output`); "" when they can.
  std::string in_place_obstacle(const Value& v, int c, const Tensor& t, bool output) const;

  ~Impl() {
    // Zero-copy aliases before the memory they import.
    for (size_t i = cells.size(); i-- > 0;) {
      cells[i].reset();
      if (i < own.size()) own[i].reset();
    }
  }

  const Value& value(const std::string& name) const {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw Error("plan has no value named '" + name + "'");
    return values[it->second];
  }
  Cell& cell_of(const Value& v) const { return *cells[vbufs[v.root].cell]; }
  // Where a value's bytes start in its cell (a bound Tensor may start later).
  uint64_t offset_of(const Value& v) const { return base[vbufs[v.root].cell] + v.byte_offset; }

  void fill_storage(bp_storage& st, const Value& v) const {
    const Cell& c = cell_of(v);
    const uint64_t off = offset_of(v);
    st = bp_storage{};
    st.struct_size = sizeof(bp_storage);
    st.data = c.host_ptr ? static_cast<char*>(c.host_ptr) + off : nullptr;
    st.buffer_handle = c.handle;
    st.byte_offset = off;
    st.byte_size = c.size - off;
    st.dtype = v.dtype;
  }

};

namespace {

std::string bytes_str(uint64_t b) {
  char buf[64];
  if (b >= (uint64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%llu bytes (%.1f MiB)", static_cast<unsigned long long>(b),
                  b / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(b));
  return buf;
}

// Builds a plan from a placed lowering; one per compile() call.
class Builder {
 public:
  Builder(Plan::Impl& p, const Lowered& l, uint64_t budget) : p_(p), l_(l), budget_(budget) {}

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
    assign_cells();
    allocate();
    for (auto& [v, t] : l_.constants) {
      const Value& val = p_.values[v];
      p_.cell_of(val).write(val.byte_offset, t->data(), t->nbytes());
      p_.vbufs[val.root].constant = true;
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
    for (size_t c = 0; c < cell_size.size(); ++c) {
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
  std::map<std::pair<int, int>, int> moved_;  // (value, device) -> transferred value
};

}  // namespace

// Every bp_storage a kernel will see, and the run's lock order, from the
// cells as bound now (at compile; bind_cell re-fills one cell's storages).
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
  // Check the whole graph's shapes first, so a bad graph is reported as such
  // before any device question (vendor ops need the device or a decomposition).
  bool has_vendor_op = false;
  for (const auto& n : graph.nodes()) has_vendor_op = has_vendor_op || detail::is_custom_op(n.op);
  if (!has_vendor_op) infer_graph(graph);
  try {
    const auto t0 = std::chrono::steady_clock::now();
    Lowered l = detail::lower(*this, graph, devices, options.keep);
    detail::place(l);
    const auto t1 = std::chrono::steady_clock::now();
    Plan plan;
    plan.impl_ = std::make_shared<Plan::Impl>();
    auto& p = *plan.impl_;
    p.runtime = impl_;
    p.poison = options.poison_outputs;
    p.profile = options.profile;
    Builder(p, l, impl_->options.max_memory_bytes).build();
    p.step_seconds.assign(p.steps.size(), 0.0);
    p.step_device_seconds.assign(p.steps.size(), -1.0);
    p.stats.placement_seconds = std::chrono::duration<double>(t1 - t0).count();
    p.stats.build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    for (auto& d : p.devs) d.ctx.host = &impl_->host;
    if (options.prepare) p.prepare();
    return plan;
  } catch (const std::bad_alloc&) {
    throw Error("compile: out of host memory (the graph's shapes need more than this machine has)",
                BP_ERR_OUT_OF_MEMORY);
  }
}

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

void Plan::set_input(const std::string& name, const HostTensor& t) {
  if (!impl_) throw Error("set_input on an empty plan");
  std::lock_guard<Gate> lk(impl_->mu);
  impl_->set_input(name, t);
}

void Plan::set_input(const std::string& name, const Tensor& t) {
  if (!impl_) throw Error("set_input on an empty plan");
  std::lock_guard<Gate> lk(impl_->mu);
  impl_->set_input(name, t);
}

void Plan::set_input(const std::string& name, const void* data, uint64_t bytes) {
  if (!impl_) throw Error("set_input on an empty plan");
  std::lock_guard<Gate> lk(impl_->mu);
  impl_->set_input(name, data, bytes);
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
    if (!by_name.count(name)) throw Error("plan has no value named '" + name + "'");
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

struct Completion::State {
  std::shared_future<void> done;
};

Completion::~Completion() {
  if (state_ && state_->done.valid()) state_->done.wait();
}

Completion& Completion::operator=(Completion&& o) noexcept {
  if (this != &o) {
    if (state_ && state_->done.valid()) state_->done.wait();
    state_ = std::move(o.state_);
  }
  return *this;
}

void Completion::wait() {
  if (!state_) throw Error("wait on an empty Completion");
  state_->done.get();
}

bool Completion::poll() const {
  if (!state_) throw Error("poll on an empty Completion");
  return state_->done.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

std::exception_ptr Completion::error() {
  if (!state_) throw Error("error on an empty Completion");
  try {
    state_->done.get();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

Completion Plan::submit() { return submit({}); }

Completion Plan::submit(const std::map<std::string, HostTensor>& inputs) {
  if (!impl_) throw Error("submit on an empty plan");
  std::shared_ptr<Impl> impl = impl_;
  // Taken here, released by the run's thread when it ends: calls made after
  // submit() returns see the plan as the run leaves it.
  impl->mu.lock();
  Completion c;
  try {
    for (const auto& [name, t] : inputs) impl->set_input(name, t);
    c.state_ = std::make_shared<Completion::State>();
    c.state_->done = std::async(std::launch::async, [impl]() {
                       struct Release {
                         Impl& p;
                         ~Release() { p.mu.unlock(); }
                       } release{*impl};
                       try {
                         impl->execute();
                       } catch (const std::bad_alloc&) {
                         throw Error("running the plan: out of host memory", BP_ERR_OUT_OF_MEMORY);
                       }
                     }).share();
  } catch (...) {
    // Nothing was started (set_input failed, or no thread could be made).
    impl->mu.unlock();
    throw;
  }
  return c;
}

std::vector<std::string> Plan::describe() const {
  std::vector<std::string> out;
  if (!impl_) return out;
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
      out.push_back(st.what);
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
