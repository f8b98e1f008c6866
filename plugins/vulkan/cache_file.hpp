// The plugin's files in its cache folder (the pipeline cache, the generated
// shaders' SPIR-V): read whole, written atomically, checked by FNV-1a.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace backplane::vulkan {

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

// The file's bytes; empty when it cannot be opened (there is none yet).
std::vector<char> read_cache_file(const std::string& path);

// `header` then `body` into `path`, through a temporary file in the same
// folder renamed over it (a reader never sees half a file), the folder made
// first. False when anything failed (nothing is left behind).
bool write_cache_file(const std::string& path, const void* header, size_t header_bytes, const void* body,
                      size_t body_bytes);

}  // namespace backplane::vulkan
