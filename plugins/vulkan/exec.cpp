#include "exec.hpp"

#include "device.hpp"

#include <algorithm>
#include <cstring>

namespace bpvk {

namespace {
constexpr uint64_t kRingChunk = 1ull << 20;  // bytes of argument words per chunk
constexpr uint32_t kSetsPerPool = 1024;
constexpr uint32_t kMaxBindings = 12;
}  // namespace

void Exec::init(Device* dev) {
  dev_ = dev;
  VkCommandPoolCreateInfo pci{};
  pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
  pci.queueFamilyIndex = dev->queue_family;
  vk_check(vkCreateCommandPool(dev->dev, &pci, nullptr, &pool_), "vkCreateCommandPool");
  VkCommandBufferAllocateInfo cai{};
  cai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
  cai.commandPool = pool_;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  vk_check(vkAllocateCommandBuffers(dev->dev, &cai, &cmd_), "vkAllocateCommandBuffers");
  VkFenceCreateInfo fci{};
  fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
  vk_check(vkCreateFence(dev->dev, &fci, nullptr, &fence_), "vkCreateFence");
  errors_ = dev->memory.create_host_buffer(64, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT);
  ring_.push_back({dev->memory.create_host_buffer(kRingChunk, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)});
}

Binding Exec::scratch(uint64_t bytes) {
  if (scratch_size_ < bytes) {
    // Commands recorded in this run may still use the old one.
    if (scratch_) retired_scratch_.push_back(scratch_);
    const uint64_t size = std::max<uint64_t>(bytes, 1 << 16);
    scratch_ = dev_->memory.allocate(size).handle;
    scratch_size_ = size;
  }
  const Allocation& a = dev_->memory.get(scratch_);
  Binding b;
  b.buffer = dev_->memory.vk_buffer(a);
  b.offset = a.offset;
  b.range = bytes;
  b.handle = scratch_;
  b.write = true;
  return b;
}

void Exec::destroy() {
  if (!dev_) return;
  VkDevice d = dev_->dev;
  for (auto p : desc_pools_) vkDestroyDescriptorPool(d, p, nullptr);
  desc_pools_.clear();
  for (auto& c : ring_) dev_->memory.destroy_host_buffer(c.buf);
  ring_.clear();
  dev_->memory.destroy_host_buffer(errors_);
  if (fence_) vkDestroyFence(d, fence_, nullptr);
  if (pool_) vkDestroyCommandPool(d, pool_, nullptr);
  fence_ = VK_NULL_HANDLE;
  pool_ = VK_NULL_HANDLE;
  cmd_ = VK_NULL_HANDLE;
  recording_ = false;
  dev_ = nullptr;
}

void Exec::reset_recording_state() {
  for (auto p : desc_pools_) vkResetDescriptorPool(dev_->dev, p, 0);
  desc_pool_cur_ = 0;
  ring_chunk_ = 0;
  ring_used_ = 0;
  auto* e = static_cast<uint32_t*>(errors_.ptr);
  e[0] = 0;
  e[1] = 0xffffffffu;
  op_names_.clear();
  for (uint64_t h : retired_scratch_) dev_->memory.free(h);
  retired_scratch_.clear();
  written_.clear();
  read_.clear();
  n_dispatches_ = 0;
}

void Exec::begin() {
  if (recording_) {
    // A run that was never synchronized: drop what it recorded.
    vkEndCommandBuffer(cmd_);
    recording_ = false;
  }
  vk_check(vkResetCommandPool(dev_->dev, pool_, 0), "vkResetCommandPool");
  reset_recording_state();
  VkCommandBufferBeginInfo bi{};
  bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  vk_check(vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer");
  recording_ = true;
}

VkDescriptorSet Exec::allocate_set(VkDescriptorSetLayout layout) {
  for (;;) {
    if (desc_pool_cur_ == desc_pools_.size()) {
      VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerPool * kMaxBindings};
      VkDescriptorPoolCreateInfo ci{};
      ci.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
      ci.maxSets = kSetsPerPool;
      ci.poolSizeCount = 1;
      ci.pPoolSizes = &size;
      VkDescriptorPool p = VK_NULL_HANDLE;
      vk_check(vkCreateDescriptorPool(dev_->dev, &ci, nullptr, &p), "vkCreateDescriptorPool");
      desc_pools_.push_back(p);
    }
    VkDescriptorSetAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
    ai.descriptorPool = desc_pools_[desc_pool_cur_];
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &layout;
    VkDescriptorSet set = VK_NULL_HANDLE;
    VkResult r = vkAllocateDescriptorSets(dev_->dev, &ai, &set);
    if (r == VK_SUCCESS) return set;
    if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL) vk_check(r, "vkAllocateDescriptorSets");
    ++desc_pool_cur_;
  }
}

std::pair<size_t, uint32_t> Exec::ring_put(std::span<const int32_t> args) {
  const uint64_t bytes = std::max<uint64_t>(args.size_bytes(), 4);
  if (ring_used_ + bytes > ring_[ring_chunk_].buf.size) {
    ++ring_chunk_;
    ring_used_ = 0;
    if (ring_chunk_ == ring_.size() || ring_[ring_chunk_].buf.size < bytes)
      ring_.insert(ring_.begin() + static_cast<ptrdiff_t>(ring_chunk_),
                   {dev_->memory.create_host_buffer(std::max(kRingChunk, bytes), VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)});
  }
  auto* base = static_cast<uint8_t*>(ring_[ring_chunk_].buf.ptr) + ring_used_;
  if (!args.empty()) std::memcpy(base, args.data(), args.size_bytes());
  const auto word = static_cast<uint32_t>(ring_used_ / 4);
  ring_used_ += bytes;
  return {ring_chunk_, word};
}

void Exec::dispatch(const Pipeline& p, std::span<const Binding> operands, std::span<const int32_t> args, uint32_t n,
                    uint32_t extra, uint64_t groups, const char* op) {
  ensure_begun();
  check(operands.size() + 2 == p.n_bindings, BP_ERR_INTERNAL, "vulkan: operand count mismatch");
  if (groups == 0) return;

  // Hazards: read-after-write, write-after-write and write-after-read on the
  // same bp buffer since the last barrier need a compute->compute barrier.
  bool barrier = false;
  for (const auto& b : operands) {
    if (!b.handle) continue;
    if (written_.count(b.handle) || (b.write && read_.count(b.handle))) barrier = true;
  }
  if (barrier) {
    VkMemoryBarrier mb{};
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb,
                         0, nullptr, 0, nullptr);
    written_.clear();
    read_.clear();
  }
  for (const auto& b : operands) {
    if (!b.handle) continue;
    (b.write ? written_ : read_).insert(b.handle);
  }

  const auto [chunk, word] = ring_put(args);
  VkDescriptorSet set = allocate_set(p.set_layout);
  std::vector<VkDescriptorBufferInfo> infos(p.n_bindings);
  infos[0] = {ring_[chunk].buf.buffer, 0, ring_[chunk].buf.size};
  infos[1] = {errors_.buffer, 0, 8};
  for (size_t i = 0; i < operands.size(); ++i) infos[i + 2] = {operands[i].buffer, operands[i].offset, operands[i].range};
  std::vector<VkWriteDescriptorSet> writes(p.n_bindings);
  for (uint32_t i = 0; i < p.n_bindings; ++i) {
    writes[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
    writes[i].dstSet = set;
    writes[i].dstBinding = i;
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  vkUpdateDescriptorSets(dev_->dev, p.n_bindings, writes.data(), 0, nullptr);

  vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline);
  vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, &set, 0, nullptr);
  PushConstants pc{word, n, n_dispatches_, extra};
  vkCmdPushConstants(cmd_, p.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);

  // Fold the grid so every dimension stays within maxComputeWorkGroupCount.
  const auto* mx = dev_->props.limits.maxComputeWorkGroupCount;
  uint64_t gx = groups, gy = 1, gz = 1;
  if (gx > mx[0]) {
    gx = mx[0];
    gy = (groups + gx - 1) / gx;
    if (gy > mx[1]) {
      gz = (gy + mx[1] - 1) / mx[1];
      gy = mx[1];
      check(gz <= mx[2], BP_ERR_INVALID_ARGUMENT, std::string("vulkan: ") + op + ": grid too large");
    }
  }
  vkCmdDispatch(cmd_, static_cast<uint32_t>(gx), static_cast<uint32_t>(gy), static_cast<uint32_t>(gz));
  op_names_.push_back(op);
  ++n_dispatches_;
}

void Exec::synchronize() {
  if (!recording_) return;
  recording_ = false;
  vk_check(vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
  if (n_dispatches_ == 0) return;
  VkSubmitInfo si{};
  si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  vk_check(vkQueueSubmit(dev_->queue, 1, &si, fence_), "vkQueueSubmit");
  VkResult r = vkWaitForFences(dev_->dev, 1, &fence_, VK_TRUE, UINT64_MAX);
  vkResetFences(dev_->dev, 1, &fence_);
  vk_check(r, "vkWaitForFences");
  const auto* e = static_cast<const uint32_t*>(errors_.ptr);
  const uint32_t flags = e[0], first = e[1];
  if (flags) {
    const char* op = first < op_names_.size() ? op_names_[first] : "kernel";
    std::string what;
    if (flags & kErrIndex) what = "index out of range";
    else if (flags & kErrDivZero) what = "integer division by zero";
    else if (flags & kErrCast) what = "cast of NaN, infinity or an out-of-range value to an integer type";
    else if (flags & kErrEmpty) what = "reduction over an empty dim";
    else what = "device error";
    fail(BP_ERR_OUT_OF_RANGE, std::string(op) + ": " + what + " (vulkan, " + dev_->name + ")");
  }
}

}  // namespace bpvk
