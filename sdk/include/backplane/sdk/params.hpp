// Reading a vendor op's params in a kernel or in infer_custom_op, without a
// JSON library. The host passes a vendor node's "params" object as JSON text
// (bp_op_params.u.custom.json); this parses it once into typed values:
//
//   bp_error* k_scale_shift(const bp_kernel_context*, ..., const bp_op_params* params) {
//     return sdk::guard([&] {
//       const sdk::VendorParams p(params, "acme.scale_shift");
//       const double scale = p.number("scale", 1.0);  // default when absent
//       const int64_t axis = p.integer("axis");       // required
//       const auto dims = p.integers("dims", {});     // an array of integers
//       ...
//     });
//   }
//
// Every mistake throws sdk::Error(BP_ERR_INVALID_ARGUMENT) naming the op and
// the param ("acme.scale_shift: param 'axis' must be an integer, got 2.5"),
// which guard() turns into the kernel's error. The text may come from a
// remote client, so the parser is bounded (nesting depth, size) and never
// reads past the text it was given.
#pragma once

#include <backplane/abi.h>
#include <backplane/sdk/plugin.hpp>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <initializer_list>
#include <system_error>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::sdk {

class VendorParams {
 public:
  enum class Kind { Null, Bool, Number, String, Array, Object };
  struct Value {
    Kind kind = Kind::Null;
    bool boolean = false;
    double number = 0;
    bool integral = false;  // written without a fraction or exponent, and fits int64
    int64_t integer = 0;
    std::string text;            // String
    std::vector<Value> items;    // Array
    std::map<std::string, Value> members;  // Object
  };

  // `op` names the op in messages. Null params, or params that are not a
  // vendor op's (kind != BP_PARAMS_CUSTOM), read as an empty object.
  VendorParams(const bp_op_params* params, std::string op) : op_(std::move(op)) {
    if (!params || params->kind != BP_PARAMS_CUSTOM || !params->u.custom.json.data) return;
    parse(std::string_view(params->u.custom.json.data, params->u.custom.json.len));
  }
  // From text directly (tests, or an op's own config string).
  VendorParams(std::string_view json, std::string op) : op_(std::move(op)) { parse(json); }

  bool has(const std::string& key) const { return root_.members.count(key) != 0; }
  const std::map<std::string, Value>& all() const { return root_.members; }
  // The raw value, or nullptr when absent.
  const Value* find(const std::string& key) const {
    auto it = root_.members.find(key);
    return it == root_.members.end() ? nullptr : &it->second;
  }

  double number(const std::string& key) const { return as_number(required(key), key); }
  double number(const std::string& key, double fallback) const {
    const Value* v = find(key);
    return v ? as_number(*v, key) : fallback;
  }
  int64_t integer(const std::string& key) const { return as_integer(required(key), key); }
  int64_t integer(const std::string& key, int64_t fallback) const {
    const Value* v = find(key);
    return v ? as_integer(*v, key) : fallback;
  }
  bool boolean(const std::string& key) const { return as_bool(required(key), key); }
  bool boolean(const std::string& key, bool fallback) const {
    const Value* v = find(key);
    return v ? as_bool(*v, key) : fallback;
  }
  std::string string(const std::string& key) const { return as_string(required(key), key); }
  std::string string(const std::string& key, const std::string& fallback) const {
    const Value* v = find(key);
    return v ? as_string(*v, key) : fallback;
  }
  std::vector<int64_t> integers(const std::string& key) const { return as_integers(required(key), key); }
  std::vector<int64_t> integers(const std::string& key, std::vector<int64_t> fallback) const {
    const Value* v = find(key);
    return v ? as_integers(*v, key) : fallback;
  }
  std::vector<double> numbers(const std::string& key) const { return as_numbers(required(key), key); }
  std::vector<double> numbers(const std::string& key, std::vector<double> fallback) const {
    const Value* v = find(key);
    return v ? as_numbers(*v, key) : fallback;
  }

  // Fails naming every param not in `known` (catches a misspelt "axsi").
  void allow_only(std::initializer_list<std::string_view> known) const {
    std::string unknown;
    for (const auto& [k, v] : root_.members) {
      bool ok = false;
      for (auto n : known) ok = ok || n == k;
      if (!ok) unknown += (unknown.empty() ? "'" : ", '") + k + "'";
    }
    if (!unknown.empty()) bad("unknown param" + std::string(unknown.find(',') == std::string::npos ? " " : "s ") + unknown);
  }

  static constexpr size_t max_depth = 32;
  static constexpr size_t max_bytes = size_t{16} << 20;

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(BP_ERR_INVALID_ARGUMENT, op_ + ": " + what);
  }
  static const char* kind_name(Kind k) {
    switch (k) {
      case Kind::Null: return "null";
      case Kind::Bool: return "a boolean";
      case Kind::Number: return "a number";
      case Kind::String: return "a string";
      case Kind::Array: return "an array";
      case Kind::Object: return "an object";
    }
    return "?";
  }
  const Value& required(const std::string& key) const {
    const Value* v = find(key);
    if (!v) bad("param '" + key + "' is required");
    return *v;
  }
  static std::string show(const Value& v) {
    if (v.kind == Kind::Number) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", v.number);
      return buf;
    }
    if (v.kind == Kind::String) return "\"" + (v.text.size() > 40 ? v.text.substr(0, 40) + "..." : v.text) + "\"";
    return kind_name(v.kind);
  }
  double as_number(const Value& v, const std::string& key) const {
    if (v.kind != Kind::Number) bad("param '" + key + "' must be a number, got " + show(v));
    return v.number;
  }
  int64_t as_integer(const Value& v, const std::string& key) const {
    if (v.kind != Kind::Number || !v.integral) bad("param '" + key + "' must be an integer, got " + show(v));
    return v.integer;
  }
  bool as_bool(const Value& v, const std::string& key) const {
    if (v.kind != Kind::Bool) bad("param '" + key + "' must be true or false, got " + show(v));
    return v.boolean;
  }
  std::string as_string(const Value& v, const std::string& key) const {
    if (v.kind != Kind::String) bad("param '" + key + "' must be a string, got " + show(v));
    return v.text;
  }
  std::vector<int64_t> as_integers(const Value& v, const std::string& key) const {
    if (v.kind != Kind::Array) bad("param '" + key + "' must be an array of integers, got " + show(v));
    std::vector<int64_t> out;
    for (size_t i = 0; i < v.items.size(); ++i) out.push_back(as_integer(v.items[i], key + "[" + std::to_string(i) + "]"));
    return out;
  }
  std::vector<double> as_numbers(const Value& v, const std::string& key) const {
    if (v.kind != Kind::Array) bad("param '" + key + "' must be an array of numbers, got " + show(v));
    std::vector<double> out;
    for (size_t i = 0; i < v.items.size(); ++i) out.push_back(as_number(v.items[i], key + "[" + std::to_string(i) + "]"));
    return out;
  }

  // --- parser: RFC 8259 JSON, bounded ----------------------------------------
  void parse(std::string_view s) {
    if (s.size() > max_bytes) bad("params are " + std::to_string(s.size()) + " bytes, more than the 16 MiB allowed");
    src_ = s;
    pos_ = 0;
    skip_ws();
    if (pos_ == src_.size()) return;  // empty text: no params
    root_ = value(0);
    skip_ws();
    if (pos_ != src_.size()) syntax("unexpected text after the params object");
    if (root_.kind != Kind::Object) bad("params must be a JSON object, got " + std::string(kind_name(root_.kind)));
  }
  [[noreturn]] void syntax(const std::string& what) const {
    bad("params are not valid JSON at byte " + std::to_string(pos_) + ": " + what);
  }
  void skip_ws() {
    while (pos_ < src_.size() && (src_[pos_] == ' ' || src_[pos_] == '\t' || src_[pos_] == '\n' || src_[pos_] == '\r'))
      ++pos_;
  }
  bool eat(char c) {
    skip_ws();
    if (pos_ < src_.size() && src_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) syntax(std::string("expected '") + c + "'");
  }
  bool literal(std::string_view word) {
    if (src_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  Value value(size_t depth) {
    if (depth >= max_depth) syntax("nested deeper than " + std::to_string(max_depth) + " levels");
    skip_ws();
    if (pos_ >= src_.size()) syntax("unexpected end");
    Value v;
    const char c = src_[pos_];
    if (c == '{') {
      ++pos_;
      v.kind = Kind::Object;
      if (eat('}')) return v;
      do {
        skip_ws();
        if (pos_ >= src_.size() || src_[pos_] != '"') syntax("expected a member name");
        std::string key = string_literal();
        expect(':');
        Value member = value(depth + 1);
        if (!v.members.emplace(std::move(key), std::move(member)).second) syntax("a member name appears twice");
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++pos_;
      v.kind = Kind::Array;
      if (eat(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Kind::String;
      v.text = string_literal();
    } else if (literal("true")) {
      v.kind = Kind::Bool;
      v.boolean = true;
    } else if (literal("false")) {
      v.kind = Kind::Bool;
    } else if (literal("null")) {
      v.kind = Kind::Null;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      number_literal(v);
    } else {
      syntax(std::string("unexpected character '") + c + "'");
    }
    return v;
  }
  void number_literal(Value& v) {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t d = pos_;
      while (pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '9') ++pos_;
      return pos_ - d;
    };
    if (src_[pos_] == '-') ++pos_;
    const size_t int_start = pos_;
    if (digits() == 0) syntax("a number needs digits");
    if (src_[int_start] == '0' && pos_ - int_start > 1) syntax("a number may not start with 0");
    bool plain = true;
    if (pos_ < src_.size() && src_[pos_] == '.') {
      ++pos_;
      plain = false;
      if (digits() == 0) syntax("a fraction needs digits");
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      ++pos_;
      plain = false;
      if (pos_ < src_.size() && (src_[pos_] == '+' || src_[pos_] == '-')) ++pos_;
      if (digits() == 0) syntax("an exponent needs digits");
    }
    // from_chars: independent of the host's locale.
    const char* first = src_.data() + start;
    const char* last = src_.data() + pos_;
    v.kind = Kind::Number;
    const auto r = std::from_chars(first, last, v.number);
    if (r.ec != std::errc() || !std::isfinite(v.number))
      syntax("the number " + std::string(first, last) + " is out of range");
    if (plain) {
      int64_t i = 0;
      if (std::from_chars(first, last, i).ec == std::errc()) {
        v.integral = true;
        v.integer = i;
      }
    }
  }
  void utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  uint32_t hex4() {
    if (src_.size() - pos_ < 4) syntax("a \\u escape needs 4 hex digits");
    uint32_t cp = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = src_[pos_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') cp |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f') cp |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') cp |= static_cast<uint32_t>(h - 'A' + 10);
      else syntax("a \\u escape needs 4 hex digits");
    }
    return cp;
  }
  std::string string_literal() {
    ++pos_;  // the opening quote
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) syntax("a string is not closed");
      const char c = src_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) syntax("a control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= src_.size()) syntax("a string is not closed");
      const char e = src_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (!literal("\\u")) syntax("a lone high surrogate");
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) syntax("a high surrogate without its low half");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            syntax("a lone low surrogate");
          }
          utf8(out, cp);
          break;
        }
        default: syntax(std::string("an unknown escape '\\") + e + "'");
      }
    }
  }

  std::string op_;
  Value root_ = [] {
    Value v;
    v.kind = Kind::Object;
    return v;
  }();
  std::string_view src_;
  size_t pos_ = 0;
};

}  // namespace backplane::sdk
