// Backplane host API: what an application links (Backplane::core).
//
//   auto rt = backplane::Runtime::create();          // finds manifests
//   for (auto& d : rt->devices()) ...                 // no library loaded yet
//   backplane::Device& dev = rt->device("auto");      // loads one plugin
//   backplane::Graph g;
//   g.input("x", BP_DTYPE_F32, {2, 3});
//   g.node("y", "relu", {"x"});
//   g.output("y");
//   backplane::Plan plan = rt->compile(g, dev);       // shapes, kernels, buffers
//   auto out = plan.run({{"x", host_tensor}});        // reusable
//
// One graph across several devices: compile against an ordered list. Each
// node goes to the first device of the list that can run it (pins in the
// graph override), values that cross devices get transfer steps:
//   auto plan = rt->compile(g, rt->select_devices("vulkan0,cpu"));
//   std::cout << plan.explain();                     // who runs what, transfers
//
// Every error is a backplane::Error whose message names what was wrong (the
// node, the op, the plugin). Nothing a plugin does can take the host down
// short of memory corruption inside the plugin itself. "Unsupported on this
// device" (no kernel, no host-memory import, no DLPack export of device-only
// memory) is always BP_ERR_UNIMPLEMENTED.
//
// Threads: Runtime's calls (device, select_devices, compile, upload,
// wrap_host, from_dlpack, ...) may be made from several threads; Device is
// read-only once listed; Plan, Tensor and Completion are safe from several
// threads (see each); Graph, HostTensor and the other structs are plain
// values: one writer at a time, any number of readers.
#pragma once

#include <backplane/abi.h>
#include <backplane/sdk/dtype.hpp>

// dlpack.h's type (only pointers to it appear here).
struct DLManagedTensor;

#include <cstddef>
#include <array>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace backplane {

using Shape = std::vector<int64_t>;
using Json = nlohmann::json;

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, bp_status_code code = BP_ERR_INVALID_ARGUMENT)
      : std::runtime_error(message), code_(code) {}
  bp_status_code code() const noexcept { return code_; }

 private:
  bp_status_code code_;
};

std::string shape_str(const Shape& s);

// ---------------------------------------------------------------------------
// Layout: shape, strides (elements, signed, 0 = broadcast), offset (elements).

class Layout {
 public:
  Layout() = default;
  Layout(Shape shape, std::vector<int64_t> strides, int64_t offset);
  static Layout contiguous(const Shape& shape);
  static Layout from_bp(const bp_layout& l);

  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const;
  // Row-major dense with offset 0 (size-1 dims may have any stride).
  bool is_contiguous() const;
  // [min, max] element index touched, relative to the storage start; for an
  // empty layout {offset, offset-1}.
  std::pair<int64_t, int64_t> extent() const;
  bp_layout to_bp() const;

  // View ops: no data moves. Each throws Error on bad arguments.
  Layout permute(const std::vector<int64_t>& dims) const;
  Layout transpose(int64_t dim0, int64_t dim1) const;
  Layout broadcast_to(const Shape& shape) const;
  Layout slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) const;
  Layout squeeze(const std::optional<std::vector<int64_t>>& dims) const;
  Layout unsqueeze(int64_t dim) const;
  // A view with a new shape when the strides allow it; nullopt when a copy is
  // needed. `shape` must already be resolved (no -1).
  std::optional<Layout> reshape(const Shape& shape) const;

  bool operator==(const Layout&) const = default;

 private:
  Shape shape_;
  std::vector<int64_t> strides_;
  int64_t offset_ = 0;
};

// ---------------------------------------------------------------------------
// HostTensor: a dense row-major tensor in host memory (inputs and results).

struct HostTensor {
  bp_dtype dtype = BP_DTYPE_INVALID;
  Shape shape;
  std::vector<std::byte> bytes;

  HostTensor() = default;
  HostTensor(bp_dtype dtype, Shape shape);  // zero-filled
  int64_t numel() const;
  size_t nbytes() const { return bytes.size(); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  // Typed access; T must fit the dtype: a floating-point T only its own
  // dtype (float f32, double f64), a signed integer T an integer dtype of its
  // size, an unsigned T (raw bits) any dtype of its size. Else Error.
  template <typename T> T* as() {
    check_access(sizeof(T), std::is_floating_point_v<T>, std::is_integral_v<T> && std::is_signed_v<T>);
    return reinterpret_cast<T*>(bytes.data());
  }
  template <typename T> const T* as() const {
    check_access(sizeof(T), std::is_floating_point_v<T>, std::is_integral_v<T> && std::is_signed_v<T>);
    return reinterpret_cast<const T*>(bytes.data());
  }
  void check_access(size_t size, bool floating, bool signed_int) const;

  // Element i (row-major) converted to/from double (exact for every dtype
  // except i64 beyond 2^53).
  double get(int64_t i) const;
  void set(int64_t i, double v);
  int64_t get_int(int64_t i) const;  // exact for integer dtypes
  void set_int(int64_t i, int64_t v);

  // Builds a tensor of `dtype` from doubles (converted element-wise).
  static HostTensor from_doubles(bp_dtype dtype, Shape shape, const std::vector<double>& values);
  template <typename T> static HostTensor from(bp_dtype dtype, Shape shape, const std::vector<T>& values) {
    HostTensor t(dtype, std::move(shape));
    for (size_t i = 0; i < values.size() && static_cast<int64_t>(i) < t.numel(); ++i)
      t.set(static_cast<int64_t>(i), static_cast<double>(values[i]));
    return t;
  }
};

// ---------------------------------------------------------------------------
// Tensor: a handle to elements that live in one device's memory (a buffer of
// the device, or application memory the device reads in place). Made by
// Runtime::upload / wrap_host / from_dlpack, or by Plan::output_tensor.
// Copies of a Tensor share the storage (the last one frees it, and keeps the
// device's plugin loaded until then); downloading is explicit.
//
// Threads: a Tensor is an immutable handle; any of its const calls may run
// from several threads at once, and against plans reading or writing its
// storage (each run locks the buffers it touches).

class Device;

class Tensor {
 public:
  Tensor() = default;
  explicit operator bool() const { return impl_ != nullptr; }
  Device& device() const;  // Error on an empty Tensor
  bp_dtype dtype() const;
  const Shape& shape() const;
  // Element strides and offset, counted from byte_offset() of the buffer.
  const Layout& layout() const;
  int64_t numel() const;
  uint64_t nbytes() const;  // numel * element size (the dense size)
  uint64_t byte_offset() const;
  bool is_contiguous() const;  // row-major dense, element offset 0
  // Host address of element offset 0 (layout().offset() counts from here)
  // when the device's memory is host-addressable (cpu; a mapped GPU heap),
  // else nullptr. Valid while any copy of the Tensor lives.
  void* data() const;
  // Copies to host memory, dense row-major.
  HostTensor download() const;
  void download_into(void* dst, uint64_t bytes) const;  // bytes must equal nbytes()
  // Copies into a new buffer on `device` (dense).
  Tensor to(Device& device) const;
  // True when both name the same storage.
  bool shares_storage_with(const Tensor& other) const;

  // DLPack (dlpack.h, DLPACK_VERSION >= 0.6): a DLManagedTensor describing
  // this tensor's memory in place (kDLCPU; strides in elements, byte_offset
  // honoured). The DLManagedTensor holds a reference to the storage until
  // its deleter is called, which the consumer must do exactly once. Only
  // host-addressable memory can be exported; other devices: Error with
  // BP_ERR_UNIMPLEMENTED (download() first).
  DLManagedTensor* to_dlpack() const;

  struct Impl;

 private:
  friend struct TensorAccess;
  std::shared_ptr<Impl> impl_;
};

// .npy I/O (format 1.0-3.0, little-endian, C order). bf16 is stored as '<u2';
// pass dtype_override = BP_DTYPE_BF16 to read such a file as bf16.
HostTensor read_npy(const std::filesystem::path& path, std::optional<bp_dtype> dtype_override = std::nullopt);
void write_npy(const std::filesystem::path& path, const HostTensor& t);

// ---------------------------------------------------------------------------
// Graphs

struct Node {
  std::string name;
  std::string op;
  std::vector<std::string> inputs;  // "" = an absent optional input (null)
  Json params = Json::object();
  std::string device;  // a pin: the device that must run this node ("" = placement decides)
};

class Graph {
 public:
  void input(const std::string& name, bp_dtype dtype, Shape shape);
  // An input with named dynamic dims: dim i is dynamic where dim_names[i]
  // is not empty (its entry in `shape` is ignored), e.g. {1, 0, 64} with
  // {"", "seq", ""}. A dim name stands for one size wherever it appears;
  // a plan compiled from the graph runs with any sizes that fit its ops
  // (Plan::set_dims, or inputs of those sizes).
  void input(const std::string& name, bp_dtype dtype, Shape shape, std::vector<std::string> dim_names);
  // Holds the value (shared by copies of the graph, never copied again).
  void constant(const std::string& name, HostTensor value);
  // A constant whose bytes another graph (or the caller) already holds.
  void constant(const std::string& name, std::shared_ptr<const HostTensor> value);
  // `device` pins the node to one device (a name Runtime::device accepts).
  void node(const std::string& name, const std::string& op, std::vector<std::string> inputs,
            Json params = Json::object(), std::string device = "");
  void output(const std::string& name);
  // Pins an existing node to a device ("" unpins); Error if there is no such node.
  void pin(const std::string& node, std::string device);

  struct Input {
    std::string name;
    bp_dtype dtype;
    Shape shape;  // a dynamic dim's entry is -1
    std::shared_ptr<const HostTensor> constant;  // null for a graph input
    std::vector<std::string> dim_names;  // per dim, "" when static; empty when all are
  };
  const std::vector<Input>& inputs() const { return inputs_; }
  // The dynamic dims' names, in order of first appearance (empty: static).
  std::vector<std::string> dynamic_dims() const;
  // A copy with every dynamic dim given its size (each must be named in
  // `dims`, >= 0); constants are shared, not copied. A node param that is
  // the string "$name" (or such an element of a list param) becomes the
  // size of dynamic dim `name`.
  Graph specialized(const std::map<std::string, int64_t>& dims) const;
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<std::string>& outputs() const { return outputs_; }

 private:
  std::vector<Input> inputs_;
  std::vector<Node> nodes_;
  std::vector<std::string> outputs_;
};

// A graph file (docs/architecture.md): the graph plus the input data it names.
struct GraphFile {
  Graph graph;
  std::map<std::string, HostTensor> inputs;  // non-constant inputs, read from .npy
};
GraphFile load_graph_file(const std::filesystem::path& path);
GraphFile parse_graph_json(const Json& j, const std::filesystem::path& base_dir);

// ---------------------------------------------------------------------------
// Devices and plugins

enum class PluginState { NotLoaded, Loaded, Rejected };

struct KernelInfo {
  std::string op;
  std::vector<bp_dtype> dtypes;  // inputs then output
  std::vector<bp_layout_capability> layouts;
  uint32_t bundle_slots = 0;
  bool variadic = false;
  bool operator==(const KernelInfo&) const = default;
};

// A vendor op ("acme.swiglu") as a manifest declares it: its inputs, params
// with defaults, output slots, and optionally a decomposition into standard
// ops that the planner runs on devices lacking the op and the conformance
// suite uses as the reference for the plugin's kernel.
struct VendorOpInfo {
  std::string op;
  std::vector<std::string> inputs;
  Json params = Json::object();      // every param the op takes, with its default
  std::vector<std::string> outputs;  // slot names: one = a plain output, more = a bundle
  // {"nodes": [...], "outputs": [...]} in graph-file syntax over `inputs`;
  // a param value "$expr" is evaluated (params, X.shape[i], + - * /). Null
  // when the manifest gives none.
  Json decomposition;
  std::vector<std::vector<Shape>> test_shapes;  // conformance cases: one shape per input
  std::vector<Json> test_params;                // conformance: each shape with each of these (default: {})
  double test_range[2] = {-2.0, 2.0};           // conformance: inputs drawn uniformly from [lo, hi)
  // "test_ranges": one [lo, hi) per input, in place of test_range (integer
  // inputs: the integers in it), for inputs that live on different scales.
  std::vector<std::array<double, 2>> test_ranges;
  std::string tolerance = "reduction";          // docs/ops.md class: "elementwise" or "reduction"
  bool has_decomposition() const { return decomposition.is_object(); }
};

struct PluginInfo {
  std::string name;
  std::string version;
  std::filesystem::path manifest_path;
  std::filesystem::path library_path;
  std::string abi_version;
  std::string device_kind;
  // Every kind the plugin's devices may report (device_kind first); a Vulkan
  // plugin's software rasteriser is a "cpu" device, a real GPU a "gpu".
  std::vector<std::string> device_kinds;
  std::string description;
  PluginState state = PluginState::NotLoaded;
  std::string rejection;  // why, when Rejected
  std::vector<KernelInfo> kernels;
  std::vector<VendorOpInfo> vendor_ops;
  // ABI 1.2 manifest flags (docs/remote.md): the library fills its kernel
  // table in initialize(); it may be loaded once per instance.
  bool dynamic_kernels = false;
  bool instances = false;
  // "process": the manifest asks to run the plugin in a child process.
  std::string isolation = "none";
  // Set by the runtime when this plugin runs isolated: its child is reached
  // through the remote plugin's library (library_path) with this instance text.
  bool isolated = false;
  std::string instance;
};

// Manifests (docs/architecture.md). parse_manifest validates against the JSON
// Schema in manifests/manifest.schema.json and throws Error naming the file.
PluginInfo parse_manifest(const std::filesystem::path& path);
Json manifest_to_json(const PluginInfo& info);
// Loads a plugin library directly (no manifest), reads what it registers, and
// unloads it: the source of truth for writing its manifest.
PluginInfo inspect_plugin_library(const std::filesystem::path& library);
std::string kernel_signature(const KernelInfo& k);  // "add(f32, f32) -> f32 [strided, strided]"

class Runtime;
class Plugin;

class Device {
 public:
  const std::string& name() const { return name_; }
  const std::string& kind() const { return kind_; }
  const std::string& description() const { return description_; }
  const std::string& plugin_name() const;
  // The kernels this device runs (the plugin's table, less what the device
  // says it lacks), made once when the plugin loads.
  const std::vector<KernelInfo>& kernels() const { return kernels_; }
  // Whether the device's plugin can use application memory in place
  // (Runtime::wrap_host, DLPack import, Plan::bind_output of host memory).
  // It may still refuse one pointer (alignment), with the reason.
  bool imports_host_memory() const;

  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device();

 private:
  friend class Runtime;
  friend class Plugin;
  friend struct DeviceAccess;
  Device() = default;
  std::string name_, kind_, description_;
  Plugin* plugin_ = nullptr;
  bp_device* handle_ = nullptr;
  bp_device_info info_{};
  std::vector<bool> supported_;  // per kernel index
  std::vector<KernelInfo> kernels_;  // the supported rows, in table order
};

// One entry of Runtime::devices(): a device, or a plugin whose devices are
// not known yet (not loaded) or that was rejected.
struct DeviceListing {
  std::string name;  // device name ("cpu", "vulkan0") or plugin name when not loaded
  std::string kind;
  std::string description;
  std::string plugin;
  std::filesystem::path manifest;
  PluginState state = PluginState::NotLoaded;
  std::string rejection;
  size_t kernel_count = 0;
};

struct RuntimeOptions {
  // Folders searched after the install's own folder and BACKPLANE_PLUGIN_PATH.
  std::vector<std::filesystem::path> plugin_paths;
  bool use_default_path = true;  // the install's own plugin folder
  bool use_environment = true;   // BACKPLANE_PLUGIN_PATH, BACKPLANE_DEVICE, BACKPLANE_NUM_THREADS
  int num_threads = 0;           // 0 = BACKPLANE_NUM_THREADS or the cores this process may use
  // A budget for the device buffers of one plan, all devices together
  // (0 = none): compile() refuses a plan above it, naming the bytes.
  uint64_t max_memory_bytes = 0;
  // Plugins to run in a private child process of their own (besides those
  // whose manifest asks for "isolation": "process" and those named in
  // BACKPLANE_ISOLATE): a kernel that crashes or hangs there becomes an error
  // naming the plugin, kernel and node instead of taking the host down.
  std::vector<std::string> isolate;
  // A kernel of an isolated plugin running longer than this ends its child
  // and becomes an error (0 = no deadline; BACKPLANE_ISOLATE_DEADLINE_MS).
  int64_t isolate_deadline_ms = 0;
  // false: every plugin runs in this process whatever its manifest or the
  // environment asks (what `backplane serve` uses for the child itself).
  bool allow_isolation = true;
  // On a cpu device the optimizer runs exported attention as
  // scaled_dot_product_attention only from this many bytes of f32 scores
  // (below it the composed ops are as fast); 0 fuses always. -1: 4 MiB, or
  // BACKPLANE_ATTENTION_CPU_MIN_BYTES.
  int64_t attention_cpu_min_bytes = -1;
};

class Plan;
struct PlanDynamic;  // a dynamic plan's specializations (plan_impl.hpp)

// The result of Plan::submit: the run goes on in the plan's submission
// thread (one per plan, runs in the order submitted).
// Threads: wait(), poll(), error() and outputs() may be called from any
// thread, any number of times; the destructor waits for the run (never
// throws).
class Completion {
 public:
  Completion() = default;
  ~Completion();
  Completion(Completion&&) noexcept = default;
  Completion& operator=(Completion&&) noexcept;
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
  // Blocks until the run has finished; throws its Error, if any (each call).
  void wait();
  // True once the run has finished (without blocking).
  bool poll() const;
  // Blocks until finished; the run's error, or nullptr on success.
  std::exception_ptr error();
  // submit(inputs) and submit_keeping_outputs() only: the run's graph
  // outputs, read before the plan was released (another submission cannot
  // have overwritten them), like run()'s result. wait() first: throws the
  // run's Error, if any.
  const std::map<std::string, HostTensor>& outputs();
  bool valid() const { return state_ != nullptr; }

  struct State;

 private:
  friend class Plan;
  std::shared_ptr<State> state_;
  std::shared_ptr<void> keep_;  // the plan, alive until the run is waited for
};

struct CompileOptions {
  // Fill every output buffer with a garbage pattern before each kernel, so a
  // kernel that leaves bytes unwritten is caught (conformance, tests).
  bool poison_outputs = false;
  // Time every step of every run (Plan::profile). A kernel on an
  // asynchronous device (Vulkan) is timed as it is enqueued; its device time
  // shows in the synchronize that follows. A transfer is timed as it moves
  // bytes, after the devices it waits for are synchronized.
  bool profile = false;
  // Let each device that can make ready, while the plan compiles, what the
  // plan's kernel calls will need (a BP_RUN_PREPARE run: the Vulkan plugin
  // compiles their pipelines), so the first run costs what later runs cost.
  // Off: the first run pays for it instead.
  bool prepare = true;
  // Values besides the graph outputs that Plan::output may read (their
  // buffers are then never reused). Reading any other value is an error.
  std::vector<std::string> keep;
  // Graph passes before placement (docs/architecture.md, "Optimization"):
  // a subgraph that a vendor op's manifest decomposition matches runs as
  // that op where the list's first device has its kernel (conv2d -> relu as
  // the CPU plugin's cpu.conv2d_relu). Plan::explain lists each replacement
  // and each near miss. Off: the graph runs node for node, as written.
  bool optimize = true;
  // Off: every vendor op whose manifest gives a decomposition runs that
  // decomposition in standard ops, even where a device has the op's kernel
  // (the conformance suite's reference; a way to compare a fused kernel with
  // what it stands for).
  bool vendor_kernels = true;
  // Also lower and place the graph unoptimized, sizing its buffers without
  // allocating them, so that Plan::compile_stats() gives both figures per
  // device (costs a second lowering; `backplane bench --model` and
  // `run --explain` ask for it).
  bool memory_baseline = false;
  // Sizes of the graph's dynamic dims for the plan's first specialization
  // (a dim not named here starts at 1). Plan::set_dims, or an input of
  // another size, moves the plan to other sizes later.
  std::map<std::string, int64_t> dims;
};

class Runtime {
 public:
  static std::unique_ptr<Runtime> create(RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Manifests found and plugins described, without loading any library.
  const std::vector<PluginInfo>& plugins() const;
  // Manifests that could not be used at all (malformed JSON, schema errors).
  const std::vector<std::pair<std::filesystem::path, std::string>>& manifest_errors() const;
  // Devices of loaded plugins, and one row per unloaded or rejected plugin.
  std::vector<DeviceListing> devices() const;
  // Loads every plugin (to list every device); rejections are recorded, not thrown.
  void load_all();

  // Selects a device: an exact device name ("cpu", "vulkan0"), a plugin name
  // (its first device), a kind ("gpu", "accelerator", "cpu"), or "auto" (the
  // first device of BACKPLANE_DEVICE if set, else the first GPU, else the
  // first accelerator, else the CPU). Loads its plugin if needed.
  Device& device(const std::string& selector);
  // An ordered device list: comma-separated selectors ("acme0,vulkan0,cpu"),
  // duplicates dropped. "auto" (alone or inside a list) stands for every
  // usable device in preference order: BACKPLANE_DEVICE's devices first if
  // set, then GPUs, accelerators, and CPU-kind devices last (the CPU plugin
  // before other CPU-kind devices), so a graph never lacks a kernel the CPU
  // plugin has. A broken plugin is left out of "auto"; naming it is an error.
  std::vector<Device*> select_devices(const std::string& list);
  // Every usable device (loads every plugin).
  std::vector<Device*> all_devices();
  // Vendor ops declared by any manifest found (first declaration wins).
  const VendorOpInfo* vendor_op(const std::string& op) const;

  // Shape/dtype inference, kernel resolution, placement, contiguize and
  // transfer insertion, buffer planning. Throws Error naming the node.
  Plan compile(const Graph& graph, Device& device, const CompileOptions& options = {});
  // The same over an ordered device list (see docs/host-guide.md): each node
  // goes to the first device that can run it, pins win, cheap nodes stay with
  // their neighbours when that moves fewer bytes, vendor ops no device has
  // run as their decomposition.
  Plan compile(const Graph& graph, const std::vector<Device*>& devices, const CompileOptions& options = {});

  // One op on host tensors (compiles a one-node graph; convenient, not fast).
  std::map<std::string, HostTensor> run_graph(const Graph& graph, Device& device,
                                              const std::map<std::string, HostTensor>& inputs);

  uint32_t num_threads() const;

  // Device tensors (see Tensor). upload copies host data into a new buffer
  // of `device`.
  Tensor upload(const HostTensor& value, Device& device);
  Tensor upload(const void* data, uint64_t bytes, bp_dtype dtype, const Shape& shape, Device& device);
  // Application memory used in place (no copy) by a device that reads host
  // memory (the cpu): `data` holds the elements of `layout` (default:
  // contiguous over `shape`), counted from `data`. `owner` is kept until the
  // last Tensor naming the memory is gone (the application must keep the
  // memory valid until then when it passes none). Refused with the reason:
  // data not aligned to the element size, `bytes` too small for the layout,
  // a device that cannot import host memory (BP_ERR_UNIMPLEMENTED).
  Tensor wrap_host(void* data, uint64_t bytes, bp_dtype dtype, const Layout& layout, Device& device,
                   std::shared_ptr<void> owner = {});
  Tensor wrap_host(void* data, uint64_t bytes, bp_dtype dtype, const Shape& shape, Device& device,
                   std::shared_ptr<void> owner = {});
  // DLPack import: takes ownership of `managed` (its deleter is called once
  // the last Tensor naming the memory is gone, or before this throws). CPU
  // memory (kDLCPU, kDLCUDAHost) is used in place on `device` (default: the
  // "cpu" device); strides are honoured (none = row-major).
  Tensor from_dlpack(DLManagedTensor* managed, Device* device = nullptr);

  struct Impl;

 private:
  friend class Plan;  // a dynamic plan compiles its specializations
  explicit Runtime(std::shared_ptr<Impl> impl);
  // compile() of a static graph into `out`; `dyn`: a dynamic plan's
  // specialization, sharing its constants' buffers.
  void build_plan(Plan& out, const Graph& graph, const std::vector<Device*>& devices, const CompileOptions& options,
                  PlanDynamic* dyn);
  // Shared with every Plan compiled from it: a plan keeps its plugins loaded
  // after the Runtime object is gone.
  std::shared_ptr<Impl> impl_;
};

// A compiled graph bound to its devices, with every buffer allocated. Running
// it again resolves nothing and allocates nothing.
//
// Threads: every call on a Plan is safe from several threads. run() is atomic
// as a whole (set inputs, execute, read outputs: another thread's calls on
// the same plan wait), so concurrent run() calls never see each other's
// inputs; the separate calls are each atomic but not together. A submitted
// run holds the plan from submit() until it ends. Plans compiled separately
// run in parallel, and may share Tensors (each run locks the buffers it
// reads or writes). A Plan keeps what it needs of its
// Runtime (plugins, thread pool) alive: it stays usable, and is destroyed
// safely, after the Runtime object is gone.
class Plan {
 public:
  Plan();
  Plan(Plan&&) noexcept;
  Plan& operator=(Plan&&) noexcept;
  ~Plan();

  // Copies host data into the plan's input buffer (dtype, shape and byte
  // count must match).
  void set_input(const std::string& name, const HostTensor& value);
  // Runs every node: locks, kernels, transfers, synchronize. Throws Error
  // naming the node whose kernel failed, or an input never set.
  void execute();
  // Reads a graph output (or a value named in CompileOptions::keep) back
  // into host memory (dense). Any other value is an error.
  HostTensor output(const std::string& name) const;
  // set_input for each, execute, output for each graph output. Every input
  // must be given except those bound to a Tensor read in place.
  std::map<std::string, HostTensor> run(const std::map<std::string, HostTensor>& inputs);

  // Device tensors as inputs. A Tensor on the input's device, dense, that is
  // not a buffer of this plan, is used in place: the plan reads it where it
  // is (no copy) on every run until the input is set again (the plan holds a
  // reference). Any other Tensor is copied in (across devices too). Which
  // happened is in describe(). Dtype and shape must match.
  void set_input(const std::string& name, const Tensor& value);
  // Host bytes copied into the input's buffer (bytes must be the dense size).
  void set_input(const std::string& name, const void* data, uint64_t bytes);
  // The device the input's buffer is on (where a Tensor is used in place).
  Device& input_device(const std::string& name) const;
  // A graph output (or a kept value) as a Tensor on its device: no copy. It
  // shares the plan's buffer: the next run of this plan writes that buffer
  // again (download() or to() to keep a value across runs). Feeding it to
  // another plan on the same device reads it in place.
  Tensor output_tensor(const std::string& name) const;
  // Reads a graph output (or kept value) into `dst`, dense (bytes must match).
  void output_into(const std::string& name, void* dst, uint64_t bytes) const;
  // Kernels write output `name` straight into `buffer` (on the output's
  // device, dense, dtype and shape of the output; not a buffer of this
  // plan) on every run until bound again; an empty Tensor unbinds. Refused
  // with the reason when the output is a view of a larger buffer, or its
  // buffer is read in place by another device.
  void bind_output(const std::string& name, const Tensor& buffer);
  // Application memory (wrap_host on the output's device): `bytes` at `data`.
  void bind_output(const std::string& name, void* data, uint64_t bytes, std::shared_ptr<void> owner = {});

  // Runs asynchronously: the inputs as set now (the plan is locked from this
  // call until the run ends; other calls on it wait). Errors, a kernel's or
  // one a device finds, come out of Completion::wait naming the node.
  // Plans compiled separately run at the same time, on different devices too.
  // submit(inputs) is run() made asynchronous: every input must be given (or
  // bound), and Completion::outputs() holds this run's outputs, atomic like
  // run()'s. After submit(), Plan::output reads whichever run wrote last.
  Completion submit();
  Completion submit(const std::map<std::string, HostTensor>& inputs);
  // submit() with the inputs as set (or bound) before, keeping the run's
  // outputs in the Completion as submit(inputs) does (bindings' own
  // language: Python's plan.submit).
  Completion submit_keeping_outputs();

  // Per-step description: name, op, kernel key and device, contiguous copies
  // and transfers (with their bytes).
  std::vector<std::string> describe() const;
  // The placement as text: each node's device and why, every transfer.
  std::string explain() const;
  // The same, as data.
  struct Transfer {
    std::string value;  // the graph value that crosses
    std::string from, to;  // device names
    uint64_t bytes = 0;    // bytes moved per run (0 when zero-copy)
    bool zero_copy = false;  // the destination device reads the source's memory in place
  };
  std::vector<Transfer> transfers() const;
  struct Placement {
    std::string node, op, device;
    std::string reason;  // "first device in the list that runs it", "pinned", ...
  };
  std::vector<Placement> placement() const;
  // With CompileOptions::profile: each step of the last run and its seconds,
  // then one "synchronize <device>" row per device with asynchronous work
  // (the wait for the device's work). A device that times its own calls
  // (Vulkan) also gives each kernel row its device_seconds.
  struct StepTime {
    std::string what;
    std::string device;
    bool transfer = false;
    double seconds = 0;
    std::string node;  // the graph node ("" for transfers and synchronize rows)
    std::string op;
    // A kernel's own time on the device, measured by the device (Vulkan
    // timestamp queries in BP_RUN_TIMED runs); negative where the
    // device does not measure it. `seconds` is then the host's time to
    // enqueue the call, and the device time shows here.
    double device_seconds = -1;
  };
  std::vector<StepTime> profile() const;
  // The same as a text table and as JSON {"steps": [...], "total_seconds"}.
  std::string profile_table() const;
  Json profile_json() const;
  // How long compile() took to place the graph (lowering, kernel lookup,
  // placement) and to build the plan (transfers, buffers, allocation).
  struct CompileStats {
    double placement_seconds = 0;
    double build_seconds = 0;
    // Bytes of device buffers the plan holds, per device name: weights,
    // inputs, outputs and intermediates after reuse by liveness (buffers
    // live as long as the plan, so this is its peak). Fused and
    // channels-last nodes count as the single steps they are.
    std::map<std::string, uint64_t> buffer_bytes;
    // The same for the graph as written (no optimization), when
    // CompileOptions::memory_baseline asked for it; else empty.
    std::map<std::string, uint64_t> unoptimized_buffer_bytes;
    double baseline_seconds = 0;  // what that baseline cost the compile
    // A dynamic plan's later specializations: bytes of constant buffers
    // taken from an earlier one (neither allocated nor uploaded again).
    uint64_t shared_constant_bytes = 0;
  };
  CompileStats compile_stats() const;
  // The devices the plan uses (runs a step on, or keeps a value on), in the
  // order of first use.
  std::vector<std::string> devices() const;
  // Device buffers the plan holds (after reuse by liveness) and their bytes.
  size_t buffer_count() const;
  uint64_t buffer_bytes() const;
  // The inferred dtype/shape of any graph value.
  std::pair<bp_dtype, Shape> value_type(const std::string& name) const;

  // Dynamic dims (Graph::input with dim names). The plan is specialized per
  // set of sizes: the first time sizes are seen, the graph at those sizes
  // is lowered, placed and given buffers (the constants' device buffers are
  // shared by every specialization, never uploaded again); a set seen
  // before is switched to at once. An input set (set_input, run, submit)
  // with a dynamic dim of another size switches too, keeping the other dims.
  // After a switch, every input is set again (as run() does); Tensors bound
  // with set_input(Tensor) and bind_output stay bound. Not from two threads
  // at once.
  void set_dims(const std::map<std::string, int64_t>& dims);
  // The current sizes (empty for a static graph).
  std::map<std::string, int64_t> dims() const;
  // How many sets of sizes the plan holds specializations for (1 when static).
  size_t specializations() const;

  struct Impl;

 private:
  friend class Runtime;
  Completion submit_impl(const std::map<std::string, HostTensor>* inputs, bool keep_outputs);
  // Moves to the sizes an input of this shape implies (dynamic plans).
  void follow_input(const std::string& name, const Shape& shape);
  void follow_inputs(const std::map<std::string, HostTensor>& inputs);
  // Shared with asynchronous runs in flight (Plan::submit).
  std::shared_ptr<Impl> impl_;
  // Dynamic dims: the specializations and what every one of them shares.
  std::shared_ptr<PlanDynamic> dyn_;
};

// Shape inference alone (no device): the dtype and shape of every value of a
// graph, or an Error naming the node. Custom (vendor) ops need the runtime.
std::map<std::string, std::pair<bp_dtype, Shape>> infer_graph(const Graph& graph);

// ---------------------------------------------------------------------------
// The standard op vocabulary as the core checks it: the same table that
// validates every node's inputs and params. `backplane ops` prints it;
// docs/ops.md's per-op tables are its Markdown form.

struct OpInputInfo {
  std::string name;
  std::string dtypes;     // "float", "float, int", "all", "bool", "i64", "like a", ...
  std::string shape;      // "" or what the op expects, e.g. "[N, C, H, W]"
  bool optional = false;  // may be null or left out
  bool variadic = false;  // repeats one or more times (concat)
};
struct OpParamInfo {
  std::string name;
  std::string kind;       // "int", "int list", "bool", "number", "string", "dtype", "dim", "dims", ...
  bool required = false;
  Json default_value;     // null when there is none
  std::string absent;     // what leaving it out means, when that is not a default value
  std::string range;      // ">= 0", "each >= 1", "!= 0", "\"none\" or \"tanh\"", ... ("" = any)
  std::string doc;
};
struct OpOutputInfo {
  std::string name;   // a bundle's slot name when the op has several outputs
  std::string dtype;  // "like x", "bool", "i64", ...
  std::string shape;
};
struct OpInfo {
  std::string name;
  std::string family;  // "Elementwise", "Layout ops and views", ...
  std::string summary;
  std::vector<OpInputInfo> inputs;
  std::vector<OpParamInfo> params;
  std::vector<OpOutputInfo> outputs;  // one: a plain output; more: the slots of a bundle
};
// Every standard op, grouped by family.
std::vector<OpInfo> op_reference();
// The same as Markdown tables (one per family), and as {"ops": [...]}.
std::string op_reference_markdown();
Json op_reference_json();

}  // namespace backplane
