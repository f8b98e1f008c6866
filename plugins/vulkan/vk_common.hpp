// Shared includes and helpers of the Vulkan plugin.
#pragma once

#include <backplane/abi.h>
#include <backplane/sdk/dtype.hpp>
#include <backplane/sdk/plugin.hpp>
#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>

namespace backplane::vulkan {

namespace sdk = backplane::sdk;
using backplane::dtype_name;
using backplane::dtype_size;
using sdk::Error;
using sdk::fail;


const char* vk_result_name(VkResult r);

// Throws an sdk::Error naming the call and the VkResult.
inline void vk_check(VkResult r, const char* what) {
  if (r == VK_SUCCESS) return;
  bp_status_code code = BP_ERR_INTERNAL;
  if (r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY) code = BP_ERR_OUT_OF_MEMORY;
  if (r == VK_ERROR_DEVICE_LOST || r == VK_ERROR_INITIALIZATION_FAILED) code = BP_ERR_UNAVAILABLE;
  fail(code, std::string("vulkan: ") + what + " failed: " + vk_result_name(r));
}

// The host API table given to initialize() (for logging).
const bp_host_api* host_api();
void log(bp_log_level level, const std::string& message);

}  // namespace backplane::vulkan
