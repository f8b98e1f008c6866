// The op vocabulary of docs/ops.md: one table of every op's inputs, params
// and outputs; params checked strictly against it, and shape/dtype inference,
// independent of any device.
#pragma once

#include <backplane/backplane.hpp>

#include <functional>
#include <memory>

namespace backplane::detail {

struct ValueType {
  bp_dtype dtype = BP_DTYPE_INVALID;
  Shape shape;
  // Bundles (multi-output ops): one entry per slot; dtype/shape above are slot 0's.
  std::vector<std::pair<bp_dtype, Shape>> slots;
  bool is_bundle() const { return !slots.empty(); }
};

enum class OpClass {
  Kernel,   // runs a device kernel
  View,     // layout-only (permute, slice, ...): no kernel, no copy
  Reshape,  // view when possible, else contiguous copy
  Slot,     // view of a bundle slot
  SlotCopy  // view_owned: copy of a bundle slot
};

// How the host canonicalises a kernel's input layouts (see abi.h).
enum class Canon { None, Broadcast, Matmul };

struct InferredNode {
  OpClass cls = OpClass::Kernel;
  Canon canon = Canon::None;
  bp_op_params params{};
  ValueType out;
  // For View/Reshape: turns the input layout into the output layout (may
  // return nullopt for a Reshape that needs a copy).
  std::function<std::optional<Layout>(const Layout&)> view;
  int64_t slot = -1;  // Slot/SlotCopy
  // fused_elementwise: the program params.u.fused points into (shared, so
  // copies of the params stay valid while any holder lives).
  std::shared_ptr<const std::vector<bp_fused_instr>> program;
};

// Infers one node. Inputs' ValueTypes are nullptr for absent optional inputs.
// Throws Error whose message names the node and the op.
InferredNode infer_node(const Node& node, const std::vector<const ValueType*>& inputs);

bool is_known_op(const std::string& op);
// Its last input repeats (concat, fused_elementwise): kernels are keyed by
// (first input, output) and flagged BP_KERNEL_FLAG_VARIADIC.
bool is_variadic_op(const std::string& op);
// Input i of `op` repeats a variadic input whose repeats the op table types
// each on its own (fused_elementwise's conditions), and `dtype` is one it
// takes: it may differ from the kernel row's dtype for that input.
bool own_typed_repeat(const std::string& op, size_t i, bp_dtype dtype);

// The inputs of `op` that may be null or left out: [first, total). Ops
// without optional inputs have none (first == total == 0).
struct OptionalInputs {
  size_t first = 0, total = 0;
};
OptionalInputs optional_inputs(const std::string& op);
bool is_custom_op(const std::string& op);  // vendor.op
std::vector<std::string> known_ops();

// Rank-normalised dim, or an Error naming `what`.
int64_t normalize_dim(int64_t dim, int64_t rank, const std::string& what);

}  // namespace backplane::detail
