#include "exec.hpp"

#include "device.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace backplane::vulkan {

namespace {
constexpr uint64_t kRingChunk = 1ull << 20;  // bytes of argument words per chunk
constexpr uint32_t kSetsPerPool = 16;
// A timestamp is written once the compute work recorded before it is done.
// (On lavapipe a timestamp costs ~25 us whichever stage it names.)
constexpr VkPipelineStageFlagBits kTimestampStage = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
}  // namespace

void Exec::init(Device* dev) {
  dev_ = dev;
  // Timestamps: the queue family's timestampValidBits decides (0: none);
  // timestampComputeAndGraphics only promises them on every compute queue.
  const uint32_t bits = dev->timestamp_bits;
  timestamp_mask_ = bits == 0 ? 0 : bits >= 64 ? ~0ull : (1ull << bits) - 1;
  timestamp_period_ = dev->props.limits.timestampPeriod > 0 ? dev->props.limits.timestampPeriod : 1.0;
  if (!timestamp_mask_)
    log(BP_LOG_INFO, "vulkan: " + dev->name + ": the queue writes no timestamps; profiles get no device times");
}

void Exec::destroy() {
  if (!dev_) return;
  for (auto& s : streams_) destroy_stream(*s);
  streams_.clear();
  idle_.clear();
  active_.clear();
  dev_ = nullptr;
}

Stream* Exec::create_stream() {
  auto s = std::make_unique<Stream>();
  try {
    VkCommandPoolCreateInfo pci{};
    pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pci.queueFamilyIndex = dev_->queue_family;
    vk_check(vkCreateCommandPool(dev_->dev, &pci, nullptr, &s->pool), "vkCreateCommandPool");
    VkCommandBufferAllocateInfo cai{};
    cai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cai.commandPool = s->pool;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    vk_check(vkAllocateCommandBuffers(dev_->dev, &cai, &s->cmd), "vkAllocateCommandBuffers");
    VkFenceCreateInfo fci{};
    fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    vk_check(vkCreateFence(dev_->dev, &fci, nullptr, &s->fence), "vkCreateFence");
    s->errors = dev_->memory.create_host_buffer(64, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT);
    s->ring.push_back(dev_->memory.create_host_buffer(kRingChunk, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT));
    s->ring_sets.push_back(VK_NULL_HANDLE);
  } catch (...) {
    destroy_stream(*s);
    throw;
  }
  streams_.push_back(std::move(s));
  return streams_.back().get();
}

void Exec::destroy_stream(Stream& s) {
  VkDevice d = dev_->dev;
  for (auto p : s.desc_pools) vkDestroyDescriptorPool(d, p, nullptr);
  s.desc_pools.clear();
  for (auto& c : s.ring) dev_->memory.destroy_host_buffer(c);
  s.ring.clear();
  s.ring_sets.clear();
  dev_->memory.destroy_host_buffer(s.errors);
  if (s.queries) vkDestroyQueryPool(d, s.queries, nullptr);
  s.queries = VK_NULL_HANDLE;
  s.query_capacity = 0;
  if (s.fence) vkDestroyFence(d, s.fence, nullptr);
  if (s.pool) vkDestroyCommandPool(d, s.pool, nullptr);
  s.fence = VK_NULL_HANDLE;
  s.pool = VK_NULL_HANDLE;
  s.cmd = VK_NULL_HANDLE;
  s.recording = false;
}

void Exec::reset_stream(Stream& s) {
  s.ring_chunk = 0;
  s.ring_used = 0;
  auto* e = static_cast<uint32_t*>(s.errors.ptr);
  e[0] = 0;
  e[1] = 0xffffffffu;
  s.op_names.clear();
  s.dispatch_calls.clear();
  s.n_calls = 0;
  for (uint64_t h : s.retired_scratch) dev_->memory.free(h);
  s.retired_scratch.clear();
  s.written.clear();
  s.read.clear();
  s.n_dispatches = 0;
  s.pending.clear();
  s.prepare = false;
  s.prepared.clear();
}

Stream* Exec::begin(bool timed, bool prepare) {
  Stream* s = nullptr;
  if (!idle_.empty()) {
    s = idle_.back();
    idle_.pop_back();
  } else {
    s = create_stream();
  }
  try {
    reset_stream(*s);
    active_.insert(s);
  } catch (...) {
    idle_.push_back(s);
    throw;
  }
  s->recording = true;
  s->timed = timed;
  s->prepare = prepare;
  return s;
}

Stream& Exec::stream(bp_run* run, const char* what) {
  auto* s = reinterpret_cast<Stream*>(run);
  BP_SDK_CHECK(s != nullptr && active_.count(s) && s->recording, BP_ERR_INVALID_ARGUMENT,
               std::string("vulkan: ") + what + " outside an open run of " + dev_->name +
                   " (the run handle is NULL, unknown or already synchronized)");
  return *s;
}

void Exec::begin_call(Stream& s) { ++s.n_calls; }

Binding Exec::scratch(Stream& s, uint64_t bytes) {
  if (s.scratch_size < bytes) {
    // Commands recorded in this run may still use the old one.
    if (s.scratch) s.retired_scratch.push_back(s.scratch);
    const uint64_t size = std::max<uint64_t>(bytes, 1 << 16);
    s.scratch = dev_->memory.allocate(size).handle;
    s.scratch_size = size;
  }
  const Allocation& a = dev_->memory.get(s.scratch);
  Binding b;
  b.buffer = dev_->memory.vk_buffer(a);
  b.address = dev_->memory.block_address(a);
  b.offset = a.offset;
  b.range = bytes;
  b.handle = s.scratch;
  b.write = true;
  return b;
}

VkDescriptorSet Exec::allocate_set(Stream& s) {
  VkDescriptorSetLayout layout = dev_->pipelines.set_layout();
  for (int attempt = 0;; ++attempt) {
    if (attempt > 0 || s.desc_pools.empty()) {
      VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerPool * 2};
      VkDescriptorPoolCreateInfo ci{};
      ci.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
      ci.maxSets = kSetsPerPool;
      ci.poolSizeCount = 1;
      ci.pPoolSizes = &size;
      VkDescriptorPool p = VK_NULL_HANDLE;
      vk_check(vkCreateDescriptorPool(dev_->dev, &ci, nullptr, &p), "vkCreateDescriptorPool");
      s.desc_pools.push_back(p);
    }
    VkDescriptorSetAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
    ai.descriptorPool = s.desc_pools.back();
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &layout;
    VkDescriptorSet set = VK_NULL_HANDLE;
    VkResult r = vkAllocateDescriptorSets(dev_->dev, &ai, &set);
    if (r == VK_SUCCESS) return set;
    if ((r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL) || attempt > 0)
      vk_check(r, "vkAllocateDescriptorSets");
  }
}

// The descriptor set of a ring chunk (the chunk and the error words): the
// only descriptors there are, made once per chunk, so recording a dispatch
// writes no descriptors.
VkDescriptorSet Exec::ring_set(Stream& s, size_t chunk) {
  if (s.ring_sets[chunk]) return s.ring_sets[chunk];
  VkDescriptorSet set = allocate_set(s);
  VkDescriptorBufferInfo infos[2] = {{s.ring[chunk].buffer, 0, s.ring[chunk].size}, {s.errors.buffer, 0, 8}};
  VkWriteDescriptorSet writes[2]{};
  for (uint32_t i = 0; i < 2; ++i) {
    writes[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
    writes[i].dstSet = set;
    writes[i].dstBinding = i;
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  vkUpdateDescriptorSets(dev_->dev, 2, writes, 0, nullptr);
  s.ring_sets[chunk] = set;
  return set;
}

std::pair<size_t, uint32_t> Exec::ring_put(Stream& s, std::span<const int32_t> args) {
  const uint64_t bytes = std::max<uint64_t>(args.size_bytes(), 4);
  if (s.ring_used + bytes > s.ring[s.ring_chunk].size) {
    ++s.ring_chunk;
    s.ring_used = 0;
    if (s.ring_chunk == s.ring.size() || s.ring[s.ring_chunk].size < bytes) {
      s.ring.insert(s.ring.begin() + static_cast<ptrdiff_t>(s.ring_chunk),
                    dev_->memory.create_host_buffer(std::max(kRingChunk, bytes), VK_BUFFER_USAGE_STORAGE_BUFFER_BIT));
      s.ring_sets.insert(s.ring_sets.begin() + static_cast<ptrdiff_t>(s.ring_chunk), VK_NULL_HANDLE);
    }
  }
  auto* base = static_cast<uint8_t*>(s.ring[s.ring_chunk].ptr) + s.ring_used;
  if (!args.empty()) std::memcpy(base, args.data(), args.size_bytes());
  const auto word = static_cast<uint32_t>(s.ring_used / 4);
  s.ring_used += bytes;
  return {s.ring_chunk, word};
}

void Exec::dispatch(Stream& s, const Pipeline& p, std::span<const Binding> operands, std::span<const int32_t> args,
                    uint32_t n, uint32_t extra, uint64_t groups, const char* op, std::array<int32_t, 4> pwords,
                    std::array<int32_t, 4> qwords) {
  BP_SDK_CHECK(operands.size() == p.n_operands && operands.size() <= kMaxOperands, BP_ERR_INTERNAL,
             "vulkan: operand count mismatch");
  if (groups == 0 && !s.prepare) return;
  // Descriptors where every window fits one (set 1 of the pipeline's twin),
  // else device addresses: the same kernel either way. Windows start at
  // multiples of minStorageBufferOffsetAlignment by construction (operand
  // windows in kernels_common.cpp, scratch at an allocation's start).
  const Pipeline* pl = &p;
  if (p.dsc &&
      std::all_of(operands.begin(), operands.end(),
                  [&](const Binding& b) { return b.range <= dev_->props.limits.maxStorageBufferRange; }))
    pl = p.dsc;
  dev_->pipelines.request(*pl);
  // A preparing run (begin_prepare, ABI 1.4) records one dispatch of no
  // workgroups per pipeline, and synchronize() submits them as a run's: it
  // waits for the compiles, and the driver makes whatever it makes at a
  // pipeline's first dispatch (lavapipe compiles its machine code there: a
  // first run of the demo took ~5x a steady one with only the compiles
  // done ahead, ~1.5x with this too). No workgroup runs, so no buffer is read
  // or written.
  if (s.prepare) {
    if (std::find(s.prepared.begin(), s.prepared.end(), pl) != s.prepared.end()) return;
    s.prepared.push_back(pl);
    groups = 0;
  }

  // Hazards: read-after-write, write-after-write and write-after-read on the
  // same bp buffer since the last barrier need a compute->compute barrier.
  bool barrier = false;
  for (const auto& b : operands) {
    if (!b.handle) continue;
    if (s.written.count(b.handle) || (b.write && s.read.count(b.handle))) barrier = true;
  }
  if (barrier) {
    s.written.clear();
    s.read.clear();
  }
  for (const auto& b : operands) {
    if (!b.handle) continue;
    (b.write ? s.written : s.read).insert(b.handle);
  }

  const auto [chunk, word] = ring_put(s, args);
  VkDescriptorSet set = ring_set(s, chunk);
  PushConstants pc{word,
                   n,
                   s.n_dispatches,
                   extra,
                   {pwords[0], pwords[1], pwords[2], pwords[3]},
                   {qwords[0], qwords[1], qwords[2], qwords[3]},
                   {}};
  if (!pl->descriptors)
    for (size_t i = 0; i < operands.size(); ++i) {
      BP_SDK_CHECK(operands[i].address != 0, BP_ERR_INTERNAL, "vulkan: an operand outside the device's memory blocks");
      pc.addr[i] = operands[i].address + operands[i].offset;
    }

  // Fold the grid so every dimension stays within maxComputeWorkGroupCount.
  const auto* mx = dev_->props.limits.maxComputeWorkGroupCount;
  uint64_t gx = groups, gy = groups ? 1 : 0, gz = groups ? 1 : 0;
  if (gx > mx[0]) {
    gx = mx[0];
    gy = (groups + gx - 1) / gx;
    if (gy > mx[1]) {
      gz = (gy + mx[1] - 1) / mx[1];
      gy = mx[1];
      BP_SDK_CHECK(gz <= mx[2], BP_ERR_INVALID_ARGUMENT, std::string("vulkan: ") + op + ": grid too large");
    }
  }
  PendingDispatch& d = s.pending.emplace_back();
  d.pipeline = pl;
  if (pl->descriptors)
    for (size_t i = 0; i < operands.size(); ++i) d.operands[i] = {operands[i].buffer, operands[i].offset, operands[i].range};
  d.set = set;
  d.groups[0] = static_cast<uint32_t>(gx);
  d.groups[1] = static_cast<uint32_t>(gy);
  d.groups[2] = static_cast<uint32_t>(gz);
  d.barrier = barrier;
  d.pc = pc;
  s.op_names.push_back(op);
  s.dispatch_calls.push_back(s.n_calls - 1);
  ++s.n_dispatches;
}

// The command buffer of the run, from its pending dispatches. The pipelines
// are waited for first without Device::mu (their compiles run on worker
// threads and on this one; other threads keep recording meanwhile); a
// pipeline that failed to compile is the error of the first call using it.
void Exec::record(Stream& s, std::unique_lock<std::mutex>& lock) {
  std::vector<const Pipeline*> need;
  for (const auto& d : s.pending)
    if (std::find(need.begin(), need.end(), d.pipeline) == need.end()) need.push_back(d.pipeline);
  lock.unlock();
  const Pipeline* failed = nullptr;
  std::string message;
  bp_status_code code = BP_OK;
  const auto t0 = std::chrono::steady_clock::now();
  size_t waited = 0;
  for (const Pipeline* p : need) {
    try {
      waited += dev_->pipelines.wait(*p) ? 1 : 0;
    } catch (const Error& e) {
      failed = p;
      code = e.code();
      message = e.what();
      break;
    } catch (...) {
      lock.lock();
      throw;
    }
  }
  if (waited) {
    // A first run: how long its compiles held up the submit.
    try {
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.2f",
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      log(BP_LOG_DEBUG, "vulkan: " + dev_->name + ": the run waited " + ms + " ms for " + std::to_string(waited) +
                            " of its " + std::to_string(need.size()) + " pipelines to compile");
    } catch (...) {
    }
  }
  lock.lock();
  if (failed) {
    int64_t call = -1;
    for (size_t i = 0; i < s.pending.size(); ++i)
      if (s.pending[i].pipeline == failed) {
        call = s.dispatch_calls[i];
        break;
      }
    throw DataError(code, message, call);
  }

  vk_check(vkResetCommandPool(dev_->dev, s.pool, 0), "vkResetCommandPool");
  VkCommandBufferBeginInfo bi{};
  bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  vk_check(vkBeginCommandBuffer(s.cmd, &bi), "vkBeginCommandBuffer");
  const bool stamps = s.timed && timestamp_mask_ != 0 && s.n_calls > 0;
  const auto n_queries = static_cast<uint32_t>(s.n_calls + 1);
  if (stamps && s.query_capacity < n_queries) {
    if (s.queries) vkDestroyQueryPool(dev_->dev, s.queries, nullptr);
    s.queries = VK_NULL_HANDLE;
    s.query_capacity = 0;
    uint32_t cap = 64;
    while (cap < n_queries) cap *= 2;
    VkQueryPoolCreateInfo qi{};
    qi.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO;
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = cap;
    VkResult r = vkCreateQueryPool(dev_->dev, &qi, nullptr, &s.queries);
    if (r != VK_SUCCESS) {
      vkEndCommandBuffer(s.cmd);
      vk_check(r, "vkCreateQueryPool");
    }
    s.query_capacity = cap;
  }
  if (stamps) vkCmdResetQueryPool(s.cmd, s.queries, 0, n_queries);
  // Make writes of earlier submissions (other streams, transfers) visible.
  VkMemoryBarrier mb{};
  mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  vkCmdPipelineBarrier(s.cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT;
  // One timestamp where the run starts and one after each kernel call's
  // last dispatch: a call's time is from the end of the work before it to
  // the end of its own (calls that overlap on the device split the time
  // between them rather than count it twice).
  if (stamps) vkCmdWriteTimestamp(s.cmd, kTimestampStage, s.queries, 0);
  for (size_t i = 0; i < s.pending.size(); ++i) {
    const PendingDispatch& d = s.pending[i];
    const int64_t call = s.dispatch_calls[i];
    if (d.barrier)
      vkCmdPipelineBarrier(s.cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1,
                           &mb, 0, nullptr, 0, nullptr);
    // Pipeline and set bound for every dispatch: keeping the bound set across
    // a pipeline change (valid: every pipeline has the one layout) gave wrong
    // results on lavapipe 22.3 (the transposed-operand binary path's test).
    vkCmdBindPipeline(s.cmd, VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline->pipeline);
    vkCmdBindDescriptorSets(s.cmd, VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline->layout, 0, 1, &d.set, 0, nullptr);
    if (d.pipeline->descriptors) {
      VkWriteDescriptorSet w[kMaxOperands]{};
      const uint32_t n = d.pipeline->n_operands;
      for (uint32_t k = 0; k < n; ++k) {
        w[k].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        w[k].dstBinding = k;
        w[k].descriptorCount = 1;
        w[k].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w[k].pBufferInfo = &d.operands[k];
      }
      dev_->push_descriptor_set(s.cmd, VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline->layout, 1, n, w);
    }
    vkCmdPushConstants(s.cmd, d.pipeline->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof d.pc, &d.pc);
    vkCmdDispatch(s.cmd, d.groups[0], d.groups[1], d.groups[2]);
    if (stamps && (i + 1 == s.pending.size() || s.dispatch_calls[i + 1] != call))
      vkCmdWriteTimestamp(s.cmd, kTimestampStage, s.queries, static_cast<uint32_t>(call + 1));
  }
  // The run's writes made visible to the host, which reads mapped and
  // imported memory once the fence signals (the fence alone makes them
  // available, not visible, on a device whose caches are not the host's).
  VkMemoryBarrier hb{};
  hb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
  hb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
  hb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(s.cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &hb, 0, nullptr,
                       0, nullptr);
  vk_check(vkEndCommandBuffer(s.cmd), "vkEndCommandBuffer");
}

// Each kernel call's time: its timestamp less the one before (the run's
// start or the last call that dispatched); 0 for a call that dispatched
// nothing, UINT64_MAX where the device wrote no timestamp.
std::vector<uint64_t> Exec::read_times(Stream& s) {
  const auto n = static_cast<size_t>(s.n_calls);
  std::vector<uint64_t> t(n, timestamp_mask_ ? 0 : UINT64_MAX);
  if (timestamp_mask_ && n > 0 && s.n_dispatches > 0) {
    std::vector<char> has(n, 0);
    for (int64_t c : s.dispatch_calls)
      if (c >= 0 && static_cast<size_t>(c) < n) has[static_cast<size_t>(c)] = 1;
    // {value, availability} per query; never waits (the fence has signalled,
    // and a call without dispatches has no timestamp written).
    std::vector<uint64_t> raw(2 * (n + 1));
    const VkResult r =
        vkGetQueryPoolResults(dev_->dev, s.queries, 0, static_cast<uint32_t>(n + 1), raw.size() * 8, raw.data(), 16,
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WITH_AVAILABILITY_BIT);
    const bool ok = r == VK_SUCCESS || r == VK_NOT_READY;
    size_t prev = 0;  // the query of the previous end
    for (size_t c = 0; c < n; ++c) {
      if (!has[c]) continue;
      const uint64_t* a = &raw[2 * prev];
      const uint64_t* b = &raw[2 * (c + 1)];
      if (!ok || !a[1] || !b[1]) {
        t[c] = UINT64_MAX;
      } else {
        const uint64_t ticks = (b[0] - a[0]) & timestamp_mask_;
        t[c] = static_cast<uint64_t>(static_cast<double>(ticks) * timestamp_period_ + 0.5);
      }
      prev = c + 1;
    }
  }
  return t;
}

void Exec::synchronize(bp_run* run, uint64_t* out_ns, size_t n_calls) {
  std::unique_lock<std::mutex> lock(dev_->mu);
  Stream& s = stream(run, "synchronize");
  // The stream goes back to the idle list however this ends.
  struct Release {
    Exec* e;
    Stream* s;
    ~Release() {
      e->active_.erase(s);
      e->idle_.push_back(s);
    }
  };
  s.recording = false;
  // A timed run's times go to out_ns, n_calls of them (the host's count).
  auto give_times = [&](const std::vector<uint64_t>& t) {
    if (!out_ns) return;
    BP_SDK_CHECK(t.size() == n_calls, BP_ERR_INVALID_ARGUMENT,
                 "vulkan: synchronize: n_calls is " + std::to_string(n_calls) + ", the timed run made " +
                     std::to_string(t.size()) + " kernel calls (" + dev_->name + ")");
    if (n_calls) std::memcpy(out_ns, t.data(), n_calls * sizeof(uint64_t));
  };
  if (s.n_dispatches == 0) {
    Release rel{this, &s};
    if (s.timed) give_times(std::vector<uint64_t>(static_cast<size_t>(s.n_calls), 0));
    return;
  }
  try {
    record(s, lock);
  } catch (...) {
    Release rel{this, &s};
    throw;
  }
  VkSubmitInfo si{};
  si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
  si.commandBufferCount = 1;
  si.pCommandBuffers = &s.cmd;
  VkResult r = vkQueueSubmit(dev_->queue, 1, &si, s.fence);
  if (r != VK_SUCCESS) {
    Release rel{this, &s};
    vk_check(r, "vkQueueSubmit");
  }
  // Wait without the device lock so other threads keep recording.
  lock.unlock();
  r = vkWaitForFences(dev_->dev, 1, &s.fence, VK_TRUE, UINT64_MAX);
  lock.lock();
  Release rel{this, &s};
  vkResetFences(dev_->dev, 1, &s.fence);
  vk_check(r, "vkWaitForFences");
  const auto* e = static_cast<const uint32_t*>(s.errors.ptr);
  const uint32_t flags = e[0], first = e[1];
  if (flags) {
    const char* op = first < s.op_names.size() ? s.op_names[first] : "kernel";
    std::string what;
    if (flags & kErrIndex) what = "index out of range";
    else if (flags & kErrDivZero) what = "integer division by zero";
    else if (flags & kErrCast) what = "cast of NaN, infinity or an out-of-range value to an integer type";
    else if (flags & kErrEmpty) what = "reduction over an empty dim";
    else what = "device error";
    const int64_t call = first < s.dispatch_calls.size() ? s.dispatch_calls[first] : -1;
    throw DataError(BP_ERR_OUT_OF_RANGE, std::string(op) + ": " + what + " (vulkan, " + dev_->name + ")",
                    call >= 0 ? call : -1);
  }
  if (s.timed) give_times(read_times(s));
}

}  // namespace backplane::vulkan
