// Recording and submission. begin() starts one command buffer; each kernel
// records dispatches into it; synchronize() submits once, waits on a fence and
// turns the device error words into a bp_error.
#pragma once

#include "memory.hpp"
#include "pipelines.hpp"

#include <span>
#include <string>
#include <unordered_set>
#include <vector>

namespace bpvk {

class Device;

// Error flags written by shaders (shaders/common.glsl).
enum : uint32_t { kErrIndex = 1, kErrDivZero = 2, kErrCast = 4, kErrEmpty = 8 };

// One storage-buffer binding of a dispatch.
struct Binding {
  VkBuffer buffer = VK_NULL_HANDLE;
  uint64_t offset = 0;
  uint64_t range = 0;
  uint64_t handle = 0;  // bp buffer handle, for hazard tracking (0 = none)
  bool write = false;
};

class Exec {
 public:
  void init(Device* dev);
  void destroy();

  void begin();
  void ensure_begun() {
    if (!recording_) begin();
  }
  // Records one dispatch of `groups` workgroups (folded into a 2-D/3-D grid
  // as the device limits require). args: the dispatch's argument block.
  void dispatch(const Pipeline& p, std::span<const Binding> operands, std::span<const int32_t> args, uint32_t n,
                uint32_t extra, uint64_t groups, const char* op);
  // Submits, waits and reports. Returns normally when there was nothing to do.
  void synchronize();
  uint32_t dispatches() const { return n_dispatches_; }
  // A device buffer of at least `bytes` for intermediate results, valid until
  // the next begin() (split reductions).
  Binding scratch(uint64_t bytes);

 private:
  struct RingChunk {
    HostBuffer buf;
  };
  void reset_recording_state();
  VkDescriptorSet allocate_set(VkDescriptorSetLayout layout);
  std::pair<size_t, uint32_t> ring_put(std::span<const int32_t> args);

  Device* dev_ = nullptr;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  bool recording_ = false;
  uint32_t n_dispatches_ = 0;

  std::vector<VkDescriptorPool> desc_pools_;
  size_t desc_pool_cur_ = 0;

  std::vector<RingChunk> ring_;
  size_t ring_chunk_ = 0;
  uint64_t ring_used_ = 0;  // bytes used in the current chunk

  HostBuffer errors_;  // {flags, first dispatch id}
  std::vector<const char*> op_names_;

  std::unordered_set<uint64_t> written_, read_;  // since the last barrier
  uint64_t scratch_ = 0, scratch_size_ = 0;       // bp buffer handle
  std::vector<uint64_t> retired_scratch_;         // freed at the next begin()
};

}  // namespace bpvk
