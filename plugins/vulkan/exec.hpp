// Recording and submission. Each run records into its own stream, and the
// stream is the run's handle (bp_run*): the host may have several runs open
// on one device, driven from several threads at once. begin() takes an idle
// stream (or makes one); each kernel appends its dispatches
// (pipeline, push constants, grid, whether a barrier precedes it) to the
// stream's list; synchronize() waits for the pipelines the run needs (their
// compiles run on worker threads meanwhile, Pipelines::wait), records the
// command buffer from the list, submits once, waits on the stream's fence and
// turns the device error words into a bp_error; the stream goes back to the
// idle list. A BP_RUN_TIMED run also writes a timestamp before and after
// each kernel call's dispatches, and synchronize() hands back each call's
// device time. A BP_RUN_PREPARE run (when the host compiles a plan) records
// one empty dispatch (no workgroups) per pipeline: its synchronize() waits
// for their compiles and lets the driver do its first-dispatch work, and
// nothing runs.
//
// Locking: every entry point runs under Device::mu except the fence wait in
// synchronize(), so runs record safely side by side and wait in parallel.
#pragma once

#include "memory.hpp"
#include "pipelines.hpp"

#include <array>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace backplane::vulkan {

class Device;

// Error flags written by shaders (shaders/common.glsl).
enum : uint32_t { kErrIndex = 1, kErrDivZero = 2, kErrCast = 4, kErrEmpty = 8 };

// A data error found on the device (an index out of range, ...), reported by
// synchronize() with the kernel call whose dispatch raised it
// (error_call_index).
class DataError : public Error {
 public:
  DataError(bp_status_code code, const std::string& message, int64_t call) : Error(code, message), call_(call) {}
  int64_t call() const noexcept { return call_; }

 private:
  int64_t call_;
};

// One operand of a dispatch: a window of a memory block's VkBuffer, passed
// to the shader as a storage-buffer descriptor {buffer, offset, range} when
// the kernel's pipeline has a descriptor twin and every operand's window
// fits one (Exec::dispatch), else as the device address of buffer + offset.
struct Binding {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceAddress address = 0;  // of `buffer`'s first byte (operands go to shaders by address)
  uint64_t offset = 0;
  uint64_t range = 0;
  uint64_t handle = 0;  // bp buffer handle, for hazard tracking (0 = none)
  bool write = false;
};

// One recorded dispatch, turned into commands at synchronize().
struct PendingDispatch {
  const Pipeline* pipeline = nullptr;
  VkDescriptorSet set = VK_NULL_HANDLE;
  uint32_t groups[3] = {1, 1, 1};
  bool barrier = false;  // a compute->compute barrier before it (a hazard)
  PushConstants pc{};
  // The operands' windows, pushed as set 1 when pipeline->descriptors.
  VkDescriptorBufferInfo operands[kMaxOperands]{};
};

// What one run records into: a command buffer and everything per run.
struct Stream {
  VkCommandPool pool = VK_NULL_HANDLE;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  bool recording = false;  // begun and not yet synchronized
  bool timed = false;      // BP_RUN_TIMED
  bool prepare = false;    // BP_RUN_PREPARE: empty dispatches only
  std::vector<const Pipeline*> prepared;  // a preparing run's pipelines, each dispatched once
  uint32_t n_dispatches = 0;
  std::vector<PendingDispatch> pending;
  VkQueryPool queries = VK_NULL_HANDLE;  // timestamps: the start, then 1 per kernel call
  uint32_t query_capacity = 0;
  std::vector<VkDescriptorPool> desc_pools;
  std::vector<HostBuffer> ring;         // argument ring chunks
  std::vector<VkDescriptorSet> ring_sets;  // per chunk: {chunk, errors}, made once
  size_t ring_chunk = 0;
  uint64_t ring_used = 0;        // bytes used in the current chunk
  HostBuffer errors;             // {flags, first dispatch id}
  std::vector<const char*> op_names;
  std::vector<int64_t> dispatch_calls;  // per dispatch: its kernel call since begin()
  int64_t n_calls = 0;                  // kernel calls since begin()
  std::unordered_set<uint64_t> written, read;  // since the last barrier
  uint64_t scratch = 0, scratch_size = 0;      // bp buffer handle
  std::vector<uint64_t> retired_scratch;       // freed at the next begin()
};

class Exec {
 public:
  void init(Device* dev);
  void destroy();

  // The caller of these holds Device::mu.
  // A new run. timed: each kernel call's device time measured. prepare:
  // each pipeline dispatched once with no workgroups.
  Stream* begin(bool timed = false, bool prepare = false);
  // The open run behind a handle the host passed; throws naming `what` for
  // NULL, a handle that is not an open run of this device, or one already
  // synchronized.
  Stream& stream(bp_run* run, const char* what);
  // A kernel call starts: its dispatches belong to it.
  void begin_call(Stream& s);
  // Records one dispatch of `groups` workgroups (folded into a 2-D/3-D grid
  // as the device limits require). args: the dispatch's argument block.
  // extra / p: the push-constant words of the family (shaders/common.glsl).
  void dispatch(Stream& s, const Pipeline& p, std::span<const Binding> operands, std::span<const int32_t> args, uint32_t n,
                uint32_t extra, uint64_t groups, const char* op, std::array<int32_t, 4> pwords = {},
                std::array<int32_t, 4> qwords = {});
  // A device buffer of at least `bytes` for intermediate results, valid until
  // the stream's next begin() (split reductions).
  Binding scratch(Stream& s, uint64_t bytes);

  // Submits a run, waits, reports and ends it. For a timed run with out_ns,
  // writes its n_calls kernel calls' device times there. Takes Device::mu
  // itself (the caller must not hold it).
  void synchronize(bp_run* run, uint64_t* out_ns, size_t n_calls);
  // Whether the queue writes timestamps (else every time is UINT64_MAX).
  bool timestamps() const { return timestamp_mask_ != 0; }

 private:
  Stream* create_stream();
  void destroy_stream(Stream& s);
  void reset_stream(Stream& s);
  VkDescriptorSet allocate_set(Stream& s);
  VkDescriptorSet ring_set(Stream& s, size_t chunk);
  std::pair<size_t, uint32_t> ring_put(Stream& s, std::span<const int32_t> args);
  // Waits for the run's pipelines (without Device::mu), then records.
  void record(Stream& s, std::unique_lock<std::mutex>& lock);
  std::vector<uint64_t> read_times(Stream& s);

  Device* dev_ = nullptr;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<Stream*> idle_;
  std::unordered_set<Stream*> active_;  // open runs
  uint64_t timestamp_mask_ = 0;  // of timestampValidBits; 0: no timestamps
  double timestamp_period_ = 1;  // ns per tick
};

}  // namespace backplane::vulkan
