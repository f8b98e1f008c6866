#include "json_schema.hpp"

#include <backplane/backplane.hpp>

#include <map>

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

SchemaPattern::SchemaPattern(std::string pattern) : source_(std::move(pattern)) { PatternCompiler(*this).run(); }

bool SchemaPattern::search(std::string_view s) const {
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

// A value for a message: scalars as JSON, at most 64 characters of them.
std::string brief(const nlohmann::json& v) {
  if (v.is_structured()) return v.is_array() ? "an array" : "an object";
  std::string s = v.is_string() ? v.get_ref<const std::string&>() : v.dump();
  if (s.size() > 64) s = s.substr(0, 64) + "... (" + std::to_string(s.size()) + " characters)";
  return v.is_string() ? "\"" + s + "\"" : s;
}

class Validator {
 public:
  std::optional<std::string> check(const nlohmann::json& s, const nlohmann::json& v, const std::string& at) {
    auto fail = [&](const std::string& m) { return std::optional<std::string>("at " + (at.empty() ? "/" : at) + ": " + m); };
    if (s.contains("type") && !type_matches(s["type"].get<std::string>(), v))
      return fail("expected " + s["type"].get<std::string>() + ", found " + std::string(v.type_name()));
    if (s.contains("enum")) {
      bool found = false;
      for (auto& e : s["enum"]) found = found || e == v;
      if (!found) return fail(brief(v) + " is not one of " + s["enum"].dump());
    }
    if (v.is_string()) {
      const auto& str = v.get_ref<const std::string&>();
      if (s.contains("minLength") && str.size() < s["minLength"].get<size_t>()) return fail("string is too short");
      if (s.contains("pattern") && !pattern(s["pattern"].get<std::string>()).search(str))
        return fail(brief(v) + " does not match " + s["pattern"].get<std::string>());
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
          return fail("unknown key " + brief(it.key()));
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

 private:
  // Each pattern compiled once per validation.
  const SchemaPattern& pattern(const std::string& p) {
    auto it = patterns_.find(p);
    if (it == patterns_.end()) it = patterns_.emplace(p, SchemaPattern(p)).first;
    return it->second;
  }
  std::map<std::string, SchemaPattern> patterns_;
};

}  // namespace

std::optional<std::string> validate_json(const nlohmann::json& schema, const nlohmann::json& value) {
  return Validator().check(schema, value, "");
}

}  // namespace backplane::detail
