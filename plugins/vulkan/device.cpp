#include "device.hpp"

#include <cstdlib>
#include <cstring>

namespace backplane::vulkan {

namespace {

const bp_host_api* g_host = nullptr;

bool has_extension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  for (const auto& e : exts)
    if (std::strcmp(e.extensionName, name) == 0) return true;
  return false;
}

}  // namespace

const bp_host_api* host_api() { return g_host; }

void log(bp_log_level level, const std::string& message) {
  if (g_host && g_host->struct_size >= offsetof(bp_host_api, log) + sizeof(g_host->log) && g_host->log)
    g_host->log(g_host->host_ctx, level, sdk::to_bp(message));
}

const char* vk_result_name(VkResult r) {
  switch (r) {
#define BPVK_CASE(x) \
  case x:            \
    return #x;
    BPVK_CASE(VK_SUCCESS)
    BPVK_CASE(VK_NOT_READY)
    BPVK_CASE(VK_TIMEOUT)
    BPVK_CASE(VK_INCOMPLETE)
    BPVK_CASE(VK_ERROR_OUT_OF_HOST_MEMORY)
    BPVK_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    BPVK_CASE(VK_ERROR_INITIALIZATION_FAILED)
    BPVK_CASE(VK_ERROR_DEVICE_LOST)
    BPVK_CASE(VK_ERROR_MEMORY_MAP_FAILED)
    BPVK_CASE(VK_ERROR_LAYER_NOT_PRESENT)
    BPVK_CASE(VK_ERROR_EXTENSION_NOT_PRESENT)
    BPVK_CASE(VK_ERROR_FEATURE_NOT_PRESENT)
    BPVK_CASE(VK_ERROR_INCOMPATIBLE_DRIVER)
    BPVK_CASE(VK_ERROR_TOO_MANY_OBJECTS)
    BPVK_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED)
    BPVK_CASE(VK_ERROR_FRAGMENTED_POOL)
    BPVK_CASE(VK_ERROR_OUT_OF_POOL_MEMORY)
    BPVK_CASE(VK_ERROR_INVALID_SHADER_NV)
#undef BPVK_CASE
    default:
      return "VkResult(other)";
  }
}

// ---------------------------------------------------------------------------

Device::Device(VkInstance inst, VkPhysicalDevice pd, uint32_t index) : instance(inst), phys(pd) {
  vkGetPhysicalDeviceProperties(phys, &props);
  vkGetPhysicalDeviceMemoryProperties(phys, &mem_props);
  {
    const char* forms = std::getenv("BACKPLANE_VULKAN_FORMS");
    direct_forms = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU && !(forms && std::strcmp(forms, "gpu") == 0);
  }
  name = "vulkan" + std::to_string(index);
  description = props.deviceName;
  switch (props.deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      kind = "cpu";
      break;
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      kind = "gpu";
      break;
    default:
      kind = "accelerator";
  }

  // A queue family that can compute.
  BP_SDK_CHECK(props.limits.maxPushConstantsSize >= sizeof(PushConstants), BP_ERR_UNAVAILABLE,
             "vulkan: " + description + " offers fewer push-constant bytes than the shaders use");

  uint32_t nq = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(phys, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> qf(nq);
  vkGetPhysicalDeviceQueueFamilyProperties(phys, &nq, qf.data());
  bool found = false;
  // Prefer a compute queue without graphics (dedicated compute), else any.
  for (int pass = 0; pass < 2 && !found; ++pass)
    for (uint32_t i = 0; i < nq; ++i) {
      const bool compute = qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT;
      const bool graphics = qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT;
      if (compute && (pass == 1 || !graphics)) {
        queue_family = i;
        timestamp_bits = qf[i].timestampValidBits;
        found = true;
        break;
      }
    }
  BP_SDK_CHECK(found, BP_ERR_UNAVAILABLE, "vulkan: " + description + " has no compute queue");

  uint32_t next = 0;
  vkEnumerateDeviceExtensionProperties(phys, nullptr, &next, nullptr);
  std::vector<VkExtensionProperties> exts(next);
  vkEnumerateDeviceExtensionProperties(phys, nullptr, &next, exts.data());
  const bool api12 = props.apiVersion >= VK_API_VERSION_1_2;
  const bool ext8 = has_extension(exts, VK_KHR_8BIT_STORAGE_EXTENSION_NAME);
  const bool ext_bda = has_extension(exts, VK_KHR_BUFFER_DEVICE_ADDRESS_EXTENSION_NAME);
  BP_SDK_CHECK(api12 || ext_bda, BP_ERR_UNAVAILABLE,
             "vulkan: " + description + " has no buffer device addresses (Vulkan 1.2 or VK_KHR_buffer_device_address)");

  // Query optional features.
  VkPhysicalDevice8BitStorageFeatures f8{};
  f8.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES;
  VkPhysicalDevice16BitStorageFeatures f16{};
  f16.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES;
  VkPhysicalDeviceBufferDeviceAddressFeatures fbda{};
  fbda.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_BUFFER_DEVICE_ADDRESS_FEATURES;
  VkPhysicalDeviceFeatures2 f2{};
  f2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
  f2.pNext = &fbda;
  fbda.pNext = &f16;
  if (api12 || ext8) f16.pNext = &f8;
  vkGetPhysicalDeviceFeatures2(phys, &f2);
  BP_SDK_CHECK(fbda.bufferDeviceAddress, BP_ERR_UNAVAILABLE,
             "vulkan: " + description + " lacks the bufferDeviceAddress feature");

  // Enable only what the shaders use.
  VkPhysicalDevice8BitStorageFeatures e8{};
  e8.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES;
  e8.storageBuffer8BitAccess = f8.storageBuffer8BitAccess;
  e8.uniformAndStorageBuffer8BitAccess = f8.uniformAndStorageBuffer8BitAccess;
  VkPhysicalDevice16BitStorageFeatures e16{};
  e16.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES;
  e16.storageBuffer16BitAccess = f16.storageBuffer16BitAccess;
  e16.uniformAndStorageBuffer16BitAccess = f16.uniformAndStorageBuffer16BitAccess;
  VkPhysicalDeviceFeatures2 e2{};
  e2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
  e2.features.shaderFloat64 = f2.features.shaderFloat64;
  e2.features.shaderInt64 = f2.features.shaderInt64;
  e2.features.shaderInt16 = f2.features.shaderInt16;
  // Operands are addressed by buffer device address (shaders/dtypes.glsl).
  VkPhysicalDeviceBufferDeviceAddressFeatures ebda{};
  ebda.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_BUFFER_DEVICE_ADDRESS_FEATURES;
  ebda.bufferDeviceAddress = VK_TRUE;
  e2.pNext = &ebda;
  ebda.pNext = &e16;
  std::vector<const char*> enabled_exts;
  if (!api12) enabled_exts.push_back(VK_KHR_BUFFER_DEVICE_ADDRESS_EXTENSION_NAME);
  if (api12 || ext8) {
    e16.pNext = &e8;
    if (!api12) enabled_exts.push_back(VK_KHR_8BIT_STORAGE_EXTENSION_NAME);
  }
  features.storage16 = f16.storageBuffer16BitAccess;
  features.storage8 = (api12 || ext8) && f8.storageBuffer8BitAccess;
  features.float64 = f2.features.shaderFloat64;
  features.int64 = f2.features.shaderInt64;
  // Subgroups, and host memory imported in place (buffer_import_host: the
  // extension needs VK_KHR_external_memory, core in 1.1, the plugin's
  // minimum): one properties query, the host-pointer block chained only
  // where the extension is there.
  {
    const bool host_ext = has_extension(exts, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
    VkPhysicalDeviceExternalMemoryHostPropertiesEXT hp{};
    hp.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT;
    VkPhysicalDeviceSubgroupProperties sg{};
    sg.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES;
    sg.pNext = host_ext ? &hp : nullptr;
    VkPhysicalDeviceProperties2 p2{};
    p2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
    p2.pNext = &sg;
    vkGetPhysicalDeviceProperties2(phys, &p2);
    features.subgroup_shuffle = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                                (sg.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) &&
                                (sg.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT);
    features.subgroup_size = std::max<uint32_t>(sg.subgroupSize, 1);
    const uint64_t a = hp.minImportedHostPointerAlignment;
    if (host_ext && a != 0 && (a & (a - 1)) == 0) {
      enabled_exts.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
      features.host_import = true;
      host_import_alignment = a;
    }
  }

  // Operands within maxStorageBufferRange are pushed as descriptors
  // (pipelines.hpp): on lavapipe a streaming add ran ~1.4x faster than
  // through device addresses.
  const bool push_ext = has_extension(exts, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
  if (push_ext) enabled_exts.push_back(VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);

  const float priority = 1.0f;
  VkDeviceQueueCreateInfo qci{};
  qci.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
  qci.queueFamilyIndex = queue_family;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;
  VkDeviceCreateInfo dci{};
  dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
  dci.pNext = &e2;
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  dci.enabledExtensionCount = static_cast<uint32_t>(enabled_exts.size());
  dci.ppEnabledExtensionNames = enabled_exts.data();
  vk_check(vkCreateDevice(phys, &dci, nullptr, &dev), "vkCreateDevice");
  vkGetDeviceQueue(dev, queue_family, 0, &queue);
  get_buffer_address = reinterpret_cast<PFN_vkGetBufferDeviceAddress>(
      vkGetDeviceProcAddr(dev, api12 ? "vkGetBufferDeviceAddress" : "vkGetBufferDeviceAddressKHR"));
  if (!get_buffer_address) {
    vkDestroyDevice(dev, nullptr);
    dev = VK_NULL_HANDLE;
    fail(BP_ERR_UNAVAILABLE, "vulkan: " + description + ": no vkGetBufferDeviceAddress");
  }

  if (push_ext)
    push_descriptor_set = reinterpret_cast<PFN_vkCmdPushDescriptorSetKHR>(
        vkGetDeviceProcAddr(dev, "vkCmdPushDescriptorSetKHR"));
  if (features.host_import) {
    get_host_pointer_properties = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
        vkGetDeviceProcAddr(dev, "vkGetMemoryHostPointerPropertiesEXT"));
    if (!get_host_pointer_properties) features.host_import = false;
  }

  try {
    memory.init(this);
    pipelines.init(this);
    exec.init(this);
  } catch (...) {
    exec.destroy();
    pipelines.destroy();
    memory.destroy();
    vkDestroyDevice(dev, nullptr);
    throw;
  }
}

Device::~Device() {
  if (dev) vkDeviceWaitIdle(dev);
  exec.destroy();
  pipelines.destroy();
  memory.destroy();
  if (dev) vkDestroyDevice(dev, nullptr);
}

bool Device::supports_dtype(bp_dtype dt) const {
  switch (dt) {
    case BP_DTYPE_F16:
    case BP_DTYPE_BF16:
    case BP_DTYPE_I16:
      return features.storage16;
    case BP_DTYPE_I8:
    case BP_DTYPE_U8:
    case BP_DTYPE_BOOL:
      return features.storage8;
    case BP_DTYPE_F64:
      return features.float64;
    case BP_DTYPE_I64:
      return features.int64;
    default:
      return true;
  }
}

// ---------------------------------------------------------------------------

namespace {
// Trivially destructible: nothing runs here at process exit.
Context* g_context = nullptr;
}  // namespace

Context* Context::current() { return g_context; }

void Context::create(const bp_host_api* host) {
  if (g_context) return;
  g_host = host;
  std::unique_ptr<Context> c(new Context());
  try {
    c->initialize();
  } catch (...) {
    c.reset();  // devices, then the instance
    g_host = nullptr;
    throw;
  }
  g_context = c.release();
}

void Context::destroy() {
  delete g_context;
  g_context = nullptr;
  g_host = nullptr;
}

Context::~Context() {
  devices_.clear();
  if (instance_) vkDestroyInstance(instance_, nullptr);
}

void Context::initialize() {
  uint32_t api = VK_API_VERSION_1_1;
  auto enum_version =
      reinterpret_cast<PFN_vkEnumerateInstanceVersion>(vkGetInstanceProcAddr(nullptr, "vkEnumerateInstanceVersion"));
  if (enum_version) {
    uint32_t v = 0;
    if (enum_version(&v) == VK_SUCCESS && v >= VK_API_VERSION_1_2) api = VK_API_VERSION_1_2;
  }
  VkApplicationInfo app{};
  app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
  app.pApplicationName = "backplane";
  app.pEngineName = "backplane-vulkan";
  app.engineVersion = VK_MAKE_VERSION(0, 1, 0);
  app.apiVersion = api;
  VkInstanceCreateInfo ici{};
  ici.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
  ici.pApplicationInfo = &app;
  VkResult r = vkCreateInstance(&ici, nullptr, &instance_);
  if (r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_INITIALIZATION_FAILED) {
    // No Vulkan driver: the plugin works, with zero devices.
    log(BP_LOG_INFO, std::string("vulkan: no Vulkan driver (") + vk_result_name(r) + "), no devices");
    instance_ = VK_NULL_HANDLE;
    return;
  }
  vk_check(r, "vkCreateInstance");

  uint32_t n = 0;
  r = vkEnumeratePhysicalDevices(instance_, &n, nullptr);
  std::vector<VkPhysicalDevice> phys(n);
  if (r == VK_SUCCESS && n > 0) r = vkEnumeratePhysicalDevices(instance_, &n, phys.data());
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) n = 0;
  phys.resize(n);
  uint32_t index = 0;
  for (VkPhysicalDevice pd : phys) {
    VkPhysicalDeviceProperties p{};
    vkGetPhysicalDeviceProperties(pd, &p);
    if (p.apiVersion < VK_API_VERSION_1_1) {
      log(BP_LOG_WARNING, std::string("vulkan: skipping ") + p.deviceName + " (Vulkan 1.0 only)");
      continue;
    }
    try {
      devices_.push_back(std::make_unique<Device>(instance_, pd, index));
      ++index;
    } catch (const Error& e) {
      log(BP_LOG_WARNING, std::string("vulkan: skipping ") + p.deviceName + ": " + e.what());
    }
  }
}

Device& Context::device(uint32_t i) {
  BP_SDK_CHECK(i < devices_.size(), BP_ERR_INVALID_ARGUMENT, "vulkan: no device " + std::to_string(i));
  return *devices_[i];
}

}  // namespace backplane::vulkan
