// backplane_vulkan_raw: what a hand-written Vulkan program pays for the work
// of the Vulkan plugin's bench cases, written against the Vulkan API alone (no
// Backplane code), so that `backplane bench --device vulkanN` can report the
// plugin's overhead as a ratio measured in the same run.
//
//   add_16M          c = a + b on 16M f32 (3 x 64 MiB buffers): one dispatch of
//                    a minimal vec4 shader (workgroup 256), one submit + fence
//                    wait per run. GB/s counts 3 x 64 MiB.
//   chain100_add_4K  y0 = x + x, y_i = y_{i-1} + x for i < 100 on 4K f32, as the
//                    plugin's case: 100 dispatches recorded into one command
//                    buffer, a compute->compute barrier before each dependent
//                    dispatch, one submit + fence wait. Per dispatch = run / 100.
//   empty_submit     an empty command buffer submitted + fence wait.
//   roof_copy        c = a on 16M f32 (vec4 loads and stores, workgroup 256):
//                    the device's bandwidth roof. GB/s counts 2 x 64 MiB.
//   roof_fma         4 independent vec4 FMA chains of 128 steps in each of 1M
//                    invocations (bench/vulkan_raw_roof.comp): the device's f32
//                    compute roof. GFLOP/s counts 2 flops per lane per FMA.
// `backplane bench --device vulkanN` divides each case's rate by the roof
// that bounds it (GB/s by roof_copy, GFLOP/s by roof_fma).
//
// Every run is recorded again (reset pool, begin, ..., end), submitted once
// and waited for, as the plugin does for each plan execution; descriptor sets
// and the pipeline are made once, as a hand-written program would. Timing is
// that of `backplane bench`: a warm-up run, batches of runs of at least 1 ms,
// until --min-time seconds and 5 batches, median of the batch means.
//
// Devices are numbered as the plugin numbers them (vulkan0, vulkan1, ...): the
// physical devices with Vulkan 1.1 or later, in enumeration order.
//
//   backplane_vulkan_raw [--device N] [--case NAME]... [--min-time S] [--json]
#include <vulkan/vulkan.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "median_time.hpp"
#include "vulkan_raw_add.spv.h"   // raw_add_spv[]: bench/vulkan_raw_add.comp, compiled at build time
#include "vulkan_raw_roof.spv.h"  // raw_roof_spv[]: bench/vulkan_raw_roof.comp

namespace {

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void vk(VkResult r, const char* what) {
  if (r != VK_SUCCESS) throw Failure(std::string(what) + " failed (VkResult " + std::to_string(r) + ")");
}

constexpr uint32_t kWG = 256;
constexpr uint32_t kBigN = 16u << 20;  // add_16M elements
constexpr uint32_t kSmallN = 4096;     // chain100_add_4K elements
constexpr int kChain = 100;
constexpr uint32_t kFmaInvocations = 1u << 20;  // roof_fma
constexpr int kFmaIters = 128;
constexpr double kFmaFlops = 2.0 * 4 * 4 * kFmaIters * kFmaInvocations;

struct Buffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;
};

struct Result {
  std::string name;
  double seconds = 0;
};

class Raw {
 public:
  // big: also the add_16M buffers (3 x 64 MiB, filled at start).
  Raw(uint32_t index, bool big) : big_wanted_(big) { create(index); }
  ~Raw() { destroy(); }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;

  std::string device_name;
  std::string api_version;

  // One run of each case: record, submit, wait.
  void run_add() {
    record([&](VkCommandBuffer c) { add(c, set_big_, kBigN); });
  }
  void run_chain() {
    record([&](VkCommandBuffer c) {
      for (int i = 0; i < kChain; ++i) {
        if (i > 0) compute_barrier(c);  // reads what the previous dispatch wrote
        add(c, i == 0 ? set_chain_[0] : set_chain_[1 + (i - 1) % 2], kSmallN);
      }
    });
  }
  void run_empty() {
    record([](VkCommandBuffer) {});
  }
  void run_copy() {
    record([&](VkCommandBuffer c) { dispatch(c, roof_copy_, set_big_, kBigN / 4); });
  }
  void run_fma() {
    record([&](VkCommandBuffer c) { dispatch(c, roof_fma_, set_big_, kFmaInvocations); });
  }

  // Reads back the first element of the add's output (after one run, when the
  // add's buffers exist) and of the chain's last output: 1 + 2 and 101 * 1.
  void verify() {
    record([&](VkCommandBuffer c) {
      VkBufferCopy r0{0, 0, 4}, r1{0, 4, 4};
      if (big_wanted_) vkCmdCopyBuffer(c, big_[2].buffer, check_.buffer, 1, &r0);
      // dispatch 99 is odd: it writes small_[2] (see create()).
      vkCmdCopyBuffer(c, small_[2].buffer, check_.buffer, 1, &r1);
      VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, VK_ACCESS_TRANSFER_WRITE_BIT,
                         VK_ACCESS_HOST_READ_BIT};
      vkCmdPipelineBarrier(c, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0,
                           nullptr, 0, nullptr);
    });
    float got[2];
    std::memcpy(got, check_.mapped, sizeof got);
    if (big_wanted_ && got[0] != 3.0f)
      throw Failure("wrong result: add gave " + std::to_string(got[0]) + ", want 3");
    if (got[1] != 101.0f) throw Failure("wrong result: chain gave " + std::to_string(got[1]) + ", want 101");
  }

 private:
  bool big_wanted_ = false;
  VkInstance instance_ = VK_NULL_HANDLE;
  VkPhysicalDevice phys_ = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties mem_{};
  VkDevice dev_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t family_ = 0;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkShaderModule module_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPipeline pipeline_ = VK_NULL_HANDLE;
  VkShaderModule roof_module_ = VK_NULL_HANDLE;
  VkPipeline roof_copy_ = VK_NULL_HANDLE, roof_fma_ = VK_NULL_HANDLE;
  VkDescriptorPool desc_pool_ = VK_NULL_HANDLE;
  Buffer big_[3], small_[3], check_;
  VkDescriptorSet set_big_ = VK_NULL_HANDLE;
  VkDescriptorSet set_chain_[3] = {};

  void create(uint32_t index) {
    VkApplicationInfo app{};
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "backplane_vulkan_raw";
    app.apiVersion = VK_API_VERSION_1_1;
    VkInstanceCreateInfo ici{};
    ici.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ici.pApplicationInfo = &app;
    vk(vkCreateInstance(&ici, nullptr, &instance_), "vkCreateInstance");

    uint32_t n = 0;
    vk(vkEnumeratePhysicalDevices(instance_, &n, nullptr), "vkEnumeratePhysicalDevices");
    std::vector<VkPhysicalDevice> all(n);
    if (n) vk(vkEnumeratePhysicalDevices(instance_, &n, all.data()), "vkEnumeratePhysicalDevices");
    std::vector<VkPhysicalDevice> usable;
    for (auto pd : all) {
      VkPhysicalDeviceProperties p{};
      vkGetPhysicalDeviceProperties(pd, &p);
      if (p.apiVersion >= VK_API_VERSION_1_1) usable.push_back(pd);
    }
    if (index >= usable.size())
      throw Failure("no Vulkan 1.1 device " + std::to_string(index) + " (" + std::to_string(usable.size()) +
                    " found)");
    phys_ = usable[index];
    VkPhysicalDeviceProperties props{};
    vkGetPhysicalDeviceProperties(phys_, &props);
    vkGetPhysicalDeviceMemoryProperties(phys_, &mem_);
    device_name = props.deviceName;
    api_version = std::to_string(VK_API_VERSION_MAJOR(props.apiVersion)) + "." +
                  std::to_string(VK_API_VERSION_MINOR(props.apiVersion)) + "." +
                  std::to_string(VK_API_VERSION_PATCH(props.apiVersion));
    if (kBigN / 4 / kWG > props.limits.maxComputeWorkGroupCount[0])
      throw Failure("grid too large for the device");
    if (uint64_t{kBigN} * 4 > props.limits.maxStorageBufferRange)
      throw Failure("64 MiB exceeds maxStorageBufferRange");

    // A compute queue, dedicated if there is one (as the plugin picks).
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(phys_, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> qf(nq);
    vkGetPhysicalDeviceQueueFamilyProperties(phys_, &nq, qf.data());
    bool found = false;
    for (int pass = 0; pass < 2 && !found; ++pass)
      for (uint32_t i = 0; i < nq && !found; ++i)
        if ((qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) &&
            (pass == 1 || !(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT))) {
          family_ = i;
          found = true;
        }
    if (!found) throw Failure("no compute queue");
    const float priority = 1.0f;
    VkDeviceQueueCreateInfo qci{};
    qci.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    qci.queueFamilyIndex = family_;
    qci.queueCount = 1;
    qci.pQueuePriorities = &priority;
    VkDeviceCreateInfo dci{};
    dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    vk(vkCreateDevice(phys_, &dci, nullptr, &dev_), "vkCreateDevice");
    vkGetDeviceQueue(dev_, family_, 0, &queue_);

    VkCommandPoolCreateInfo pci{};
    pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pci.queueFamilyIndex = family_;
    vk(vkCreateCommandPool(dev_, &pci, nullptr, &pool_), "vkCreateCommandPool");
    VkCommandBufferAllocateInfo cai{};
    cai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cai.commandPool = pool_;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    vk(vkAllocateCommandBuffers(dev_, &cai, &cmd_), "vkAllocateCommandBuffers");
    VkFenceCreateInfo fci{};
    fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    vk(vkCreateFence(dev_, &fci, nullptr, &fence_), "vkCreateFence");

    // The pipeline: three storage buffers, 4 bytes of push constants.
    VkShaderModuleCreateInfo smi{};
    smi.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
    smi.codeSize = sizeof raw_add_spv;
    smi.pCode = raw_add_spv;
    vk(vkCreateShaderModule(dev_, &smi, nullptr, &module_), "vkCreateShaderModule");
    VkDescriptorSetLayoutBinding b[3]{};
    for (uint32_t i = 0; i < 3; ++i) {
      b[i].binding = i;
      b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      b[i].descriptorCount = 1;
      b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo sli{};
    sli.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
    sli.bindingCount = 3;
    sli.pBindings = b;
    vk(vkCreateDescriptorSetLayout(dev_, &sli, nullptr, &set_layout_), "vkCreateDescriptorSetLayout");
    VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, 4};
    VkPipelineLayoutCreateInfo pli{};
    pli.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
    pli.setLayoutCount = 1;
    pli.pSetLayouts = &set_layout_;
    pli.pushConstantRangeCount = 1;
    pli.pPushConstantRanges = &pcr;
    vk(vkCreatePipelineLayout(dev_, &pli, nullptr, &layout_), "vkCreatePipelineLayout");
    VkComputePipelineCreateInfo cpi{};
    cpi.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
    cpi.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    cpi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    cpi.stage.module = module_;
    cpi.stage.pName = "main";
    cpi.layout = layout_;
    vk(vkCreateComputePipelines(dev_, VK_NULL_HANDLE, 1, &cpi, nullptr, &pipeline_),
       "vkCreateComputePipelines");
    // The roofs: same layout, the mode a specialization constant.
    smi.codeSize = sizeof raw_roof_spv;
    smi.pCode = raw_roof_spv;
    vk(vkCreateShaderModule(dev_, &smi, nullptr, &roof_module_), "vkCreateShaderModule");
    for (uint32_t mode = 0; mode < 2; ++mode) {
      const uint32_t spec[2] = {mode, static_cast<uint32_t>(kFmaIters)};
      const VkSpecializationMapEntry entries[2] = {{0, 0, 4}, {1, 4, 4}};
      VkSpecializationInfo si{2, entries, sizeof spec, spec};
      cpi.stage.module = roof_module_;
      cpi.stage.pSpecializationInfo = &si;
      vk(vkCreateComputePipelines(dev_, VK_NULL_HANDLE, 1, &cpi, nullptr, mode ? &roof_fma_ : &roof_copy_),
         "vkCreateComputePipelines (roof)");
    }

    // Buffers: a, b, c of 16M f32; x, p, q of 4K f32; a small readback buffer.
    if (big_wanted_)
      for (auto& buf : big_) buf = make_buffer(uint64_t{kBigN} * 4, false);
    for (auto& buf : small_) buf = make_buffer(uint64_t{kSmallN} * 4, false);
    check_ = make_buffer(64, true);

    VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 12};
    VkDescriptorPoolCreateInfo dpi{};
    dpi.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
    dpi.maxSets = 4;
    dpi.poolSizeCount = 1;
    dpi.pPoolSizes = &ps;
    vk(vkCreateDescriptorPool(dev_, &dpi, nullptr, &desc_pool_), "vkCreateDescriptorPool");
    if (big_wanted_) set_big_ = make_set(big_[0], big_[1], big_[2]);
    // The chain ping-pongs between p (small_[1]) and q (small_[2]):
    // dispatch 0: p = x + x; odd i: q = p + x; even i > 0: p = q + x.
    set_chain_[0] = make_set(small_[0], small_[0], small_[1]);
    set_chain_[1] = make_set(small_[1], small_[0], small_[2]);
    set_chain_[2] = make_set(small_[2], small_[0], small_[1]);

    // Inputs: a = 1, b = 2, x = 1 (vkCmdFillBuffer works on any memory type).
    record([&](VkCommandBuffer c) {
      const float one = 1.0f, two = 2.0f;
      uint32_t one_bits, two_bits;
      std::memcpy(&one_bits, &one, 4);
      std::memcpy(&two_bits, &two, 4);
      if (big_wanted_) {
        vkCmdFillBuffer(c, big_[0].buffer, 0, VK_WHOLE_SIZE, one_bits);
        vkCmdFillBuffer(c, big_[1].buffer, 0, VK_WHOLE_SIZE, two_bits);
      }
      vkCmdFillBuffer(c, small_[0].buffer, 0, VK_WHOLE_SIZE, one_bits);
    });
  }

  void destroy() {
    if (dev_) {
      vkDeviceWaitIdle(dev_);
      if (desc_pool_) vkDestroyDescriptorPool(dev_, desc_pool_, nullptr);
      for (Buffer* buf : {&big_[0], &big_[1], &big_[2], &small_[0], &small_[1], &small_[2], &check_}) {
        if (buf->buffer) vkDestroyBuffer(dev_, buf->buffer, nullptr);
        if (buf->memory) vkFreeMemory(dev_, buf->memory, nullptr);
      }
      if (pipeline_) vkDestroyPipeline(dev_, pipeline_, nullptr);
      if (roof_copy_) vkDestroyPipeline(dev_, roof_copy_, nullptr);
      if (roof_fma_) vkDestroyPipeline(dev_, roof_fma_, nullptr);
      if (roof_module_) vkDestroyShaderModule(dev_, roof_module_, nullptr);
      if (layout_) vkDestroyPipelineLayout(dev_, layout_, nullptr);
      if (set_layout_) vkDestroyDescriptorSetLayout(dev_, set_layout_, nullptr);
      if (module_) vkDestroyShaderModule(dev_, module_, nullptr);
      if (fence_) vkDestroyFence(dev_, fence_, nullptr);
      if (pool_) vkDestroyCommandPool(dev_, pool_, nullptr);
      vkDestroyDevice(dev_, nullptr);
    }
    if (instance_) vkDestroyInstance(instance_, nullptr);
  }

  Buffer make_buffer(uint64_t size, bool host) {
    Buffer buf;
    VkBufferCreateInfo bci{};
    bci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bci.size = size;
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    vk(vkCreateBuffer(dev_, &bci, nullptr, &buf.buffer), "vkCreateBuffer");
    VkMemoryRequirements req{};
    vkGetBufferMemoryRequirements(dev_, buf.buffer, &req);
    const VkMemoryPropertyFlags want =
        host ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
             : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    uint32_t type = UINT32_MAX;
    for (uint32_t t = 0; t < mem_.memoryTypeCount && type == UINT32_MAX; ++t)
      if ((req.memoryTypeBits & (1u << t)) && (mem_.memoryTypes[t].propertyFlags & want) == want) type = t;
    for (uint32_t t = 0; t < mem_.memoryTypeCount && type == UINT32_MAX && !host; ++t)
      if (req.memoryTypeBits & (1u << t)) type = t;
    if (type == UINT32_MAX) throw Failure("no suitable memory type");
    VkMemoryAllocateInfo mai{};
    mai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    mai.allocationSize = req.size;
    mai.memoryTypeIndex = type;
    vk(vkAllocateMemory(dev_, &mai, nullptr, &buf.memory), "vkAllocateMemory");
    vk(vkBindBufferMemory(dev_, buf.buffer, buf.memory, 0), "vkBindBufferMemory");
    if (host) vk(vkMapMemory(dev_, buf.memory, 0, VK_WHOLE_SIZE, 0, &buf.mapped), "vkMapMemory");
    return buf;
  }

  VkDescriptorSet make_set(const Buffer& a, const Buffer& b, const Buffer& c) {
    VkDescriptorSetAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
    ai.descriptorPool = desc_pool_;
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &set_layout_;
    VkDescriptorSet set = VK_NULL_HANDLE;
    vk(vkAllocateDescriptorSets(dev_, &ai, &set), "vkAllocateDescriptorSets");
    VkDescriptorBufferInfo info[3] = {
        {a.buffer, 0, VK_WHOLE_SIZE}, {b.buffer, 0, VK_WHOLE_SIZE}, {c.buffer, 0, VK_WHOLE_SIZE}};
    VkWriteDescriptorSet w[3]{};
    for (uint32_t i = 0; i < 3; ++i) {
      w[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
      w[i].dstSet = set;
      w[i].dstBinding = i;
      w[i].descriptorCount = 1;
      w[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      w[i].pBufferInfo = &info[i];
    }
    vkUpdateDescriptorSets(dev_, 3, w, 0, nullptr);
    return set;
  }

  static void compute_barrier(VkCommandBuffer c) {
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr,
                       VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT,
                       VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
    vkCmdPipelineBarrier(c, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1,
                         &mb, 0, nullptr, 0, nullptr);
  }

  void add(VkCommandBuffer c, VkDescriptorSet set, uint32_t n) { dispatch(c, pipeline_, set, n / 4); }

  // n4 invocations (4-vectors) of `pipeline`.
  void dispatch(VkCommandBuffer c, VkPipeline pipeline, VkDescriptorSet set, uint32_t n4) {
    vkCmdBindPipeline(c, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
    vkCmdBindDescriptorSets(c, VK_PIPELINE_BIND_POINT_COMPUTE, layout_, 0, 1, &set, 0, nullptr);
    vkCmdPushConstants(c, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, 4, &n4);
    vkCmdDispatch(c, (n4 + kWG - 1) / kWG, 1, 1);
  }

  // Records a command buffer (after a barrier that makes earlier submissions'
  // writes visible, as any program reusing buffers across submits needs),
  // submits it and waits for it.
  void record(const std::function<void(VkCommandBuffer)>& body) {
    vk(vkResetCommandPool(dev_, pool_, 0), "vkResetCommandPool");
    VkCommandBufferBeginInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    vk(vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer");
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr,
                       VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                       VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                           VK_ACCESS_TRANSFER_WRITE_BIT};
    vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0,
                         nullptr, 0, nullptr);
    body(cmd_);
    vk(vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
    VkSubmitInfo si{};
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd_;
    vk(vkQueueSubmit(queue_, 1, &si, fence_), "vkQueueSubmit");
    vk(vkWaitForFences(dev_, 1, &fence_, VK_TRUE, UINT64_MAX), "vkWaitForFences");
    vk(vkResetFences(dev_, 1, &fence_), "vkResetFences");
  }
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

std::string human_time(double t) {
  char buf[32];
  if (t < 1e-3)
    std::snprintf(buf, sizeof buf, "%.3f us", t * 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.3f ms", t * 1e3);
  return buf;
}

int usage(const char* why) {
  FILE* out = why ? stderr : stdout;
  if (why) std::fprintf(stderr, "backplane_vulkan_raw: %s\n", why);
  std::fprintf(out,
               "usage: backplane_vulkan_raw [--device N] [--case add_16M|chain100_add_4K|empty_submit|roof_copy|roof_fma]... "
               "[--min-time SECONDS] [--json]\n");
  return why ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t device = 0;
  double min_time = 0.3;
  bool json = false;
  std::vector<std::string> cases;
  const std::vector<std::string> known = {"add_16M", "chain100_add_4K", "empty_submit", "roof_copy", "roof_fma"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Failure(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--json")
        json = true;
      else if (a == "--device")
        device = static_cast<uint32_t>(std::stoul(value()));
      else if (a == "--min-time")
        min_time = std::stod(value());
      else if (a == "--case") {
        cases.push_back(value());
        if (std::find(known.begin(), known.end(), cases.back()) == known.end())
          return usage(("unknown case " + cases.back()).c_str());
      } else if (a == "--help" || a == "-h")
        return usage(nullptr);
      else
        return usage(("unknown argument " + a).c_str());
    } catch (const std::exception& e) {
      return usage(e.what());
    }
  }
  if (cases.empty()) cases = known;
  auto wanted = [&](const char* name) { return std::find(cases.begin(), cases.end(), name) != cases.end(); };

  try {
    const bool big = wanted("add_16M") || wanted("roof_copy") || wanted("roof_fma");
    Raw raw(device, big);
    if (big) raw.run_add();
    raw.run_chain();
    raw.verify();
    std::vector<Result> results;
    if (wanted("add_16M")) results.push_back({"add_16M", backplane::bench::median_seconds([&] { raw.run_add(); }, min_time)});
    if (wanted("chain100_add_4K"))
      results.push_back({"chain100_add_4K", backplane::bench::median_seconds([&] { raw.run_chain(); }, min_time)});
    if (wanted("empty_submit"))
      results.push_back({"empty_submit", backplane::bench::median_seconds([&] { raw.run_empty(); }, min_time)});
    if (wanted("roof_copy"))
      results.push_back({"roof_copy", backplane::bench::median_seconds([&] { raw.run_copy(); }, min_time)});
    if (wanted("roof_fma"))
      results.push_back({"roof_fma", backplane::bench::median_seconds([&] { raw.run_fma(); }, min_time)});

    const double add_bytes = 3.0 * 4 * kBigN;
    const double copy_bytes = 2.0 * 4 * kBigN;
    if (json) {
      std::printf(
          "{\n  \"program\": \"backplane_vulkan_raw\",\n  \"device_index\": %u,\n  \"device\": %s,\n"
          "  \"api_version\": \"%s\",\n  \"cases\": [",
          device, json_string(raw.device_name).c_str(), raw.api_version.c_str());
      for (size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        std::printf("%s\n    {\"case\": \"%s\", \"seconds\": %.9g", i ? "," : "", r.name.c_str(), r.seconds);
        if (r.name == "add_16M")
          std::printf(", \"bytes\": %.0f, \"gbps\": %.6g", add_bytes, add_bytes / r.seconds / 1e9);
        if (r.name == "roof_copy")
          std::printf(", \"bytes\": %.0f, \"gbps\": %.6g", copy_bytes, copy_bytes / r.seconds / 1e9);
        if (r.name == "roof_fma")
          std::printf(", \"flops\": %.0f, \"gflops\": %.6g", kFmaFlops, kFmaFlops / r.seconds / 1e9);
        if (r.name == "chain100_add_4K")
          std::printf(", \"dispatches\": %d, \"per_dispatch_seconds\": %.9g", kChain, r.seconds / kChain);
        std::printf("}");
      }
      std::printf("\n  ]\n}\n");
    } else {
      std::printf("raw Vulkan baseline, device %u: %s (Vulkan %s)\n%-26s %12s  %s\n", device,
                  raw.device_name.c_str(), raw.api_version.c_str(), "case", "time", "rate");
      for (const Result& r : results) {
        std::string rate;
        char buf[64];
        if (r.name == "add_16M")
          std::snprintf(buf, sizeof buf, "%.2f GB/s", add_bytes / r.seconds / 1e9), rate = buf;
        if (r.name == "chain100_add_4K") rate = human_time(r.seconds / kChain) + " per dispatch";
        if (r.name == "roof_copy")
          std::snprintf(buf, sizeof buf, "%.2f GB/s", copy_bytes / r.seconds / 1e9), rate = buf;
        if (r.name == "roof_fma")
          std::snprintf(buf, sizeof buf, "%.2f GFLOP/s", kFmaFlops / r.seconds / 1e9), rate = buf;
        std::printf("%-26s %12s  %s\n", r.name.c_str(), human_time(r.seconds).c_str(), rate.c_str());
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "backplane_vulkan_raw: %s\n", e.what());
    return 1;
  }
}
