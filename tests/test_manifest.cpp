// Manifest parsing and schema validation: every defect gets a message that
// names the file and the place.
#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

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
  CHECK(info.library_path == path.parent_path() / "libacme.so");
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
