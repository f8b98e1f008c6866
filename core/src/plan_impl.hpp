// The plan's internals, shared by the files that build it (plan_build.cpp),
// run it (plan_run.cpp) and report on it (plan_report.cpp): its devices,
// buffers (vbufs and cells) and steps, and Plan::Impl.
#pragma once

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <future>
#include <mutex>
#include <set>
#include <shared_mutex>
#include "lowering.hpp"
#include "runtime_impl.hpp"
#include "tensor_impl.hpp"

namespace backplane {

using detail::LNode;
using detail::Lowered;
using detail::LValue;
using detail::SlotSpec;


namespace detail::plan {

struct PlanDevice {
  Device* device = nullptr;
  Plugin* plugin = nullptr;
  bp_device* handle = nullptr;
  uint64_t align = 16;
  bool host_addressable = false;  // buffers have host_ptr (HOST or MAPPED memory)
  bp_kernel_context ctx{};
};

// The plan's lock: held by one call at a time, and by an asynchronous run
// (Plan::submit) from the submitting call until the run ends, so it can be
// released by another thread than the one that took it.
class Gate {
 public:
  void lock() {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return !held_; });
    held_ = true;
  }
  void unlock() {
    {
      std::lock_guard<std::mutex> lk(m_);
      held_ = false;
    }
    cv_.notify_one();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool held_ = false;
};

// The thread that runs a plan's submitted runs, in order (Plan::submit),
// made at the first submit and kept until the plan goes: a thread per run
// cost 200-400 us per submit().wait(). After a run it watches for the next
// one as briefly as the host pool's workers do, then sleeps. Jobs never own
// the plan (the Completion does), so the plan is never destroyed on this
// thread and its destructor can join it.
class Submitter {
 public:
  Submitter();
  ~Submitter();
  Submitter(const Submitter&) = delete;
  Submitter& operator=(const Submitter&) = delete;
  void post(std::function<void()> job);

 private:
  void loop();
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  std::atomic<int> queued_{0};
  bool stop_ = false;
  std::thread t_;
};

// A value of the plan is a lowered value whose `root` indexes the plan's
// vbufs (vbuf i is lowered root i; transfers and copies add more).
using Value = detail::LValue;

struct VBuf {
  uint64_t size = 0;
  int dev = 0;
  int def_step = -1;  // -1: graph input/constant (live from the start)
  int last_use = -1;
  bool pinned = false;  // graph inputs, constants, outputs, zero-copy aliases: never shared
  bool constant = false;  // a graph constant: written once when the plan is built
  int cell = -1;
  int alias_of = -1;          // zero-copy transfer: the vbuf whose memory this one imports
  uint64_t alias_offset = 0;  // bytes from that vbuf's start
};

struct Step {
  bool transfer = false;
  int dev = 0;  // the device that runs it (a transfer: the destination)
  std::string what;
  // Kernel steps.
  int kernel = -1;
  bp_kernel_fn fn = nullptr;
  std::vector<int> inputs;  // value ids, -1 = absent optional
  std::vector<Layout> in_layouts;
  int output = -1;
  Layout out_layout;
  bp_op_params params{};
  std::string custom_json;
  std::shared_ptr<const std::vector<bp_fused_instr>> program;  // fused_elementwise: params point into it
  std::vector<bp_storage> in_st;
  std::vector<uint32_t> in_flags;  // BP_INPUT_* per input (kernel context)
  bp_storage out_st{};
  std::vector<bp_layout> layouts;
  std::vector<bp_bundle_slot> slots;
  // Transfer steps: bytes [src_offset, +bytes) of the source value's cell to
  // [dst_offset, ...) of the destination's.
  int src_dev = 0;
  int src_value = -1;
  uint64_t src_offset = 0, dst_offset = 0, bytes = 0;
  bool zero_copy = false;
  bool import_refused = false;  // planned zero-copy; the destination refused at allocation
  // Kernel steps: the graph node and op (profile).
  std::string node, op;
};

}  // namespace detail::plan

using detail::plan::Gate;
using detail::plan::Submitter;
using detail::plan::PlanDevice;
using detail::plan::Step;
using detail::plan::Value;
using detail::plan::VBuf;

struct Plan::Impl {
  // First member, so it is released last: the plugins that own the cells'
  // buffers stay loaded until the cells are freed.
  std::shared_ptr<Runtime::Impl> runtime;
  std::vector<PlanDevice> devs;
  bool poison = false;
  std::vector<Value> values;
  std::map<std::string, int> by_name;
  // Every value name of the graph as given: a name the optimizer merged,
  // fused or removed is still known, for output()'s message.
  std::set<std::string> graph_names;
  std::vector<VBuf> vbufs;
  std::vector<std::shared_ptr<Cell>> cells;
  std::vector<Step> steps;
  std::vector<std::pair<std::string, int>> inputs;  // non-constant graph inputs
  std::vector<std::string> outputs;
  std::vector<std::pair<Cell*, bool>> lock_order;  // (cell, write)
  std::vector<Plan::Placement> placement;
  std::vector<std::string> notes;
  bool profile = false;
  std::vector<double> step_seconds;
  // Per step, the device's own time for a kernel call (a BP_RUN_TIMED run's
  // synchronize); negative when the device did not measure it.
  std::vector<double> step_device_seconds;
  Plan::CompileStats stats;
  std::vector<std::string> kept;  // CompileOptions::keep
  std::vector<char> input_set;    // parallel to inputs
  // Per device: the steps whose kernels were called since its last begin(),
  // in call order (error_call_index names one of them). Reused by
  // every run, so execute() allocates nothing once warm.
  std::vector<std::vector<int>> calls;
  std::vector<double> sync_seconds;  // per device (profile)
  mutable Gate mu;                   // one call at a time; run() and submitted runs hold it throughout
  // Device tensors bound in place of the plan's own buffers: cells[c] is
  // own[c] or a Tensor's cell, whose elements start base[c] bytes in.
  std::vector<std::shared_ptr<Cell>> own;
  std::vector<uint64_t> base;
  std::vector<char> aliased;             // per vbuf: another device imports its memory in place
  std::vector<std::string> input_note;   // parallel to inputs: how the value was last set
  std::map<std::string, std::string> output_note;  // bound outputs
  std::mutex submitter_mu;
  std::unique_ptr<Submitter> submitter;  // made by the first submit

  void set_input(const std::string& name, const HostTensor& t);
  void set_input(const std::string& name, const void* data, uint64_t bytes);
  void set_input(const std::string& name, const Tensor& t);
  void execute();
  void prepare();
  HostTensor output(const std::string& name) const;
  const Value& readable(const std::string& name) const;
  int input_index(const std::string& name) const;
  // The graph output `name` (bind_output's error when it is none).
  const Value& output_value(const std::string& name) const;
  void bind_cell(int cell, std::shared_ptr<Cell> c, uint64_t at);
  void refresh();
  // Per cell slot: the kernel storages that name it (step, input index; -1
  // for the output) and how the run uses it (1 read, 2 written), so binding
  // one Tensor re-fills only its storages (refresh() at compile fills all).
  std::vector<std::vector<std::pair<int, int>>> cell_users;
  std::vector<int> cell_mode;
  void refill(int cell);
  void order_locks();
  void fill_output(Step& st) const;
  // Why the kernels cannot use Tensor `t` in place of cell slot `c` holding
  // value `v` (an input, or an output when `output`); "" when they can.
  std::string in_place_obstacle(const Value& v, int c, const Tensor& t, bool output) const;
  // The index of the graph input that the slice_update writing cell `out_cell`
  // updates (its x), when nothing else reads that input: the two may then be
  // bound to one Tensor (a KV cache updated in place). -1 otherwise.
  int updated_input(int out_cell) const;
  // The graph input whose buffer is cell slot `c`, or -1.
  int input_of_cell(int c) const;
  // Whether step `s` is a slice_update whose output and x are one buffer now.
  bool updates_in_place(const Step& st) const;

  ~Impl() {
    submitter.reset();  // its thread first: it may not outlive what runs use
    // Zero-copy aliases before the memory they import.
    for (size_t i = cells.size(); i-- > 0;) {
      cells[i].reset();
      if (i < own.size()) own[i].reset();
    }
  }

  const Value& value(const std::string& name) const {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw Error("plan has no value named '" + name + "'");
    return values[it->second];
  }
  Cell& cell_of(const Value& v) const { return *cells[vbufs[v.root].cell]; }
  // Where a value's bytes start in its cell (a bound Tensor may start later).
  uint64_t offset_of(const Value& v) const { return base[vbufs[v.root].cell] + v.byte_offset; }

  void fill_storage(bp_storage& st, const Value& v) const {
    const Cell& c = cell_of(v);
    const uint64_t off = offset_of(v);
    st = bp_storage{};
    st.struct_size = sizeof(bp_storage);
    st.data = c.host_ptr ? static_cast<char*>(c.host_ptr) + off : nullptr;
    st.buffer_handle = c.handle;
    st.byte_offset = off;
    st.byte_size = c.size - off;
    st.dtype = v.dtype;
  }

};

// A plan compiled from a graph with dynamic dims: one specialization (a
// Plan::Impl) per set of sizes seen, the constants' device buffers shared
// by all of them, and the Tensors bound to the plan, bound again on each
// specialization as it becomes current.
struct PlanDynamic {
  std::shared_ptr<Runtime::Impl> runtime;
  Graph graph;  // as written (its constants shared with the specializations' graphs)
  std::vector<Device*> devices;
  CompileOptions options;
  std::vector<std::string> names;  // the dynamic dims
  std::vector<int64_t> current;    // their sizes now, parallel to names
  std::map<std::vector<int64_t>, std::shared_ptr<Plan::Impl>> specs;
  // Sizes by last use: past kMaxSpecializations, the least recently used
  // specialization (never the current one) is dropped, its buffers freed,
  // and compiled again if its sizes come back.
  static constexpr size_t kMaxSpecializations = 16;
  std::map<std::vector<int64_t>, uint64_t> last_used;
  uint64_t uses = 0;
  // Constant buffers by (graph constant, device, bytes).
  std::map<std::tuple<const HostTensor*, const Device*, uint64_t>, std::shared_ptr<Cell>> constants;
  // Bindings, replayed onto a specialization whose `applied` version is older.
  std::map<std::string, Tensor> bound_inputs;
  std::map<std::string, Tensor> bound_outputs;  // application memory too (wrapped as a Tensor)
  uint64_t version = 0;
  std::map<const Plan::Impl*, uint64_t> applied;

  std::string sizes(const std::vector<int64_t>& v) const {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i)
      out += (i ? ", " : "") + names[i] + "=" + std::to_string(v[i]);
    return out;
  }
};

// "123 bytes" or "12345678 bytes (11.8 MiB)".

inline std::string bytes_str(uint64_t b) {
  char buf[64];
  if (b >= (uint64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%llu bytes (%.1f MiB)", static_cast<unsigned long long>(b),
                  b / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(b));
  return buf;
}

}  // namespace backplane
