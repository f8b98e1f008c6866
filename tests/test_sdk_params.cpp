// The SDK's reader of vendor-op params (sdk/params.hpp): typed values,
// defaults, messages that name the op and the param, and malformed text
// refused with the byte where it went wrong (the text may come from a remote
// client through the server).
#include <catch2/catch.hpp>

#include <backplane/sdk/params.hpp>

#include <limits>
#include <string>

namespace sdk = backplane::sdk;
using Catch::Matchers::Contains;

namespace {

// The message a parse or a read fails with ("" when it does not fail).
template <typename F> std::string failure(F&& f) {
  try {
    f();
  } catch (const sdk::Error& e) {
    CHECK(e.code() == BP_ERR_INVALID_ARGUMENT);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("vendor params: typed values and defaults", "[sdk][params]") {
  const sdk::VendorParams p(
      R"({"scale": 2.5, "axis": -1, "big": 9007199254740993, "on": true, "mode": "re\"fl\u00e9ct\n",
          "dims": [1, 2, 3], "ws": [0.5, -1e-3, 4], "none": null, "nested": {"a": [[]]}})",
      "acme.op");
  CHECK(p.number("scale") == 2.5);
  CHECK(p.integer("axis") == -1);
  CHECK(p.number("axis") == -1.0);  // an integer is a number too
  // Beyond 2^53 the integer is exact, not rounded through a double.
  CHECK(p.integer("big") == 9007199254740993LL);
  CHECK(p.boolean("on"));
  CHECK(p.string("mode") == "re\"fl\xc3\xa9" "ct\n");
  CHECK(p.integers("dims") == std::vector<int64_t>{1, 2, 3});
  CHECK(p.numbers("ws") == std::vector<double>{0.5, -1e-3, 4});
  CHECK(p.has("none"));
  CHECK_FALSE(p.has("missing"));
  CHECK(p.find("nested")->members.at("a").items.at(0).kind == sdk::VendorParams::Kind::Array);
  // Defaults only when absent.
  CHECK(p.number("missing", 7.0) == 7.0);
  CHECK(p.integer("missing", 3) == 3);
  CHECK(p.string("missing", "x") == "x");
  CHECK(p.integers("missing", {4}) == std::vector<int64_t>{4});
  CHECK(p.number("scale", 7.0) == 2.5);
}

TEST_CASE("vendor params: wrong types and missing params name the op and the param", "[sdk][params]") {
  const sdk::VendorParams p(R"({"scale": "big", "axis": 2.5, "dims": [1, "x"], "flag": 1})", "acme.op");
  CHECK(failure([&] { (void)p.number("scale"); }) == "acme.op: param 'scale' must be a number, got \"big\"");
  CHECK(failure([&] { (void)p.integer("axis"); }) == "acme.op: param 'axis' must be an integer, got 2.5");
  CHECK(failure([&] { (void)p.integers("dims"); }) == "acme.op: param 'dims[1]' must be an integer, got \"x\"");
  CHECK(failure([&] { (void)p.boolean("flag"); }) == "acme.op: param 'flag' must be true or false, got 1");
  CHECK(failure([&] { (void)p.number("gone"); }) == "acme.op: param 'gone' is required");
  // A default does not excuse a wrong type.
  CHECK_THAT(failure([&] { (void)p.number("scale", 1.0); }), Contains("'scale' must be a number"));
  // An integer too large for int64 is a number, not an integer.
  const sdk::VendorParams huge(R"({"n": 99999999999999999999})", "acme.op");
  CHECK(huge.number("n") == 1e20);
  CHECK_THAT(failure([&] { (void)huge.integer("n"); }), Contains("'n' must be an integer"));
  // allow_only lists every unknown name.
  CHECK(failure([&] { p.allow_only({"scale", "axis"}); }) == "acme.op: unknown params 'dims', 'flag'");
  CHECK(failure([&] { p.allow_only({"scale", "axis", "dims"}); }) == "acme.op: unknown param 'flag'");
  CHECK(failure([&] { p.allow_only({"scale", "axis", "dims", "flag"}); }).empty());
}

TEST_CASE("vendor params: absent params read as an empty object", "[sdk][params]") {
  const sdk::VendorParams none(static_cast<const bp_op_params*>(nullptr), "acme.op");
  CHECK(none.all().empty());
  CHECK(none.number("x", 1.5) == 1.5);
  bp_op_params reduce{};
  reduce.struct_size = sizeof reduce;
  reduce.kind = BP_PARAMS_REDUCE;  // not a vendor op's: nothing to read
  CHECK(sdk::VendorParams(&reduce, "acme.op").all().empty());
  const std::string text = R"({"k": 4})";
  bp_op_params custom{};
  custom.struct_size = sizeof custom;
  custom.kind = BP_PARAMS_CUSTOM;
  // Only `len` bytes are read: the text is not NUL-terminated by contract.
  const std::string padded = text + "garbage";
  custom.u.custom.json = bp_string{padded.data(), text.size()};
  CHECK(sdk::VendorParams(&custom, "acme.op").integer("k") == 4);
  CHECK(sdk::VendorParams("", "acme.op").all().empty());
  CHECK(sdk::VendorParams("  {}  ", "acme.op").all().empty());
}

TEST_CASE("vendor params: malformed text is refused with the byte where it failed", "[sdk][params]") {
  struct Bad {
    const char* text;
    const char* says;
  };
  const Bad cases[] = {
      {"[1, 2]", "params must be a JSON object, got an array"},
      {"{\"a\": 1", "at byte 7: expected '}'"},
      {"{\"a\" 1}", "at byte 5: expected ':'"},
      {"{a: 1}", "expected a member name"},
      {"{\"a\": 1,}", "expected a member name"},
      {"{\"a\": 01}", "may not start with 0"},
      {"{\"a\": 1.}", "a fraction needs digits"},
      {"{\"a\": 1e}", "an exponent needs digits"},
      {"{\"a\": -}", "a number needs digits"},
      {"{\"a\": +1}", "unexpected character '+'"},
      {"{\"a\": 1e999}", "out of range"},
      {"{\"a\": NaN}", "unexpected character 'N'"},
      {"{\"a\": tru}", "unexpected character 't'"},
      {"{\"a\": \"x}", "a string is not closed"},
      {"{\"a\": \"\\q\"}", "an unknown escape '\\q'"},
      {"{\"a\": \"\\u12\"}", "4 hex digits"},
      {"{\"a\": \"\\ud800\"}", "a lone high surrogate"},
      {"{\"a\": \"\\udc00\"}", "a lone low surrogate"},
      {"{\"a\": \"\x01\"}", "a control character"},
      {"{\"a\": 1, \"a\": 2}", "a member name appears twice"},
      {"{} {}", "unexpected text after the params object"},
      {"{\"a\": [1, 2}", "expected ']'"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    const std::string msg = failure([&] { sdk::VendorParams(c.text, "acme.op"); });
    CHECK_THAT(msg, Contains("acme.op: ") && Contains(c.says));
  }
  // Nesting is bounded: a hostile 100,000-deep array is refused, not a stack overflow.
  const std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  CHECK_THAT(failure([&] { sdk::VendorParams(deep, "acme.op"); }), Contains("nested deeper than 32"));
  // A surrogate pair decodes to one code point (U+1F600, 4 bytes of UTF-8).
  CHECK(sdk::VendorParams(R"({"s": "\ud83d\ude00"})", "acme.op").string("s") == "\xf0\x9f\x98\x80");
}
