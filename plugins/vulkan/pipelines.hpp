// Compute pipelines built from the embedded SPIR-V, created once per
// (shader, specialization constants) and cached for the device's lifetime.
// A VkPipelineCache per device is loaded from / saved to $BACKPLANE_CACHE_DIR
// (`off`: none), else $XDG_CACHE_HOME/backplane, else ~/.cache/backplane:
// one file per device and driver (vendor/device id, pipelineCacheUUID),
// stamped with the plugin build; anything else found there is ignored with
// a log line.
#pragma once

#include "vk_common.hpp"

#include <map>
#include <string>
#include <vector>

namespace bpvk {

class Device;

struct Pipeline {
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  uint32_t n_operands = 0;  // operand addresses the shader reads (pc.addr)
};

// Operands per dispatch (pc.addr in shaders/common.glsl).
constexpr uint32_t kMaxOperands = 8;

// 112 bytes of push constants, see shaders/common.glsl.
struct PushConstants {
  uint32_t base;
  uint32_t n;
  uint32_t id;
  uint32_t extra;
  int32_t p[4];
  int32_t q[4];
  uint64_t addr[kMaxOperands];  // uvec2 in the shaders: low word first
};
static_assert(sizeof(PushConstants) == 112);

class Pipelines {
 public:
  void init(Device* dev);
  void destroy();
  // n_operands: operand addresses the shader reads.
  const Pipeline& get(const std::string& shader, const std::vector<int32_t>& spec, uint32_t n_operands);
  bool shader_available(const std::string& shader) const;
  VkDescriptorSetLayout set_layout() { return layout().set; }

 private:
  struct Layout {
    VkDescriptorSetLayout set = VK_NULL_HANDLE;
    VkPipelineLayout pipeline = VK_NULL_HANDLE;
  };
  // The one layout of every pipeline: set 0 = {argument ring, error words}.
  const Layout& layout();
  VkShaderModule module(const std::string& shader);
  std::string cache_path() const;
  std::vector<char> load_cache() const;
  void save_cache();

  Device* dev_ = nullptr;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::string path_;  // the on-disk cache, empty when disabled
  bool cache_dirty_ = false;
  Layout layout_;
  std::map<std::string, VkShaderModule> modules_;
  std::map<std::pair<std::string, std::vector<int32_t>>, Pipeline> pipelines_;
};

}  // namespace bpvk
