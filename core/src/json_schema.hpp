// A validator for the subset of JSON Schema our manifest schema uses: type,
// required, properties, additionalProperties (bool), items, enum, pattern,
// minLength, minItems, minimum, maximum. No well-kept C++ validator is in
// Debian; this subset is small enough to own.
#pragma once

#include <nlohmann/json.hpp>

#include <bitset>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::detail {

class SchemaPattern;

// A schema read once into a tree of plain fields, its patterns compiled, so
// that checking a value copies nothing and allocates nothing until it finds a
// violation (reading every keyword of the schema as JSON at every value made
// checking a 500-kernel manifest cost ~3 ms). Throws Error when the schema has
// a "pattern" outside SchemaPattern's subset (a bug in the schema, not in the
// value).
class CompiledSchema {
 public:
  explicit CompiledSchema(const nlohmann::json& schema);
  ~CompiledSchema();
  CompiledSchema(CompiledSchema&&) noexcept;
  CompiledSchema& operator=(CompiledSchema&&) noexcept;

  // The first violation as "at /plugin/kernels/3/op: ..." or nullopt. Keys
  // are checked in the order the object holds them (sorted), after the
  // object's own "required"; items in order.
  std::optional<std::string> check(const nlohmann::json& value) const;

 private:
  struct Node;
  struct Path;
  int compile(const nlohmann::json& s);
  std::optional<std::string> check(int node, const nlohmann::json& v, const Path* at) const;

  std::vector<Node> nodes_;
  std::vector<SchemaPattern> patterns_;
};

// Returns the first violation as "at /plugin/kernels/3/op: ..." or nullopt
// (compiles the schema for this one call: see CompiledSchema).
// Throws Error when the schema has a "pattern" outside SchemaPattern's subset
// (a bug in the schema, not in the value).
std::optional<std::string> validate_json(const nlohmann::json& schema, const nlohmann::json& value);

// The manifest schema (manifests/manifest.schema.json), embedded at build time.
const nlohmann::json& manifest_schema();
// The same, compiled once per process.
const CompiledSchema& manifest_schema_compiled();

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
  bool search_sets(std::string_view s) const;
  void make_masks();

  std::string source_;
  std::vector<State> states_;
  int start_ = -1;
  bool anchor_start_ = false;
  bool anchor_end_ = false;
  // A pattern of at most 64 states (every pattern of the schema) runs on
  // bit masks of states, with no allocation per string: the states that
  // take each byte, and each state's epsilon closure of what follows it.
  bool masks_ = false;
  std::vector<uint64_t> takes_;      // [byte]: the Chars states that take it
  std::vector<uint64_t> after_;      // [state]: the closure of its out
  uint64_t start_mask_ = 0, match_mask_ = 0;

  friend class PatternCompiler;
};

}  // namespace backplane::detail
