// The planner's first two passes, before any buffer exists:
//
//   lower()  infers every node, turns view ops into layouts over their
//            producer's bytes, expands vendor ops that no listed device runs
//            into their decomposition, and records for each node that runs
//            a kernel the devices that can run it (its candidates).
//   place()  picks one candidate per node: the pin, else the first device of
//            the list that can run it; then a cheap node moves to a later
//            candidate when that moves strictly fewer bytes across devices.
//
// plan_build.cpp then inserts transfers and contiguous copies, assigns buffers per
// device and builds what the executor needs.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ops.hpp"
#include "plugin.hpp"

namespace backplane::detail {

struct SlotSpec {
  bp_dtype dtype;
  Shape shape;
  uint64_t byte_offset;
};

// A value: bytes of a root seen through a layout that counts elements from
// the root's start + byte_offset.
struct LValue {
  std::string name;
  bp_dtype dtype = BP_DTYPE_INVALID;
  Shape shape;
  int root = -1;
  uint64_t byte_offset = 0;
  Layout layout;
  std::vector<SlotSpec> slots;  // bundles
  uint64_t bytes() const;       // what the value spans (a bundle: all slots)
};

// Storage: a graph input or constant, or the output of a node.
struct LRoot {
  uint64_t size = 0;
  int producer = -1;         // index into Lowered::nodes; -1 = graph input/constant
  bool output = false;       // a graph output
  Device* device = nullptr;  // set by place()
};

struct Candidate {
  Device* device = nullptr;
  int kernel = -1;
  std::vector<char> contiguize;  // per input: the device must copy it dense first
};

// Something that runs on a device: a node's kernel, or a contiguous copy
// (reshape that cannot be a view, view_owned).
struct LNode {
  std::string node;   // graph node name
  std::string op;     // the op ("contiguous" for copies)
  std::string where;  // "node 'y' (add)", for messages
  bool copy = false;
  std::vector<int> inputs;  // value ids, -1 = absent optional input
  std::vector<Layout> in_layouts;
  Layout out_layout;
  int output = -1;
  bp_op_params params{};
  std::string custom_json;
  std::shared_ptr<const std::vector<bp_fused_instr>> program;  // fused_elementwise: params point into it
  std::vector<bp_dtype> key;
  bool heavy = false;  // never moved off its first choice to save transfers
  bool pinned = false;
  std::vector<Candidate> candidates;  // in list order
  int chosen = -1;                    // index into candidates
  std::string reason;                 // why the chosen device
  std::string first_refusal;          // why the list's first device cannot run it
};

struct Lowered {
  std::vector<Device*> devices;  // the list
  std::vector<LValue> values;
  std::map<std::string, int> by_name;
  std::vector<LRoot> roots;
  std::vector<LNode> nodes;
  std::vector<std::pair<std::string, int>> inputs;           // non-constant graph inputs
  std::vector<std::pair<int, const HostTensor*>> constants;  // value id, data
  std::vector<std::string> outputs;
  std::vector<std::string> kept;  // CompileOptions::keep
  uint64_t align = 16;             // bundle slot alignment: the largest of the devices'
  std::vector<std::string> notes;  // decompositions used, for explain()

  Device* device_of(int value) const { return roots[values[value].root].device; }
};

// `keep`: values besides the graph outputs that must stay readable.
// `nodes`: the graph's nodes as the passes before lowering left them
// (pass_patterns.hpp); null = the graph's own.
Lowered lower(Runtime& rt, const Graph& graph, const std::vector<Device*>& devices,
              const std::vector<std::string>& keep = {}, const std::vector<Node>* nodes = nullptr,
              bool vendor_kernels = true);
void place(Lowered& l);

// "add(f32, f32) -> f32"
std::string signature(const std::string& op, const std::vector<bp_dtype>& key);

}  // namespace backplane::detail
