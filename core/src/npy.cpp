// NumPy .npy files, versions 1.0-3.0, little-endian, C order.
//
// The header is read by an exact grammar, not by searching it: a file is
// input a user may not control, so every defect is an Error naming the file
// and what is wrong, and nothing is allocated before the file is known to
// hold the data its header claims.
#include <backplane/backplane.hpp>

#include "checked.hpp"
#include "input_files.hpp"

#include <cstring>
#include <fstream>
#include <string_view>

namespace backplane {

namespace {
const char* npy_descr(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F32: return "<f4";
    case BP_DTYPE_F16: return "<f2";
    case BP_DTYPE_BF16: return "<u2";  // NumPy has no bf16; the graph file says "bf16"
    case BP_DTYPE_F64: return "<f8";
    case BP_DTYPE_I8: return "|i1";
    case BP_DTYPE_I16: return "<i2";
    case BP_DTYPE_I32: return "<i4";
    case BP_DTYPE_I64: return "<i8";
    case BP_DTYPE_U8: return "|u1";
    case BP_DTYPE_BOOL: return "|b1";
    default: return nullptr;
  }
}

std::optional<bp_dtype> dtype_from_descr(std::string d) {
  if (d.size() == 3 && d[0] == '=') d[0] = '<';
  if (d == "<f4") return BP_DTYPE_F32;
  if (d == "<f2") return BP_DTYPE_F16;
  if (d == "<f8") return BP_DTYPE_F64;
  if (d == "|i1" || d == "<i1") return BP_DTYPE_I8;
  if (d == "<i2") return BP_DTYPE_I16;
  if (d == "<i4") return BP_DTYPE_I32;
  if (d == "<i8") return BP_DTYPE_I64;
  if (d == "|u1" || d == "<u1") return BP_DTYPE_U8;
  if (d == "|b1" || d == "<b1") return BP_DTYPE_BOOL;
  if (d == "<u2") return BP_DTYPE_BF16;  // only valid with a bf16 override
  return std::nullopt;
}

// The longest header read: a version 1.0 header is < 64 KiB by its format,
// and NumPy writes no longer ones in 2.0/3.0 unless a dtype has thousands
// of fields, which we do not read anyway.
constexpr uint32_t kMaxHeader = 64 * 1024;

// Text from the file for a message: one line, printable, at most 40 bytes.
std::string quote(std::string_view s) {
  constexpr size_t kMax = 40;
  s = s.substr(0, s.find('\n'));
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  std::string out;
  for (char c : s.substr(0, kMax)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return s.size() <= kMax ? out : out + "...";
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

// The header dict as NumPy writes it (a Python dict literal):
//
//   dict  := '{' ws (entry (ws ',' ws entry)* (ws ',')?)? ws '}' ws
//   entry := str ws ':' ws value
//   str   := "'" chars "'" | '"' chars '"'      (no escapes)
//   shape := '(' ws ')' | '(' ws dim ws ',' ws ')' | '(' ws dim (ws ',' ws dim)+ (ws ',')? ws ')'
//   dim   := [0-9]+ 'L'?                          (Python 2 NumPy wrote 3L)
//
// with exactly the keys 'descr' (a str), 'fortran_order' (True or False) and
// 'shape', each once, in any order; ws is spaces, tabs and newlines.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& where) : s_(text), where_(where) {}

  Header parse() {
    Header h;
    bool have_descr = false, have_order = false, have_shape = false;
    skip_ws();
    expect('{', "the header is not a dict");
    skip_ws();
    while (!at('}')) {
      const std::string key = str("a key");
      skip_ws();
      expect(':', "no ':' after key '" + quote(key) + "'");
      skip_ws();
      auto once = [&](bool& seen) {
        if (seen) fail("key '" + key + "' appears twice");
        seen = true;
      };
      if (key == "descr") {
        once(have_descr);
        if (!at('\'') && !at('"')) fail("'descr' is not a string (structured dtypes are not supported)");
        h.descr = str("'descr'");
      } else if (key == "fortran_order") {
        once(have_order);
        const std::string_view word = token();
        if (word == "True") h.fortran_order = true;
        else if (word == "False") h.fortran_order = false;
        else fail("'fortran_order' is " + quote(word) + ", not True or False");
      } else if (key == "shape") {
        once(have_shape);
        h.shape = shape();
      } else {
        fail("unknown key '" + quote(key) + "' (a .npy header has 'descr', 'fortran_order' and 'shape')");
      }
      skip_ws();
      if (at('}')) break;
      expect(',', "no ',' or '}' after the value of '" + key + "'");
      skip_ws();
    }
    ++i_;  // '}'
    skip_ws();
    if (i_ != s_.size()) fail("text after the dict: " + quote(s_.substr(i_)));
    if (!have_descr) fail("no 'descr'");
    if (!have_order) fail("no 'fortran_order'");
    if (!have_shape) fail("no 'shape'");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw Error("npy: " + where_ + ": bad header: " + what); }

  bool at(char c) const { return i_ < s_.size() && s_[i_] == c; }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c, const std::string& why) {
    if (!at(c)) fail(why + (i_ < s_.size() ? " (at " + quote(s_.substr(i_)) + ")" : " (the header ends)"));
    ++i_;
  }
  // A quoted string, no escapes.
  std::string str(const std::string& what) {
    if (!at('\'') && !at('"')) fail(what + " is not a quoted string" + (i_ < s_.size() ? ": " + quote(s_.substr(i_)) : ""));
    const char q = s_[i_++];
    const size_t start = i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\' || s_[i_] == '\n') fail(what + ": escapes and line breaks in strings are not supported");
      ++i_;
    }
    if (i_ == s_.size()) fail(what + ": the string " + quote(s_.substr(start - 1)) + " is not closed");
    return std::string(s_.substr(start, i_++ - start));
  }
  // A run of characters up to a delimiter: a word or a number.
  std::string_view token() {
    const size_t start = i_;
    while (i_ < s_.size() && std::strchr(",:(){}[] \t\r\n'\"", s_[i_]) == nullptr) ++i_;
    return s_.substr(start, i_ - start);
  }
  int64_t dim() {
    std::string_view t = token();
    if (t.empty()) fail("'shape' holds " + (i_ < s_.size() ? quote(s_.substr(i_)) : std::string("nothing")) + " where a dim should be");
    std::string_view digits = t;
    if (digits.size() > 1 && digits.back() == 'L') digits.remove_suffix(1);
    const bool negative = digits.size() > 1 && digits.front() == '-';
    if (negative) digits.remove_prefix(1);
    bool all_digits = !digits.empty();
    for (char c : digits) all_digits = all_digits && c >= '0' && c <= '9';
    if (!all_digits) fail("dim " + quote(t) + " of 'shape' is not a non-negative integer");
    if (negative) fail("dim " + quote(t) + " of 'shape' is negative");
    int64_t v = 0;
    for (char c : digits)
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v))
        fail("dim " + quote(t) + " of 'shape' does not fit int64");
    return v;
  }
  Shape shape() {
    const size_t start = i_;
    expect('(', "'shape' is not a tuple");
    Shape out;
    skip_ws();
    bool comma = false;  // after the last dim
    while (!at(')')) {
      if (!out.empty() && !comma) expect(',', "no ',' or ')' after a dim of 'shape'");
      out.push_back(dim());
      skip_ws();
      comma = at(',');
      if (comma) ++i_;
      skip_ws();
    }
    ++i_;  // ')'
    if (out.size() == 1 && !comma)
      fail("'shape' " + quote(s_.substr(start, i_ - start)) + " is not a tuple: a 1-d shape is written (" +
           std::to_string(out[0]) + ",)");
    if (out.size() > BP_MAX_RANK) fail("'shape' has rank " + std::to_string(out.size()) + " (at most 8)");
    return out;
  }

  std::string_view s_;
  const std::string& where_;
  size_t i_ = 0;
};

uint32_t little_endian(const unsigned char* b, size_t n) {
  uint32_t v = 0;
  for (size_t i = n; i-- > 0;) v = (v << 8) | b[i];
  return v;
}

}  // namespace

HostTensor read_npy(const std::filesystem::path& path, std::optional<bp_dtype> dtype_override) {
  const std::string where = path.string();
  detail::RegularFile f(path, "npy: " + where + ": ");
  unsigned char pre[12];
  if (f.read(pre, 8) != 8 || std::memcmp(pre, "\x93NUMPY", 6) != 0) throw Error("npy: " + where + " is not a .npy file");
  const int major = pre[6];
  if (major < 1 || major > 3) throw Error("npy: " + where + ": unsupported format version " + std::to_string(major));
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (f.read(pre + 8, len_bytes) != len_bytes) throw Error("npy: " + where + ": truncated header");
  const uint32_t header_len = little_endian(pre + 8, len_bytes);
  if (header_len > kMaxHeader)
    throw Error("npy: " + where + ": header of " + std::to_string(header_len) + " bytes is over the 64 KiB limit");
  const uint64_t data_offset = 8 + len_bytes + header_len;
  if (data_offset > f.size())
    throw Error("npy: " + where + ": truncated header (" + std::to_string(header_len) + " bytes claimed, " +
                std::to_string(f.size() - std::min<uint64_t>(f.size(), 8 + len_bytes)) + " in the file)");
  std::string text(header_len, '\0');
  if (f.read(text.data(), header_len) != header_len) throw Error("npy: " + where + ": truncated header");
  const Header h = HeaderParser(text, where).parse();

  if (h.fortran_order) throw Error("npy: " + where + ": Fortran order is not supported");
  auto dt = dtype_from_descr(h.descr);
  if (!dt) throw Error("npy: " + where + ": unsupported dtype '" + quote(h.descr) + "'");
  if (*dt == BP_DTYPE_BF16 && dtype_override != BP_DTYPE_BF16)
    throw Error("npy: " + where + ": dtype '<u2' is only read as bf16 (say \"dtype\": \"bf16\")");
  if (dtype_override && *dtype_override != *dt)
    throw Error("npy: " + where + " holds " + std::string(dtype_name(*dt)) + ", not " +
                std::string(dtype_name(*dtype_override)));

  // The data the header claims must be in the file before anything is allocated.
  const uint64_t need = detail::checked_bytes(h.shape, dtype_size(*dt), "npy: " + where);
  const uint64_t have = f.size() - data_offset;
  if (need > have)
    throw Error("npy: " + where + ": data is short: shape " + shape_str(h.shape) + " of " + std::string(dtype_name(*dt)) +
                " needs " + std::to_string(need) + " bytes, the file has " + std::to_string(have) + " bytes after the header");
  HostTensor t(*dt, h.shape);
  if (f.read(t.bytes.data(), t.bytes.size()) != t.bytes.size())
    throw Error("npy: " + where + ": data shorter than shape " + shape_str(h.shape) + " needs (the file shrank while read)");
  if (t.dtype == BP_DTYPE_BOOL)
    for (auto& b : t.bytes)
      if (static_cast<unsigned char>(b) > 1) throw Error("npy: " + where + ": bool value other than 0/1");
  return t;
}

void write_npy(const std::filesystem::path& path, const HostTensor& t) {
  const char* descr = npy_descr(t.dtype);
  if (!descr) throw Error("npy: cannot write " + path.string() + ": invalid dtype");
  std::string header = "{'descr': '";
  header += descr;
  header += "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < t.shape.size(); ++i) header += std::to_string(t.shape[i]) + (t.shape.size() == 1 ? "," : (i + 1 < t.shape.size() ? ", " : ""));
  header += "), }";
  // Pad so that magic(6)+version(2)+len(2)+header is a multiple of 64, ending in '\n'.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error("npy: cannot write " + path.string());
  f.write("\x93NUMPY\x01\x00", 8);
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff), static_cast<unsigned char>(header.size() >> 8)};
  f.write(reinterpret_cast<const char*>(len), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  if (!f) throw Error("npy: failed writing " + path.string());
}

}  // namespace backplane
