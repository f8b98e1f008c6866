// A validator for the subset of JSON Schema our manifest schema uses: type,
// required, properties, additionalProperties (bool), items, enum, pattern,
// minLength, minItems, minimum, maximum. No well-kept C++ validator is in
// Debian; this subset is small enough to own.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace backplane::detail {

// Returns the first violation as "at /plugin/kernels/3/op: ..." or nullopt.
std::optional<std::string> validate_json(const nlohmann::json& schema, const nlohmann::json& value);

// The manifest schema (manifests/manifest.schema.json), embedded at build time.
const nlohmann::json& manifest_schema();

}  // namespace backplane::detail
