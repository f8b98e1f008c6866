// The server's check of one kernel call from the wire, before any byte of it
// reaches a plugin. A kernel may rely on everything the ABI says the host
// guarantees (shapes agree with the op, outputs dense, layouts inside their
// storages, params normalised); a remote client is not that host, so each
// guarantee is re-established here: the call is re-inferred with the core's
// own shape inference and must agree with it field by field.
#pragma once

#include "codec.hpp"

#include <backplane/backplane.hpp>

#include <google/protobuf/io/zero_copy_stream.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace backplane::remote {

// A call as the server will make it, with the buffers still named by their
// wire ids (the caller turns them into the plugin's handles and pointers).
struct CheckedCall {
  uint32_t device = 0;
  uint32_t kernel = 0;
  std::vector<bp_storage> inputs, outputs;
  std::vector<uint64_t> input_buffers, output_buffers;  // wire ids, 0 = absent
  std::vector<std::vector<bp_bundle_slot>> output_slots;
  std::vector<bp_layout> layouts;
  bp_op_params params{};
  std::string json;  // params.u.custom points into it

  CheckedCall() = default;
  CheckedCall(const CheckedCall& o) { *this = o; }
  CheckedCall& operator=(const CheckedCall& o);  // re-points the internal pointers
};

struct CallContext {
  const KernelInfo* kernel = nullptr;  // the device's plugin's row
  uint64_t alignment = 16;             // the device's buffer alignment
  // The size of a buffer this session owns on this device, or nullopt.
  std::function<std::optional<uint64_t>(uint64_t wire_id)> buffer_size;
  // Shape inference for a vendor op ("acme.x"), through the plugin that
  // declares it: "" and the output, or what is wrong.
  std::function<std::string(const std::string& op, const std::vector<bp_dtype>& dtypes,
                            const std::vector<bp_layout>& layouts, const bp_op_params& params, bp_dtype& out_dtype,
                            bp_layout& out_layout)>
      infer_custom;
};

// "" when the call is one the host could have made; else what is wrong.
std::string check_call(const Call& call, const CallContext& ctx, CheckedCall& out);

// The graph-file params that produce `p` for `op` (the inverse of shape
// inference's normalisation): used to re-infer a call. x is input 0's dtype.
Json params_json(const std::string& op, const bp_op_params& p, bp_dtype x, int64_t x_rank);

// What one Request decoded from the wire may hold in the server's memory.
// Protobuf turns a 2-byte empty Call into an object of about a hundred bytes
// (and a Call of 256 empty inputs into tens of kilobytes), so a message's
// wire size does not bound its decoded size.
constexpr uint64_t kMaxDecodedBytes = uint64_t{256} << 20;

// Walks the encoded Request in `in` without decoding it (nothing is
// allocated per field): "" when every repeated field is within its limit and
// the decoded message would take at most kMaxDecodedBytes, with `bytes` set
// to about what it would take; else what is wrong, naming the field or the
// limit ("Batch.calls has more than 65536 entries"), with `bytes` above
// kMaxDecodedBytes when the limit was the memory.
std::string measure_request(google::protobuf::io::ZeroCopyInputStream& in, uint64_t& bytes);

}  // namespace backplane::remote
