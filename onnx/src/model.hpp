// The ONNX side of the importer: reading and checking a ModelProto, tensors
// and dtypes (model.cpp).
#pragma once

#include <backplane/backplane.hpp>

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace backplane::onnx::detail {

// Parses a model; Error naming `label` when the bytes are not a ModelProto.
void read_model_file(const std::filesystem::path& path, ::onnx::ModelProto& m);
void read_model_bytes(std::string_view bytes, ::onnx::ModelProto& m, const std::string& label);
// ONNX's checker (structure, opset imports, node attributes against the
// schemas), external data looked for in `base` (the model's folder; empty
// for a model in memory, which may have none); its complaint becomes an
// Error naming the model.
void check_model(const ::onnx::ModelProto& m, const std::string& label, const std::filesystem::path& base);
// An external data location: relative, never leaving the model's folder.
void check_location(const std::string& location, const std::string& where);

std::optional<bp_dtype> dtype_of(int32_t onnx_type);
std::string onnx_type_name(int32_t onnx_type);

// A TensorProto's values as a HostTensor. External data is read from `base`
// (the model's folder; empty: refused). With `release`, the proto's own copy
// of the bytes is freed once copied, so the weights are in memory once.
HostTensor tensor_from_proto(::onnx::TensorProto& t, const std::filesystem::path& base, const std::string& where,
                             bool release);

}  // namespace backplane::onnx::detail
