// The importer's state while it walks one model (import.cpp) and the op
// handlers that map each ONNX op (ops.cpp).
#pragma once

#include "model.hpp"
#include "ops.hpp"  // the core's op table: backplane::detail::infer_node

#include <backplane/onnx.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace backplane::onnx::detail {

constexpr int64_t kMinOpset = 11;
constexpr int64_t kMaxOpset = 18;

// One ONNX value as the import knows it: a graph value (input, node or
// constant) and/or its data when known at import.
struct Val {
  std::string base;  // the ONNX name it came from (a node's name before sanitizing)
  std::string name;  // its name in the Backplane graph, once there
  backplane::detail::ValueType type;
  std::shared_ptr<HostTensor> value;  // known at import
  bool in_graph = false;
  bool moved = false;  // its data went into the graph (no longer here for folding)
  std::string origin;  // the ONNX node that made it ("node 'q' (Reshape)"), for messages
};
using ValPtr = std::shared_ptr<Val>;

// The model's opset of the default domain; Error outside kMinOpset-kMaxOpset.
int64_t default_opset(const ::onnx::ModelProto& model, const std::string& label);

// The model's initializers, converted once and shared by every import of
// the model (the trial import and the probes of a dynamic import).
using Initializers = std::map<std::string, std::shared_ptr<HostTensor>>;

// Imports a checked model: once, or (dynamic dims kept) at the trial sizes
// and at others, the graphs compared (dynamic.cpp).
ImportedModel import_model(::onnx::ModelProto& model, const ImportOptions& options, const std::string& label,
                           const std::filesystem::path& base);

class Importer;
using Handler = std::function<void(Importer&, const ::onnx::NodeProto&)>;
const std::map<std::string, Handler>& handlers();

class Importer {
 public:
  // `probe`: sizes that replace those of the options for these named dims
  // (the other sizes a dynamic import imports the model at).
  Importer(const ImportOptions& options, std::string label, std::filesystem::path base_dir,
           std::map<std::string, int64_t> probe = {})
      : options_(options), label_(std::move(label)), base_dir_(std::move(base_dir)), probe_(std::move(probe)) {}
  // The graph is static: every dynamic dim at its size.
  ImportedModel run(const ::onnx::ModelProto& model, const Initializers& initializers);
  // After run: each graph value's origin ("node 'q' (Reshape)"), and the
  // size of every named dynamic dim.
  const std::map<std::string, std::string>& origins() const { return origins_; }
  const std::map<std::string, int64_t>& dim_values() const { return dim_values_; }

  // --- for the handlers ---------------------------------------------------
  int64_t opset() const { return opset_; }
  const ImportOptions& options() const { return options_; }
  std::string where(const ::onnx::NodeProto& n) const;
  static std::string origin(const ::onnx::NodeProto& n);  // "node 'NAME' (OpType)"
  // Input k of n (nullptr when absent or ""), or an Error when required.
  ValPtr get(const ::onnx::NodeProto& n, int k) const;
  ValPtr need(const ::onnx::NodeProto& n, int k) const;
  // Input k's data, which must be known at import (a shape, axes, bounds).
  const HostTensor& known(const ::onnx::NodeProto& n, int k, const char* what) const;
  void set(const ::onnx::NodeProto& n, int k, ValPtr v);
  // A node of the standard op table over `ins`, inferred by the core; folded
  // into a constant when every input is known. `base` names it.
  ValPtr emit(const std::string& base, const std::string& op, const std::vector<ValPtr>& ins,
              Json params = Json::object());
  ValPtr constant(HostTensor t, const std::string& base);
  // Uses of an ONNX value by live nodes and outputs.
  int uses(const std::string& onnx_value) const {
    auto it = uses_.find(onnx_value);
    return it == uses_.end() ? 0 : it->second;
  }
  // The next live node (for folds that take two nodes at once), and marking
  // it done.
  const ::onnx::NodeProto* next() const { return next_; }
  // The next node was handled with this one: it is not visited, and what
  // it read no longer counts as read.
  void skip_next() {
    if (next_index_ < 0) return;
    skip_.insert(next_index_);
    for (const auto& in : next_->input()) --uses_[in];
  }
  void count_folded_bn() { ++folded_bn_; }

  static const ::onnx::AttributeProto* attr(const ::onnx::NodeProto& n, const std::string& name);
  static int64_t attr_i(const ::onnx::NodeProto& n, const std::string& name, int64_t dflt);
  static double attr_f(const ::onnx::NodeProto& n, const std::string& name, double dflt);
  static std::string attr_s(const ::onnx::NodeProto& n, const std::string& name, const std::string& dflt);
  static std::optional<std::vector<int64_t>> attr_ints(const ::onnx::NodeProto& n, const std::string& name);
  static std::vector<int64_t> ints_of(const HostTensor& t);
  static int64_t numel(const Shape& s);
  static std::string sanitize(const std::string& onnx_name);

 private:
  static constexpr uint64_t kKeepBytes = 1 << 16;
  std::string unique(const std::string& base);
  void ensure_in_graph(const ValPtr& v);
  Shape input_shape(const ::onnx::ValueInfoProto& vi, const std::string& name);

  const ImportOptions& options_;
  std::string label_;
  std::filesystem::path base_dir_;
  int64_t opset_ = 0;
  Graph graph_;
  ImportedModel result_;
  std::map<std::string, ValPtr> vals_;
  std::set<std::string> used_;
  std::map<std::string, int> uses_;
  std::map<std::string, int64_t> probe_;
  std::map<std::string, int64_t> dim_values_;
  std::map<std::string, std::string> origins_;
  const ::onnx::NodeProto* current_node_ = nullptr;
  std::set<int> skip_;
  const ::onnx::NodeProto* next_ = nullptr;
  int next_index_ = -1;
  const std::string* current_ = nullptr;
  uint64_t weight_bytes_ = 0;
  int folded_ = 0, folded_bn_ = 0;
};

}  // namespace backplane::onnx::detail
