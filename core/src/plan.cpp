// The planner and the executor.
//
// compile(): infer every node, resolve its kernel, canonicalise input layouts
// (broadcast, matmul promotion), insert a device Contiguize step before
// contiguous-only kernel inputs, lay out bundles, turn view ops into layouts
// over the producer's buffer, then assign buffers by liveness (reusing those
// whose last reader has run) and allocate each buffer once on the device.
// Every bp_storage/bp_layout a kernel will see is built here, so execute()
// only locks, calls kernels and synchronizes.
#include "ops.hpp"
#include "plugin.hpp"
#include "runtime_impl.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>
#include <shared_mutex>

namespace backplane {

using detail::Canon;
using detail::InferredNode;
using detail::OpClass;
using detail::ValueType;

namespace {

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct Cell {
  Plugin* plugin = nullptr;
  bp_device* device = nullptr;
  uint64_t size = 0;
  uint64_t handle = 0;
  void* host_ptr = nullptr;
  std::shared_mutex mu;
  ~Cell() {
    if (handle && plugin->api()) plugin->api()->buffer_free(device, handle);
  }
};

struct SlotSpec {
  bp_dtype dtype;
  Shape shape;
  uint64_t byte_offset;
};

// A value of the plan: bytes in a virtual buffer, seen through a layout that
// counts elements from vbuf start + byte_offset.
struct Value {
  std::string name;
  bp_dtype dtype = BP_DTYPE_INVALID;
  Shape shape;
  int vbuf = -1;
  uint64_t byte_offset = 0;
  Layout layout;
  std::vector<SlotSpec> slots;  // bundles
};

struct VBuf {
  uint64_t size = 0;
  int def_step = -1;   // -1: graph input/constant (live from the start)
  int last_use = -1;
  bool pinned = false;  // graph inputs, constants, outputs: never shared
  int cell = -1;
};

struct Step {
  std::string what;  // "node 'y' (add, kernel add(f32, f32) -> f32 [...] on cpu)"
  int kernel = -1;
  bp_kernel_fn fn = nullptr;
  std::vector<int> inputs;   // value ids, -1 = absent optional
  std::vector<Layout> in_layouts;  // canonical layouts, parallel to inputs
  int output = -1;           // value id
  Layout out_layout;         // what the kernel is told (matmul: the promoted shape)
  bp_op_params params{};
  std::string custom_json;
  // Built by finalize():
  std::vector<bp_storage> in_st;
  bp_storage out_st{};
  std::vector<bp_layout> layouts;
  std::vector<bp_bundle_slot> slots;
};

}  // namespace

struct Plan::Impl {
  Device* device = nullptr;
  Plugin* plugin = nullptr;
  bool poison = false;
  std::vector<Value> values;
  std::map<std::string, int> by_name;
  std::vector<VBuf> vbufs;
  std::vector<std::unique_ptr<Cell>> cells;
  std::vector<Step> steps;
  std::vector<std::pair<std::string, int>> inputs;  // non-constant graph inputs
  std::vector<std::string> outputs;
  std::vector<std::pair<Cell*, bool>> lock_order;  // (cell, write)
  std::vector<std::string> description;
  bp_kernel_context ctx{};

  const Value& value(const std::string& name) const {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw Error("plan has no value named '" + name + "'");
    return values[it->second];
  }
  Cell& cell_of(const Value& v) const { return *cells[vbufs[v.vbuf].cell]; }

  void fill_storage(bp_storage& st, const Value& v) const {
    const Cell& c = cell_of(v);
    st = bp_storage{};
    st.struct_size = sizeof(bp_storage);
    st.data = c.host_ptr ? static_cast<char*>(c.host_ptr) + v.byte_offset : nullptr;
    st.buffer_handle = c.handle;
    st.byte_offset = v.byte_offset;
    st.byte_size = c.size - v.byte_offset;
    st.dtype = v.dtype;
  }

  void read_bytes(const Cell& c, uint64_t offset, void* dst, uint64_t size) const {
    if (size == 0) return;
    if (c.host_ptr) {
      std::memcpy(dst, static_cast<const char*>(c.host_ptr) + offset, size);
    } else {
      plugin->check(plugin->api()->buffer_read(DeviceAccess::handle(*device), c.handle, offset, dst, size),
                    "reading a result from device '" + device->name() + "'");
    }
  }
  void write_bytes(Cell& c, uint64_t offset, const void* src, uint64_t size) const {
    if (size == 0) return;
    if (c.host_ptr) {
      std::memcpy(static_cast<char*>(c.host_ptr) + offset, src, size);
    } else {
      plugin->check(plugin->api()->buffer_write(DeviceAccess::handle(*device), c.handle, offset, src, size),
                    "writing an input to device '" + device->name() + "'");
    }
  }
};

namespace {

// Builds a plan; one per compile() call.
class Planner {
 public:
  Planner(Plan::Impl& p, const Graph& g) : p_(p), g_(g) {
    dev_ = p.device;
    plugin_ = p.plugin;
    align_ = std::max<uint64_t>(DeviceAccess::info(*dev_).buffer_alignment, 16);
  }

  void build() {
    for (const auto& in : g_.inputs()) {
      if (p_.by_name.count(in.name)) throw Error("graph input '" + in.name + "' is defined twice");
      const int vb = new_vbuf(nbytes(in.dtype, in.shape), -1);
      p_.vbufs[vb].pinned = true;
      const int v = add_value(in.name, in.dtype, in.shape, vb, 0, Layout::contiguous(in.shape));
      if (in.constant) constants_.push_back({v, &*in.constant});
      else p_.inputs.push_back({in.name, v});
    }
    for (const auto& node : g_.nodes()) plan_node(node);
    for (const auto& out : g_.outputs()) {
      auto it = p_.by_name.find(out);
      if (it == p_.by_name.end()) throw Error("graph output '" + out + "' is not an input or a node of the graph");
      const Value& v = p_.values[it->second];
      if (!v.slots.empty())
        throw Error("graph output '" + out + "' is a multi-output bundle; output its slots through 'view' or 'view_owned'");
      p_.vbufs[v.vbuf].pinned = true;
      p_.outputs.push_back(out);
    }
    assign_cells();
    allocate();
    for (auto& [v, t] : constants_) {
      const Value& val = p_.values[v];
      p_.write_bytes(p_.cell_of(val), val.byte_offset, t->data(), t->nbytes());
    }
    finalize();
  }

 private:
  static uint64_t nbytes(bp_dtype d, const Shape& s) {
    uint64_t n = dtype_size(d);
    for (auto x : s) n *= static_cast<uint64_t>(x);
    return n;
  }

  int new_vbuf(uint64_t size, int def_step) {
    p_.vbufs.push_back(VBuf{size, def_step, def_step, false, -1});
    return static_cast<int>(p_.vbufs.size()) - 1;
  }

  int add_value(const std::string& name, bp_dtype dtype, Shape shape, int vbuf, uint64_t byte_offset, Layout layout) {
    Value v;
    v.name = name;
    v.dtype = dtype;
    v.shape = std::move(shape);
    v.vbuf = vbuf;
    v.byte_offset = byte_offset;
    v.layout = std::move(layout);
    p_.values.push_back(std::move(v));
    const int id = static_cast<int>(p_.values.size()) - 1;
    if (!name.empty()) p_.by_name[name] = id;
    return id;
  }

  void use(int value, int step) {
    auto& vb = p_.vbufs[p_.values[value].vbuf];
    vb.last_use = std::max(vb.last_use, step);
  }

  std::string kernel_list(const std::string& op) const {
    std::string s;
    for (const auto& k : dev_->kernels())
      if (k.op == op) s += "\n    " + kernel_signature(k);
    return s.empty() ? " none (the device has no '" + op + "' kernel)" : s;
  }

  int resolve(const std::string& where, const std::string& op, const std::vector<bp_dtype>& key, bool variadic_ok) {
    int k = plugin_->find_kernel(op, key);
    if ((k < 0 || !DeviceAccess::supports(*dev_, k)) && variadic_ok && key.size() > 2) {
      // Variadic kernels are keyed by (first input, output).
      k = plugin_->find_kernel(op, {key.front(), key.back()});
      if (k >= 0 && !(plugin_->api()->kernels[k].flags & BP_KERNEL_FLAG_VARIADIC)) k = -1;
    }
    if (k < 0 || !DeviceAccess::supports(*dev_, k)) {
      std::string sig = op + "(";
      for (size_t i = 0; i + 1 < key.size(); ++i) sig += std::string(i ? ", " : "") + std::string(dtype_name(key[i]));
      sig += ") -> " + std::string(dtype_name(key.back()));
      throw Error(where + ": device '" + dev_->name() + "' has no kernel " + sig + "; it offers:" + kernel_list(op),
                  BP_ERR_UNIMPLEMENTED);
    }
    return k;
  }

  // Appends a device Contiguize step that copies `layout` of value `src` into
  // a new dense buffer; returns the new value.
  int contiguize(int src, const Layout& layout, const std::string& why) {
    const Value& s = p_.values[src];
    const bp_dtype dt = s.dtype;
    const int k = resolve(why + ": inserting a contiguous copy", "contiguous", {dt, dt}, false);
    if (plugin_->api()->kernels[k].input_layouts[0] != BP_LAYOUT_STRIDED)
      throw Error(why + ": device '" + dev_->name() + "' has a contiguous kernel that itself needs contiguous input");
    const int step = static_cast<int>(p_.steps.size());
    const Shape shape = layout.shape();
    const int vb = new_vbuf(nbytes(dt, shape), step);
    const int out = add_value("", dt, shape, vb, 0, Layout::contiguous(shape));
    Step st;
    st.what = why + " (contiguous copy on " + dev_->name() + ")";
    st.kernel = k;
    st.fn = plugin_->api()->kernels[k].fn;
    st.inputs = {src};
    st.in_layouts = {layout};
    st.output = out;
    st.out_layout = Layout::contiguous(shape);
    st.params.struct_size = sizeof(bp_op_params);
    st.params.kind = BP_PARAMS_NONE;
    p_.steps.push_back(std::move(st));
    use(src, step);
    p_.description.push_back(p_.steps.back().what);
    return out;
  }

  InferredNode infer_custom(const Node& node, const std::vector<const ValueType*>& in) {
    const std::string where = "node '" + node.name + "' (" + node.op + ")";
    auto* api = plugin_->api();
    bool offered = false;
    for (const auto& k : dev_->kernels()) offered = offered || k.op == node.op;
    if (!offered) throw Error(where + ": device '" + dev_->name() + "' offers no kernel for the vendor op '" + node.op + "'");
    if (!api->infer_custom_op)
      throw Error(where + ": plugin '" + plugin_->info().name + "' gives no shape inference for its vendor ops");
    std::vector<bp_dtype> dts;
    std::vector<bp_layout> ls;
    for (size_t i = 0; i < in.size(); ++i) {
      if (!in[i]) throw Error(where + ": input " + std::to_string(i) + " is null");
      if (in[i]->is_bundle()) throw Error(where + ": input " + std::to_string(i) + " is a bundle; use 'view'");
      dts.push_back(in[i]->dtype);
      ls.push_back(Layout::contiguous(in[i]->shape).to_bp());
    }
    InferredNode r;
    r.params.struct_size = sizeof(bp_op_params);
    r.params.kind = BP_PARAMS_CUSTOM;
    custom_json_ = node.params.dump();
    r.params.u.custom.json = {custom_json_.data(), custom_json_.size()};
    bp_dtype out_dt = BP_DTYPE_INVALID;
    bp_layout out_l{};
    plugin_->check(api->infer_custom_op({node.op.data(), node.op.size()}, dts.data(), ls.data(), ls.size(), &r.params,
                                        &out_dt, &out_l),
                   where);
    if (dtype_size(out_dt) == 0 || out_l.rank > BP_MAX_RANK)
      throw Error(where + ": the plugin's shape inference returned an invalid dtype or rank");
    r.out.dtype = out_dt;
    r.out.shape.assign(out_l.shape, out_l.shape + out_l.rank);
    for (auto d : r.out.shape)
      if (d < 0) throw Error(where + ": the plugin's shape inference returned a negative dim");
    return r;
  }

  void plan_node(const Node& node) {
    const std::string where = "node '" + node.name + "' (" + node.op + ")";
    if (node.name.empty()) throw Error("a node of op '" + node.op + "' has no name");
    if (p_.by_name.count(node.name)) throw Error(where + ": the name '" + node.name + "' is already used");
    std::vector<int> in_ids;
    std::vector<ValueType> in_types;
    in_types.reserve(node.inputs.size());
    for (const auto& n : node.inputs) {
      if (n.empty()) {
        in_ids.push_back(-1);
        in_types.push_back({});
        continue;
      }
      auto it = p_.by_name.find(n);
      if (it == p_.by_name.end()) throw Error(where + ": input '" + n + "' is not defined before this node");
      const Value& v = p_.values[it->second];
      in_ids.push_back(it->second);
      ValueType t{v.dtype, v.shape, {}};
      for (const auto& s : v.slots) t.slots.push_back({s.dtype, s.shape});
      in_types.push_back(std::move(t));
    }
    // Trailing optional inputs left out are the same as nulls: one kernel row serves both.
    const size_t full_arity = detail::optional_inputs(node.op).total;
    while (in_ids.size() < full_arity && !in_ids.empty()) {
      in_ids.push_back(-1);
      in_types.push_back({});
    }
    std::vector<const ValueType*> in_ptrs;
    for (size_t i = 0; i < in_types.size(); ++i) in_ptrs.push_back(in_ids[i] < 0 ? nullptr : &in_types[i]);

    InferredNode r = detail::is_custom_op(node.op) && !detail::is_known_op(node.op) ? infer_custom(node, in_ptrs)
                                                                                    : detail::infer_node(node, in_ptrs);
    switch (r.cls) {
      case OpClass::View: {
        const Value& src = p_.values[in_ids[0]];
        Layout l = *r.view(src.layout);
        add_value(node.name, src.dtype, r.out.shape, src.vbuf, src.byte_offset, std::move(l));
        return;
      }
      case OpClass::Reshape: {
        const Value src = p_.values[in_ids[0]];
        if (auto l = r.view(src.layout)) {
          add_value(node.name, src.dtype, r.out.shape, src.vbuf, src.byte_offset, std::move(*l));
        } else {
          const int dense = contiguize(in_ids[0], src.layout, where);
          const Value d = p_.values[dense];
          add_value(node.name, d.dtype, r.out.shape, d.vbuf, 0, Layout::contiguous(r.out.shape));
        }
        return;
      }
      case OpClass::Slot:
      case OpClass::SlotCopy: {
        const Value src = p_.values[in_ids[0]];
        const SlotSpec& s = src.slots[r.slot];
        if (r.cls == OpClass::Slot) {
          add_value(node.name, s.dtype, s.shape, src.vbuf, src.byte_offset + s.byte_offset, Layout::contiguous(s.shape));
        } else {
          const int view = add_value("", s.dtype, s.shape, src.vbuf, src.byte_offset + s.byte_offset, Layout::contiguous(s.shape));
          const int copy = contiguize(view, Layout::contiguous(s.shape), where);
          p_.values[copy].name = node.name;
          p_.by_name[node.name] = copy;
        }
        return;
      }
      case OpClass::Kernel:
        break;
    }

    // Dispatch key: input dtypes (absent optional inputs take the output's), then output.
    std::vector<bp_dtype> key;
    for (size_t i = 0; i < in_ids.size(); ++i) key.push_back(in_ids[i] < 0 ? r.out.dtype : p_.values[in_ids[i]].dtype);
    key.push_back(r.out.dtype);
    const int k = resolve(where, node.op, key, node.op == "concat" || detail::is_custom_op(node.op));
    const bp_kernel_desc& desc = plugin_->api()->kernels[k];
    const bool variadic = desc.flags & BP_KERNEL_FLAG_VARIADIC;
    if (!variadic && desc.n_inputs != in_ids.size())
      throw Error(where + ": kernel takes " + std::to_string(desc.n_inputs) + " inputs, node gives " + std::to_string(in_ids.size()));
    if (desc.bundle_slots != r.out.slots.size())
      throw Error(where + ": kernel declares " + std::to_string(desc.bundle_slots) + " bundle slots, the op has " +
                  std::to_string(r.out.slots.size()));

    // Canonical input layouts.
    std::vector<Layout> layouts;
    for (size_t i = 0; i < in_ids.size(); ++i) {
      if (in_ids[i] < 0) {
        layouts.emplace_back();
        continue;
      }
      const Value& v = p_.values[in_ids[i]];
      Layout l = v.layout;
      if (r.canon == Canon::Broadcast) {
        l = l.broadcast_to(r.out.shape);
      }
      layouts.push_back(std::move(l));
    }
    Layout out_layout = Layout::contiguous(r.out.shape);
    if (r.canon == Canon::Matmul) {
      Layout a = layouts[0], b = layouts[1];
      if (a.rank() == 1) a = a.unsqueeze(0);
      if (b.rank() == 1) b = b.unsqueeze(1);
      const size_t rank = std::max(a.rank(), b.rank());
      Shape batch(rank - 2, 1);
      for (const Layout* l : {&a, &b})
        for (size_t i = 0; i + 2 < l->rank(); ++i) {
          int64_t& d = batch[rank - l->rank() + i];
          d = std::max(d, l->shape()[i]);
        }
      Shape as = batch, bs = batch, os = batch;
      as.insert(as.end(), {a.shape()[a.rank() - 2], a.shape().back()});
      bs.insert(bs.end(), {b.shape()[b.rank() - 2], b.shape().back()});
      os.insert(os.end(), {a.shape()[a.rank() - 2], b.shape().back()});
      layouts[0] = a.broadcast_to(as);
      layouts[1] = b.broadcast_to(bs);
      out_layout = Layout::contiguous(os);
    }
    // Contiguize inputs the kernel cannot stride through.
    std::vector<int> ids = in_ids;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0) continue;
      const uint8_t cap = desc.input_layouts[std::min<size_t>(i, desc.n_inputs - 1)];
      if (cap == BP_LAYOUT_CONTIGUOUS && !layouts[i].is_contiguous()) {
        ids[i] = contiguize(ids[i], layouts[i], where + " input " + std::to_string(i));
        layouts[i] = Layout::contiguous(layouts[i].shape());
      }
    }
    const int step = static_cast<int>(p_.steps.size());
    // Output buffer: plain, or a bundle with each slot aligned.
    std::vector<SlotSpec> slots;
    uint64_t size = nbytes(r.out.dtype, r.out.shape);
    if (r.out.is_bundle()) {
      uint64_t off = 0;
      for (const auto& [dt, shape] : r.out.slots) {
        off = align_up(off, std::max<uint64_t>(align_, dtype_size(dt)));
        slots.push_back({dt, shape, off});
        off += nbytes(dt, shape);
      }
      size = off;
    }
    const int vb = new_vbuf(size, step);
    const int out = add_value(node.name, r.out.dtype, r.out.shape, vb, 0, Layout::contiguous(r.out.shape));
    p_.values[out].slots = std::move(slots);

    Step st;
    st.what = where + " [kernel " + kernel_signature(plugin_->info().kernels[k]) + " on " + dev_->name() + "]";
    st.kernel = k;
    st.fn = desc.fn;
    st.inputs = ids;
    st.in_layouts = std::move(layouts);
    st.output = out;
    st.out_layout = std::move(out_layout);
    st.params = r.params;
    if (r.params.kind == BP_PARAMS_CUSTOM) st.custom_json = custom_json_;
    for (int id : ids)
      if (id >= 0) use(id, step);
    p_.description.push_back(st.what);
    p_.steps.push_back(std::move(st));
  }

  // Greedy buffer reuse: a step's output takes a free cell whose values are
  // all dead before this step (never one the step also reads).
  void assign_cells() {
    std::vector<uint64_t> cell_size;
    std::vector<int> cell_free_after;  // step index after which the cell is free; INT_MAX = pinned
    std::vector<std::vector<int>> by_step(p_.steps.size() + 1);
    for (size_t i = 0; i < p_.vbufs.size(); ++i) {
      auto& vb = p_.vbufs[i];
      if (vb.pinned || vb.def_step < 0) {
        vb.cell = static_cast<int>(cell_size.size());
        cell_size.push_back(vb.size);
        cell_free_after.push_back(INT32_MAX);
      } else {
        by_step[vb.def_step].push_back(static_cast<int>(i));
      }
    }
    for (size_t s = 0; s < p_.steps.size(); ++s) {
      for (int i : by_step[s]) {
        auto& vb = p_.vbufs[i];
        int best = -1;
        for (size_t c = 0; c < cell_size.size(); ++c) {
          if (cell_free_after[c] >= static_cast<int>(s)) continue;
          // Prefer the smallest cell that fits, else the largest to grow.
          if (best < 0) { best = static_cast<int>(c); continue; }
          const bool fits = cell_size[c] >= vb.size, best_fits = cell_size[best] >= vb.size;
          if ((fits && (!best_fits || cell_size[c] < cell_size[best])) || (!fits && !best_fits && cell_size[c] > cell_size[best]))
            best = static_cast<int>(c);
        }
        if (best < 0) {
          best = static_cast<int>(cell_size.size());
          cell_size.push_back(0);
          cell_free_after.push_back(-1);
        }
        vb.cell = best;
        cell_size[best] = std::max(cell_size[best], vb.size);
        cell_free_after[best] = std::max(vb.last_use, static_cast<int>(s));
      }
    }
    for (size_t c = 0; c < cell_size.size(); ++c) {
      auto cell = std::make_unique<Cell>();
      cell->plugin = plugin_;
      cell->device = DeviceAccess::handle(*dev_);
      cell->size = std::max<uint64_t>(cell_size[c], align_);
      p_.cells.push_back(std::move(cell));
    }
  }

  void allocate() {
    for (auto& c : p_.cells) {
      bp_buffer b{};
      b.struct_size = sizeof b;
      plugin_->check(plugin_->api()->buffer_allocate(c->device, c->size, &b),
                     "allocating " + std::to_string(c->size) + " bytes on device '" + dev_->name() + "'");
      c->handle = b.handle;
      c->host_ptr = b.host_ptr;
    }
  }

  void finalize() {
    std::vector<int> mode(p_.cells.size(), 0);  // 0 unused, 1 read, 2 write
    for (size_t s = 0; s < p_.steps.size(); ++s) {
      Step& st = p_.steps[s];
      st.in_st.resize(st.inputs.size());
      st.layouts.clear();
      for (size_t i = 0; i < st.inputs.size(); ++i) {
        if (st.inputs[i] < 0) {
          st.in_st[i] = bp_storage{};
          st.in_st[i].struct_size = sizeof(bp_storage);
          st.in_st[i].dtype = p_.values[st.output].dtype;
          st.layouts.push_back(bp_layout{});
          continue;
        }
        const Value& v = p_.values[st.inputs[i]];
        p_.fill_storage(st.in_st[i], v);
        st.layouts.push_back(st.in_layouts[i].to_bp());
        int& m = mode[p_.vbufs[v.vbuf].cell];
        m = std::max(m, 1);
      }
      const Value& out = p_.values[st.output];
      p_.fill_storage(st.out_st, out);
      mode[p_.vbufs[out.vbuf].cell] = 2;
      st.slots.clear();
      for (const auto& sl : out.slots) {
        bp_bundle_slot b{};
        b.dtype = sl.dtype;
        b.layout = Layout::contiguous(sl.shape).to_bp();
        b.byte_offset = sl.byte_offset;
        st.slots.push_back(b);
      }
      if (!st.slots.empty()) {
        st.out_st.n_slots = static_cast<uint32_t>(st.slots.size());
        st.out_st.slots = st.slots.data();
        st.out_st.dtype = st.slots[0].dtype;
        st.layouts.push_back(st.slots[0].layout);
      } else {
        st.layouts.push_back(st.out_layout.to_bp());
      }
      if (st.params.kind == BP_PARAMS_CUSTOM) st.params.u.custom.json = {st.custom_json.data(), st.custom_json.size()};
    }
    for (size_t c = 0; c < p_.cells.size(); ++c)
      if (mode[c]) p_.lock_order.push_back({p_.cells[c].get(), mode[c] == 2});
    std::sort(p_.lock_order.begin(), p_.lock_order.end(),
              [](const auto& a, const auto& b) { return std::less<Cell*>()(a.first, b.first); });
  }

  Plan::Impl& p_;
  const Graph& g_;
  Device* dev_;
  Plugin* plugin_;
  uint64_t align_;
  std::string custom_json_;
  std::vector<std::pair<int, const HostTensor*>> constants_;
};

// Holds the plan's locks for one run, in the global (address) order.
class RunLocks {
 public:
  explicit RunLocks(const std::vector<std::pair<Cell*, bool>>& order) : order_(order) {
    for (auto& [c, w] : order_) {
      if (w) c->mu.lock(); else c->mu.lock_shared();
      ++held_;
    }
  }
  ~RunLocks() {
    for (size_t i = held_; i-- > 0;) {
      auto& [c, w] = order_[i];
      if (w) c->mu.unlock(); else c->mu.unlock_shared();
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
  Plan plan;
  plan.impl_ = std::make_unique<Plan::Impl>();
  auto& p = *plan.impl_;
  p.device = &device;
  p.plugin = &DeviceAccess::plugin(device);
  p.poison = options.poison_outputs;
  if (!p.plugin->loaded()) throw Error("device '" + device.name() + "': its plugin is not loaded");
  // Check the whole graph's shapes first, so a bad graph is reported as such
  // before any device question (vendor ops need the device's inference).
  bool has_vendor_op = false;
  for (const auto& n : graph.nodes()) has_vendor_op = has_vendor_op || detail::is_custom_op(n.op);
  if (!has_vendor_op) infer_graph(graph);
  Planner(p, graph).build();
  p.ctx.struct_size = sizeof(bp_kernel_context);
  p.ctx.device = DeviceAccess::handle(device);
  p.ctx.host = &impl_->host;
  return plan;
}

void Plan::set_input(const std::string& name, const HostTensor& t) {
  if (!impl_) throw Error("set_input on an empty plan");
  auto& p = *impl_;
  auto it = std::find_if(p.inputs.begin(), p.inputs.end(), [&](auto& e) { return e.first == name; });
  if (it == p.inputs.end()) throw Error("the graph has no (non-constant) input named '" + name + "'");
  const auto& v = p.values[it->second];
  if (t.dtype != v.dtype || t.shape != v.shape)
    throw Error("input '" + name + "': expected " + std::string(dtype_name(v.dtype)) + shape_str(v.shape) + ", got " +
                std::string(dtype_name(t.dtype)) + shape_str(t.shape));
  Cell& c = p.cell_of(v);
  std::unique_lock<std::shared_mutex> lk(c.mu);
  p.write_bytes(c, v.byte_offset, t.data(), t.nbytes());
}

void Plan::execute() {
  if (!impl_) throw Error("execute on an empty plan");
  auto& p = *impl_;
  const bp_plugin_api* api = p.plugin->api();
  bp_device* dev = p.ctx.device;
  RunLocks locks(p.lock_order);
  // With poisoning on an asynchronous device, each step is submitted on its
  // own so the poison lands right before the kernel that must overwrite it.
  const bool step_sync = p.poison && api->synchronize;
  auto sync = [&](const std::string& what) {
    if (api->synchronize) p.plugin->check(api->synchronize(dev), what);
  };
  auto begin = [&]() {
    if (api->begin) p.plugin->check(api->begin(dev), "device '" + p.device->name() + "': begin");
  };
  begin();
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const Step& st = p.steps[s];
    if (p.poison) {
      const Value& out = p.values[st.output];
      Cell& c = p.cell_of(out);
      uint64_t bytes = 0;
      if (out.slots.empty()) {
        bytes = static_cast<uint64_t>(out.layout.numel()) * dtype_size(out.dtype);
      } else {
        const auto& last = out.slots.back();
        bytes = last.byte_offset + static_cast<uint64_t>(Layout::contiguous(last.shape).numel()) * dtype_size(last.dtype);
      }
      std::vector<unsigned char> junk(bytes, 0xFF);
      p.write_bytes(c, out.byte_offset, junk.data(), bytes);
    }
    auto ctx = p.ctx;
    ctx.kernel_index = static_cast<uint32_t>(st.kernel);
    bp_error* err = st.fn(&ctx, st.in_st.data(), st.in_st.size(), &st.out_st, 1, st.layouts.data(), &st.params);
    if (err) {
      const auto code = api->error_code(err);
      const std::string msg = p.plugin->take_error(err);
      if (api->synchronize) p.plugin->take_error(api->synchronize(dev));  // drain, keep the first error
      throw Error(st.what + ": " + msg, code);
    }
    if (step_sync) {
      sync(st.what);
      if (s + 1 < p.steps.size()) begin();
    }
  }
  if (!step_sync) sync("running the plan on device '" + p.device->name() + "'");
}

HostTensor Plan::output(const std::string& name) const {
  if (!impl_) throw Error("output on an empty plan");
  const auto& p = *impl_;
  const Value& v = p.value(name);
  if (!v.slots.empty()) throw Error("'" + name + "' is a bundle; read its slots through 'view'");
  HostTensor t(v.dtype, v.shape);
  Cell& c = p.cell_of(v);
  std::shared_lock<std::shared_mutex> lk(c.mu);
  const size_t es = dtype_size(v.dtype);
  if (v.layout.is_contiguous()) {
    p.read_bytes(c, v.byte_offset, t.data(), t.nbytes());
    return t;
  }
  if (t.numel() == 0) return t;
  // A strided view: fetch the span it touches, then gather on the host.
  const auto [lo, hi] = v.layout.extent();
  std::vector<std::byte> span(static_cast<size_t>(hi - lo + 1) * es);
  p.read_bytes(c, v.byte_offset + static_cast<uint64_t>(lo) * es, span.data(), span.size());
  const auto& shape = v.layout.shape();
  const auto& strides = v.layout.strides();
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t off = v.layout.offset() - lo;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * strides[d];
    std::memcpy(t.bytes.data() + i * es, span.data() + off * es, es);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return t;
}

std::map<std::string, HostTensor> Plan::run(const std::map<std::string, HostTensor>& inputs) {
  if (!impl_) throw Error("run on an empty plan");
  for (const auto& [name, _] : impl_->inputs)
    if (!inputs.count(name)) throw Error("input '" + name + "' was not given");
  for (const auto& [name, t] : inputs) set_input(name, t);
  execute();
  std::map<std::string, HostTensor> out;
  for (const auto& name : impl_->outputs) out[name] = output(name);
  return out;
}

std::vector<std::string> Plan::describe() const { return impl_ ? impl_->description : std::vector<std::string>{}; }

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
