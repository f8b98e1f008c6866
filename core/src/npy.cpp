// NumPy .npy files, versions 1.0-3.0, little-endian, C order.
#include <backplane/backplane.hpp>

#include <cstring>
#include <fstream>
#include <regex>

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
}  // namespace

HostTensor read_npy(const std::filesystem::path& path, std::optional<bp_dtype> dtype_override) {
  const std::string where = path.string();
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("npy: cannot open " + where);
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw Error("npy: " + where + " is not a .npy file");
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!f.read(reinterpret_cast<char*>(b), 2)) throw Error("npy: " + where + ": truncated header");
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) throw Error("npy: " + where + ": truncated header");
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    throw Error("npy: " + where + ": unsupported format version " + std::to_string(major));
  }
  if (header_len > (1u << 20)) throw Error("npy: " + where + ": header too long");
  std::string header(header_len, '\0');
  if (!f.read(header.data(), header_len)) throw Error("npy: " + where + ": truncated header");

  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr'\\s*:\\s*'([^']*)'")))
    throw Error("npy: " + where + ": header has no descr");
  const std::string descr = m[1];
  if (std::regex_search(header, m, std::regex("'fortran_order'\\s*:\\s*(True|False)")) && m[1] == "True")
    throw Error("npy: " + where + ": Fortran order is not supported");
  if (!std::regex_search(header, m, std::regex("'shape'\\s*:\\s*\\(([^)]*)\\)")))
    throw Error("npy: " + where + ": header has no shape");
  Shape shape;
  const std::string dims = m[1];
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it)
    shape.push_back(std::stoll(it->str()));
  if (shape.size() > BP_MAX_RANK) throw Error("npy: " + where + ": rank " + std::to_string(shape.size()) + " > 8");

  auto dt = dtype_from_descr(descr);
  if (!dt) throw Error("npy: " + where + ": unsupported dtype '" + descr + "'");
  if (*dt == BP_DTYPE_BF16 && dtype_override != BP_DTYPE_BF16)
    throw Error("npy: " + where + ": dtype '<u2' is only read as bf16 (say \"dtype\": \"bf16\")");
  if (dtype_override && *dtype_override != *dt)
    throw Error("npy: " + where + " holds " + std::string(dtype_name(*dt)) + ", not " +
                std::string(dtype_name(*dtype_override)));
  HostTensor t(*dt, shape);
  if (!f.read(reinterpret_cast<char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size())))
    throw Error("npy: " + where + ": data shorter than shape " + shape_str(shape) + " needs");
  if (t.dtype == BP_DTYPE_BOOL)
    for (auto& b : t.bytes)
      if (static_cast<unsigned char>(b) > 1) throw Error("npy: " + where + ": bool value other than 0/1");
  return t;
}

void write_npy(const std::filesystem::path& path, const HostTensor& t) {
  std::string header = "{'descr': '";
  header += npy_descr(t.dtype);
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
