// The transports of a session (Link, remote_impl.hpp): a gRPC stream to a
// remote server, or framed messages on the unix socket of an isolated child.
#include "remote_impl.hpp"

#include "frames.hpp"

#include "backplane_remote.grpc.pb.h"
#include <grpcpp/grpcpp.h>

#include <sys/socket.h>
#include <sys/un.h>

namespace bp_remote {

namespace {

class GrpcLink final : public Link {
 public:
  GrpcLink(const std::string& address, const std::string& token, const std::string& ca_pem,
           std::chrono::milliseconds connect_ms) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes));
    args.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kWindowBytes);
    args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kFrameBytes);
    args.SetString(GRPC_ARG_OPTIMIZATION_TARGET, "latency");
    std::shared_ptr<grpc::ChannelCredentials> creds;
    if (!ca_pem.empty()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = ca_pem;
      creds = grpc::SslCredentials(ssl);
    } else {
      creds = grpc::InsecureChannelCredentials();
    }
    channel_ = grpc::CreateCustomChannel(address, creds, args);
    if (!channel_->WaitForConnected(std::chrono::system_clock::now() + connect_ms)) {
      // Plain TCP against a TLS server fails the same way as no server at
      // all: say which of the two this client spoke.
      std::string hint;
      if (address.rfind("unix:", 0) != 0)
        hint = ca_pem.empty() ? " (this client spoke plain TCP: if the server uses TLS, set BACKPLANE_REMOTE_CA_FILE "
                                "to its certificate)"
                              : " (over TLS: is the server up, and is BACKPLANE_REMOTE_CA_FILE its certificate?)";
      throw sdk::Error(BP_ERR_UNAVAILABLE, "cannot connect to " + address + " within " +
                                               std::to_string(connect_ms.count()) + " ms" + hint);
    }
    // The stream sends bytes, not messages: a bulk write arrives already in
    // wire form (write_encoded), other requests are serialized here.
    context_.AddMetadata(kTokenKey, token);
    const grpc::internal::RpcMethod method("/backplane.remote.Remote/Session", grpc::internal::RpcMethod::BIDI_STREAMING,
                                           channel_);
    stream_.reset(grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, Response>::Create(channel_.get(), method,
                                                                                                 &context_));
  }
  bool write(const Request& req) override {
    grpc::ByteBuffer bytes;
    bool own = false;
    return grpc::SerializationTraits<Request>::Serialize(req, &bytes, &own).ok() && stream_->Write(bytes);
  }
  bool write_encoded(std::string&& bytes) override {
    // The slice owns the string: no copy of the bytes.
    auto* owned = new std::string(std::move(bytes));
    grpc::Slice slice(owned->data(), owned->size(), [](void* p) { delete static_cast<std::string*>(p); }, owned);
    grpc::ByteBuffer buffer(&slice, 1);
    return stream_->Write(buffer);
  }
  bool read(Response& resp) override { return stream_->Read(&resp); }
  void cancel() override { context_.TryCancel(); }
  std::string finish() override {
    stream_->WritesDone();
    const grpc::Status st = stream_->Finish();
    if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED) return "the server refused the token";
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) return "connection lost (" + st.error_message() + ")";
    return st.ok() ? "the server closed the session" : st.error_message();
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, Response>> stream_;
};

// How long the host polls for a child's reply before it sleeps: a small
// batch is answered within a few tens of microseconds.
constexpr int kReplySpinUs = 50;

class FramedLink final : public Link {
 public:
  FramedLink(const std::string& path, const std::string& token) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) throw sdk::Error(BP_ERR_UNAVAILABLE, "the socket path " + path + " is too long");
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw sdk::Error(BP_ERR_UNAVAILABLE, "cannot create a unix socket: " + socket_error_text(errno));
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      const int err = errno;
      ::close(fd_);
      throw sdk::Error(BP_ERR_UNAVAILABLE, "cannot connect to unix:" + path + ": " + socket_error_text(err));
    }
    if (!write_frame_bytes(fd_, token)) {
      const int err = errno;
      ::close(fd_);
      throw sdk::Error(BP_ERR_UNAVAILABLE, "cannot send the token to unix:" + path + ": " + socket_error_text(err));
    }
  }
  ~FramedLink() override { ::close(fd_); }
  bool write(const Request& req) override {
    if (write_frame(fd_, req, scratch_)) return true;
    error_ = errno;
    return false;
  }
  bool write_encoded(std::string&& bytes) override {
    if (write_frame_bytes(fd_, bytes)) return true;
    error_ = errno;
    return false;
  }
  bool read(Response& resp) override {
    FrameRead how;
    how.max_bytes = kMaxMessageBytes;
    how.spin_us = kReplySpinUs;
    const FrameResult r = read_frame(fd_, bytes_, how);
    if (r == FrameResult::ok && resp.ParseFromString(bytes_)) {
      if (bytes_.capacity() > (size_t{1} << 20)) std::string().swap(bytes_);
      // A refusal (a wrong token, too many sessions) is the server's last word.
      return true;
    }
    if (r == FrameResult::ok) malformed_ = true;
    else if (r == FrameResult::too_large) too_large_ = how.announced;
    else if (r == FrameResult::failed) error_ = how.error;
    return false;
  }
  void cancel() override { ::shutdown(fd_, SHUT_RDWR); }
  std::string finish() override {
    ::shutdown(fd_, SHUT_RDWR);
    if (malformed_) return "the server sent a malformed message";
    if (too_large_) return "the server sent a message of " + std::to_string(too_large_) + " bytes, over the limit";
    if (error_) return "connection lost (" + socket_error_text(error_) + ")";
    return "the server closed the session";
  }

 private:
  int fd_ = -1;
  std::string scratch_, bytes_;
  int error_ = 0;
  bool malformed_ = false;
  uint64_t too_large_ = 0;
};

}  // namespace

std::unique_ptr<Link> grpc_link(const std::string& address, const std::string& token, const std::string& ca_pem,
                                std::chrono::milliseconds connect_ms) {
  return std::make_unique<GrpcLink>(address, token, ca_pem, connect_ms);
}

std::unique_ptr<Link> framed_link(const std::string& path, const std::string& token) {
  return std::make_unique<FramedLink>(path, token);
}

}  // namespace bp_remote
