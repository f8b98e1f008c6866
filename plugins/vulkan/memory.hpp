// Device memory: buffers are sub-allocated from large VkDeviceMemory blocks,
// each covered by one VkBuffer, so a bp buffer is (block, offset) and no
// vkAllocateMemory happens per buffer.
#pragma once

#include "vk_common.hpp"

#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

namespace backplane::vulkan {

class Device;

// A small dedicated host-visible, coherent buffer (argument ring, error
// words, staging).
struct HostBuffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* ptr = nullptr;
  uint64_t size = 0;
};

struct Block {
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  uint64_t size = 0;
  uint8_t* mapped = nullptr;
  VkDeviceAddress address = 0;  // of `buffer` (shaders address operands by it)
  std::map<uint64_t, uint64_t> free;  // offset -> size, coalesced
  uint64_t live = 0;                  // allocations in this block
  // The host's memory (import_host): one buffer, never shared; freeing it
  // releases the VkDeviceMemory and VkBuffer only.
  bool imported = false;
};

struct Allocation {
  uint32_t block = 0;
  uint64_t offset = 0;  // in the block
  uint64_t size = 0;    // requested size
  uint64_t reserved = 0;
};

class Memory {
 public:
  void init(Device* dev);
  void destroy();

  bp_buffer allocate(uint64_t size);
  // `size` bytes of host memory at `ptr` as a buffer, in place
  // (VK_EXT_external_memory_host): the range imported is widened to
  // minImportedHostPointerAlignment, which must not exceed a page (so the
  // widened range lies in pages the host's bytes already occupy); the
  // buffer's own bytes start at `ptr`. Throws (BP_ERR_UNIMPLEMENTED without
  // the extension, BP_ERR_INVALID_ARGUMENT for a pointer or size the device
  // cannot import, BP_ERR_UNAVAILABLE when the driver refuses) with the reason.
  bp_buffer import_host(void* ptr, uint64_t size);
  void free(uint64_t handle);
  // Throws BP_ERR_INVALID_ARGUMENT for an unknown handle.
  const Allocation& get(uint64_t handle) const;
  VkBuffer vk_buffer(const Allocation& a) const { return blocks_[a.block]->buffer; }
  // The device address of the first byte of vk_buffer(a).
  VkDeviceAddress block_address(const Allocation& a) const { return blocks_[a.block]->address; }
  uint8_t* mapped(const Allocation& a) const {
    auto* m = blocks_[a.block]->mapped;
    return m ? m + a.offset : nullptr;
  }

  void write(uint64_t handle, uint64_t offset, const void* src, uint64_t size);
  void read(uint64_t handle, uint64_t offset, void* dst, uint64_t size);

  HostBuffer create_host_buffer(uint64_t size, VkBufferUsageFlags usage);
  void destroy_host_buffer(HostBuffer& b);

  bool host_mapped() const { return mapped_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t max_allocation() const { return max_alloc_; }
  // Whether import_host can work on this device (the extension, and buffers
  // of the plugin's usage importable from host allocations).
  bool can_import() const { return import_ok_; }

 private:
  Block* new_block(uint64_t size);
  VkBuffer block_buffer(uint64_t size, const void* next, const char* what) const;
  uint64_t address_of(VkBuffer buffer) const;
  uint32_t add_block(std::unique_ptr<Block> b);  // its index in blocks_
  void staged_copy(VkBuffer src, uint64_t src_off, VkBuffer dst, uint64_t dst_off, uint64_t size);

  Device* dev_ = nullptr;
  bool mapped_ = false;
  uint32_t device_type_ = 0;  // memory type index for blocks
  uint32_t host_type_ = 0;    // host-visible coherent type for small buffers
  uint64_t alignment_ = 16;
  uint64_t block_size_ = 64ull << 20;
  uint64_t max_alloc_ = 0;
  bool import_ok_ = false;
  bool import_dedicated_ = false;  // imports need a dedicated allocation
  std::vector<std::unique_ptr<Block>> blocks_;
  std::unordered_map<uint64_t, Allocation> allocs_;
  uint64_t next_handle_ = 1;
  HostBuffer staging_;
};

}  // namespace backplane::vulkan
