// Framed messages over a stream socket: the transport between a host and
// its isolated children (a unix socket in a private folder), where gRPC's
// HTTP/2 machinery and its threads cost more than the call itself.
//
// A frame is a 4-byte little-endian length, then that many bytes: a
// serialized Request from the client, a serialized Response from the
// server. The client's first frame is the token; a server that refuses it
// answers one Response with a failure and closes the socket.
//
// Reads may spin before they sleep: a reply that comes within `spin_us`
// is taken without the wake-up of a sleeping thread, which on a virtual
// machine's idle vCPU costs tens of microseconds.
#pragma once

#include <google/protobuf/message_lite.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace backplane::remote {

enum class FrameResult {
  ok,
  closed,     // the peer closed the socket before a frame began
  failed,     // a socket error, or the peer closed it inside a frame
  too_large,  // the length exceeds the reader's limit (nothing past it was read)
  timed_out,  // the frame did not arrive within the timeout
};

// Writes `m` as one frame (one system call for small messages); `scratch`
// is reused between calls. False when the socket failed or was shut down.
bool write_frame(int fd, const google::protobuf::MessageLite& m, std::string& scratch);
// Writes raw bytes as one frame (the client's token).
bool write_frame_bytes(int fd, const std::string& bytes);

// How read_frame reads, and what it found.
struct FrameRead {
  size_t max_bytes = 0;  // a longer frame is too_large
  int timeout_ms = -1;   // for the whole frame; < 0 waits for ever
  int spin_us = 0;       // polls this long before sleeping
  // Asked before n bytes are allocated (a server's memory budget): false
  // fails the read with too_large.
  std::function<bool(uint64_t n)> reserve;
  uint64_t announced = 0;  // out: the length the header announced
  int error = 0;           // out: errno of a failed read
};
FrameResult read_frame(int fd, std::string& out, FrameRead& how);

// What a failed read said (FrameRead::error's text), for messages.
std::string socket_error_text(int error);

}  // namespace backplane::remote
