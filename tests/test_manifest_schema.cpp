// The compiled schema checker (json_schema.hpp): every keyword's message and
// place, the order violations are found in, the shipped manifests, and a
// defect deep in a large manifest named with its file and row.
#include <backplane/backplane.hpp>

// The validator is internal; the library exports it, so it is tested here directly.
#include "../core/src/json_schema.hpp"

#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

using namespace backplane;
using detail::CompiledSchema;

namespace {

const Json kSchema = Json::parse(R"({
  "type": "object",
  "required": ["name", "rows"],
  "additionalProperties": false,
  "properties": {
    "name": {"type": "string", "minLength": 2, "pattern": "^[a-z]+$"},
    "kind": {"type": "string", "enum": ["cpu", "gpu"]},
    "count": {"type": "integer", "minimum": 0, "maximum": 16},
    "scale": {"type": "number", "minimum": -1.5},
    "open": {"type": "object", "properties": {"x": {"type": "boolean"}}},
    "rows": {
      "type": "array",
      "minItems": 1,
      "items": {
        "type": "object",
        "required": ["op"],
        "additionalProperties": false,
        "properties": {"op": {"type": "string"}, "dims": {"type": "array", "maxItems": 3, "items": {"type": "integer"}}}
      }
    }
  }
})");

std::string check(const CompiledSchema& schema, const std::string& value) {
  const auto r = schema.check(Json::parse(value));
  return r ? *r : "ok";
}

std::filesystem::path source_manifest(const std::string& name) {
  return std::filesystem::path(BACKPLANE_SOURCE_DIR) / "manifests" / name;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string manifest_error(const std::filesystem::path& dir, const std::string& name, const Json& j) {
  const auto path = dir / name;
  std::ofstream(path) << j.dump(1);
  try {
    parse_manifest(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("compiled schema: each keyword's message names the place", "[manifest][schema]") {
  const CompiledSchema s(kSchema);
  CHECK(check(s, R"({"name": "ab", "rows": [{"op": "add", "dims": [1, 2]}]})") == "ok");
  CHECK(check(s, R"([1])") == "at /: expected object, found array");
  CHECK(check(s, R"({"rows": [{"op": "a"}]})") == "at /: missing required key \"name\"");
  CHECK(check(s, R"({"name": "a", "rows": [{"op": "a"}]})") == "at /name: string is too short");
  CHECK(check(s, R"({"name": "aB", "rows": [{"op": "a"}]})") == "at /name: \"aB\" does not match ^[a-z]+$");
  CHECK(check(s, R"({"name": 7, "rows": [{"op": "a"}]})") == "at /name: expected string, found number");
  CHECK(check(s, R"({"name": "ab", "kind": "tpu", "rows": [{"op": "a"}]})") ==
        "at /kind: \"tpu\" is not one of [\"cpu\",\"gpu\"]");
  CHECK(check(s, R"({"name": "ab", "count": 2.5, "rows": [{"op": "a"}]})") == "at /count: expected integer, found number");
  CHECK(check(s, R"({"name": "ab", "count": -1, "rows": [{"op": "a"}]})") == "at /count: -1 is below the minimum 0");
  CHECK(check(s, R"({"name": "ab", "count": 17, "rows": [{"op": "a"}]})") == "at /count: 17 is above the maximum 16");
  CHECK(check(s, R"({"name": "ab", "count": 16, "scale": -1.5, "rows": [{"op": "a"}]})") == "ok");
  CHECK(check(s, R"({"name": "ab", "scale": -2, "rows": [{"op": "a"}]})") == "at /scale: -2 is below the minimum -1.5");
  CHECK(check(s, R"({"name": "ab", "colour": 1, "rows": [{"op": "a"}]})") == "at /: unknown key \"colour\"");
  CHECK(check(s, R"({"name": "ab", "rows": []})") == "at /rows: too few items");
  // maxItems (once ignored: a test_ranges entry of three numbers passed).
  CHECK(check(s, R"({"name": "ab", "rows": [{"op": "a", "dims": [1, 2, 3]}]})") == "ok");
  CHECK(check(s, R"({"name": "ab", "rows": [{"op": "a", "dims": [1, 2, 3, 4]}]})") ==
        "at /rows/0/dims: too many items (at most 3)");
  CHECK(check(s, R"({"name": "ab", "rows": [{"op": "a"}, {"op": "b", "dims": [1, "2"]}]})") ==
        "at /rows/1/dims/1: expected integer, found string");
  CHECK(check(s, R"({"name": "ab", "rows": [{"op": "a"}, {"dims": []}]})") == "at /rows/1: missing required key \"op\"");
  CHECK(check(s, R"({"name": "ab", "rows": [{"op": "a", "op2": 1}]})") == "at /rows/0: unknown key \"op2\"");
  // An object without "additionalProperties": false takes other keys, and checks the ones it names.
  CHECK(check(s, R"({"name": "ab", "open": {"y": 1}, "rows": [{"op": "a"}]})") == "ok");
  CHECK(check(s, R"({"name": "ab", "open": {"x": 1}, "rows": [{"op": "a"}]})") == "at /open/x: expected boolean, found number");
  // A long string is quoted in part.
  const auto long_name = check(s, R"({"name": ")" + std::string(1000, 'a') + R"(9", "rows": [{"op": "a"}]})");
  CHECK_THAT(long_name, Catch::StartsWith("at /name: \"aaaa") && Catch::Contains("(1001 characters)\" does not match"));
}

TEST_CASE("compiled schema: the first violation is the one reported", "[manifest][schema]") {
  const CompiledSchema s(kSchema);
  // Required keys before any key's own value.
  CHECK(check(s, R"({"name": "A", "count": -1})") == "at /: missing required key \"rows\"");
  // Then keys in the object's (sorted) order, whatever their order in the text.
  CHECK(check(s, R"({"rows": [{"op": 1}], "name": "A", "count": -1})") == "at /count: -1 is below the minimum 0");
  CHECK(check(s, R"({"rows": [{"op": 1}], "name": "A"})") == "at /name: string is too short");
  // Then items in order.
  CHECK(check(s, R"({"name": "ab", "rows": [{"op": "a"}, {"op": 2}, {"op": 3}]})") == "at /rows/1/op: expected string, found number");
  // A checker is reused: one value's failure leaves nothing behind for the next.
  CHECK(check(s, R"({"name": "ab", "rows": [{"op": "a"}]})") == "ok");
  // validate_json compiles the schema for one call and agrees.
  CHECK(detail::validate_json(kSchema, Json::parse(R"({"name": "ab", "rows": [{"op": 3}]})")) ==
        std::optional<std::string>("at /rows/0/op: expected string, found number"));
}

TEST_CASE("compiled schema: a bad pattern is found once, when the schema is compiled", "[manifest][schema]") {
  // No value reaches the pattern, and still the schema's bug is named.
  const Json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "string"}, {"pattern", "^a|b$"}}}}}};
  CHECK_THROWS_WITH(CompiledSchema(schema), Catch::Contains("pattern") && Catch::Contains("^a|b$"));
}

TEST_CASE("schema patterns of more than 64 states match like short ones", "[manifest][schema]") {
  // 40 x "a?" is 80 states, past the bit-mask form: the state-list form runs it.
  std::string anchored = "^";
  for (int i = 0; i < 40; ++i) anchored += "a?";
  anchored += "b$";
  const detail::SchemaPattern p(anchored);
  CHECK(p.search("b"));
  CHECK(p.search(std::string(40, 'a') + "b"));
  CHECK_FALSE(p.search(std::string(41, 'a') + "b"));
  CHECK_FALSE(p.search(std::string(10, 'a')));
  std::string unanchored;  // 70 states
  for (int i = 0; i < 70; ++i) unanchored += "[xy]";
  const detail::SchemaPattern q(unanchored);
  CHECK(q.search("--" + std::string(70, 'x') + "--"));
  CHECK_FALSE(q.search("--" + std::string(69, 'y') + "-y"));
  // The same languages in a few states.
  CHECK(detail::SchemaPattern("^a?a?b$").search("aab"));
  CHECK_FALSE(detail::SchemaPattern("^a?a?b$").search("aaab"));
}

TEST_CASE("the shipped manifests meet the schema", "[manifest][schema]") {
  for (const char* name : {"cpu.json", "vulkan.json", "remote.json"}) {
    INFO(name);
    const Json j = Json::parse(read_text(source_manifest(name)));
    CHECK(detail::manifest_schema_compiled().check(j) == std::nullopt);
    const PluginInfo info = parse_manifest(source_manifest(name));
    CHECK(info.kernels.size() == j["plugin"]["kernels"].size());
  }
  // Read field by field: the CPU manifest's rows as written.
  const Json cpu = Json::parse(read_text(source_manifest("cpu.json")));
  const PluginInfo info = parse_manifest(source_manifest("cpu.json"));
  REQUIRE(info.kernels.size() > 100);
  for (size_t i = 0; i < info.kernels.size(); ++i) {
    const Json& row = cpu["plugin"]["kernels"][i];
    const KernelInfo& k = info.kernels[i];
    INFO("kernel #" << i);
    CHECK(k.op == row["op"].get<std::string>());
    REQUIRE(k.dtypes.size() == row["dtypes"].size());
    for (size_t d = 0; d < k.dtypes.size(); ++d) CHECK(dtype_name(k.dtypes[d]) == row["dtypes"][d].get<std::string>());
    REQUIRE(k.layouts.size() == row["layouts"].size());
    for (size_t l = 0; l < k.layouts.size(); ++l)
      CHECK((k.layouts[l] == BP_LAYOUT_STRIDED) == (row["layouts"][l] == "strided"));
    CHECK(k.bundle_slots == row.value("bundle_slots", 0u));
    CHECK(k.variadic == row.value("variadic", false));
  }
}

TEST_CASE("a defect deep in a large manifest is named with its file and row", "[manifest][schema]") {
  const auto dir = std::filesystem::temp_directory_path() / "backplane_manifest_schema_tests";
  std::filesystem::create_directories(dir);
  const Json cpu = Json::parse(read_text(source_manifest("cpu.json")));
  REQUIRE(cpu["plugin"]["kernels"].size() > 400);
  Json j = cpu;
  j["plugin"]["kernels"][400]["dtypes"][1] = "f17";
  CHECK_THAT(manifest_error(dir, "row400.json", j),
             Catch::Contains("row400.json") && Catch::Contains("at /plugin/kernels/400/dtypes/1: \"f17\" is not one of"));
  j = cpu;
  j["plugin"]["kernels"][300].erase("layouts");
  CHECK_THAT(manifest_error(dir, "row300.json", j),
             Catch::Contains("row300.json") && Catch::Contains("at /plugin/kernels/300: missing required key \"layouts\""));
  j = cpu;
  j["plugin"]["kernels"][123]["bundle_slots"] = 17;
  CHECK_THAT(manifest_error(dir, "row123.json", j), Catch::Contains("at /plugin/kernels/123/bundle_slots: 17 is above the maximum 16"));
  // A vendor op's [lo, hi] of three numbers (the schema's maxItems, once ignored).
  j = cpu;
  int vendor_with_ranges = -1;
  auto& vendor = j["plugin"]["vendor_ops"];
  for (size_t v = 0; v < vendor.size() && vendor_with_ranges < 0; ++v)
    if (vendor[v].contains("test_ranges")) vendor_with_ranges = static_cast<int>(v);
  REQUIRE(vendor_with_ranges >= 0);
  vendor[static_cast<size_t>(vendor_with_ranges)]["test_ranges"][1] = Json::array({0, 1, 2});
  CHECK_THAT(manifest_error(dir, "ranges.json", j),
             Catch::Contains("/test_ranges/1: too many items (at most 2)"));
  j = cpu;
  j["plugin"]["kernels"][7]["op"] = "Add";
  CHECK_THAT(manifest_error(dir, "row7.json", j), Catch::Contains("at /plugin/kernels/7/op: \"Add\" does not match"));
  // Two defects: the row earlier in the table is named.
  j = cpu;
  j["plugin"]["kernels"][450]["variadic"] = "yes";
  j["plugin"]["kernels"][20]["layouts"][0] = "tiled";
  CHECK_THAT(manifest_error(dir, "two.json", j), Catch::Contains("at /plugin/kernels/20/layouts/0: \"tiled\" is not one of"));
  // A defect in the row count check after the schema: still named by row.
  j = cpu;
  j["plugin"]["kernels"][200]["dtypes"].push_back("f32");
  CHECK_THAT(manifest_error(dir, "count.json", j), Catch::Contains("count.json") && Catch::Contains("kernel #200"));
  // The unchanged table is accepted.
  CHECK(manifest_error(dir, "same.json", cpu) == "accepted");
}
