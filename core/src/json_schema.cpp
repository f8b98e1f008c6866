#include "json_schema.hpp"

#include <backplane/backplane.hpp>

#include <algorithm>
#include <bit>

namespace backplane::detail {

// ---- SchemaPattern ------------------------------------------------------------

class PatternCompiler {
 public:
  explicit PatternCompiler(SchemaPattern& p) : p_(p), s_(p.source_) {}

  void run() {
    const std::vector<Node> items = seq(0);
    p_.states_.push_back({});  // Match
    p_.start_ = compile_seq(items, 0);
  }

 private:
  // A character set or a group, with its quantifier.
  struct Node {
    bool group = false;
    std::bitset<256> chars;
    std::vector<Node> items;
    char quant = 0;
  };
  using State = SchemaPattern::State;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("schema pattern \"" + s_ + "\": " + what + " (at character " + std::to_string(i_ + 1) +
                    "); this is a bug in the schema: its patterns may use literal characters, \\-escaped punctuation, "
                    "[...] classes with ranges, ( ) groups, the quantifiers * + ? and the anchors ^ $",
                BP_ERR_INTERNAL);
  }
  static bool printable(char c) { return c >= 0x20 && c < 0x7f; }
  static bool quantifier(char c) { return c == '*' || c == '+' || c == '?'; }
  bool more() const { return i_ < s_.size(); }

  std::vector<Node> seq(int depth) {
    std::vector<Node> items;
    while (more()) {
      const char c = s_[i_];
      if (c == ')') {
        if (depth == 0) fail("')' without '('");
        return items;
      }
      if (c == '^') {
        if (i_ != 0) fail("'^' is supported only as the first character");
        p_.anchor_start_ = true;
        ++i_;
        continue;
      }
      if (c == '$') {
        if (depth != 0 || i_ + 1 != s_.size()) fail("'$' is supported only as the last character");
        p_.anchor_end_ = true;
        ++i_;
        continue;
      }
      if (quantifier(c)) fail(std::string("'") + c + "' has nothing to repeat");
      Node n = atom(depth);
      if (more() && quantifier(s_[i_])) {
        n.quant = s_[i_++];
        if (more() && quantifier(s_[i_])) fail("a quantifier after a quantifier (lazy or nested repetition) is not supported");
      }
      if (more() && s_[i_] == '{') fail("counted repetition {n,m} is not supported");
      items.push_back(std::move(n));
    }
    if (depth != 0) fail("'(' without ')'");
    return items;
  }

  Node atom(int depth) {
    const char c = s_[i_];
    Node n;
    switch (c) {
      case '(':
        ++i_;
        if (more() && s_[i_] == '?') fail("(?...) groups are not supported");
        if (depth >= 16) fail("groups nested deeper than 16");
        n.group = true;
        n.items = seq(depth + 1);
        ++i_;  // ')'
        return n;
      case '[': return char_class();
      case '\\': n.chars.set(escaped()); return n;
      case '.': fail("'.' (any character) is not supported");
      case '|': fail("alternation '|' is not supported");
      case '{':
      case '}': fail("counted repetition {n,m} is not supported");
      case ']': fail("']' without '['");
      default:
        if (!printable(c)) fail("only printable ASCII characters are supported");
        n.chars.set(static_cast<unsigned char>(c));
        ++i_;
        return n;
    }
  }

  // At a '\': the character it escapes.
  unsigned char escaped() {
    ++i_;
    if (!more()) fail("'\\' at the end");
    const char c = s_[i_];
    if (!printable(c) || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      fail(std::string("the escape '\\") + c + "' is not supported (only punctuation may be escaped)");
    ++i_;
    return static_cast<unsigned char>(c);
  }

  // At a '[': the class up to its ']'.
  Node char_class() {
    ++i_;
    Node n;
    if (more() && s_[i_] == '^') fail("negated classes [^...] are not supported");
    if (more() && s_[i_] == ']') fail("an empty class [] is not supported");
    auto one = [&]() -> unsigned char {
      if (s_[i_] == '\\') return escaped();
      if (!printable(s_[i_])) fail("only printable ASCII characters are supported");
      return static_cast<unsigned char>(s_[i_++]);
    };
    while (true) {
      if (!more()) fail("'[' without ']'");
      if (s_[i_] == ']') break;
      const unsigned char lo = one();
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        ++i_;
        const unsigned char hi = one();
        if (hi < lo) fail(std::string("the range ") + static_cast<char>(lo) + "-" + static_cast<char>(hi) + " is reversed");
        for (unsigned c = lo; c <= hi; ++c) n.chars.set(c);
      } else {
        n.chars.set(lo);
      }
    }
    ++i_;  // ']'
    return n;
  }

  int add(State s) {
    p_.states_.push_back(s);
    return static_cast<int>(p_.states_.size()) - 1;
  }
  // Thompson's construction, back to front: each node is built knowing the
  // state that follows it.
  int compile_seq(const std::vector<Node>& items, int next) {
    for (auto it = items.rbegin(); it != items.rend(); ++it) next = compile(*it, next);
    return next;
  }
  int compile_once(const Node& n, int next) {
    if (n.group) return compile_seq(n.items, next);
    State s;
    s.kind = State::Chars;
    s.chars = n.chars;
    s.out = next;
    return add(s);
  }
  int compile(const Node& n, int next) {
    if (n.quant == 0) return compile_once(n, next);
    State split;
    split.kind = State::Split;
    split.alt = next;
    if (n.quant == '?') {
      split.out = compile_once(n, next);
      return add(split);
    }
    const int loop = add(split);  // * and +: after the body, again or on
    const int body = compile_once(n, loop);
    p_.states_[loop].out = body;
    return n.quant == '*' ? loop : body;
  }

  SchemaPattern& p_;
  const std::string& s_;
  size_t i_ = 0;
};

SchemaPattern::SchemaPattern(std::string pattern) : source_(std::move(pattern)) {
  PatternCompiler(*this).run();
  make_masks();
}

void SchemaPattern::make_masks() {
  if (states_.size() > 64) return;
  // closure(x): the Chars and Match states reached from x through Splits.
  auto closure = [&](int first) {
    uint64_t seen = 0, out = 0;
    std::vector<int> stack = {first};
    while (!stack.empty()) {
      const int x = stack.back();
      stack.pop_back();
      if (seen & (uint64_t{1} << x)) continue;
      seen |= uint64_t{1} << x;
      if (states_[x].kind == State::Split) {
        stack.push_back(states_[x].alt);
        stack.push_back(states_[x].out);
      } else {
        out |= uint64_t{1} << x;
      }
    }
    return out;
  };
  takes_.assign(256, 0);
  after_.assign(states_.size(), 0);
  for (size_t x = 0; x < states_.size(); ++x) {
    if (states_[x].kind == State::Match) match_mask_ |= uint64_t{1} << x;
    if (states_[x].kind != State::Chars) continue;
    after_[x] = closure(states_[x].out);
    for (unsigned c = 0; c < 256; ++c)
      if (states_[x].chars.test(c)) takes_[c] |= uint64_t{1} << x;
  }
  start_mask_ = closure(start_);
  masks_ = true;
}

bool SchemaPattern::search(std::string_view s) const {
  if (!masks_) return search_sets(s);
  // The same run as search_sets, a set of states a bit each.
  uint64_t cur = start_mask_;
  for (size_t i = 0;; ++i) {
    if ((cur & match_mask_) && (!anchor_end_ || i == s.size())) return true;
    if (i == s.size() || cur == 0) return false;
    uint64_t next = anchor_start_ ? 0 : start_mask_;  // a match may also start after byte i
    for (uint64_t live = cur & takes_[static_cast<unsigned char>(s[i])]; live; live &= live - 1)
      next |= after_[static_cast<size_t>(std::countr_zero(live))];
    cur = next;
  }
}

bool SchemaPattern::search_sets(std::string_view s) const {
  // The states alive after each byte, each with its epsilon closure; a state
  // enters a list at most once per step (marked with the step's number).
  std::vector<int> cur, next, stack;
  std::vector<uint64_t> mark(states_.size(), 0);
  uint64_t step = 1;
  auto enter = [&](std::vector<int>& list, int first) {
    stack.push_back(first);
    while (!stack.empty()) {
      const int x = stack.back();
      stack.pop_back();
      if (mark[x] == step) continue;
      mark[x] = step;
      if (states_[x].kind == State::Split) {
        stack.push_back(states_[x].alt);
        stack.push_back(states_[x].out);
      } else {
        list.push_back(x);
      }
    }
  };
  enter(cur, start_);
  for (size_t i = 0;; ++i) {
    for (int x : cur)
      if (states_[x].kind == State::Match && (!anchor_end_ || i == s.size())) return true;
    if (i == s.size() || cur.empty()) return false;
    ++step;
    next.clear();
    const auto c = static_cast<unsigned char>(s[i]);
    for (int x : cur)
      if (states_[x].kind == State::Chars && states_[x].chars.test(c)) enter(next, states_[x].out);
    if (!anchor_start_) enter(next, start_);  // a match may also start after byte i
    std::swap(cur, next);
  }
}

// ---- Validator ------------------------------------------------------------------

namespace {

// A value for a message: scalars as JSON, at most 64 characters of them.
std::string brief(const nlohmann::json& v) {
  if (v.is_structured()) return v.is_array() ? "an array" : "an object";
  std::string s = v.is_string() ? v.get_ref<const std::string&>() : v.dump();
  if (s.size() > 64) s = s.substr(0, 64) + "... (" + std::to_string(s.size()) + " characters)";
  return v.is_string() ? "\"" + s + "\"" : s;
}

}  // namespace

struct CompiledSchema::Node {
  enum class Type : unsigned char { Any, Object, Array, String, Integer, Number, Boolean, Null, Unknown };
  Type type = Type::Any;
  std::string type_name;  // "type" as the schema spells it
  bool has_enum = false;
  nlohmann::json enum_values;  // "enum"
  std::string enum_text;       // ... as the message quotes it
  std::optional<size_t> min_length, min_items, max_items;
  int pattern = -1;  // into patterns_
  std::optional<double> minimum, maximum;
  std::string minimum_text, maximum_text;
  std::vector<std::string> required;
  std::vector<std::pair<std::string, int>> properties;  // sorted by name
  bool closed = false;                                   // "additionalProperties": false
  int items = -1;

  bool type_matches(const nlohmann::json& v) const {
    switch (type) {
      case Type::Any: return true;
      case Type::Object: return v.is_object();
      case Type::Array: return v.is_array();
      case Type::String: return v.is_string();
      case Type::Integer: return v.is_number_integer();
      case Type::Number: return v.is_number();
      case Type::Boolean: return v.is_boolean();
      case Type::Null: return v.is_null();
      case Type::Unknown: return false;
    }
    return false;
  }
};

// Where a value lies, as a chain up to the root on the checker's stack: the
// text "/plugin/kernels/3" is only made for a message.
struct CompiledSchema::Path {
  const Path* up = nullptr;
  std::string_view key;  // an object's key, or
  size_t index = 0;      // an array's index
  bool is_key = false;

  static std::string text(const Path* p) {
    std::vector<const Path*> chain;
    for (; p && p->up; p = p->up) chain.push_back(p);  // the root names nothing
    if (chain.empty()) return "/";
    std::string out;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it)
      out += "/" + ((*it)->is_key ? std::string((*it)->key) : std::to_string((*it)->index));
    return out;
  }
};

CompiledSchema::CompiledSchema(const nlohmann::json& schema) { compile(schema); }
CompiledSchema::~CompiledSchema() = default;
CompiledSchema::CompiledSchema(CompiledSchema&&) noexcept = default;
CompiledSchema& CompiledSchema::operator=(CompiledSchema&&) noexcept = default;

// Reads one schema object and those below it; returns its index. Reads each
// keyword as the checker of every value once did, so a malformed keyword
// (a "minimum" that is not a number) throws here, once.
int CompiledSchema::compile(const nlohmann::json& s) {
  using Type = Node::Type;
  Node n;
  if (s.contains("type")) {
    n.type_name = s["type"].get<std::string>();
    static const std::pair<const char*, Type> kTypes[] = {
        {"object", Type::Object},   {"array", Type::Array},     {"string", Type::String}, {"integer", Type::Integer},
        {"number", Type::Number},   {"boolean", Type::Boolean}, {"null", Type::Null}};
    n.type = Type::Unknown;  // never matches, as a misspelt type never did
    for (const auto& [name, t] : kTypes)
      if (n.type_name == name) n.type = t;
  }
  if (s.contains("enum")) {
    n.has_enum = true;
    n.enum_values = s["enum"];
    n.enum_text = n.enum_values.dump();
  }
  if (s.contains("minLength")) n.min_length = s["minLength"].get<size_t>();
  if (s.contains("pattern")) {
    const auto& source = s["pattern"].get_ref<const std::string&>();
    for (size_t i = 0; i < patterns_.size() && n.pattern < 0; ++i)
      if (patterns_[i].source() == source) n.pattern = static_cast<int>(i);
    if (n.pattern < 0) {
      patterns_.emplace_back(source);
      n.pattern = static_cast<int>(patterns_.size()) - 1;
    }
  }
  if (s.contains("minimum")) {
    n.minimum = s["minimum"].get<double>();
    n.minimum_text = s["minimum"].dump();
  }
  if (s.contains("maximum")) {
    n.maximum = s["maximum"].get<double>();
    n.maximum_text = s["maximum"].dump();
  }
  if (s.contains("required"))
    for (const auto& r : s["required"]) n.required.push_back(r.get<std::string>());
  n.closed = s.contains("additionalProperties") && s["additionalProperties"] == false;
  if (s.contains("minItems")) n.min_items = s["minItems"].get<size_t>();
  if (s.contains("maxItems")) n.max_items = s["maxItems"].get<size_t>();
  const int self = static_cast<int>(nodes_.size());
  nodes_.push_back(std::move(n));
  // Children after the parent is in place (nodes_ may move as it grows).
  if (s.contains("properties")) {
    std::vector<std::pair<std::string, int>> props;
    for (const auto& [key, sub] : s["properties"].items()) props.emplace_back(key, compile(sub));
    std::sort(props.begin(), props.end());
    nodes_[static_cast<size_t>(self)].properties = std::move(props);
  }
  if (s.contains("items")) {
    const int items = compile(s["items"]);
    nodes_[static_cast<size_t>(self)].items = items;
  }
  return self;
}

std::optional<std::string> CompiledSchema::check(const nlohmann::json& value) const {
  const Path root;
  return check(0, value, &root);
}

std::optional<std::string> CompiledSchema::check(int node, const nlohmann::json& v, const Path* at) const {
  const Node& s = nodes_[static_cast<size_t>(node)];
  auto fail = [&](const std::string& m) { return std::optional<std::string>("at " + Path::text(at) + ": " + m); };
  if (!s.type_matches(v)) return fail("expected " + s.type_name + ", found " + std::string(v.type_name()));
  if (s.has_enum && std::none_of(s.enum_values.begin(), s.enum_values.end(), [&](const nlohmann::json& e) { return e == v; }))
    return fail(brief(v) + " is not one of " + s.enum_text);
  if (v.is_string()) {
    const auto& str = v.get_ref<const std::string&>();
    if (s.min_length && str.size() < *s.min_length) return fail("string is too short");
    if (s.pattern >= 0 && !patterns_[static_cast<size_t>(s.pattern)].search(str))
      return fail(brief(v) + " does not match " + patterns_[static_cast<size_t>(s.pattern)].source());
  }
  if (v.is_number()) {
    if (s.minimum && v.get<double>() < *s.minimum) return fail(v.dump() + " is below the minimum " + s.minimum_text);
    if (s.maximum && v.get<double>() > *s.maximum) return fail(v.dump() + " is above the maximum " + s.maximum_text);
  }
  if (v.is_object()) {
    for (const auto& r : s.required)
      if (!v.contains(r)) return fail("missing required key \"" + r + "\"");
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string& key = it.key();
      const auto p = std::lower_bound(s.properties.begin(), s.properties.end(), key,
                                      [](const std::pair<std::string, int>& e, const std::string& k) { return e.first < k; });
      if (p != s.properties.end() && p->first == key) {
        const Path here{at, key, 0, true};
        if (auto e = check(p->second, it.value(), &here)) return e;
      } else if (s.closed) {
        return fail("unknown key " + brief(key));
      }
    }
  }
  if (v.is_array()) {
    if (s.min_items && v.size() < *s.min_items) return fail("too few items");
    if (s.max_items && v.size() > *s.max_items) return fail("too many items (at most " + std::to_string(*s.max_items) + ")");
    if (s.items >= 0)
      for (size_t i = 0; i < v.size(); ++i) {
        const Path here{at, {}, i, false};
        if (auto e = check(s.items, v[i], &here)) return e;
      }
  }
  return std::nullopt;
}

std::optional<std::string> validate_json(const nlohmann::json& schema, const nlohmann::json& value) {
  return CompiledSchema(schema).check(value);
}

const CompiledSchema& manifest_schema_compiled() {
  static const CompiledSchema schema(manifest_schema());
  return schema;
}

}  // namespace backplane::detail
