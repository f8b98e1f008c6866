// Framed messages over a stream socket (frames.hpp).
#include "frames.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

namespace backplane::remote {

namespace {

using Clock = std::chrono::steady_clock;

bool send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// A frame's header: its length, 4 bytes little-endian.
void put_length(uint32_t n, uint8_t* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
}
uint32_t get_length(const uint8_t* in) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t{in[i]} << (8 * i);
  return n;
}

// Milliseconds left until `until` (at least 0), or -1 without a deadline.
int left_ms(bool bounded, Clock::time_point until) {
  if (!bounded) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(left, 0));
}

// Reads exactly n bytes. A deadline bounds every wait when `bounded`.
FrameResult recv_all(int fd, char* p, size_t n, bool bounded, Clock::time_point until, int& error) {
  while (n > 0) {
    if (bounded) {
      pollfd pfd{fd, POLLIN, 0};
      const int r = ::poll(&pfd, 1, left_ms(bounded, until));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        error = errno;
        return FrameResult::failed;
      }
      if (r == 0) return FrameResult::timed_out;
    }
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      error = errno;
      return FrameResult::failed;
    }
    if (got == 0) return FrameResult::closed;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return FrameResult::ok;
}

}  // namespace

bool write_frame(int fd, const google::protobuf::MessageLite& m, std::string& scratch) {
  const size_t n = m.ByteSizeLong();
  if (n > UINT32_MAX) return false;
  scratch.resize(4 + n);
  auto* p = reinterpret_cast<uint8_t*>(scratch.data());
  put_length(static_cast<uint32_t>(n), p);
  m.SerializeWithCachedSizesToArray(p + 4);
  return send_all(fd, scratch.data(), scratch.size());
}

bool write_frame_bytes(int fd, const std::string& bytes) {
  if (bytes.size() > UINT32_MAX) return false;
  uint8_t header[4];
  put_length(static_cast<uint32_t>(bytes.size()), header);
  return send_all(fd, reinterpret_cast<const char*>(header), sizeof header) && send_all(fd, bytes.data(), bytes.size());
}

FrameResult read_frame(int fd, std::string& out, FrameRead& how) {
  const bool bounded = how.timeout_ms >= 0;
  const auto until = Clock::now() + std::chrono::milliseconds(bounded ? how.timeout_ms : 0);
  how.announced = 0;
  how.error = 0;
  uint8_t header[4];
  size_t got = 0;
  if (how.spin_us > 0) {
    // Poll without sleeping for a while: a reply that is already on its
    // way is taken without a wake-up.
    const auto spin_until = Clock::now() + std::chrono::microseconds(how.spin_us);
    for (;;) {
      const ssize_t r = ::recv(fd, header, sizeof header, MSG_DONTWAIT);
      if (r > 0) {
        got = static_cast<size_t>(r);
        break;
      }
      if (r == 0) return FrameResult::closed;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        how.error = errno;
        return FrameResult::failed;
      }
      if (Clock::now() >= spin_until) break;
      // Yield rather than pause: a spinning thread must not hold a CPU
      // another runnable thread (the one about to answer) needs.
      sched_yield();
    }
  }
  if (got < sizeof header) {
    const FrameResult r = recv_all(fd, reinterpret_cast<char*>(header) + got, sizeof header - got, bounded, until, how.error);
    // The peer closed inside a header it had begun: not a clean end.
    if (r == FrameResult::closed && got > 0) return FrameResult::failed;
    if (r != FrameResult::ok) return r;
  }
  const uint64_t n = get_length(header);
  how.announced = n;
  if (n > how.max_bytes || (how.reserve && !how.reserve(n))) return FrameResult::too_large;
  out.resize(static_cast<size_t>(n));
  const FrameResult r = recv_all(fd, out.data(), out.size(), bounded, until, how.error);
  return r == FrameResult::closed ? FrameResult::failed : r;
}

std::string socket_error_text(int error) { return error ? std::strerror(error) : "the peer closed the connection"; }

}  // namespace backplane::remote
