// Turning the ABI's structs into wire messages and back. Shared by the
// `remote` plugin (which encodes) and `backplane serve` (which decodes). The
// decoders never trust their input: every count, rank, dtype and size is
// checked, and a failure is a message naming the field, never a crash.
#pragma once

#include "backplane_remote.pb.h"

#include <backplane/abi.h>

#include <cstdint>
#include <string>

namespace backplane::remote {

// Bumped when a message changes meaning; Hello carries it.
constexpr uint32_t kProtocolVersion = 1;

// Limits every message is checked against (the server's, and the client's
// for what the server sends back).
constexpr size_t kMaxMessageBytes = 80u << 20;    // one gRPC message
constexpr size_t kMaxChunkBytes = 32u << 20;      // bytes of one Write or Read
constexpr size_t kMaxCallsPerBatch = 1u << 16;
constexpr size_t kMaxWritesPerBatch = 1u << 12;
constexpr size_t kMaxReadsPerBatch = 1u << 12;
constexpr size_t kMaxCallInputs = 256;            // concat's inputs
constexpr size_t kMaxParamsJson = 64u << 10;      // a vendor op's params
constexpr size_t kMaxStringBytes = 4096;          // names, ops, descriptions
constexpr size_t kMaxKernels = 1u << 16;
constexpr size_t kMaxDevices = 1024;

// HTTP/2 flow-control window and frame size both sides ask for: gRPC's
// defaults (64 KiB window) hold a bulk transfer to a fraction of what the
// link and TLS can do.
constexpr int kWindowBytes = 32 << 20;
constexpr int kFrameBytes = (1 << 24) - 1;

// A write of at least this many bytes travels alone, as a Request already
// in wire form (encode_bulk_write), which the server copies from the
// received message straight into a host-memory buffer; smaller ones are
// cheaper batched with the run's calls.
constexpr uint64_t kBulkWriteBytes = 64 * 1024;

// Request{batch{writes{buffer, offset, data}}} in protobuf's wire form, the
// data copied once (not into a Write message and then its serialization).
std::string encode_bulk_write(uint64_t buffer, uint64_t offset, const char* data, uint64_t n);

// The gRPC metadata key that carries the token.
constexpr const char* kTokenKey = "x-backplane-token";

void encode_layout(const bp_layout& in, Layout* out);
void encode_params(const bp_op_params& in, Params* out);
void encode_storage(const bp_storage& in, uint64_t wire_buffer, Storage* out);

// Decoders: "" on success, else what is wrong (the caller adds where).
std::string decode_layout(const Layout& in, bp_layout& out);
std::string decode_dtype(uint32_t in, bp_dtype& out);
// `json` receives a vendor op's params text (out.u.custom points into it),
// or fused_elementwise's instructions (out.u.fused points into it).
std::string decode_params(const Params& in, bp_op_params& out, std::string& json);

// Two params are the same request (field by field, for the kind).
bool same_params(const bp_op_params& a, const bp_op_params& b);

// Constant-time comparison of two secrets (length leaks, content does not).
bool same_secret(const std::string& a, const std::string& b);

}  // namespace backplane::remote
