// The Vulkan instance and one bp_device per physical device.
#pragma once

#include "exec.hpp"
#include "memory.hpp"
#include "pipelines.hpp"
#include "vk_common.hpp"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace backplane::vulkan {

// Optional device features the shaders use.
struct Features {
  bool storage16 = false;  // storageBuffer16BitAccess: f16, bf16, i16
  bool storage8 = false;   // storageBuffer8BitAccess: i8, u8, bool
  bool float64 = false;    // shaderFloat64
  bool int64 = false;      // shaderInt64 (i64 arithmetic; i64 indices need none)
  bool subgroup_shuffle = false;  // compute-stage subgroup shuffles (the _sg reductions)
  uint32_t subgroup_size = 1;     // VkPhysicalDeviceSubgroupProperties::subgroupSize (>= 1)
  // VK_EXT_external_memory_host, enabled: host memory imported as buffers
  // without a copy (buffer_import_host; Memory::import_host).
  bool host_import = false;
};

class Device {
 public:
  Device(VkInstance instance, VkPhysicalDevice phys, uint32_t index);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  std::string name, kind, description;
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice phys = VK_NULL_HANDLE;
  VkDevice dev = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t queue_family = 0;
  uint32_t timestamp_bits = 0;  // that family's timestampValidBits (0: no timestamps)
  VkPhysicalDeviceProperties props{};
  VkPhysicalDeviceMemoryProperties mem_props{};
  // The kernels' forms for CPU devices (lavapipe): the direct ones unless
  // BACKPLANE_VULKAN_FORMS=gpu asks for the workgroup forms a GPU runs, so
  // those shaders are checked on a machine without a GPU.
  bool direct_forms = false;
  Features features;
  // vkGetBufferDeviceAddress (core 1.2) or its KHR alias.
  PFN_vkGetBufferDeviceAddress get_buffer_address = nullptr;
  // vkCmdPushDescriptorSetKHR (VK_KHR_push_descriptor), or null: then every
  // operand is passed by device address (no descriptor modules).
  PFN_vkCmdPushDescriptorSetKHR push_descriptor_set = nullptr;
  // vkGetMemoryHostPointerPropertiesEXT, when features.host_import.
  PFN_vkGetMemoryHostPointerPropertiesEXT get_host_pointer_properties = nullptr;
  // VkPhysicalDeviceExternalMemoryHostPropertiesEXT::minImportedHostPointerAlignment
  // (0 without the extension).
  uint64_t host_import_alignment = 0;

  std::mutex mu;  // one caller at a time per device
  Memory memory;
  Pipelines pipelines;
  Exec exec;

  bp_device* handle() { return reinterpret_cast<bp_device*>(this); }
  static Device& from(bp_device* d) {
    BP_SDK_CHECK(d != nullptr, BP_ERR_INVALID_ARGUMENT, "vulkan: null device");
    return *reinterpret_cast<Device*>(d);
  }
  // Whether the device has what a dtype needs (storage width, 64-bit types).
  bool supports_dtype(bp_dtype dt) const;
};

// Process-wide state, created by the plugin's initialize() and destroyed by
// its shutdown(). Held through a plain pointer, never a static object: a host
// that keeps its Runtime in a static shuts the plugin down at process exit,
// after the plugin's own static destructors have run, so no static destructor
// may own (or do) Vulkan work.
class Context {
 public:
  // The live context, or nullptr outside initialize() .. shutdown().
  static Context* current();
  // Creates the context once (a second call while it lives does nothing).
  static void create(const bp_host_api* host);
  // Destroys the context (devices, then the instance); safe when there is none.
  static void destroy();

  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  uint32_t device_count() const { return static_cast<uint32_t>(devices_.size()); }
  Device& device(uint32_t i);

 private:
  Context() = default;
  void initialize();

  VkInstance instance_ = VK_NULL_HANDLE;
  std::vector<std::unique_ptr<Device>> devices_;
};

}  // namespace backplane::vulkan
