#include "memory.hpp"

#include "device.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

namespace backplane::vulkan {

namespace {

constexpr VkBufferUsageFlags kBlockUsage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                           VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                                           VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

constexpr VkExternalMemoryHandleTypeFlagBits kHostAllocation = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;

std::string hex(uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t page_size() {
  const long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<uint64_t>(p) : 4096;
}

// Memory types allowed for a buffer with `usage`.
uint32_t buffer_type_bits(VkDevice dev, VkBufferUsageFlags usage) {
  VkBufferCreateInfo bci{};
  bci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
  bci.size = 4096;
  bci.usage = usage;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer b = VK_NULL_HANDLE;
  vk_check(vkCreateBuffer(dev, &bci, nullptr, &b), "vkCreateBuffer");
  VkMemoryRequirements req{};
  vkGetBufferMemoryRequirements(dev, b, &req);
  vkDestroyBuffer(dev, b, nullptr);
  return req.memoryTypeBits;
}

}  // namespace

void Memory::init(Device* dev) {
  dev_ = dev;
  const auto& mp = dev->mem_props;
  const uint32_t bits = buffer_type_bits(dev->dev, kBlockUsage);
  constexpr VkMemoryPropertyFlags kHost = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;

  // The biggest device-local heap.
  uint64_t best_heap = 0;
  for (uint32_t h = 0; h < mp.memoryHeapCount; ++h)
    if (mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) best_heap = std::max(best_heap, mp.memoryHeaps[h].size);

  int device_type = -1, mapped_type = -1, host_type = -1;
  for (uint32_t t = 0; t < mp.memoryTypeCount; ++t) {
    if (!(bits & (1u << t))) continue;
    const auto f = mp.memoryTypes[t].propertyFlags;
    const uint64_t heap = mp.memoryHeaps[mp.memoryTypes[t].heapIndex].size;
    const bool local = f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    if (local && device_type < 0) device_type = static_cast<int>(t);
    // Mapped device memory only when it is the device's main memory
    // (integrated GPUs, CPU devices like lavapipe, full resizable BAR).
    if (local && (f & kHost) == kHost && heap == best_heap && mapped_type < 0) mapped_type = static_cast<int>(t);
    if ((f & kHost) == kHost && host_type < 0) host_type = static_cast<int>(t);
  }
  BP_SDK_CHECK(host_type >= 0, BP_ERR_UNAVAILABLE, "vulkan: no host-visible coherent memory type");
  if (mapped_type >= 0) {
    mapped_ = true;
    device_type_ = static_cast<uint32_t>(mapped_type);
  } else {
    mapped_ = false;
    device_type_ = static_cast<uint32_t>(device_type >= 0 ? device_type : host_type);
  }
  host_type_ = static_cast<uint32_t>(host_type);

  alignment_ = std::max<uint64_t>(dev->props.limits.minStorageBufferOffsetAlignment, 16);
  VkPhysicalDeviceMaintenance3Properties m3{};
  m3.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES;
  VkPhysicalDeviceProperties2 p2{};
  p2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
  p2.pNext = &m3;
  vkGetPhysicalDeviceProperties2(dev->phys, &p2);
  max_alloc_ = m3.maxMemoryAllocationSize ? m3.maxMemoryAllocationSize : (1ull << 30);
  // Nor more than the heap the blocks come from: a buffer that cannot fit is
  // refused by the host's plan (naming the node and the bytes) before a run.
  max_alloc_ = std::min<uint64_t>(max_alloc_, mp.memoryHeaps[mp.memoryTypes[device_type_].heapIndex].size);
  block_size_ = std::min<uint64_t>(block_size_, max_alloc_);

  // Host memory imported in place: the driver must import host allocations
  // into buffers of the blocks' usage (storage, transfers, device address).
  if (dev->features.host_import) {
    VkPhysicalDeviceExternalBufferInfo ebi{};
    ebi.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_BUFFER_INFO;
    ebi.usage = kBlockUsage;
    ebi.handleType = kHostAllocation;
    VkExternalBufferProperties ebp{};
    ebp.sType = VK_STRUCTURE_TYPE_EXTERNAL_BUFFER_PROPERTIES;
    vkGetPhysicalDeviceExternalBufferProperties(dev->phys, &ebi, &ebp);
    const auto& em = ebp.externalMemoryProperties;
    import_ok_ = (em.externalMemoryFeatures & VK_EXTERNAL_MEMORY_FEATURE_IMPORTABLE_BIT) != 0;
    import_dedicated_ = (em.externalMemoryFeatures & VK_EXTERNAL_MEMORY_FEATURE_DEDICATED_ONLY_BIT) != 0;
    if (!import_ok_)
      log(BP_LOG_INFO, "vulkan: " + dev->name + " has VK_EXT_external_memory_host but cannot import host memory "
                       "into storage buffers with device addresses; host data is copied");
  }
}

void Memory::destroy() {
  if (!dev_) return;
  destroy_host_buffer(staging_);
  for (auto& b : blocks_) {
    if (!b) continue;
    if (b->buffer) vkDestroyBuffer(dev_->dev, b->buffer, nullptr);
    if (b->memory) vkFreeMemory(dev_->dev, b->memory, nullptr);
  }
  blocks_.clear();
  allocs_.clear();
  dev_ = nullptr;
}

// A buffer covering a whole block (every operand usage, a device address).
VkBuffer Memory::block_buffer(uint64_t size, const void* next, const char* what) const {
  VkBufferCreateInfo bci{};
  bci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
  bci.pNext = next;
  bci.size = size;
  bci.usage = kBlockUsage;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buffer = VK_NULL_HANDLE;
  vk_check(vkCreateBuffer(dev_->dev, &bci, nullptr, &buffer), what);
  return buffer;
}

uint64_t Memory::address_of(VkBuffer buffer) const {
  VkBufferDeviceAddressInfo ai{};
  ai.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO;
  ai.buffer = buffer;
  return dev_->get_buffer_address(dev_->dev, &ai);
}

Block* Memory::new_block(uint64_t size) {
  auto b = std::make_unique<Block>();
  b->buffer = block_buffer(size, nullptr, "vkCreateBuffer (memory block)");
  VkMemoryRequirements req{};
  vkGetBufferMemoryRequirements(dev_->dev, b->buffer, &req);
  VkMemoryAllocateInfo mai{};
  mai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = device_type_;
  VkMemoryAllocateFlagsInfo flags{};
  flags.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO;
  flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  mai.pNext = &flags;
  VkResult r = vkAllocateMemory(dev_->dev, &mai, nullptr, &b->memory);
  if (r != VK_SUCCESS) {
    vkDestroyBuffer(dev_->dev, b->buffer, nullptr);
    fail(BP_ERR_OUT_OF_MEMORY, "vulkan: cannot allocate a " + std::to_string(size >> 20) +
                                   " MiB memory block on " + dev_->name + " (" + vk_result_name(r) + ")");
  }
  r = vkBindBufferMemory(dev_->dev, b->buffer, b->memory, 0);
  if (r != VK_SUCCESS) {
    vkDestroyBuffer(dev_->dev, b->buffer, nullptr);
    vkFreeMemory(dev_->dev, b->memory, nullptr);
    vk_check(r, "vkBindBufferMemory");
  }
  b->address = address_of(b->buffer);
  if (b->address % 64 != 0) {
    // Operand windows are 64-byte aligned within a block, and the shaders
    // declare their references 16-byte aligned (shaders/dtypes.glsl).
    vkDestroyBuffer(dev_->dev, b->buffer, nullptr);
    vkFreeMemory(dev_->dev, b->memory, nullptr);
    fail(BP_ERR_UNAVAILABLE, "vulkan: " + dev_->name + " placed a memory block at an address not 64-byte aligned");
  }
  if (mapped_) {
    void* p = nullptr;
    vk_check(vkMapMemory(dev_->dev, b->memory, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory");
    b->mapped = static_cast<uint8_t*>(p);
  }
  b->size = size;
  b->free[0] = size;
  return blocks_[add_block(std::move(b))].get();
}

uint32_t Memory::add_block(std::unique_ptr<Block> b) {
  // Reuse an empty slot in the block list.
  for (uint32_t i = 0; i < blocks_.size(); ++i)
    if (!blocks_[i]) {
      blocks_[i] = std::move(b);
      return i;
    }
  blocks_.push_back(std::move(b));
  return static_cast<uint32_t>(blocks_.size() - 1);
}

bp_buffer Memory::import_host(void* ptr, uint64_t size) {
  const std::string& dn = dev_->name;
  BP_SDK_CHECK(dev_->features.host_import, BP_ERR_UNIMPLEMENTED,
             "vulkan: " + dn + " cannot import host memory (its driver lacks VK_EXT_external_memory_host)");
  BP_SDK_CHECK(import_ok_, BP_ERR_UNIMPLEMENTED,
             "vulkan: " + dn + " cannot import host memory into storage buffers with device addresses");
  if (const char* e = std::getenv("BACKPLANE_VULKAN_HOST_IMPORT"); e && std::strcmp(e, "0") == 0)
    fail(BP_ERR_UNAVAILABLE, "vulkan: host memory import on " + dn + " is disabled (BACKPLANE_VULKAN_HOST_IMPORT=0)");
  BP_SDK_CHECK(ptr != nullptr, BP_ERR_INVALID_ARGUMENT, "vulkan: buffer_import_host of a NULL pointer");
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  BP_SDK_CHECK(addr % alignment_ == 0, BP_ERR_INVALID_ARGUMENT,
             "vulkan: host memory at " + hex(addr) + " is not aligned to " + dn + "'s buffer_alignment (" +
                 std::to_string(alignment_) + " bytes)");
  BP_SDK_CHECK(size <= max_alloc_ && addr + size >= addr, BP_ERR_OUT_OF_MEMORY,
             "vulkan: importing " + std::to_string(size) + " bytes of host memory: " + dn + " allocates at most " +
                 std::to_string(max_alloc_));
  // The driver imports whole units of minImportedHostPointerAlignment. Up to
  // a page, the units around [ptr, ptr + size) lie in pages the host's own
  // bytes occupy, so they are mapped memory and may be imported (the device
  // reads and writes only the buffer's bytes). A larger unit could reach an
  // unmapped page: then the range itself must be whole units.
  const uint64_t unit = dev_->host_import_alignment;
  const uint64_t start = addr / unit * unit;
  const uint64_t end = align_up(addr + std::max<uint64_t>(size, 1), unit);
  if (unit > page_size())
    BP_SDK_CHECK(start == addr && end == addr + size, BP_ERR_INVALID_ARGUMENT,
               "vulkan: " + dn + " imports host memory in units of " + std::to_string(unit) +
                   " bytes (minImportedHostPointerAlignment, more than a page): the address " + hex(addr) +
                   " and the size " + std::to_string(size) + " must be multiples of it");
  const uint64_t span = end - start;
  BP_SDK_CHECK(span <= max_alloc_, BP_ERR_OUT_OF_MEMORY,
             "vulkan: importing " + std::to_string(span) + " bytes of host memory: " + dn + " allocates at most " +
                 std::to_string(max_alloc_));
  void* base = reinterpret_cast<void*>(static_cast<uintptr_t>(start));

  VkMemoryHostPointerPropertiesEXT hp{};
  hp.sType = VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT;
  VkResult r = dev_->get_host_pointer_properties(dev_->dev, kHostAllocation, base, &hp);
  BP_SDK_CHECK(r == VK_SUCCESS, BP_ERR_UNAVAILABLE,
             "vulkan: " + dn + " cannot import the host memory at " + hex(addr) +
                 " (vkGetMemoryHostPointerPropertiesEXT: " + vk_result_name(r) + ")");

  auto b = std::make_unique<Block>();
  auto release = [&] {
    if (b->buffer) vkDestroyBuffer(dev_->dev, b->buffer, nullptr);
    if (b->memory) vkFreeMemory(dev_->dev, b->memory, nullptr);
    b->buffer = VK_NULL_HANDLE;
    b->memory = VK_NULL_HANDLE;
  };
  VkExternalMemoryBufferCreateInfo ext{};
  ext.sType = VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO;
  ext.handleTypes = kHostAllocation;
  b->buffer = block_buffer(span, &ext, "vkCreateBuffer (imported host memory)");
  VkMemoryRequirements req{};
  vkGetBufferMemoryRequirements(dev_->dev, b->buffer, &req);
  // A device-local, host-visible, coherent type: host memory that is the
  // device's own (lavapipe, integrated GPUs), which the host's writes reach
  // without a flush and the device's without an invalidate. A discrete GPU
  // offers host pointers only as memory across the bus, which every kernel
  // would then read through: refused, so the host copies into the device's
  // memory once instead.
  constexpr VkMemoryPropertyFlags kWant = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                          VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  const auto& mp = dev_->mem_props;
  int type = -1;
  for (uint32_t t = 0; t < mp.memoryTypeCount && type < 0; ++t)
    if ((hp.memoryTypeBits & req.memoryTypeBits & (1u << t)) && (mp.memoryTypes[t].propertyFlags & kWant) == kWant)
      type = static_cast<int>(t);
  if (type < 0 || req.size > span || start % std::max<uint64_t>(req.alignment, 1) != 0) {
    release();
    fail(BP_ERR_UNAVAILABLE, "vulkan: " + dn + " can use the host memory at " + hex(addr) +
                                 " only across the bus (no device-local, host-coherent memory type for it); the host "
                                 "copies it instead");
  }
  VkMemoryAllocateFlagsInfo flags{};
  flags.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO;
  flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  VkMemoryDedicatedAllocateInfo dedicated{};
  dedicated.sType = VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO;
  dedicated.buffer = b->buffer;
  if (import_dedicated_) flags.pNext = &dedicated;
  VkImportMemoryHostPointerInfoEXT import{};
  import.sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT;
  import.pNext = &flags;
  import.handleType = kHostAllocation;
  import.pHostPointer = base;
  VkMemoryAllocateInfo mai{};
  mai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
  mai.pNext = &import;
  mai.allocationSize = span;
  mai.memoryTypeIndex = static_cast<uint32_t>(type);
  r = vkAllocateMemory(dev_->dev, &mai, nullptr, &b->memory);
  if (r == VK_SUCCESS) r = vkBindBufferMemory(dev_->dev, b->buffer, b->memory, 0);
  if (r != VK_SUCCESS) {
    release();
    fail(r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? BP_ERR_OUT_OF_MEMORY : BP_ERR_UNAVAILABLE,
         "vulkan: " + dn + " refused to import " + std::to_string(span) + " bytes of host memory at " + hex(start) + " (" +
             vk_result_name(r) + ")");
  }
  b->address = address_of(b->buffer);
  if (b->address % 64 != 0) {
    // As for blocks: operand windows are 64-byte aligned from this address.
    release();
    fail(BP_ERR_UNAVAILABLE, "vulkan: " + dn + " placed imported host memory at an address not 64-byte aligned");
  }
  b->mapped = static_cast<uint8_t*>(base);
  b->size = span;
  b->imported = true;
  b->live = 1;
  Allocation a{};
  a.offset = addr - start;
  a.size = size;
  a.reserved = span - a.offset;
  const uint64_t handle = next_handle_;
  try {
    // Room first (what may throw), then the block moves in.
    a.block = 0;
    while (a.block < blocks_.size() && blocks_[a.block]) ++a.block;
    if (a.block == blocks_.size()) blocks_.emplace_back();
    allocs_.emplace(handle, a);
  } catch (...) {
    release();
    throw;
  }
  blocks_[a.block] = std::move(b);
  ++next_handle_;
  bp_buffer out{};
  out.struct_size = sizeof(bp_buffer);
  out.handle = handle;
  out.host_ptr = ptr;
  out.size = size;
  return out;
}

bp_buffer Memory::allocate(uint64_t size) {
  BP_SDK_CHECK(size <= max_alloc_, BP_ERR_OUT_OF_MEMORY,
             "vulkan: buffer of " + std::to_string(size) +
                 " bytes exceeds the device's maxMemoryAllocationSize (" + std::to_string(max_alloc_) + ")");
  const uint64_t need = align_up(std::max<uint64_t>(size, 1), alignment_);
  Allocation a{};
  bool placed = false;
  // First fit in an existing shared block.
  for (uint32_t bi = 0; bi < blocks_.size() && !placed; ++bi) {
    Block* b = blocks_[bi].get();
    if (!b || b->imported) continue;
    for (auto it = b->free.begin(); it != b->free.end(); ++it) {
      if (it->second < need) continue;
      a.block = bi;
      a.offset = it->first;
      const uint64_t rest = it->second - need;
      const uint64_t at = it->first + need;
      b->free.erase(it);
      if (rest) b->free[at] = rest;
      placed = true;
      break;
    }
  }
  if (!placed) {
    // Big buffers get a block of their own; small ones a fresh shared block.
    const uint64_t bsize = need > block_size_ / 2 ? need : block_size_;
    Block* b = new_block(bsize);
    uint32_t bi = 0;
    while (blocks_[bi].get() != b) ++bi;
    a.block = bi;
    a.offset = 0;
    b->free.clear();
    if (bsize > need) b->free[need] = bsize - need;
  }
  a.size = size;
  a.reserved = need;
  blocks_[a.block]->live++;
  const uint64_t handle = next_handle_++;
  allocs_[handle] = a;
  bp_buffer out{};
  out.struct_size = sizeof(bp_buffer);
  out.handle = handle;
  out.host_ptr = mapped(a);
  out.size = size;
  return out;
}

void Memory::free(uint64_t handle) {
  auto it = allocs_.find(handle);
  if (it == allocs_.end()) return;
  const Allocation a = it->second;
  allocs_.erase(it);
  Block* b = blocks_[a.block].get();
  if (b->imported) {
    // The wrapper only: the memory stays the host's.
    vkDestroyBuffer(dev_->dev, b->buffer, nullptr);
    vkFreeMemory(dev_->dev, b->memory, nullptr);
    blocks_[a.block].reset();
    return;
  }
  // Insert and coalesce with neighbours.
  auto [pos, ok] = b->free.emplace(a.offset, a.reserved);
  (void)ok;
  auto next = std::next(pos);
  if (next != b->free.end() && pos->first + pos->second == next->first) {
    pos->second += next->second;
    b->free.erase(next);
  }
  if (pos != b->free.begin()) {
    auto prev = std::prev(pos);
    if (prev->first + prev->second == pos->first) {
      prev->second += pos->second;
      b->free.erase(pos);
    }
  }
  if (--b->live == 0 && (b->size != block_size_ || blocks_.size() > 1)) {
    // Give dedicated and surplus blocks back; keep one shared block warm.
    uint32_t shared_blocks = 0;
    for (auto& bb : blocks_)
      if (bb && !bb->imported && bb->size == block_size_) ++shared_blocks;
    if (b->size != block_size_ || shared_blocks > 1) {
      vkDestroyBuffer(dev_->dev, b->buffer, nullptr);
      vkFreeMemory(dev_->dev, b->memory, nullptr);
      blocks_[a.block].reset();
    }
  }
}

const Allocation& Memory::get(uint64_t handle) const {
  auto it = allocs_.find(handle);
  if (it == allocs_.end()) fail(BP_ERR_INVALID_ARGUMENT, "vulkan: unknown buffer handle " + std::to_string(handle));
  return it->second;
}

HostBuffer Memory::create_host_buffer(uint64_t size, VkBufferUsageFlags usage) {
  HostBuffer h;
  VkBufferCreateInfo bci{};
  bci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
  bci.size = size;
  bci.usage = usage;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  vk_check(vkCreateBuffer(dev_->dev, &bci, nullptr, &h.buffer), "vkCreateBuffer (host buffer)");
  VkMemoryRequirements req{};
  vkGetBufferMemoryRequirements(dev_->dev, h.buffer, &req);
  uint32_t type = host_type_;
  if (!(req.memoryTypeBits & (1u << type))) {
    constexpr VkMemoryPropertyFlags kHost = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    const auto& mp = dev_->mem_props;
    for (uint32_t t = 0; t < mp.memoryTypeCount; ++t)
      if ((req.memoryTypeBits & (1u << t)) && (mp.memoryTypes[t].propertyFlags & kHost) == kHost) {
        type = t;
        break;
      }
  }
  VkMemoryAllocateInfo mai{};
  mai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = type;
  VkResult r = vkAllocateMemory(dev_->dev, &mai, nullptr, &h.memory);
  if (r != VK_SUCCESS) {
    vkDestroyBuffer(dev_->dev, h.buffer, nullptr);
    vk_check(r, "vkAllocateMemory (host buffer)");
  }
  vk_check(vkBindBufferMemory(dev_->dev, h.buffer, h.memory, 0), "vkBindBufferMemory");
  vk_check(vkMapMemory(dev_->dev, h.memory, 0, VK_WHOLE_SIZE, 0, &h.ptr), "vkMapMemory");
  h.size = size;
  return h;
}

void Memory::destroy_host_buffer(HostBuffer& h) {
  if (!dev_) return;
  if (h.buffer) vkDestroyBuffer(dev_->dev, h.buffer, nullptr);
  if (h.memory) vkFreeMemory(dev_->dev, h.memory, nullptr);
  h = HostBuffer{};
}

// One blocking copy through a transient command buffer.
void Memory::staged_copy(VkBuffer src, uint64_t src_off, VkBuffer dst, uint64_t dst_off, uint64_t size) {
  VkCommandPoolCreateInfo pci{};
  pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
  pci.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
  pci.queueFamilyIndex = dev_->queue_family;
  VkCommandPool pool = VK_NULL_HANDLE;
  vk_check(vkCreateCommandPool(dev_->dev, &pci, nullptr, &pool), "vkCreateCommandPool");
  VkFence fence = VK_NULL_HANDLE;
  try {
    VkCommandBufferAllocateInfo cai{};
    cai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cai.commandPool = pool;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    vk_check(vkAllocateCommandBuffers(dev_->dev, &cai, &cmd), "vkAllocateCommandBuffers");
    VkCommandBufferBeginInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    vk_check(vkBeginCommandBuffer(cmd, &bi), "vkBeginCommandBuffer");
    VkBufferCopy region{src_off, dst_off, size};
    vkCmdCopyBuffer(cmd, src, dst, 1, &region);
    vk_check(vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
    VkFenceCreateInfo fci{};
    fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    vk_check(vkCreateFence(dev_->dev, &fci, nullptr, &fence), "vkCreateFence");
    VkSubmitInfo si{};
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
    vk_check(vkQueueSubmit(dev_->queue, 1, &si, fence), "vkQueueSubmit (copy)");
    vk_check(vkWaitForFences(dev_->dev, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences (copy)");
  } catch (...) {
    if (fence) vkDestroyFence(dev_->dev, fence, nullptr);
    vkDestroyCommandPool(dev_->dev, pool, nullptr);
    throw;
  }
  vkDestroyFence(dev_->dev, fence, nullptr);
  vkDestroyCommandPool(dev_->dev, pool, nullptr);
}

void Memory::write(uint64_t handle, uint64_t offset, const void* src, uint64_t size) {
  const Allocation& a = get(handle);
  BP_SDK_CHECK(offset <= a.size && size <= a.size - offset, BP_ERR_INVALID_ARGUMENT,
             "vulkan: buffer_write of " + std::to_string(size) + " bytes at " + std::to_string(offset) +
                 " outside a buffer of " + std::to_string(a.size));
  if (size == 0) return;
  if (uint8_t* p = mapped(a)) {
    std::memcpy(p + offset, src, size);
    return;
  }
  constexpr uint64_t kStaging = 16ull << 20;
  if (!staging_.buffer) staging_ = create_host_buffer(kStaging, VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT);
  const auto* s = static_cast<const uint8_t*>(src);
  for (uint64_t done = 0; done < size;) {
    const uint64_t chunk = std::min(kStaging, size - done);
    std::memcpy(staging_.ptr, s + done, chunk);
    staged_copy(staging_.buffer, 0, vk_buffer(a), a.offset + offset + done, chunk);
    done += chunk;
  }
}

void Memory::read(uint64_t handle, uint64_t offset, void* dst, uint64_t size) {
  const Allocation& a = get(handle);
  BP_SDK_CHECK(offset <= a.size && size <= a.size - offset, BP_ERR_INVALID_ARGUMENT,
             "vulkan: buffer_read of " + std::to_string(size) + " bytes at " + std::to_string(offset) +
                 " outside a buffer of " + std::to_string(a.size));
  if (size == 0) return;
  if (uint8_t* p = mapped(a)) {
    std::memcpy(dst, p + offset, size);
    return;
  }
  constexpr uint64_t kStaging = 16ull << 20;
  if (!staging_.buffer) staging_ = create_host_buffer(kStaging, VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT);
  auto* d = static_cast<uint8_t*>(dst);
  for (uint64_t done = 0; done < size;) {
    const uint64_t chunk = std::min(kStaging, size - done);
    staged_copy(vk_buffer(a), a.offset + offset + done, staging_.buffer, 0, chunk);
    std::memcpy(d + done, staging_.ptr, chunk);
    done += chunk;
  }
}

}  // namespace backplane::vulkan
