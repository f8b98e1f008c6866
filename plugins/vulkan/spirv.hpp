// The embedded SPIR-V of shaders/, generated at build time
// (cmake/embed_spirv.cmake writes the tables; find_spirv looks them up).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace backplane::vulkan {

struct SpirvBlob {
  const char* name;  // "<family>_<variant>", e.g. "binary_f32"
  const uint32_t* words;
  size_t n_words;
};

const SpirvBlob* find_spirv(std::string_view name);
// Identifies the embedded shaders of this build (names, sizes, sampled words).
uint64_t spirv_fingerprint();

}  // namespace backplane::vulkan
