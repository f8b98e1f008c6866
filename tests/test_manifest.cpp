// Manifest parsing and schema validation: every defect gets a message that
// names the file and the place.
#include <backplane/backplane.hpp>

// The validator is internal; the library exports it, so its matcher is tested here directly.
#include "../core/src/json_schema.hpp"

#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <fstream>

using namespace backplane;

namespace {
std::filesystem::path write_manifest(const std::string& name, const std::string& text) {
  auto dir = std::filesystem::temp_directory_path() / "backplane_manifest_tests";
  std::filesystem::create_directories(dir);
  auto path = dir / name;
  std::ofstream(path) << text;
  return path;
}

const char* kGood = R"({"file_format_version": "1.0.0", "plugin": {"name": "acme", "version": "2.1", "library_path": "libacme.so",
  "abi_version": "1.0", "device_kind": "accelerator", "description": "test",
  "kernels": [{"op": "add", "dtypes": ["f32", "f32", "f32"], "layouts": ["strided", "contiguous"]},
              {"op": "topk", "dtypes": ["f16", "f16"], "layouts": ["strided"], "bundle_slots": 2},
              {"op": "concat", "dtypes": ["i8", "i8"], "layouts": ["strided"], "variadic": true}]}})";
}  // namespace

TEST_CASE("a valid manifest is read field by field", "[manifest]") {
  const auto path = write_manifest("good.json", kGood);
  const PluginInfo info = parse_manifest(path);
  CHECK(info.name == "acme");
  CHECK(info.version == "2.1");
  CHECK(info.device_kind == "accelerator");
  CHECK(info.library_path == std::filesystem::weakly_canonical(path.parent_path()) / "libacme.so");
  REQUIRE(info.kernels.size() == 3);
  CHECK(info.kernels[0].layouts[1] == BP_LAYOUT_CONTIGUOUS);
  CHECK(info.kernels[1].bundle_slots == 2);
  CHECK(info.kernels[1].dtypes == std::vector<bp_dtype>{BP_DTYPE_F16, BP_DTYPE_F16});
  CHECK(info.kernels[2].variadic);
  // And it survives a round trip through manifest_to_json.
  const auto again = write_manifest("again.json", manifest_to_json(info).dump());
  CHECK(parse_manifest(again).kernels == info.kernels);
}

TEST_CASE("manifest defects are named precisely", "[manifest]") {
  auto bad = [](const std::string& name, const std::string& text) {
    try {
      parse_manifest(write_manifest(name, text));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(bad("json.json", "{not json"), Catch::Contains("json.json") && Catch::Contains("malformed JSON"));
  CHECK_THAT(bad("nokey.json", R"({"file_format_version": "1.0.0"})"), Catch::Contains("missing required key \"plugin\""));
  std::string s = kGood;
  CHECK_THAT(bad("kind.json", std::string(s).replace(s.find("accelerator"), 11, "toaster")),
             Catch::Contains("/plugin/device_kind") && Catch::Contains("toaster"));
  CHECK_THAT(bad("dtype.json", std::string(s).replace(s.find("\"f16\""), 5, "\"f17\"")),
             Catch::Contains("/plugin/kernels/1/dtypes/0"));
  CHECK_THAT(bad("extra.json", std::string(s).replace(s.find("\"description\""), 13, "\"colour\"")),
             Catch::Contains("unknown key \"colour\""));
  CHECK_THAT(bad("count.json", std::string(s).replace(s.find("\"f32\", \"f32\", \"f32\""), 19, "\"f32\", \"f32\"")),
             Catch::Contains("kernel #0") && Catch::Contains("dtypes"));
  CHECK_THAT(bad("abi.json", std::string(s).replace(s.find("\"1.0\""), 5, "\"one\"")), Catch::Contains("/plugin/abi_version"));
}

TEST_CASE("discovery follows the search path and reports unusable manifests", "[manifest]") {
  auto dir = std::filesystem::temp_directory_path() / "backplane_discovery";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "a");
  std::filesystem::create_directories(dir / "b");
  std::ofstream(dir / "a" / "acme.json") << kGood;
  std::ofstream(dir / "b" / "acme.json") << kGood;  // same plugin later on the path: ignored
  std::ofstream(dir / "b" / "broken.json") << "{";
  RuntimeOptions opts;
  opts.use_default_path = false;
  opts.use_environment = false;
  opts.plugin_paths = {dir / "a", dir / "b", dir / "missing"};
  auto rt = Runtime::create(opts);
  REQUIRE(rt->plugins().size() == 1);
  CHECK(rt->plugins()[0].manifest_path == dir / "a" / "acme.json");
  CHECK(rt->plugins()[0].state == PluginState::NotLoaded);
  REQUIRE(rt->manifest_errors().size() == 2);
  // Listing devices loads nothing.
  const auto devices = rt->devices();
  REQUIRE(devices.size() == 1);
  CHECK(devices[0].state == PluginState::NotLoaded);
  CHECK(devices[0].kernel_count == 3);
}

namespace {
std::string manifest_error(const std::filesystem::path& path) {
  try {
    parse_manifest(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}
std::string with_field(std::string text, const std::string& key, const std::string& value) {
  const auto at = text.find("\"" + key + "\": \"");
  REQUIRE(at != std::string::npos);
  const auto start = at + key.size() + 5;
  return text.replace(start, text.find('"', start) - start, value);
}
}  // namespace

TEST_CASE("manifest strings are checked against the schema's patterns", "[manifest]") {
  auto bad = [](const std::string& name, const std::string& text) { return manifest_error(write_manifest(name, text)); };
  const std::string s = kGood;
  CHECK(bad("p_ok.json", with_field(s, "name", "a.b-c_9")) == "accepted");
  CHECK_THAT(bad("p_name.json", with_field(s, "name", "Acme")), Catch::Contains("/plugin/name") && Catch::Contains("does not match"));
  CHECK_THAT(bad("p_name2.json", with_field(s, "name", "9acme")), Catch::Contains("/plugin/name"));
  CHECK_THAT(bad("p_ffv.json", with_field(s, "file_format_version", "2.0.0")), Catch::Contains("/file_format_version"));
  CHECK_THAT(bad("p_ffv2.json", with_field(s, "file_format_version", "1x0.0")), Catch::Contains("/file_format_version"));
  CHECK_THAT(bad("p_ffv3.json", with_field(s, "file_format_version", "1.0.0.")), Catch::Contains("/file_format_version"));
  CHECK_THAT(bad("p_abi.json", with_field(s, "abi_version", "1.")), Catch::Contains("/plugin/abi_version"));
  CHECK_THAT(bad("p_op.json", with_field(s, "op", "add.")), Catch::Contains("/plugin/kernels/0/op"));
  CHECK_THAT(bad("p_op2.json", with_field(s, "op", "a.b.c")), Catch::Contains("/plugin/kernels/0/op"));
  CHECK(bad("p_op3.json", with_field(s, "op", "acme.add_2")) == "accepted");
  // A 1 MB name: std::regex recursed once per character and overflowed the stack.
  CHECK(bad("p_long.json", with_field(s, "name", std::string(1 << 20, 'a'))) == "accepted");
  const auto msg = bad("p_long2.json", with_field(s, "name", std::string(1 << 20, 'a') + "!"));
  CHECK_THAT(msg, Catch::Contains("/plugin/name") && Catch::Contains("does not match"));
  CHECK(msg.size() < 1000);  // the message quotes the start of the string, not all of it
}

TEST_CASE("manifest schema: the pattern matcher agrees with each pattern of the schema", "[manifest]") {
  struct Case {
    const char* pattern;
    std::vector<std::string> match, miss;
  };
  const std::vector<Case> cases = {
      {"^1\\.[0-9]+\\.[0-9]+$", {"1.0.0", "1.10.23"}, {"", "1.0", "2.0.0", "1x0.0", "1.0.0.", " 1.0.0", "1..0", "1.a.0"}},
      {"^[a-z][a-z0-9_.-]*$", {"a", "cpu", "a.b-c_9", "vulkan"}, {"", "Acme", "9a", "-a", "a b", "a!", "a\n"}},
      {"^[0-9]+\\.[0-9]+$", {"1.0", "12.345"}, {"1", "1.", ".1", "1.0.0", "a.b"}},
      {"^[a-z][a-z0-9_]*(\\.[a-z][a-z0-9_]*)?$", {"add", "acme.add_2", "a.b"}, {"", "add.", ".add", "a.b.c", "a-b", "A.b", "a.9"}},
      {"^[a-z][a-z0-9_]*\\.[a-z][a-z0-9_]*$", {"acme.scale", "a.b"}, {"add", "a.b.c", "a.", "a..b"}},
      {"^[a-z_][a-z0-9_]*$", {"x", "_in", "w2"}, {"", "2w", "X", "a.b"}},
  };
  // Every pattern in the schema is one of the cases above.
  std::vector<std::string> in_schema;
  std::vector<const Json*> todo = {&detail::manifest_schema()};
  while (!todo.empty()) {
    const Json* j = todo.back();
    todo.pop_back();
    if (j->is_object() && j->contains("pattern")) in_schema.push_back((*j)["pattern"].get<std::string>());
    if (j->is_structured())
      for (const auto& e : *j) todo.push_back(&e);
  }
  CHECK(in_schema.size() >= 6);
  for (const auto& p : in_schema) {
    INFO(p);
    CHECK(std::any_of(cases.begin(), cases.end(), [&](const Case& c) { return p == c.pattern; }));
  }
  for (const auto& c : cases) {
    const detail::SchemaPattern p(c.pattern);
    for (const auto& s : c.match) {
      INFO(c.pattern << " on \"" << s << "\"");
      CHECK(p.search(s));
    }
    for (const auto& s : c.miss) {
      INFO(c.pattern << " on \"" << s << "\"");
      CHECK_FALSE(p.search(s));
    }
  }
  // Unanchored patterns match anywhere, as in JSON Schema; classes, escapes and groups.
  CHECK(detail::SchemaPattern("b+c").search("aabbbcd"));
  CHECK_FALSE(detail::SchemaPattern("b+c").search("aac"));
  CHECK(detail::SchemaPattern("^ab").search("abz"));
  CHECK_FALSE(detail::SchemaPattern("^ab").search("zab"));
  CHECK(detail::SchemaPattern("ab$").search("zab"));
  CHECK_FALSE(detail::SchemaPattern("ab$").search("abz"));
  CHECK(detail::SchemaPattern("^(ab)*c?$").search("ababc"));
  CHECK_FALSE(detail::SchemaPattern("^(ab)*c?$").search("abac"));
  CHECK(detail::SchemaPattern("^[-a]+[\\]x-]$").search("-a-]"));
  CHECK(detail::SchemaPattern("^\\(\\$\\)$").search("($)"));
  CHECK(detail::SchemaPattern("").search("anything"));
  CHECK(detail::SchemaPattern("^$").search(""));
  CHECK_FALSE(detail::SchemaPattern("^$").search("a"));
  // Linear time where a backtracking matcher takes exponential time.
  CHECK_FALSE(detail::SchemaPattern("^(a*)*b$").search(std::string(100000, 'a')));
  CHECK(detail::SchemaPattern("^((a+)?)*$").search(std::string(100000, 'a')));
}

TEST_CASE("manifest schema: patterns outside the supported subset are schema bugs", "[manifest]") {
  for (const char* pattern : {"^a{2}$", "^a|b$", "^\\d+$", "^[^a]$", "^(?:a)$", "^a**$", "^.$", "^a^$", "^a$b", "^[z-a]$",
                              "^(a$", "^a)$", "^[ab$", "^\\w$"}) {
    INFO(pattern);
    const Json schema = {{"type", "string"}, {"pattern", pattern}};
    CHECK_THROWS_WITH(detail::validate_json(schema, "aa"), Catch::Contains("pattern") && Catch::Contains(pattern));
  }
}

TEST_CASE("library_path stays inside the manifest's folder", "[manifest]") {
  const std::string s = kGood;
  // Absolute paths and '..' reached any library on the machine.
  for (const std::string lib : {"/usr/lib/libacme.so", "../libacme.so", "sub/../../libacme.so", "sub/.."}) {
    INFO(lib);
    CHECK_THAT(manifest_error(write_manifest("lp.json", with_field(s, "library_path", lib))),
               Catch::Contains("lp.json") && Catch::Contains(lib) && Catch::Contains("library_path"));
  }
  // A subfolder is fine.
  const auto sub = write_manifest("lp_sub.json", with_field(s, "library_path", "sub/libacme.so"));
  CHECK(parse_manifest(sub).library_path == std::filesystem::weakly_canonical(sub.parent_path()) / "sub" / "libacme.so");
  // A symlink is followed and the real file recorded.
  const auto dir = sub.parent_path();
  std::filesystem::create_directories(dir / "real");
  std::ofstream(dir / "real" / "libreal.so") << "x";
  std::filesystem::remove(dir / "liblink.so");
  std::filesystem::create_symlink("real/libreal.so", dir / "liblink.so");
  const auto linked = write_manifest("lp_link.json", with_field(s, "library_path", "liblink.so"));
  CHECK(parse_manifest(linked).library_path == std::filesystem::canonical(dir / "real" / "libreal.so"));
}

TEST_CASE("manifests that are FIFOs or too large or too deep are refused", "[manifest]") {
  auto dir = std::filesystem::temp_directory_path() / "backplane_manifest_files";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // Opening a FIFO blocked for ever.
  REQUIRE(mkfifo((dir / "fifo.json").c_str(), 0600) == 0);
  CHECK_THAT(manifest_error(dir / "fifo.json"), Catch::Contains("fifo.json") && Catch::Contains("is not a regular file"));
  // Over the 4 MiB cap (sparse: nothing is written or read).
  std::ofstream(dir / "big.json").close();
  std::filesystem::resize_file(dir / "big.json", (uint64_t{4} << 20) + 1);
  CHECK_THAT(manifest_error(dir / "big.json"), Catch::Contains("big.json") && Catch::Contains("4 MiB"));
  // Nesting 200000 deep overflowed the stack in the JSON parser.
  std::ofstream(dir / "deep.json") << R"({"plugin": )" << std::string(200000, '[') << std::string(200000, ']') << "}";
  CHECK_THAT(manifest_error(dir / "deep.json"), Catch::Contains("deep.json") && Catch::Contains("nested"));
}

TEST_CASE("discovery skips a FIFO named like a manifest", "[manifest]") {
  auto dir = std::filesystem::temp_directory_path() / "backplane_discovery_fifo";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "acme.json") << kGood;
  REQUIRE(mkfifo((dir / "x.json").c_str(), 0600) == 0);
  RuntimeOptions opts;
  opts.use_default_path = false;
  opts.use_environment = false;
  opts.plugin_paths = {dir};
  // Runtime::create (every command) blocked for ever on the FIFO.
  auto rt = Runtime::create(opts);
  REQUIRE(rt->plugins().size() == 1);
  REQUIRE(rt->manifest_errors().size() == 1);
  CHECK(rt->manifest_errors()[0].first == dir / "x.json");
  CHECK_THAT(rt->manifest_errors()[0].second, Catch::Contains("not a regular file"));
}
