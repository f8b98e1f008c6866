// Requests the remote tests build by hand (tests/test_remote.cpp,
// tests/test_server_abuse.cpp).
#pragma once

#include "backplane_remote.grpc.pb.h"

#include <backplane/abi.h>

#include <cstdint>

namespace backplane::remotetest {

// out = a + a on a [2, 3] f32 view of buffer `buf` (in place), with the
// server's f32 add at kernel index `kernel`.
inline remote::Call add_call(uint32_t kernel, uint64_t buf) {
  remote::Call call;
  call.set_kernel(kernel);
  for (int i = 0; i < 3; ++i) {
    auto* s = i < 2 ? call.add_inputs() : call.add_outputs();
    s->set_buffer(buf);
    s->set_byte_size(24);
    s->set_dtype(BP_DTYPE_F32);
  }
  for (int i = 0; i < 3; ++i) {
    auto* l = call.add_layouts();
    l->add_shape(2);
    l->add_shape(3);
    l->add_strides(3);
    l->add_strides(1);
  }
  call.mutable_params()->set_kind(BP_PARAMS_NONE);
  return call;
}

}  // namespace backplane::remotetest
