// fused_elementwise on Vulkan (fused.cpp): a GLSL compute shader generated
// per program and compiled at run time with glslang's C++ library, its
// SPIR-V kept in the on-disk cache folder (Pipelines::cache_dir()).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::vulkan {

class Registry;

// The embedded text of a shaders/*.glsl include (gen/glsl_sources.cpp,
// cmake/embed_glsl.cmake); nullptr when not embedded.
const char* find_glsl(std::string_view name);

// The SPIR-V of generated shader `name` with GLSL `source`: from `dir`'s
// disk cache when a valid entry is there (checked: size, magic, the hash of
// the source and glslang version, a hash of the words), else compiled with
// glslang and written there atomically (temporary file, then rename). `dir`
// empty: no disk cache. `device` names the device in log lines (debug level:
// "compiled" / "loaded from the disk cache"; info: a cache file ignored).
// Throws a bp error naming the shader when glslang refuses the source.
std::vector<uint32_t> generated_spirv(const std::string& device, const std::string& name, const std::string& source,
                                      const std::string& dir);

void register_fused(Registry& r);

}  // namespace backplane::vulkan
