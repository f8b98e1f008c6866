#include "pipelines.hpp"

#include "cache_file.hpp"
#include "device.hpp"
#include "fused.hpp"
#include "spirv.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace backplane::vulkan {

namespace {

// The on-disk pipeline cache file: this header, then the driver's
// vkGetPipelineCacheData bytes. Anything that does not match this device,
// driver and plugin build, or whose data does not check out, is ignored.
struct CacheHeader {
  char magic[8];  // "BPVKPC\0\1"
  uint32_t vendor_id;
  uint32_t device_id;
  uint32_t driver_version;
  uint32_t header_size;  // sizeof(CacheHeader)
  uint8_t uuid[VK_UUID_SIZE];  // pipelineCacheUUID
  uint64_t build;              // spirv_fingerprint() of the plugin build
  uint64_t data_size;
  uint64_t data_hash;  // FNV-1a of the data
};
constexpr char kCacheMagic[8] = {'B', 'P', 'V', 'K', 'P', 'C', '\0', '\1'};

}  // namespace

// $BACKPLANE_CACHE_DIR (`off`: no disk cache), else $XDG_CACHE_HOME/backplane,
// else ~/.cache/backplane; empty when disabled (also by the older
// BACKPLANE_VULKAN_PIPELINE_CACHE=0) or when there is no such place.
std::string Pipelines::cache_dir() {
  namespace fs = std::filesystem;
  if (const char* e = std::getenv("BACKPLANE_VULKAN_PIPELINE_CACHE");
      e && (std::strcmp(e, "0") == 0 || std::strcmp(e, "off") == 0))
    return {};
  if (const char* c = std::getenv("BACKPLANE_CACHE_DIR"); c && *c) {
    if (std::strcmp(c, "off") == 0) return {};
    return c;
  }
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "backplane").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "backplane").string();
  return {};
}

std::string Pipelines::cache_path() const {
  namespace fs = std::filesystem;
  const std::string d = cache_dir();
  if (d.empty()) return {};
  const fs::path dir(d);
  // One file per device and driver (pipelineCacheUUID names the driver build).
  std::string uuid;
  char hex[3];
  for (uint8_t b : dev_->props.pipelineCacheUUID) {
    std::snprintf(hex, sizeof hex, "%02x", b);
    uuid += hex;
  }
  char name[160];
  std::snprintf(name, sizeof name, "vulkan-%04x-%04x-%s.pipelines", dev_->props.vendorID, dev_->props.deviceID,
                uuid.c_str());
  return (dir / name).string();
}

void Pipelines::init(Device* dev) {
  dev_ = dev;
  // Compile workers: one fewer than the cores (the thread that waits for a
  // pipeline compiles too), at most 7, started as compiles are queued;
  // BACKPLANE_VULKAN_COMPILE_THREADS=N sets N (0: each pipeline compiled when
  // a kernel first asks for it, on the kernel's thread).
  const unsigned hw = std::max(2u, std::thread::hardware_concurrency());
  max_workers_ = std::min<size_t>(hw - 1, 7);
  if (const char* e = std::getenv("BACKPLANE_VULKAN_COMPILE_THREADS"); e && *e) {
    char* end = nullptr;
    const long n = std::strtol(e, &end, 10);
    if (end && *end == '\0' && n >= 0) max_workers_ = static_cast<size_t>(std::min(n, 64L));
  }
  if (const char* e = std::getenv("BACKPLANE_VULKAN_ADDRESSING"); e && std::strcmp(e, "addresses") == 0)
    addressing_ = Addressing::addresses;
  path_ = cache_path();
  std::vector<char> data;
  if (!path_.empty()) data = load_cache();
  VkPipelineCacheCreateInfo pci{};
  pci.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO;
  pci.initialDataSize = data.size();
  pci.pInitialData = data.empty() ? nullptr : data.data();
  if (vkCreatePipelineCache(dev->dev, &pci, nullptr, &cache_) != VK_SUCCESS) {
    if (!data.empty()) log(BP_LOG_INFO, "vulkan: " + dev->name + ": the driver refused the pipeline cache " + path_);
    pci.initialDataSize = 0;
    pci.pInitialData = nullptr;
    vk_check(vkCreatePipelineCache(dev->dev, &pci, nullptr, &cache_), "vkCreatePipelineCache");
  }
}

// The cached driver data, or nothing (with a log line saying why, unless
// there is no file yet).
std::vector<char> Pipelines::load_cache() const {
  const std::vector<char> file = read_cache_file(path_);
  if (file.empty()) return {};
  const auto ignore = [&](const std::string& why) {
    log(BP_LOG_INFO, "vulkan: " + dev_->name + ": ignoring the pipeline cache " + path_ + ": " + why);
    return std::vector<char>();
  };
  CacheHeader h{};
  if (file.size() < sizeof h) return ignore("truncated header");
  std::memcpy(&h, file.data(), sizeof h);
  if (std::memcmp(h.magic, kCacheMagic, sizeof kCacheMagic) != 0 || h.header_size != sizeof h)
    return ignore("not a Backplane pipeline cache");
  if (h.vendor_id != dev_->props.vendorID || h.device_id != dev_->props.deviceID ||
      h.driver_version != dev_->props.driverVersion ||
      std::memcmp(h.uuid, dev_->props.pipelineCacheUUID, VK_UUID_SIZE) != 0)
    return ignore("written for another device or driver");
  if (h.build != spirv_fingerprint()) return ignore("written by another build of the plugin");
  if (h.data_size != file.size() - sizeof h) return ignore("truncated or padded data");
  if (h.data_hash != fnv1a(file.data() + sizeof h, file.size() - sizeof h)) return ignore("corrupt data");
  // The driver's own header must name this device too (Vulkan spec, 10.7.4).
  const char* d = file.data() + sizeof h;
  uint32_t vk[4] = {};
  if (h.data_size < 16 + VK_UUID_SIZE) return ignore("truncated driver data");
  std::memcpy(vk, d, sizeof vk);
  if (vk[0] < 16 + VK_UUID_SIZE || vk[1] != VK_PIPELINE_CACHE_HEADER_VERSION_ONE || vk[2] != dev_->props.vendorID ||
      vk[3] != dev_->props.deviceID || std::memcmp(d + 16, dev_->props.pipelineCacheUUID, VK_UUID_SIZE) != 0)
    return ignore("driver data for another device");
  return std::vector<char>(file.begin() + static_cast<ptrdiff_t>(sizeof h), file.end());
}

// Writes the cache atomically: a temporary file in the same folder, then a
// rename over the old one, so a reader sees the old file or the new, never
// half of one. Best effort: failing costs compile time on the next run only.
void Pipelines::save_cache() {
  VkDevice d = dev_->dev;
  size_t size = 0;
  if (vkGetPipelineCacheData(d, cache_, &size, nullptr) != VK_SUCCESS || size == 0) return;
  std::vector<char> data(size);
  if (vkGetPipelineCacheData(d, cache_, &size, data.data()) != VK_SUCCESS) return;
  data.resize(size);
  CacheHeader h{};
  std::memcpy(h.magic, kCacheMagic, sizeof kCacheMagic);
  h.vendor_id = dev_->props.vendorID;
  h.device_id = dev_->props.deviceID;
  h.driver_version = dev_->props.driverVersion;
  h.header_size = sizeof h;
  std::memcpy(h.uuid, dev_->props.pipelineCacheUUID, VK_UUID_SIZE);
  h.build = spirv_fingerprint();
  h.data_size = size;
  h.data_hash = fnv1a(data.data(), size);
  if (!write_cache_file(path_, &h, sizeof h, data.data(), size))
    log(BP_LOG_INFO, "vulkan: " + dev_->name + ": could not write the pipeline cache " + path_);
}

Pipelines::~Pipelines() { stop_workers(); }

// Ends the workers after the compiles they are running; drops queued ones.
void Pipelines::stop_workers() {
  {
    std::lock_guard<std::mutex> lk(jobs_mu_);
    stop_ = true;
    queue_.clear();
  }
  jobs_cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
  std::lock_guard<std::mutex> lk(jobs_mu_);
  stop_ = false;
}

void Pipelines::destroy() {
  if (!dev_) return;
  stop_workers();
  VkDevice d = dev_->dev;
  if (cache_ && cache_dirty_ && !path_.empty()) {
    try {
      save_cache();
    } catch (...) {
    }
  }
  for (auto& [k, p] : pipelines_)
    if (p->pipeline) vkDestroyPipeline(d, p->pipeline, nullptr);
  pipelines_.clear();
  for (auto& [k, m] : modules_) vkDestroyShaderModule(d, m, nullptr);
  modules_.clear();
  generated_.clear();
  if (layout_.pipeline) vkDestroyPipelineLayout(d, layout_.pipeline, nullptr);
  if (layout_.set) vkDestroyDescriptorSetLayout(d, layout_.set, nullptr);
  if (layout_.operands) vkDestroyDescriptorSetLayout(d, layout_.operands, nullptr);
  layout_ = Layout{};
  if (cache_) vkDestroyPipelineCache(d, cache_, nullptr);
  cache_ = VK_NULL_HANDLE;
  dev_ = nullptr;
}

const Pipelines::Layout& Pipelines::layout() {
  if (layout_.pipeline) return layout_;
  VkDescriptorSetLayoutBinding b[kMaxOperands]{};
  for (uint32_t i = 0; i < kMaxOperands; ++i) {
    b[i].binding = i;
    b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b[i].descriptorCount = 1;
    b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  Layout l;
  const auto release = [&] {
    if (l.set) vkDestroyDescriptorSetLayout(dev_->dev, l.set, nullptr);
    if (l.operands) vkDestroyDescriptorSetLayout(dev_->dev, l.operands, nullptr);
  };
  VkDescriptorSetLayoutCreateInfo dci{};
  dci.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
  dci.bindingCount = 2;
  dci.pBindings = b;
  vk_check(vkCreateDescriptorSetLayout(dev_->dev, &dci, nullptr, &l.set), "vkCreateDescriptorSetLayout");
  if (dev_->push_descriptor_set) {
    dci.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
    dci.bindingCount = kMaxOperands;
    VkResult r = vkCreateDescriptorSetLayout(dev_->dev, &dci, nullptr, &l.operands);
    if (r != VK_SUCCESS) {
      release();
      vk_check(r, "vkCreateDescriptorSetLayout (operands)");
    }
  }
  const VkDescriptorSetLayout sets[2] = {l.set, l.operands};
  VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(PushConstants)};
  VkPipelineLayoutCreateInfo pli{};
  pli.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
  pli.setLayoutCount = l.operands ? 2 : 1;
  pli.pSetLayouts = sets;
  pli.pushConstantRangeCount = 1;
  pli.pPushConstantRanges = &pcr;
  VkResult r = vkCreatePipelineLayout(dev_->dev, &pli, nullptr, &l.pipeline);
  if (r != VK_SUCCESS) {
    release();
    vk_check(r, "vkCreatePipelineLayout");
  }
  layout_ = l;
  return layout_;
}

bool Pipelines::shader_available(const std::string& shader) const {
  return generated_.count(shader) != 0 || find_spirv(shader) != nullptr;
}

void Pipelines::add_generated(const std::string& shader, std::string source) {
  generated_.emplace(shader, std::move(source));
}

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
  if (auto g = generated_.find(shader); g != generated_.end()) {
    // fused.cpp: the disk cache's copy, else glslang's compile (here, at the
    // first request: in a preparing run, that is the plan's compile()).
    file_words = generated_spirv(dev_->name, shader, g->second, cache_dir());
  }
  if (!file_words.empty()) {
    ci.codeSize = file_words.size() * 4;
    ci.pCode = file_words.data();
  } else {
    const SpirvBlob* blob = find_spirv(shader);
    BP_SDK_CHECK(blob != nullptr, BP_ERR_INTERNAL, "vulkan: no embedded shader " + shader);
    ci.codeSize = blob->n_words * 4;
    ci.pCode = blob->words;
  }
  VkShaderModule m = VK_NULL_HANDLE;
  vk_check(vkCreateShaderModule(dev_->dev, &ci, nullptr, &m), "vkCreateShaderModule");
  modules_[shader] = m;
  return m;
}

Pipeline& Pipelines::entry(const std::string& shader, const std::vector<int32_t>& spec, uint32_t n_operands) {
  auto key = std::make_pair(shader, spec);
  auto it = pipelines_.find(key);
  if (it != pipelines_.end()) {
    BP_SDK_CHECK(it->second->n_operands == n_operands, BP_ERR_INTERNAL, "vulkan: operand count mismatch for " + shader);
    return *it->second;
  }
  BP_SDK_CHECK(n_operands <= kMaxOperands, BP_ERR_INTERNAL, "vulkan: too many operands for " + shader);
  auto p = std::make_unique<Pipeline>();
  p->layout = layout().pipeline;
  p->n_operands = n_operands;
  p->shader = shader;
  p->spec = spec;
  Pipeline& ref = *p;
  pipelines_.emplace(std::move(key), std::move(p));
  return ref;
}

const Pipeline& Pipelines::get(const std::string& shader, const std::vector<int32_t>& spec, uint32_t n_operands) {
  Pipeline& p = entry(shader, spec, n_operands);
  // The descriptor twin, looked for once (a module of its own, built for
  // every shader but the casts).
  if (!p.looked_for_dsc) {
    p.looked_for_dsc = true;
    if (layout().operands && addressing_ != Addressing::addresses) {
      const std::string twin = shader + "_dsc";
      if (shader_available(twin)) {
        Pipeline& d = entry(twin, spec, n_operands);
        d.descriptors = true;
        d.looked_for_dsc = true;
        p.dsc = &d;
      }
    }
  }
  return p;
}

void Pipelines::request(const Pipeline& target) {
  auto& p = const_cast<Pipeline&>(target);  // every Pipeline is this object's own
  {
    std::lock_guard<std::mutex> lk(jobs_mu_);
    BP_SDK_CHECK(p.state != Pipeline::State::failed, p.error_code, p.error);
    if (p.state != Pipeline::State::idle) return;
  }
  p.module = module(p.shader);
  cache_dirty_ = true;
  if (max_workers_ == 0) {
    // BACKPLANE_VULKAN_COMPILE_THREADS=0: compiled here and now.
    compile(p);
    std::lock_guard<std::mutex> lk(jobs_mu_);
    BP_SDK_CHECK(p.state == Pipeline::State::ready, p.error_code, p.error);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(jobs_mu_);
    p.state = Pipeline::State::queued;
    queue_.push_back(&p);
    if (workers_.size() < std::min(max_workers_, queue_.size())) {
      try {
        workers_.emplace_back([this] { worker(); });
      } catch (...) {
        // No thread: the waiting thread compiles it.
      }
    }
  }
  jobs_cv_.notify_one();
}

void Pipelines::worker() {
  std::unique_lock<std::mutex> lk(jobs_mu_);
  for (;;) {
    jobs_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Pipeline* p = queue_.front();
    queue_.pop_front();
    p->state = Pipeline::State::compiling;
    lk.unlock();
    compile(*p);
    lk.lock();
    done_cv_.notify_all();
  }
}

bool Pipelines::wait(const Pipeline& target) {
  std::unique_lock<std::mutex> lk(jobs_mu_);
  BP_SDK_CHECK(target.state != Pipeline::State::idle, BP_ERR_INTERNAL,
             "vulkan: pipeline " + target.shader + " waited for but never requested");
  const bool waited = target.state != Pipeline::State::ready;
  while (target.state != Pipeline::State::ready && target.state != Pipeline::State::failed) {
    if (queue_.empty()) {
      done_cv_.wait(lk);
      continue;
    }
    // Compile here rather than wait: the target if still queued, else the
    // oldest queued one.
    auto it = std::find(queue_.begin(), queue_.end(), &target);
    if (it == queue_.end()) it = queue_.begin();
    Pipeline* p = *it;
    queue_.erase(it);
    p->state = Pipeline::State::compiling;
    lk.unlock();
    compile(*p);
    lk.lock();
    done_cv_.notify_all();
  }
  BP_SDK_CHECK(target.state == Pipeline::State::ready, target.error_code, target.error);
  return waited;
}

// Runs without jobs_mu_ and without Device::mu: the module, layout and
// cache are made before and live until destroy() (which joins the workers
// first); vkCreateComputePipelines is thread-safe on distinct pipelines and
// the pipeline cache synchronizes itself. Sets the state under jobs_mu_.
void Pipelines::compile(Pipeline& p) {
  std::vector<VkSpecializationMapEntry> entries(p.spec.size());
  for (uint32_t i = 0; i < p.spec.size(); ++i) entries[i] = {i, i * 4u, 4};
  VkSpecializationInfo si{};
  si.mapEntryCount = static_cast<uint32_t>(entries.size());
  si.pMapEntries = entries.data();
  si.dataSize = p.spec.size() * 4;
  si.pData = p.spec.data();
  VkComputePipelineCreateInfo ci{};
  ci.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = p.module;
  ci.stage.pName = "main";
  ci.stage.pSpecializationInfo = p.spec.empty() ? nullptr : &si;
  ci.layout = p.layout;
  const auto t0 = std::chrono::steady_clock::now();
  VkPipeline handle = VK_NULL_HANDLE;
  const VkResult r = vkCreateComputePipelines(dev_->dev, cache_, 1, &ci, nullptr, &handle);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::string error;
  bp_status_code code = BP_OK;
  if (r != VK_SUCCESS) {
    try {
      vk_check(r, ("vkCreateComputePipelines (" + p.shader + ")").c_str());
    } catch (const Error& e) {
      code = e.code();
      error = e.what();
    } catch (...) {
      code = BP_ERR_OUT_OF_MEMORY;
    }
  } else {
    // The driver's compile is most of a first run's time (plugins/vulkan/README.md).
    try {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f", ms);
      log(BP_LOG_DEBUG, "vulkan: " + dev_->name + ": pipeline " + p.shader + " created in " + buf + " ms");
    } catch (...) {
    }
  }
  std::lock_guard<std::mutex> lk(jobs_mu_);
  p.pipeline = handle;
  if (code == BP_OK) {
    p.state = Pipeline::State::ready;
  } else {
    p.state = Pipeline::State::failed;
    p.error_code = code;
    try {
      p.error = std::move(error);
    } catch (...) {
    }
  }
}

}  // namespace backplane::vulkan
