#include "json_schema.hpp"

#include <regex>

namespace backplane::detail {

namespace {

bool type_matches(const std::string& t, const nlohmann::json& v) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "integer") return v.is_number_integer();
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

std::optional<std::string> check(const nlohmann::json& s, const nlohmann::json& v, const std::string& at) {
  auto fail = [&](const std::string& m) { return std::optional<std::string>("at " + (at.empty() ? "/" : at) + ": " + m); };
  if (s.contains("type") && !type_matches(s["type"].get<std::string>(), v))
    return fail("expected " + s["type"].get<std::string>() + ", found " + std::string(v.type_name()));
  if (s.contains("enum")) {
    bool found = false;
    for (auto& e : s["enum"]) found = found || e == v;
    if (!found) return fail(v.dump() + " is not one of " + s["enum"].dump());
  }
  if (v.is_string()) {
    const auto str = v.get<std::string>();
    if (s.contains("minLength") && str.size() < s["minLength"].get<size_t>()) return fail("string is too short");
    if (s.contains("pattern") && !std::regex_search(str, std::regex(s["pattern"].get<std::string>())))
      return fail("\"" + str + "\" does not match " + s["pattern"].get<std::string>());
  }
  if (v.is_number()) {
    if (s.contains("minimum") && v.get<double>() < s["minimum"].get<double>()) return fail(v.dump() + " is below the minimum " + s["minimum"].dump());
    if (s.contains("maximum") && v.get<double>() > s["maximum"].get<double>()) return fail(v.dump() + " is above the maximum " + s["maximum"].dump());
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (auto& r : s["required"])
        if (!v.contains(r.get<std::string>())) return fail("missing required key \"" + r.get<std::string>() + "\"");
    const auto props = s.value("properties", nlohmann::json::object());
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        if (auto e = check(props[it.key()], it.value(), at + "/" + it.key())) return e;
      } else if (s.contains("additionalProperties") && s["additionalProperties"] == false) {
        return fail("unknown key \"" + it.key() + "\"");
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return fail("too few items");
    if (s.contains("items"))
      for (size_t i = 0; i < v.size(); ++i)
        if (auto e = check(s["items"], v[i], at + "/" + std::to_string(i))) return e;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> validate_json(const nlohmann::json& schema, const nlohmann::json& value) {
  return check(schema, value, "");
}

}  // namespace backplane::detail
