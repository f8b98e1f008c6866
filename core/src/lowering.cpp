// lower(): graph -> device-independent values and runnable nodes with their
// candidate devices (see lowering.hpp).
#include "lowering.hpp"

#include <algorithm>

#include "checked.hpp"
#include "vendor_ops.hpp"

namespace backplane::detail {

namespace {

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// The bytes a dense value of `d` and `s` spans, checked: a size that
// overflows (f32 [2^62], a broadcast_to that large fed to a kernel) is an
// Error naming the value (what() makes its name only then), never a wrapped
// number a buffer is then sized by.
template <class What> uint64_t nbytes(bp_dtype d, const Shape& s, What what) {
  int64_t n = static_cast<int64_t>(dtype_size(d));
  for (auto x : s)
    if (x < 0 || __builtin_mul_overflow(n, x, &n) || n > kMaxCount)
      throw Error(what() + ": " + std::string(dtype_name(d)) + " " + shape_str(s) +
                      " is more bytes than a buffer can hold (the limit is 2^62)",
                  BP_ERR_OUT_OF_RANGE);
  return static_cast<uint64_t>(n);
}

std::string kernel_list(const Device& dev, const std::string& op) {
  std::string s;
  for (const auto& k : dev.kernels())
    if (k.op == op) s += "\n    " + kernel_signature(k);
  return s.empty() ? " none (the device has no '" + op + "' kernel)" : s;
}

bool device_has_op(const Device& dev, const std::string& op) {
  for (const auto& k : dev.kernels())
    if (k.op == op) return true;
  return false;
}

class Lowerer {
 public:
  Lowerer(Runtime& rt, const Graph& g, const std::vector<Device*>& devices, const std::vector<std::string>& keep,
          const std::vector<Node>* nodes, bool vendor_kernels)
      : rt_(rt), g_(g), nodes_(nodes), vendor_kernels_(vendor_kernels), keep_(keep) {
    l_.devices = devices;
    for (auto* d : devices) l_.align = std::max<uint64_t>(l_.align, DeviceAccess::info(*d).buffer_alignment);
  }

  Lowered run() {
    for (const auto& in : g_.inputs()) {
      if (l_.by_name.count(in.name)) throw Error("graph input '" + in.name + "' is defined twice");
      const int r = new_root(nbytes(in.dtype, in.shape, [&] { return "input '" + in.name + "'"; }), -1);
      const int v = add_value(in.name, in.dtype, in.shape, r, 0, Layout::contiguous(in.shape));
      if (in.constant)
        l_.constants.push_back({v, &*in.constant});
      else
        l_.inputs.push_back({in.name, v});
    }
    for (const auto& node : nodes_ ? *nodes_ : g_.nodes()) lower_node(node);
    for (const auto& out : g_.outputs()) {
      if (bundles_.count(out))
        throw Error("graph output '" + out +
                    "' is a multi-output bundle; output its slots through 'view' or 'view_owned'");
      auto it = l_.by_name.find(out);
      if (it == l_.by_name.end())
        throw Error("graph output '" + out + "' is not an input or a node of the graph");
      const LValue& v = l_.values[it->second];
      if (!v.slots.empty())
        throw Error("graph output '" + out +
                    "' is a multi-output bundle; output its slots through 'view' or 'view_owned'");
      l_.roots[v.root].output = true;
      l_.outputs.push_back(out);
    }
    for (const auto& k : keep_) {
      auto it = l_.by_name.find(k);
      if (it == l_.by_name.end()) throw Error("compile: keep names '" + k + "', which is not a value of the graph");
      if (!l_.values[it->second].slots.empty())
        throw Error("compile: keep names '" + k + "', a multi-output bundle; keep its slots' views instead");
      l_.roots[l_.values[it->second].root].output = true;
      l_.kept.push_back(k);
    }
    return std::move(l_);
  }

 private:
  int new_root(uint64_t size, int producer) {
    l_.roots.push_back(LRoot{size, producer, false, nullptr});
    return static_cast<int>(l_.roots.size()) - 1;
  }

  int add_value(const std::string& name, bp_dtype dtype, Shape shape, int root, uint64_t byte_offset,
                Layout layout) {
    LValue v;
    v.name = name;
    v.dtype = dtype;
    v.shape = std::move(shape);
    v.root = root;
    v.byte_offset = byte_offset;
    v.layout = std::move(layout);
    l_.values.push_back(std::move(v));
    const int id = static_cast<int>(l_.values.size()) - 1;
    if (!name.empty()) l_.by_name[name] = id;
    return id;
  }

  // The devices a node may use: its pin, or the list.
  std::vector<Device*> choices(const Node& node, const std::string& where) {
    if (node.device.empty()) return l_.devices;
    try {
      return {&rt_.device(node.device)};
    } catch (const Error& e) {
      throw Error(where + " is pinned to device '" + node.device + "': " + e.what(), e.code());
    }
  }

  // Can `dev` run kernel `op` with dispatch `key` on inputs laid out as
  // `layouts`? Fills `c` and returns "" when it can, else why not.
  std::string try_device(Device* dev, const LNode& n, size_t bundle_slots, bool variadic_ok, Candidate& c) {
    Plugin& plugin = DeviceAccess::plugin(*dev);
    int k = plugin.find_kernel(n.op, n.key);
    if ((k < 0 || !DeviceAccess::supports(*dev, k)) && variadic_ok && n.key.size() > 2) {
      // Variadic kernels are keyed by (first input, output).
      k = plugin.find_kernel(n.op, {n.key.front(), n.key.back()});
      if (k >= 0 && !(plugin.api()->kernels[k].flags & BP_KERNEL_FLAG_VARIADIC)) k = -1;
    }
    if (k < 0 || !DeviceAccess::supports(*dev, k))
      return "has no kernel " + signature(n.op, n.key) + "; it offers:" + kernel_list(*dev, n.op);
    const bp_kernel_desc& desc = plugin.api()->kernels[k];
    const bool variadic = desc.flags & BP_KERNEL_FLAG_VARIADIC;
    if (!variadic && desc.n_inputs != n.inputs.size())
      return "has a kernel that takes " + std::to_string(desc.n_inputs) + " inputs, the node gives " +
             std::to_string(n.inputs.size());
    if (desc.bundle_slots != bundle_slots)
      return "has a kernel that declares " + std::to_string(desc.bundle_slots) +
             " bundle slots, the op has " + std::to_string(bundle_slots);
    c.device = dev;
    c.kernel = k;
    c.contiguize.assign(n.inputs.size(), 0);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i] < 0 || desc.n_inputs == 0) continue;
      const uint8_t cap = desc.input_layouts[std::min<size_t>(i, desc.n_inputs - 1)];
      if (cap != BP_LAYOUT_CONTIGUOUS || n.in_layouts[i].is_contiguous()) continue;
      const bp_dtype dt = l_.values[n.inputs[i]].dtype;
      const int kc = plugin.find_kernel("contiguous", {dt, dt});
      if (kc < 0 || !DeviceAccess::supports(*dev, kc))
        return "needs input " + std::to_string(i) + " dense and has no kernel " +
               signature("contiguous", {dt, dt}) + " to copy it so";
      if (plugin.api()->kernels[kc].input_layouts[0] != BP_LAYOUT_STRIDED)
        return "has a contiguous kernel that itself needs contiguous input";
      c.contiguize[i] = 1;
    }
    return "";
  }

  // Fills n.candidates from `devs`; throws when none can run the node.
  void find_candidates(LNode& n, const std::vector<Device*>& devs, size_t bundle_slots, bool variadic_ok,
                       const std::string& pin) {
    std::vector<std::pair<Device*, std::string>> refusals;
    for (Device* d : devs) {
      Candidate c;
      std::string why = try_device(d, n, bundle_slots, variadic_ok, c);
      if (why.empty())
        n.candidates.push_back(std::move(c));
      else
        refusals.emplace_back(d, std::move(why));
    }
    if (!refusals.empty() && refusals.front().first == devs.front())
      n.first_refusal = refusals.front().second;
    if (!n.candidates.empty()) return;
    if (!pin.empty())
      throw Error(
          n.where + " is pinned to device '" + devs.front()->name() + "', which " + refusals.front().second,
          BP_ERR_UNIMPLEMENTED);
    if (refusals.size() == 1)
      throw Error(n.where + ": device '" + refusals.front().first->name() + "' " + refusals.front().second,
                  BP_ERR_UNIMPLEMENTED);
    std::string s = n.where + ": no device of the list can run it:";
    for (const auto& [d, why] : refusals) s += "\n  device '" + d->name() + "' " + why;
    throw Error(s, BP_ERR_UNIMPLEMENTED);
  }

  // A contiguous copy of value `src` (seen through `layout`) into new bytes.
  int add_copy(const Node& node, const std::string& where, int src, const Layout& layout,
               const std::string& name) {
    const LValue& s = l_.values[src];
    const bp_dtype dt = s.dtype;
    LNode n;
    n.node = node.name;
    n.op = "contiguous";
    n.where = where;
    n.copy = true;
    n.inputs = {src};
    n.in_layouts = {layout};
    n.out_layout = Layout::contiguous(layout.shape());
    n.params.struct_size = sizeof(bp_op_params);
    n.params.kind = BP_PARAMS_NONE;
    n.key = {dt, dt};
    n.pinned = !node.device.empty();
    find_candidates(n, choices(node, where), 0, false, node.device);
    const int idx = static_cast<int>(l_.nodes.size());
    const int r = new_root(nbytes(dt, layout.shape(), [&] { return "a copy of '" + l_.values[src].name + "'"; }), idx);
    n.output = add_value(name, dt, layout.shape(), r, 0, Layout::contiguous(layout.shape()));
    l_.nodes.push_back(std::move(n));
    return l_.nodes.back().output;
  }

  // Types of a vendor node through its decomposition (no device needed).
  std::vector<ValueType> decomposition_types(const VendorOpInfo& decl, const Node& node,
                                             const std::vector<std::pair<bp_dtype, Shape>>& in) {
    std::vector<ValueType> out;
    for (auto& [dt, shape] : decomposition_output_types(decl, node, in)) out.push_back({dt, std::move(shape), {}});
    return out;
  }

  void lower_vendor(const Node& node, const std::string& where, const std::vector<int>& in_ids) {
    const VendorOpInfo* decl = rt_.vendor_op(node.op);
    const auto devs = choices(node, where);
    std::vector<Device*> with_kernel;
    for (Device* d : devs)
      if (device_has_op(*d, node.op) && (vendor_kernels_ || !decl || !decl->has_decomposition()))
        with_kernel.push_back(d);
    std::vector<std::pair<bp_dtype, Shape>> in_types;
    for (size_t i = 0; i < in_ids.size(); ++i) {
      if (in_ids[i] < 0) throw Error(where + ": input " + std::to_string(i) + " is null");
      const LValue& v = l_.values[in_ids[i]];
      if (!v.slots.empty()) throw Error(where + ": input " + std::to_string(i) + " is a bundle; use 'view'");
      in_types.emplace_back(v.dtype, v.shape);
    }
    if (with_kernel.empty()) {
      if (!decl || !decl->has_decomposition()) {
        std::string names;
        for (auto* d : devs) names += (names.empty() ? "" : ", ") + d->name();
        throw Error(where + ": no device of the list (" + names + ") has a kernel for the vendor op '" +
                        node.op + "', and " +
                        (decl ? "its manifest gives no decomposition" : "no manifest declares it"),
                    BP_ERR_UNIMPLEMENTED);
      }
      const Expansion e = expand_vendor_node(*decl, node, in_types);
      l_.notes.push_back(where + ": no device of the list has the vendor op; runs its decomposition (" +
                         std::to_string(e.nodes.size()) + " standard nodes, " + node.name + "/...)");
      for (const auto& sub : e.nodes) lower_node(sub);
      std::vector<int> outs;
      for (const auto& o : e.outputs) outs.push_back(l_.by_name.at(o));
      if (decl->outputs.size() == 1)
        l_.by_name[node.name] = outs[0];
      else
        bundles_[node.name] = outs;
      return;
    }
    // A device runs the op's kernel: types from the plugin's inference and/or
    // the decomposition; when both exist they must agree.
    Json params = decl ? vendor_params(*decl, node) : node.params;
    std::vector<ValueType> types;
    if (decl && decl->has_decomposition()) types = decomposition_types(*decl, node, in_types);
    Plugin& plugin = DeviceAccess::plugin(*with_kernel.front());
    auto* api = plugin.api();
    LNode n;
    n.node = node.name;
    n.op = node.op;
    n.where = where;
    n.heavy = true;
    n.pinned = !node.device.empty();
    n.inputs = in_ids;
    n.custom_json = params.dump();
    n.params.struct_size = sizeof(bp_op_params);
    n.params.kind = BP_PARAMS_CUSTOM;
    n.params.u.custom.json = {n.custom_json.data(), n.custom_json.size()};
    // The ABI's inference gives one output: a multi-output op's slots come
    // from its decomposition alone.
    const bool multi = decl && decl->outputs.size() > 1;
    if (api->infer_custom_op && !multi) {
      std::vector<bp_dtype> dts;
      std::vector<bp_layout> ls;
      for (const auto& [dt, shape] : in_types) {
        dts.push_back(dt);
        ls.push_back(Layout::contiguous(shape).to_bp());
      }
      bp_dtype out_dt = BP_DTYPE_INVALID;
      bp_layout out_l{};
      plugin.check(api->infer_custom_op(plugin.ctx(), {node.op.data(), node.op.size()}, dts.data(), ls.data(), ls.size(),
                                        &n.params, &out_dt, &out_l),
                   where);
      if (dtype_size(out_dt) == 0 || out_l.rank > BP_MAX_RANK)
        throw Error(where + ": the plugin's shape inference returned an invalid dtype or rank");
      ValueType t{out_dt, Shape(out_l.shape, out_l.shape + out_l.rank), {}};
      for (auto d : t.shape)
        if (d < 0) throw Error(where + ": the plugin's shape inference returned a negative dim");
      if (!types.empty() && (types[0].dtype != t.dtype || types[0].shape != t.shape))
        throw Error(where + ": plugin '" + plugin.info().name + "' infers " +
                    std::string(dtype_name(t.dtype)) + shape_str(t.shape) +
                    " but the op's decomposition gives " + std::string(dtype_name(types[0].dtype)) +
                    shape_str(types[0].shape));
      if (types.empty()) types.push_back(t);
    }
    if (types.empty())
      throw Error(where + ": plugin '" + plugin.info().name +
                  "' gives no shape inference for its vendor ops and no manifest gives a decomposition");
    const size_t slots = types.size() > 1 ? types.size() : 0;
    if (decl && decl->outputs.size() > 1 && types.size() != decl->outputs.size())
      throw Error(where + ": declares " + std::to_string(decl->outputs.size()) +
                  " outputs; a multi-output vendor op needs a decomposition");
    for (auto id : in_ids) {
      n.key.push_back(l_.values[id].dtype);
      n.in_layouts.push_back(l_.values[id].layout);
    }
    n.key.push_back(types[0].dtype);
    find_candidates(n, with_kernel, slots, true, node.device);
    if (with_kernel.front() != devs.front()) n.first_refusal = "has no " + node.op + " kernel";
    n.out_layout = Layout::contiguous(types[0].shape);
    emit_kernel_node(std::move(n), types, node.name);
  }

  // Appends a kernel node producing `types` (one, or a bundle's slots).
  void emit_kernel_node(LNode n, const std::vector<ValueType>& types, const std::string& name) {
    const int idx = static_cast<int>(l_.nodes.size());
    std::vector<SlotSpec> slots;
    auto what = [&] { return "node '" + name + "'"; };
    uint64_t size = nbytes(types[0].dtype, types[0].shape, what);
    if (types.size() > 1) {
      uint64_t off = 0;
      for (const auto& t : types) {
        off = align_up(off, std::max<uint64_t>(l_.align, dtype_size(t.dtype)));
        slots.push_back({t.dtype, t.shape, off});
        off = static_cast<uint64_t>(checked_add(static_cast<int64_t>(off),
                                                static_cast<int64_t>(nbytes(t.dtype, t.shape, what)), what() + ": its slots' bytes"));
      }
      size = off;
    }
    const int r = new_root(size, idx);
    n.output = add_value(name, types[0].dtype, types[0].shape, r, 0, Layout::contiguous(types[0].shape));
    l_.values[n.output].slots = std::move(slots);
    l_.nodes.push_back(std::move(n));
  }

  void lower_node(const Node& node) {
    const std::string where = "node '" + node.name + "' (" + node.op + ")";
    if (node.name.empty()) throw Error("a node of op '" + node.op + "' has no name");
    if (l_.by_name.count(node.name) || bundles_.count(node.name))
      throw Error(where + ": the name '" + node.name + "' is already used");
    // Slots of a vendor op that ran as its decomposition: plain values.
    if ((node.op == "view" || node.op == "view_owned") && node.inputs.size() == 1 &&
        bundles_.count(node.inputs[0])) {
      if (node.op == "view" && !node.device.empty())
        throw Error(where +
                    ": a view has no device of its own (it is read where its producer's bytes are); pin its "
                    "producer or its consumers");
      const auto& outs = bundles_[node.inputs[0]];
      for (auto it = node.params.begin(); it != node.params.end(); ++it)
        if (it.key() != "slot") throw Error(where + ": unknown param '" + it.key() + "'");
      if (!node.params.contains("slot") || !node.params["slot"].is_number_integer())
        throw Error(where + ": 'slot' (an integer) is required");
      const int64_t slot = node.params["slot"].get<int64_t>();
      if (slot < 0 || slot >= static_cast<int64_t>(outs.size()))
        throw Error(where + ": slot " + std::to_string(slot) + " is out of range for a bundle of " +
                    std::to_string(outs.size()));
      const int src = outs[static_cast<size_t>(slot)];
      if (node.op == "view")
        l_.by_name[node.name] = src;
      else
        add_copy(node, where, src, l_.values[src].layout, node.name);
      return;
    }
    std::vector<int> in_ids;
    std::vector<ValueType> in_types;
    in_types.reserve(node.inputs.size() + 3);
    for (const auto& n : node.inputs) {
      if (n.empty()) {
        in_ids.push_back(-1);
        in_types.push_back({});
        continue;
      }
      if (bundles_.count(n))
        throw Error(where + ": input '" + n + "' is a multi-output bundle; read its slots through 'view'");
      auto it = l_.by_name.find(n);
      if (it == l_.by_name.end()) throw Error(where + ": input '" + n + "' is not defined before this node");
      const LValue& v = l_.values[it->second];
      in_ids.push_back(it->second);
      ValueType t{v.dtype, v.shape, {}};
      for (const auto& s : v.slots) t.slots.push_back({s.dtype, s.shape});
      in_types.push_back(std::move(t));
    }
    if (is_custom_op(node.op) && !is_known_op(node.op)) {
      lower_vendor(node, where, in_ids);
      return;
    }
    // Trailing optional inputs left out are the same as nulls: one kernel row serves both.
    const size_t full_arity = optional_inputs(node.op).total;
    while (in_ids.size() < full_arity && !in_ids.empty()) {
      in_ids.push_back(-1);
      in_types.push_back({});
    }
    std::vector<const ValueType*> in_ptrs;
    for (size_t i = 0; i < in_types.size(); ++i) in_ptrs.push_back(in_ids[i] < 0 ? nullptr : &in_types[i]);
    InferredNode r = infer_node(node, in_ptrs);
    const bool layout_only = r.cls == OpClass::View || r.cls == OpClass::Slot;
    if (layout_only && !node.device.empty())
      throw Error(where +
                  ": a view has no device of its own (it is read where its producer's bytes are); pin its "
                  "producer or its consumers");
    switch (r.cls) {
      case OpClass::View: {
        const LValue src = l_.values[in_ids[0]];
        add_value(node.name, src.dtype, r.out.shape, src.root, src.byte_offset, *r.view(src.layout));
        return;
      }
      case OpClass::Reshape: {
        const LValue src = l_.values[in_ids[0]];
        if (auto l = r.view(src.layout)) {
          add_value(node.name, src.dtype, r.out.shape, src.root, src.byte_offset, std::move(*l));
        } else {
          const int dense = add_copy(node, where, in_ids[0], src.layout, "");
          const LValue d = l_.values[dense];
          add_value(node.name, d.dtype, r.out.shape, d.root, 0, Layout::contiguous(r.out.shape));
        }
        return;
      }
      case OpClass::Slot:
      case OpClass::SlotCopy: {
        const LValue src = l_.values[in_ids[0]];
        const SlotSpec s = src.slots[r.slot];
        if (r.cls == OpClass::Slot) {
          add_value(node.name, s.dtype, s.shape, src.root, src.byte_offset + s.byte_offset,
                    Layout::contiguous(s.shape));
        } else {
          // Named for messages and explain(): "t:slot1".
          const int view = add_value(node.inputs[0] + ":slot" + std::to_string(r.slot), s.dtype, s.shape,
                                     src.root, src.byte_offset + s.byte_offset, Layout::contiguous(s.shape));
          add_copy(node, where, view, Layout::contiguous(s.shape), node.name);
        }
        return;
      }
      case OpClass::Kernel:
        break;
    }
    LNode n;
    n.node = node.name;
    n.op = node.op;
    n.where = where;
    n.heavy = node.op == "matmul" || node.op == "conv2d" || node.op == "selective_scan";
    n.pinned = !node.device.empty();
    n.params = r.params;
    n.program = r.program;
    // Dispatch key: input dtypes (absent optional inputs take the output's), then output.
    for (size_t i = 0; i < in_ids.size(); ++i)
      n.key.push_back(in_ids[i] < 0 ? r.out.dtype : l_.values[in_ids[i]].dtype);
    n.key.push_back(r.out.dtype);
    // Canonical input layouts.
    for (size_t i = 0; i < in_ids.size(); ++i) {
      if (in_ids[i] < 0) {
        n.in_layouts.emplace_back();
        continue;
      }
      Layout l = l_.values[in_ids[i]].layout;
      if (r.canon == Canon::Broadcast) l = l.broadcast_to(r.out.shape);
      n.in_layouts.push_back(std::move(l));
    }
    n.out_layout = Layout::contiguous(r.out.shape);
    // The ABI promises kernels 0 <= dim < rank: a scalar given dim 0 or -1
    // (softmax, cumsum, argmax, gather of rank 0) is shown to them as [1],
    // the same bytes.
    if ((r.params.kind == BP_PARAMS_DIM || r.params.kind == BP_PARAMS_ARG_REDUCE) && !in_ids.empty() &&
        in_ids[0] >= 0 && l_.values[in_ids[0]].shape.empty()) {
      for (auto& l : n.in_layouts)
        if (l.rank() == 0) l = l.unsqueeze(0);
      if (n.out_layout.rank() == 0) n.out_layout = n.out_layout.unsqueeze(0);
    }
    if (r.canon == Canon::Matmul) {
      Layout a = n.in_layouts[0], b = n.in_layouts[1];
      if (a.rank() == 1) a = a.unsqueeze(0);
      if (b.rank() == 1) b = b.unsqueeze(1);
      const size_t rank = std::max(a.rank(), b.rank());
      Shape batch(rank - 2, 1);
      for (const Layout* l : {&a, &b})
        for (size_t i = 0; i + 2 < l->rank(); ++i) {
          int64_t& d = batch[rank - l->rank() + i];
          if (d == 1) d = l->shape()[i];  // NumPy: 1 stretches, 0 beats 1 (inference refused other mismatches)
        }
      Shape as = batch, bs = batch, os = batch;
      as.insert(as.end(), {a.shape()[a.rank() - 2], a.shape().back()});
      bs.insert(bs.end(), {b.shape()[b.rank() - 2], b.shape().back()});
      os.insert(os.end(), {a.shape()[a.rank() - 2], b.shape().back()});
      n.in_layouts[0] = a.broadcast_to(as);
      n.in_layouts[1] = b.broadcast_to(bs);
      n.out_layout = Layout::contiguous(os);
    }
    n.inputs = in_ids;
    find_candidates(n, choices(node, where), r.out.slots.size(), is_variadic_op(node.op), node.device);
    std::vector<ValueType> types;
    if (r.out.is_bundle()) {
      for (const auto& [dt, shape] : r.out.slots) types.push_back({dt, shape, {}});
    } else {
      types.push_back(r.out);
    }
    emit_kernel_node(std::move(n), types, node.name);
  }

  Runtime& rt_;
  const Graph& g_;
  const std::vector<Node>* nodes_;  // the graph's nodes after the passes, or null: g_'s
  bool vendor_kernels_;             // false: vendor ops with a decomposition run it
  const std::vector<std::string>& keep_;
  Lowered l_;
  std::map<std::string, std::vector<int>> bundles_;  // vendor nodes run as decompositions: slot values
};

}  // namespace

uint64_t LValue::bytes() const {
  if (!slots.empty()) {
    const auto& last = slots.back();
    return last.byte_offset + nbytes(last.dtype, last.shape, [&] { return "value '" + name + "'"; });
  }
  return nbytes(dtype, shape, [&] { return "value '" + name + "'"; });
}

std::string signature(const std::string& op, const std::vector<bp_dtype>& key) {
  std::string sig = op + "(";
  for (size_t i = 0; i + 1 < key.size(); ++i)
    sig += std::string(i ? ", " : "") + std::string(dtype_name(key[i]));
  return sig + ") -> " + std::string(key.empty() ? "?" : dtype_name(key.back()));
}

Lowered lower(Runtime& rt, const Graph& graph, const std::vector<Device*>& devices,
              const std::vector<std::string>& keep, const std::vector<Node>* nodes, bool vendor_kernels) {
  if (devices.empty()) throw Error("compile: the device list is empty");
  return Lowerer(rt, graph, devices, keep, nodes, vendor_kernels).run();
}

}  // namespace backplane::detail
