// Compute pipelines built from the embedded SPIR-V, created once per
// (shader, specialization constants) and cached for the device's lifetime.
// get() does not wait for the driver's compile: it queues it on worker
// threads and returns at once, and the stream waits for the pipeline only
// when it records the command buffer (Exec::synchronize), helping with
// queued compiles meanwhile. So a first run's pipelines compile in parallel
// and while the host records its later calls (plugins/vulkan/README.md,
// "First run").
// A VkPipelineCache per device is loaded from / saved to $BACKPLANE_CACHE_DIR
// (`off`: none), else $XDG_CACHE_HOME/backplane, else ~/.cache/backplane:
// one file per device and driver (vendor/device id, pipelineCacheUUID),
// stamped with the plugin build; anything else found there is ignored with
// a log line.
#pragma once

#include "vk_common.hpp"

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace backplane::vulkan {

class Device;

// Lives as long as the device; `pipeline` is valid once Pipelines::wait()
// returned for it. Nothing is compiled until a dispatch asks for it
// (Pipelines::request): a kernel's pipeline and its descriptor twin are
// found together, and only the one the dispatch's operands allow is built.
struct Pipeline {
  Pipeline() = default;
  Pipeline(const Pipeline&) = delete;  // kernels hold it by reference; streams by pointer
  Pipeline& operator=(const Pipeline&) = delete;

  VkPipeline pipeline = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  uint32_t n_operands = 0;  // operands the shader reads
  // Operands are storage-buffer descriptors pushed into set 1 (a module
  // <shader>_dsc, shaders/dtypes.glsl BP_DESC), else device addresses in pc.addr.
  bool descriptors = false;
  // The same kernel with descriptor operands, where the device pushes
  // descriptors and the module exists (null otherwise, and on the twin).
  const Pipeline* dsc = nullptr;

 private:
  friend class Pipelines;
  enum class State { idle, queued, compiling, ready, failed };
  State state = State::idle;  // guarded by Pipelines::jobs_mu_
  bool looked_for_dsc = false;  // get() looked for the descriptor twin (under Device::mu)
  std::string shader;
  std::vector<int32_t> spec;
  VkShaderModule module = VK_NULL_HANDLE;
  bp_status_code error_code = BP_OK;
  std::string error;
};

// Operands per dispatch (pc.addr in shaders/common.glsl, set 1 bindings).
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
  ~Pipelines();
  // n_operands: operands the shader reads. Finds or makes the pipeline
  // (and its descriptor twin) without compiling anything.
  const Pipeline& get(const std::string& shader, const std::vector<int32_t>& spec, uint32_t n_operands);
  // A dispatch will use `p`: queues its compile if not asked for before and
  // returns without waiting; throws the error of a compile that failed
  // earlier. Under Device::mu.
  void request(const Pipeline& p);
  // Waits until `p` is compiled, compiling queued pipelines on this thread
  // meanwhile; throws its compile error. Thread-safe; needs no Device::mu.
  // Returns whether it was not ready yet.
  bool wait(const Pipeline& p);
  bool shader_available(const std::string& shader) const;
  VkDescriptorSetLayout set_layout() { return layout().set; }
  // A shader generated at run time (fused_elementwise, fused.cpp): its GLSL
  // source, compiled to SPIR-V by glslang (or found in the disk cache) when
  // a dispatch first requests a pipeline of it. Under Device::mu.
  void add_generated(const std::string& shader, std::string source);
  bool has_generated(const std::string& shader) const { return generated_.count(shader) != 0; }
  // The on-disk cache folder: $BACKPLANE_CACHE_DIR (`off`: none), else
  // $XDG_CACHE_HOME/backplane, else ~/.cache/backplane; empty when disabled.
  static std::string cache_dir();

 private:
  struct Layout {
    VkDescriptorSetLayout set = VK_NULL_HANDLE;
    VkDescriptorSetLayout operands = VK_NULL_HANDLE;  // set 1, pushed; null without VK_KHR_push_descriptor
    VkPipelineLayout pipeline = VK_NULL_HANDLE;
  };
  // The one layout of every pipeline: set 0 = {argument ring, error words},
  // set 1 = the operands of descriptor modules (kMaxOperands storage
  // buffers, pushed per dispatch).
  const Layout& layout();
  Pipeline& entry(const std::string& shader, const std::vector<int32_t>& spec, uint32_t n_operands);
  VkShaderModule module(const std::string& shader);
  std::string cache_path() const;
  std::vector<char> load_cache() const;
  void save_cache();
  void compile(Pipeline& p);  // the driver's compile, on any thread
  void worker();
  void stop_workers();

  // BACKPLANE_VULKAN_ADDRESSING=addresses: no descriptor twins (every
  // operand through its device address), to compare or test that path.
  enum class Addressing { automatic, addresses };
  Addressing addressing_ = Addressing::automatic;

  Device* dev_ = nullptr;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::string path_;  // the on-disk cache, empty when disabled
  bool cache_dirty_ = false;
  Layout layout_;
  std::map<std::string, VkShaderModule> modules_;
  std::map<std::string, std::string> generated_;  // generated shaders' GLSL, by name
  std::map<std::pair<std::string, std::vector<int32_t>>, std::unique_ptr<Pipeline>> pipelines_;

  // The compile queue and its workers (started on the first compile).
  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;  // a job was queued, or stop
  std::condition_variable done_cv_;  // a compile finished
  std::deque<Pipeline*> queue_;
  std::vector<std::thread> workers_;
  size_t max_workers_ = 1;
  bool stop_ = false;
};

}  // namespace backplane::vulkan
