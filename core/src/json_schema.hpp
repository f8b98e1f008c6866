// A validator for the subset of JSON Schema our manifest schema uses: type,
// required, properties, additionalProperties (bool), items, enum, pattern,
// minLength, minItems, minimum, maximum. No well-kept C++ validator is in
// Debian; this subset is small enough to own.
#pragma once

#include <nlohmann/json.hpp>

#include <bitset>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::detail {

// Returns the first violation as "at /plugin/kernels/3/op: ..." or nullopt.
// Throws Error when the schema has a "pattern" outside SchemaPattern's subset
// (a bug in the schema, not in the value).
std::optional<std::string> validate_json(const nlohmann::json& schema, const nlohmann::json& value);

// The manifest schema (manifests/manifest.schema.json), embedded at build time.
const nlohmann::json& manifest_schema();

// A schema "pattern": the regular-expression subset our schema uses, matched
// in time linear in the string (an NFA run in lock step, no backtracking, no
// recursion over the string), and without std::regex, whose compilation cost
// ~100 ms at every Runtime::create and whose matcher recursed once per
// character (a 1 MB string overflowed the stack).
//
// The subset: literal characters; '\' before a punctuation character (\. \-
// \\ ...); classes [...] of characters and ranges a-z ('-' first or last is
// literal; no negation); groups ( ... ); the quantifiers * + ? after a
// character, class or group; '^' as the first and '$' as the last
// character. Like JSON Schema (ECMA-262) a pattern matches anywhere in the
// string unless anchored. Bytes are matched one by one (the subset is ASCII).
// Anything else ('.', '|', {n,m}, \d, [^...], (?...) ...) is refused with an
// Error naming the pattern and the construct.
class SchemaPattern {
 public:
  explicit SchemaPattern(std::string pattern);
  bool search(std::string_view s) const;
  const std::string& source() const { return source_; }

 private:
  struct State {
    enum Kind : unsigned char { Chars, Split, Match } kind = Match;
    std::bitset<256> chars;  // Chars: the bytes it takes
    int out = -1;            // Chars, Split: the next state
    int alt = -1;            // Split: the other next state
  };
  std::string source_;
  std::vector<State> states_;
  int start_ = -1;
  bool anchor_start_ = false;
  bool anchor_end_ = false;

  friend class PatternCompiler;
};

}  // namespace backplane::detail
