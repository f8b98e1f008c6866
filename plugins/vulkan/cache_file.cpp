#include "cache_file.hpp"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

namespace backplane::vulkan {

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::vector<char> read_cache_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool write_cache_file(const std::string& path, const void* header, size_t header_bytes, const void* body,
                      size_t body_bytes) {
  namespace fs = std::filesystem;
  static std::atomic<unsigned> serial{0};
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp" + std::to_string(getpid()) + "." + std::to_string(serial++);
  bool ok = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(header), static_cast<std::streamsize>(header_bytes));
    out.write(static_cast<const char*>(body), static_cast<std::streamsize>(body_bytes));
    out.flush();
    ok = static_cast<bool>(out);
  }
  if (ok) fs::rename(tmp, path, ec);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

}  // namespace backplane::vulkan
