// Derived forms of constant inputs (ABI 2.0 BP_INPUT_CONSTANT): weights in
// the layout a kernel computes from (oneDNN's blocked formats, Winograd's
// transformed filters), made at a plan's first run and kept until the
// host frees the weights' buffer (buffer_free calls drop()). A plan's
// weights are then packed once, not at every run, as ONNX Runtime and
// oneDNN's own graph API do.
#pragma once

#include "kernels.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace backplane::cpu::packed {

// Whether kernels keep packed forms at all (BACKPLANE_CPU_PACK=0 at
// initialize turns it off, to compare; on by default).
extern std::atomic<bool> g_enabled;

// Whether input i of the call keeps its bytes until its buffer is freed
// (and packing is on).
inline bool constant(const Call& c, size_t i) {
  const bp_kernel_context* k = c.ctx;
  return g_enabled.load(std::memory_order_relaxed) && k && k->struct_size >= offsetof(bp_kernel_context, input_flags) + sizeof(k->input_flags) && k->input_flags &&
         i < c.n_in && (k->input_flags[i] & BP_INPUT_CONSTANT) && c.in[i].buffer_handle != 0;
}

// The object kept for (input i's buffer and offset, key), or nullptr.
std::shared_ptr<const void> find(const Call& c, size_t i, const std::string& key);
// Keeps obj for (input i's buffer and offset, key) and returns what is kept
// (another thread's, when it got there first).
std::shared_ptr<const void> keep(const Call& c, size_t i, const std::string& key, std::shared_ptr<const void> obj);

// The kept T for input i under `key`, made by make() (returning
// std::shared_ptr<T>) when there is none yet. Only for constant inputs.
template <class T, class F> std::shared_ptr<const T> get(const Call& c, size_t i, const std::string& key, F&& make) {
  if (auto hit = find(c, i, key)) return std::static_pointer_cast<const T>(hit);
  std::shared_ptr<const void> made = std::shared_ptr<const T>(make());
  return std::static_pointer_cast<const T>(keep(c, i, key, std::move(made)));
}

// Forgets everything kept for a buffer (its buffer_free).
void drop(uint64_t handle) noexcept;
// Forgets everything (shutdown).
void clear() noexcept;
// How many objects are kept (tests).
size_t count() noexcept;

}  // namespace backplane::cpu::packed
