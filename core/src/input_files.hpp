// Files that users name (graph files, .npy inputs, manifests) are read
// through here: regular files only, since opening a FIFO blocks until a writer
// comes and opening a device may do anything; sizes known before reading, so a
// cap is checked without reading; JSON nesting bounded, since nlohmann's
// parser recurses once per level and a few hundred KB of '[' overflow the stack.
#pragma once

#include <backplane/backplane.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace backplane::detail {

// What a non-regular file is, for messages.
inline const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

// A regular file open for reading. Every Error starts with `prefix` (say
// "graph file x.json: ").
class RegularFile {
 public:
  RegularFile(const std::filesystem::path& path, std::string prefix) : prefix_(std::move(prefix)) {
    // stat first: it has no side effects on a FIFO or a device; then open
    // non-blocking and check the descriptor too (the path may have changed).
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw Error(prefix_ + "cannot open: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw Error(prefix_ + "is not a regular file (it is " + file_kind(st.st_mode) + ")");
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd_ < 0) throw Error(prefix_ + "cannot open: " + std::strerror(errno));
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw Error(prefix_ + "is not a regular file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~RegularFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  // The size when opened.
  uint64_t size() const { return size_; }

  // Reads up to n bytes; fewer only at the end of the file.
  size_t read(void* buf, size_t n) {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(fd_, static_cast<char*>(buf) + got, n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw Error(prefix_ + "read failed: " + std::strerror(errno));
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    return got;
  }

 private:
  std::string prefix_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole of a regular file of at most `max_bytes` (`limit` says the cap
// in words: "256 MiB").
inline std::string read_regular_file(const std::filesystem::path& path, uint64_t max_bytes, const std::string& limit,
                                     const std::string& prefix) {
  RegularFile f(path, prefix);
  auto too_big = [&](uint64_t n) {
    return Error(prefix + "is " + std::to_string(n) + " bytes, over the " + limit + " limit");
  };
  if (f.size() > max_bytes) throw too_big(f.size());
  // Read to the end, not to the size stat gave: the file may grow meanwhile.
  std::string text(static_cast<size_t>(f.size()) + 1, '\0');
  size_t have = f.read(text.data(), text.size());
  while (have == text.size()) {
    if (text.size() > max_bytes) throw too_big(text.size());
    text.resize(std::min<uint64_t>(text.size() * 2, max_bytes + 1));
    have += f.read(text.data() + have, text.size() - have);
  }
  text.resize(have);
  return text;
}

// The deepest JSON nesting a graph file or manifest may have.
inline constexpr int kMaxJsonDepth = 64;

// Parses JSON text; Error(prefix + "malformed JSON: ...") or
// Error(prefix + "nested deeper than 64 levels").
inline Json parse_json_bounded(const std::string& text, const std::string& prefix) {
  auto bound = [&](int depth, Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      throw Error(prefix + "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return true;
  };
  try {
    return Json::parse(text, bound);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(prefix + "malformed JSON: " + e.what());
  }
}

}  // namespace backplane::detail
