#include "pipelines.hpp"

#include "device.hpp"
#include "spirv.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace bpvk {

namespace {

bool disk_cache_enabled() {
  const char* e = std::getenv("BACKPLANE_VULKAN_PIPELINE_CACHE");
  return !(e && (std::strcmp(e, "0") == 0 || std::strcmp(e, "off") == 0));
}

}  // namespace

std::string Pipelines::cache_path() const {
  namespace fs = std::filesystem;
  fs::path dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    dir = fs::path(x) / "backplane";
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    dir = fs::path(h) / ".cache" / "backplane";
  } else {
    return {};
  }
  char name[96];
  std::snprintf(name, sizeof name, "vulkan-%04x-%04x-%08x.pipelines", dev_->props.vendorID, dev_->props.deviceID,
                dev_->props.driverVersion);
  return (dir / name).string();
}

void Pipelines::init(Device* dev) {
  dev_ = dev;
  std::vector<char> data;
  if (disk_cache_enabled()) {
    const std::string path = cache_path();
    std::ifstream in(path, std::ios::binary);
    if (in) data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    // Accept only a header written by this very device and driver.
    if (data.size() >= 32) {
      uint32_t hdr[4];
      std::memcpy(hdr, data.data(), sizeof hdr);
      const bool ok = hdr[0] >= 32 && hdr[1] == VK_PIPELINE_CACHE_HEADER_VERSION_ONE &&
                      hdr[2] == dev->props.vendorID && hdr[3] == dev->props.deviceID &&
                      std::memcmp(data.data() + 16, dev->props.pipelineCacheUUID, VK_UUID_SIZE) == 0;
      if (!ok) data.clear();
    } else {
      data.clear();
    }
  }
  VkPipelineCacheCreateInfo pci{};
  pci.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO;
  pci.initialDataSize = data.size();
  pci.pInitialData = data.empty() ? nullptr : data.data();
  if (vkCreatePipelineCache(dev->dev, &pci, nullptr, &cache_) != VK_SUCCESS) {
    pci.initialDataSize = 0;
    pci.pInitialData = nullptr;
    vk_check(vkCreatePipelineCache(dev->dev, &pci, nullptr, &cache_), "vkCreatePipelineCache");
  }
}

void Pipelines::destroy() {
  if (!dev_) return;
  VkDevice d = dev_->dev;
  if (cache_ && cache_dirty_ && disk_cache_enabled()) {
    // Best effort: a failure to persist only costs compile time next run.
    size_t size = 0;
    if (vkGetPipelineCacheData(d, cache_, &size, nullptr) == VK_SUCCESS && size > 0) {
      std::vector<char> data(size);
      if (vkGetPipelineCacheData(d, cache_, &size, data.data()) == VK_SUCCESS) {
        const std::string path = cache_path();
        if (!path.empty()) {
          std::error_code ec;
          std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
          const std::string tmp = path + ".tmp" + std::to_string(reinterpret_cast<uintptr_t>(this));
          {
            std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
            out.write(data.data(), static_cast<std::streamsize>(size));
          }
          std::filesystem::rename(tmp, path, ec);
          if (ec) std::filesystem::remove(tmp, ec);
        }
      }
    }
  }
  for (auto& [k, p] : pipelines_) vkDestroyPipeline(d, p.pipeline, nullptr);
  pipelines_.clear();
  for (auto& [k, m] : modules_) vkDestroyShaderModule(d, m, nullptr);
  modules_.clear();
  if (layout_.pipeline) vkDestroyPipelineLayout(d, layout_.pipeline, nullptr);
  if (layout_.set) vkDestroyDescriptorSetLayout(d, layout_.set, nullptr);
  layout_ = Layout{};
  if (cache_) vkDestroyPipelineCache(d, cache_, nullptr);
  cache_ = VK_NULL_HANDLE;
  dev_ = nullptr;
}

const Pipelines::Layout& Pipelines::layout() {
  if (layout_.pipeline) return layout_;
  VkDescriptorSetLayoutBinding b[2]{};
  for (uint32_t i = 0; i < 2; ++i) {
    b[i].binding = i;
    b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b[i].descriptorCount = 1;
    b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  Layout l;
  VkDescriptorSetLayoutCreateInfo dci{};
  dci.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
  dci.bindingCount = 2;
  dci.pBindings = b;
  vk_check(vkCreateDescriptorSetLayout(dev_->dev, &dci, nullptr, &l.set), "vkCreateDescriptorSetLayout");
  VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(PushConstants)};
  VkPipelineLayoutCreateInfo pli{};
  pli.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
  pli.setLayoutCount = 1;
  pli.pSetLayouts = &l.set;
  pli.pushConstantRangeCount = 1;
  pli.pPushConstantRanges = &pcr;
  VkResult r = vkCreatePipelineLayout(dev_->dev, &pli, nullptr, &l.pipeline);
  if (r != VK_SUCCESS) {
    vkDestroyDescriptorSetLayout(dev_->dev, l.set, nullptr);
    vk_check(r, "vkCreatePipelineLayout");
  }
  layout_ = l;
  return layout_;
}

bool Pipelines::shader_available(const std::string& shader) const { return find_spirv(shader) != nullptr; }

VkShaderModule Pipelines::module(const std::string& shader) {
  auto it = modules_.find(shader);
  if (it != modules_.end()) return it->second;
  VkShaderModuleCreateInfo ci{};
  ci.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
  // Shader development: BACKPLANE_VULKAN_SHADER_DIR=<dir> loads <dir>/<name>.spv
  // instead of the embedded copy when the file exists.
  std::vector<uint32_t> file_words;
  if (const char* dir = std::getenv("BACKPLANE_VULKAN_SHADER_DIR"); dir && *dir) {
    std::ifstream in(std::string(dir) + "/" + shader + ".spv", std::ios::binary);
    if (in) {
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      file_words.resize(bytes.size() / 4);
      std::memcpy(file_words.data(), bytes.data(), file_words.size() * 4);
    }
  }
  if (!file_words.empty()) {
    ci.codeSize = file_words.size() * 4;
    ci.pCode = file_words.data();
  } else {
    const SpirvBlob* blob = find_spirv(shader);
    BPVK_CHECK(blob != nullptr, BP_ERR_INTERNAL, "vulkan: no embedded shader " + shader);
    ci.codeSize = blob->n_words * 4;
    ci.pCode = blob->words;
  }
  VkShaderModule m = VK_NULL_HANDLE;
  vk_check(vkCreateShaderModule(dev_->dev, &ci, nullptr, &m), "vkCreateShaderModule");
  modules_[shader] = m;
  return m;
}

const Pipeline& Pipelines::get(const std::string& shader, const std::vector<int32_t>& spec, uint32_t n_operands) {
  auto key = std::make_pair(shader, spec);
  auto it = pipelines_.find(key);
  if (it != pipelines_.end()) {
    BPVK_CHECK(it->second.n_operands == n_operands, BP_ERR_INTERNAL,
               "vulkan: operand count mismatch for " + shader);
    return it->second;
  }
  BPVK_CHECK(n_operands <= kMaxOperands, BP_ERR_INTERNAL, "vulkan: too many operands for " + shader);
  const Layout& l = layout();
  std::vector<VkSpecializationMapEntry> entries(spec.size());
  for (uint32_t i = 0; i < spec.size(); ++i) entries[i] = {i, i * 4u, 4};
  VkSpecializationInfo si{};
  si.mapEntryCount = static_cast<uint32_t>(entries.size());
  si.pMapEntries = entries.data();
  si.dataSize = spec.size() * 4;
  si.pData = spec.data();
  VkComputePipelineCreateInfo ci{};
  ci.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = module(shader);
  ci.stage.pName = "main";
  ci.stage.pSpecializationInfo = spec.empty() ? nullptr : &si;
  ci.layout = l.pipeline;
  Pipeline p;
  vk_check(vkCreateComputePipelines(dev_->dev, cache_, 1, &ci, nullptr, &p.pipeline),
           ("vkCreateComputePipelines (" + shader + ")").c_str());
  p.layout = l.pipeline;
  p.set_layout = l.set;
  p.n_operands = n_operands;
  cache_dirty_ = true;
  return pipelines_.emplace(std::move(key), p).first->second;
}

}  // namespace bpvk
