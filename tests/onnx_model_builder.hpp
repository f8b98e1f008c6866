// Test helpers shared by the ONNX importer's tests: a small ONNX model
// written node by node with ONNX's own protobuf classes, and the message of
// the Error a call throws.
#pragma once

#include <backplane/backplane.hpp>
#include <onnx/onnx_pb.h>

#include <cctype>
#include <functional>
#include <string>
#include <vector>

namespace backplane::test {

// A small ONNX model, written node by node.
struct ModelBuilder {
  ::onnx::ModelProto m;
  ::onnx::GraphProto* g;
  explicit ModelBuilder(int64_t opset = 13) {
    m.set_ir_version(8);
    m.set_producer_name("backplane-test");
    auto* o = m.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
    g = m.mutable_graph();
    g->set_name("test");
  }
  static void set_type(::onnx::ValueInfoProto* vi, int elem, const std::vector<std::string>& dims) {
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem);
    auto* sh = tt->mutable_shape();
    for (const auto& d : dims) {
      auto* dim = sh->add_dim();
      if (!d.empty() && (std::isdigit(static_cast<unsigned char>(d[0])) != 0)) dim->set_dim_value(std::stoll(d));
      else if (!d.empty()) dim->set_dim_param(d);
    }
  }
  ModelBuilder& input(const std::string& name, std::vector<std::string> dims, int elem = ::onnx::TensorProto::FLOAT) {
    auto* vi = g->add_input();
    vi->set_name(name);
    set_type(vi, elem, dims);
    return *this;
  }
  ModelBuilder& output(const std::string& name, int elem = ::onnx::TensorProto::FLOAT) {
    auto* vi = g->add_output();
    vi->set_name(name);
    vi->mutable_type()->mutable_tensor_type()->set_elem_type(elem);
    vi->mutable_type()->mutable_tensor_type()->mutable_shape();
    return *this;
  }
  ModelBuilder& init_f(const std::string& name, std::vector<int64_t> dims, std::vector<float> v) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(::onnx::TensorProto::FLOAT);
    for (auto d : dims) t->add_dims(d);
    t->set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
    return *this;
  }
  ModelBuilder& init_i(const std::string& name, std::vector<int64_t> dims, std::vector<int64_t> v) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(::onnx::TensorProto::INT64);
    for (auto d : dims) t->add_dims(d);
    for (auto x : v) t->add_int64_data(x);
    return *this;
  }
  ::onnx::NodeProto* node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
                          const std::string& name = "") {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? out.at(0) + "_node" : name);
    for (auto& i : in) n->add_input(i);
    for (auto& o : out) n->add_output(o);
    return n;
  }
  static void attr_i(::onnx::NodeProto* n, const std::string& name, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void attr_f(::onnx::NodeProto* n, const std::string& name, float v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  static void attr_ints(::onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::INTS);
    for (auto x : v) a->add_ints(x);
  }
  std::string bytes() const { return m.SerializeAsString(); }
};

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace backplane::test
