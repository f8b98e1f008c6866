/*
 * Backplane plugin ABI.
 *
 * This header is the whole contract between the Backplane host (the core
 * library an application links) and a backend plugin (a shared library the
 * host loads at run time). It is C99 and includes only <stddef.h>,
 * <stdint.h> and <stdbool.h>, so a plugin built by another compiler or
 * another C++ standard library can be loaded.
 *
 * Rules that hold for everything below:
 *  - Every struct that is passed by pointer begins with `struct_size`, set by
 *    the side that fills it to sizeof() of the version it was compiled
 *    against. A reader reads only the fields that struct_size says exist and
 *    treats missing trailing fields as zero/NULL. Structs only grow at the end.
 *  - Small value types that travel in arrays (bp_string, bp_layout,
 *    bp_bundle_slot) have no struct_size: they are frozen for a major version.
 *    So is bp_storage: it has a struct_size but travels in arrays, so it
 *    cannot grow within a major either.
 *  - Strings are (ptr, len) pairs, UTF-8, not necessarily NUL-terminated.
 *  - Errors are values (bp_error*): created by the side that failed and freed
 *    by that same side. NULL means success. Nothing throws or longjmps across
 *    this boundary.
 *  - Outputs of functions come last and are named out_*.
 *  - Nothing the host holds points into a plugin after the plugin's shutdown()
 *    returned: the host copies every string and table it keeps.
 *
 * Versioning: BP_ABI_VERSION_MAJOR changes when an existing field or function
 * changes meaning; MINOR when fields/functions are appended. See
 * sdk/CHANGELOG.md. A host of major 2 also loads plugins of major 1 (it
 * adapts their 1.x table); a plugin built against a newer minor than the
 * host's loads with its newer entries unread.
 *
 * Threading (ABI 2.0). "Concurrently" means from several threads at once.
 *  - error_code, error_message, error_destroy, error_call_index,
 *    infer_custom_op: any thread, concurrently, at any time between the
 *    entry call and shutdown (the error functions also for an error of
 *    initialize itself).
 *  - initialize and shutdown: once each, with no other call of this plugin
 *    in flight.
 *  - device_count, device_get, device_info, device_supports_kernel: any
 *    thread, concurrently, after initialize.
 *  - buffer_allocate, buffer_import_host, buffer_free, buffer_write,
 *    buffer_read: any thread, concurrently with each other and with runs,
 *    on one device or several. The host never frees or writes a buffer that a
 *    run in flight uses, and never reads one a run in flight writes.
 *  - Runs: begin() opens a run on one device and returns its handle; the
 *    kernel calls of that run (their bp_kernel_context carries it) and its
 *    synchronize() come from one thread at a time, in order. Several runs
 *    may be open on one device at once, opened and driven from different
 *    threads: a plugin keeps a run's state in its bp_run, never per thread.
 *    Runs on different devices are independent.
 */
#ifndef BACKPLANE_ABI_H_
#define BACKPLANE_ABI_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BP_ABI_VERSION_MAJOR 2
#define BP_ABI_VERSION_MINOR 2

/* The one symbol every plugin exports (see bp_plugin_entry_fn). */
#define BP_PLUGIN_ENTRY_SYMBOL "backplane_plugin_entry"

#define BP_MAX_RANK 8

#if defined(_WIN32)
#define BP_EXPORT __declspec(dllexport)
#else
#define BP_EXPORT __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------ */
/* Basic value types                                                         */
/* ------------------------------------------------------------------------ */

typedef struct bp_string {
  const char* data; /* may be NULL when len == 0 */
  size_t len;
} bp_string;

/* Element types. Values are stable for a major version. */
typedef enum bp_dtype {
  BP_DTYPE_INVALID = 0,
  BP_DTYPE_F32 = 1,
  BP_DTYPE_F16 = 2,
  BP_DTYPE_BF16 = 3,
  BP_DTYPE_F64 = 4,
  BP_DTYPE_I8 = 5,
  BP_DTYPE_I16 = 6,
  BP_DTYPE_I32 = 7,
  BP_DTYPE_I64 = 8,
  BP_DTYPE_U8 = 9,
  BP_DTYPE_BOOL = 10, /* one byte, 0 or 1 */
  BP_DTYPE_COUNT_ = 11
} bp_dtype;

typedef enum bp_status_code {
  BP_OK = 0,
  BP_ERR_INVALID_ARGUMENT = 1, /* bad params, shapes, dtypes */
  BP_ERR_OUT_OF_RANGE = 2,     /* an index out of range, div by zero, ... */
  BP_ERR_UNIMPLEMENTED = 3,    /* the entry exists but does nothing yet */
  BP_ERR_UNAVAILABLE = 4,      /* the device or a resource is not there */
  BP_ERR_OUT_OF_MEMORY = 5,
  BP_ERR_INCOMPATIBLE = 6, /* ABI/version negotiation failed */
  BP_ERR_INTERNAL = 7      /* a bug, or an exception caught at the boundary */
} bp_status_code;

/* Opaque error object. Created by the side that failed (a plugin's error is
 * read and freed through that plugin's bp_plugin_api). */
typedef struct bp_error bp_error;

/* A strided view of elements inside a storage.
 *   element (i0..i{rank-1}) lives at element index
 *       offset + sum_k i_k * strides[k]
 *   counted in elements of the storage's dtype from the storage's start.
 * strides may be negative; stride 0 means broadcast. Entries past `rank` are
 * ignored. rank 0 is a scalar (one element at `offset`). */
typedef struct bp_layout {
  uint32_t rank;
  uint32_t reserved_; /* zero */
  int64_t shape[BP_MAX_RANK];
  int64_t strides[BP_MAX_RANK];
  int64_t offset;
} bp_layout;

/* One logical output of a multi-output (bundled) op. */
typedef struct bp_bundle_slot {
  bp_dtype dtype;
  uint32_t reserved_; /* zero */
  bp_layout layout;     /* offset is in elements of `dtype` from byte_offset */
  uint64_t byte_offset; /* from the start of the bundle storage */
} bp_bundle_slot;

/* What a kernel sees of one storage. Built by the host for each call; the
 * pointers inside live for the duration of the call only. */
typedef struct bp_storage {
  size_t struct_size;
  /* Host-addressable start of the storage (buffer base + byte_offset), or
   * NULL for device memory that is not mapped. */
  void* data;
  /* The plugin's own buffer handle (from buffer_allocate) and where this
   * storage starts inside it. */
  uint64_t buffer_handle;
  uint64_t byte_offset;
  uint64_t byte_size;
  bp_dtype dtype; /* the primary dtype; for a bundle, slot 0's */
  /* Bundles: n_slots > 0 and slots[] describe each logical output. */
  uint32_t n_slots;
  const bp_bundle_slot* slots;
} bp_storage;

/* ------------------------------------------------------------------------ */
/* Op params: a tagged union of op-family extras                             */
/* ------------------------------------------------------------------------ */

typedef enum bp_params_kind {
  BP_PARAMS_NONE = 0,
  BP_PARAMS_REDUCE = 1,     /* sum mean prod max min */
  BP_PARAMS_ARG_REDUCE = 2, /* argmax argmin */
  BP_PARAMS_DIM = 3,        /* softmax log_softmax cumsum gather index_select concat */
  BP_PARAMS_CAST = 4,
  BP_PARAMS_CLAMP = 5,
  BP_PARAMS_AFFINE = 6,
  BP_PARAMS_GELU = 7,
  BP_PARAMS_LAYER_NORM = 8,
  BP_PARAMS_CONV2D = 9,
  BP_PARAMS_TOPK = 10,
  BP_PARAMS_VAR_MEAN = 11,
  BP_PARAMS_SELECTIVE_SCAN = 12,
  BP_PARAMS_CUSTOM = 13, /* vendor ops: the graph's params as JSON text */
  BP_PARAMS_POOL2D = 14, /* ABI 1.5: max_pool2d avg_pool2d */
  BP_PARAMS_ATTENTION = 15, /* ABI 2.1: scaled_dot_product_attention */
  BP_PARAMS_FUSED = 16      /* ABI 2.2: fused_elementwise */
} bp_params_kind;

/* All dims below are already normalised by the host: 0 <= dim < rank of the
 * input they refer to, sorted ascending and unique where a list. */
typedef struct bp_reduce_params {
  uint32_t n_dims;
  int32_t dims[BP_MAX_RANK];
  bool keepdim;
} bp_reduce_params;

typedef struct bp_arg_reduce_params {
  int32_t dim;
  bool keepdim;
  bool select_last_index;
} bp_arg_reduce_params;

typedef struct bp_dim_params {
  int32_t dim;
  bool exclusive; /* cumsum */
  bool reverse;   /* cumsum */
} bp_dim_params;

typedef struct bp_cast_params {
  bp_dtype dtype;
} bp_cast_params;

typedef struct bp_clamp_params {
  bool has_min;
  bool has_max;
  double min_f, max_f;  /* for float dtypes */
  int64_t min_i, max_i; /* for integer dtypes (exact) */
} bp_clamp_params;

typedef struct bp_affine_params {
  double mul;
  double add;
} bp_affine_params;

typedef struct bp_gelu_params {
  bool tanh_approximation;
} bp_gelu_params;

typedef struct bp_layer_norm_params {
  uint32_t n_dims; /* the trailing n_dims dims are normalised */
  double eps;
} bp_layer_norm_params;

typedef struct bp_conv2d_params {
  int64_t stride[2];
  int64_t padding[4]; /* top, left, bottom, right */
  int64_t dilation[2];
  int64_t groups;
} bp_conv2d_params;

typedef struct bp_topk_params {
  int64_t k;
  int32_t dim;
  bool largest;
  bool sorted;
} bp_topk_params;

typedef struct bp_var_mean_params {
  uint32_t n_dims;
  int32_t dims[BP_MAX_RANK];
  double correction;
  bool keepdim;
} bp_var_mean_params;

typedef struct bp_selective_scan_params {
  bool delta_softplus;
} bp_selective_scan_params;

/* ABI 1.5. Every value fits int32 (the host refuses others); the output's
 * H' and W' were computed by the host (ceil_mode applied, a last window that
 * would start in the bottom/right padding dropped). count_include_pad is
 * false for max_pool2d. */
typedef struct bp_pool2d_params {
  int32_t kernel[2];
  int32_t stride[2];
  int32_t padding[4]; /* top, left, bottom, right */
  int32_t dilation[2];
  bool ceil_mode;
  bool count_include_pad; /* avg_pool2d: the divisor counts padding positions */
} bp_pool2d_params;

/* ABI 2.1. scale is resolved by the host (1/sqrt(D), D = q.shape[-1], when
 * the graph leaves it out). causal: query row i of Sq sees the keys
 * j <= i + Sk - Sq (aligned to the end of the keys, as a KV cache needs; the
 * usual upper triangle when Sq == Sk). A row whose scores are all -inf
 * gives NaN, as softmax of -inf does; Sk == 0 gives zeros. */
typedef struct bp_attention_params {
  double scale;
  bool causal;
} bp_attention_params;

/* ABI 2.2: fused_elementwise's program. Registers 0 .. n_inputs-1 hold the
 * op's inputs (each broadcast to the output's shape); instruction k writes
 * register n_inputs + k, and the output is the last instruction's register.
 * A register is either of the compute dtype (the output's dtype: float) or a
 * condition (bool: an input of dtype bool, or a comparison's result). Every
 * instruction means exactly what the standard op of the same name means on
 * one element of the compute dtype, so a chain of nodes and its program give
 * the same values. The host checks every program before a plugin sees it:
 * operands name earlier registers of the kinds the opcode takes, at most
 * BP_FUSED_MAX_CODE instructions. docs/ops.md gives the text form. */
#define BP_FUSED_MAX_CODE 64
typedef enum bp_fused_opcode {
  /* unary, on a compute register: args[0] */
  BP_FUSED_NEG = 0, BP_FUSED_ABS = 1, BP_FUSED_SIGN = 2, BP_FUSED_SQR = 3,
  BP_FUSED_SQRT = 4, BP_FUSED_RSQRT = 5, BP_FUSED_RECIP = 6, BP_FUSED_EXP = 7,
  BP_FUSED_LOG = 8, BP_FUSED_SIN = 9, BP_FUSED_COS = 10, BP_FUSED_TANH = 11,
  BP_FUSED_ERF = 12, BP_FUSED_FLOOR = 13, BP_FUSED_CEIL = 14, BP_FUSED_ROUND = 15,
  BP_FUSED_RELU = 16, BP_FUSED_SIGMOID = 17, BP_FUSED_SILU = 18,
  BP_FUSED_SOFTPLUS = 19,
  BP_FUSED_GELU = 20,   /* imm[0] != 0: the tanh approximation */
  BP_FUSED_CLAMP = 21,  /* imm[0] min, imm[1] max; NaN: no bound */
  BP_FUSED_AFFINE = 22, /* imm[0]·x + imm[1], in double, rounded once */
  /* binary, on two compute registers: args[0], args[1] */
  BP_FUSED_ADD = 32, BP_FUSED_SUB = 33, BP_FUSED_MUL = 34, BP_FUSED_DIV = 35,
  BP_FUSED_MAXIMUM = 36, BP_FUSED_MINIMUM = 37, BP_FUSED_POW = 38,
  /* comparisons of two compute registers, giving a condition */
  BP_FUSED_EQ = 48, BP_FUSED_NE = 49, BP_FUSED_LT = 50, BP_FUSED_LE = 51,
  BP_FUSED_GT = 52, BP_FUSED_GE = 53,
  /* args[0] a condition, args[1] and args[2] compute registers */
  BP_FUSED_WHERE = 64
} bp_fused_opcode;

typedef struct bp_fused_instr {
  uint16_t op;      /* a bp_fused_opcode */
  uint16_t args[3]; /* registers; unused ones are zero */
  uint32_t reserved_[2]; /* zero */
  double imm[2];
} bp_fused_instr;

typedef struct bp_fused_params {
  const bp_fused_instr* code; /* lives as long as the plan (or the call) */
  uint32_t n_code;
} bp_fused_params;

typedef struct bp_custom_params {
  bp_string json; /* the node's "params" object as JSON text */
} bp_custom_params;

typedef struct bp_op_params {
  size_t struct_size;
  bp_params_kind kind;
  union {
    bp_reduce_params reduce;
    bp_arg_reduce_params arg_reduce;
    bp_dim_params dim;
    bp_cast_params cast;
    bp_clamp_params clamp;
    bp_affine_params affine;
    bp_gelu_params gelu;
    bp_layer_norm_params layer_norm;
    bp_conv2d_params conv2d;
    bp_topk_params topk;
    bp_var_mean_params var_mean;
    bp_selective_scan_params selective_scan;
    bp_custom_params custom;
    bp_pool2d_params pool2d; /* ABI 1.5 */
    bp_attention_params attention; /* ABI 2.1 */
    bp_fused_params fused;         /* ABI 2.2 */
  } u;
} bp_op_params;

/* ------------------------------------------------------------------------ */
/* Host API: what the host offers a plugin                                   */
/* ------------------------------------------------------------------------ */

typedef enum bp_log_level {
  BP_LOG_DEBUG = 0,
  BP_LOG_INFO = 1,
  BP_LOG_WARNING = 2,
  BP_LOG_ERROR = 3
} bp_log_level;

/* A chunk of a parallel loop: handles [begin, end). Must not throw/longjmp. */
typedef void (*bp_parallel_fn)(void* user, int64_t begin, int64_t end);

typedef struct bp_host_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  void* host_ctx; /* passed back as the first argument below */
  /* Thread-safe. */
  void (*log)(void* host_ctx, bp_log_level level, bp_string message);
  /* Runs fn over [0, n) split into chunks of at least `grain` items on the
   * host's thread pool and returns when all are done. The host decides the
   * thread count; it may run everything on the calling thread. Re-entrant
   * calls from inside fn run serially on the calling thread. */
  void (*parallel_for)(void* host_ctx, int64_t n, int64_t grain, bp_parallel_fn fn, void* user);
  /* The number of threads parallel_for may use (>= 1). */
  uint32_t (*num_threads)(void* host_ctx);
} bp_host_api;

/* ------------------------------------------------------------------------ */
/* Kernels                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct bp_device bp_device; /* opaque, owned by the plugin */
typedef struct bp_run bp_run;       /* opaque, owned by the plugin (ABI 2.0) */

/* Per-call context. */
typedef struct bp_kernel_context {
  size_t struct_size;
  bp_device* device;
  const bp_host_api* host;
  /* Index of this kernel in the plugin's kernel table. */
  uint32_t kernel_index;
  /* ABI 2.0: the context initialize() returned, and the run this call
   * belongs to (what begin() returned; NULL when the plugin has no begin). */
  void* plugin;
  bp_run* run;
  /* ABI 2.0: n_inputs entries of BP_INPUT_* bits, or NULL (none set). */
  const uint32_t* input_flags;
} bp_kernel_context;

/* BP_INPUT_CONSTANT: the bytes of this input stay the same from this call
 * until buffer_free of its buffer (a graph's constants, such as weights). A
 * kernel may derive data from them once (repacked weights) and keep it,
 * keyed on (buffer_handle, byte_offset) with its layout, dtypes and params,
 * until that buffer_free. */
enum { BP_INPUT_CONSTANT = 1u };

/* The KernelRef. inputs[0..n_inputs), outputs[0..n_outputs),
 * layouts[0..n_inputs + n_outputs): input layouts then output layouts.
 * Outputs were allocated by the host; the kernel writes every byte of every
 * output element and nothing outside them. An optional input that is absent
 * has buffer_handle == 0, data == NULL and byte_size == 0.
 * A bundled output has n_outputs == 1, outputs[0].n_slots > 0, and its
 * layout entry describes slot 0.
 * For asynchronous devices the kernel may only enqueue work; errors found
 * later are reported by synchronize(). Returns NULL on success. */
typedef bp_error* (*bp_kernel_fn)(const bp_kernel_context* ctx, const bp_storage* inputs,
                                  size_t n_inputs, const bp_storage* outputs, size_t n_outputs,
                                  const bp_layout* layouts, const bp_op_params* params);

/* What the host guarantees every kernel, so plugins need not re-derive it:
 *  - Output layouts are dense row-major with offset 0 (for a bundle, each
 *    slot is dense at its byte_offset). Inputs declared BP_LAYOUT_CONTIGUOUS
 *    are dense too; BP_LAYOUT_STRIDED inputs may have any strides (negative,
 *    zero) and any offset.
 *  - Shapes, dtypes and params were checked by the host's shape inference;
 *    dims in params are normalised (non-negative, sorted, unique).
 *  - Elementwise ops (unary, binary, comparisons, where, clamp, affine, cast,
 *    contiguous): every input layout already has the output's rank and shape;
 *    broadcast dims have stride 0.
 *  - matmul: inputs are given as a [..., M, K] and b [..., K, N] with the
 *    same rank >= 2 and the same batch dims (broadcast batch dims stride 0);
 *    the output layout is [..., M, N] of that rank (1-D operands were
 *    promoted by the host; the dense output bytes are the same).
 *  - Reductions: the output layout has keepdim applied as the params say; the
 *    reduced dims are in params.
 *  - Optional inputs (layer_norm weight/bias, conv2d bias) that are absent
 *    arrive with buffer_handle 0 and data NULL; their dtype key entry equals
 *    the output dtype.
 *  - Data-dependent errors (an index out of range, integer division by zero,
 *    a float->int cast of NaN/inf/out-of-range) are the kernel's to report,
 *    as BP_ERR_OUT_OF_RANGE naming the op. */

typedef enum bp_layout_capability {
  BP_LAYOUT_CONTIGUOUS = 0, /* the host makes the input dense (row-major, offset 0) */
  BP_LAYOUT_STRIDED = 1     /* the kernel walks any strides itself */
} bp_layout_capability;

enum { BP_KERNEL_FLAG_VARIADIC = 1u };

/* One row of a plugin's kernel table. The table is static: it lives from the
 * entry call until the library is unloaded. (ABI 1.2: a plugin whose manifest
 * says "dynamic_kernels": true fills `kernels`/`n_kernels` of its table in
 * initialize(); the host reads them after initialize() returns, checks each
 * row, and the table then stays unchanged until shutdown().) */
typedef struct bp_kernel_desc {
  size_t struct_size;
  bp_string op; /* a docs/ops.md name, or "vendor.op" for custom ops */
  /* Dispatch key: the dtype of each input, then the output dtype (for a
   * bundle, the primary = slot 0 dtype). n_dtypes == n_inputs + 1. */
  const bp_dtype* dtypes;
  uint32_t n_dtypes;
  /* Per input: a bp_layout_capability. n_inputs entries. */
  const uint8_t* input_layouts;
  uint32_t n_inputs;
  /* 1 for plain ops; for bundled ops also 1 with bundle_slots > 0. */
  uint32_t n_outputs;
  uint32_t bundle_slots;
  /* BP_KERNEL_FLAG_VARIADIC: the last input (dtype and layout capability)
   * repeats one or more times (concat). */
  uint32_t flags;
  bp_kernel_fn fn;
} bp_kernel_desc;

/* ------------------------------------------------------------------------ */
/* Devices and memory                                                        */
/* ------------------------------------------------------------------------ */

typedef enum bp_memory_kind {
  BP_MEMORY_HOST = 0,   /* buffers are host memory; bp_buffer.host_ptr is set */
  BP_MEMORY_MAPPED = 1, /* device memory the host can map (integrated, lavapipe) */
  BP_MEMORY_DEVICE = 2  /* device memory reached through buffer_read/write */
} bp_memory_kind;

typedef struct bp_device_info {
  size_t struct_size;
  bp_string name;        /* unique within the plugin, e.g. "vulkan0" */
  bp_string kind;        /* "cpu", "gpu", "accelerator" */
  bp_string description; /* human-readable, e.g. the GPU's name */
  bp_memory_kind memory_kind;
  uint64_t buffer_alignment; /* required alignment of storage starts, bytes */
  uint64_t max_buffer_size;  /* 0 = no limit */
} bp_device_info;

typedef struct bp_buffer {
  size_t struct_size;
  uint64_t handle; /* nonzero, the plugin's */
  void* host_ptr;  /* set for HOST and MAPPED memory, else NULL */
  uint64_t size;
} bp_buffer;

/* ------------------------------------------------------------------------ */
/* The plugin API table                                                      */
/* ------------------------------------------------------------------------ */

/* begin() flags. A plugin says which it honours in bp_plugin_api.run_flags;
 * the host sets no flag the plugin did not list. */
enum {
  /* Time each kernel call of the run on the device: synchronize() then
   * writes the device time of every call (GPU timestamp queries, say). */
  BP_RUN_TIMED = 1u,
  /* Prepare only: the kernel calls of this run read and write no buffer and
   * run nothing; the device makes ready what those calls will need (the
   * Vulkan plugin compiles their pipelines) and synchronize() waits for that.
   * The host makes one such run when it compiles a plan, with the plan's own
   * buffers, layouts and params, so the plan's first run pays no set-up. An
   * error of a call or of synchronize() here is not reported: the real run
   * meets it again and names its node. */
  BP_RUN_PREPARE = 2u
};

/* Every plugin-level entry but initialize takes `plugin`: the context that
 * initialize() wrote to *out_plugin (for the error functions of an error of
 * initialize itself: whatever it wrote before failing, or NULL). A plugin
 * keeps its state there, so one library can serve several instances. */
typedef struct bp_plugin_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  bp_string name;    /* must equal the manifest's */
  bp_string version; /* must equal the manifest's */

  /* The kernel table: static, living from the entry call until the library
   * is unloaded; or, for a plugin whose manifest says "dynamic_kernels":
   * true, filled in by initialize() (the host reads it after initialize
   * returns, checks each row, and it stays unchanged until shutdown). */
  const bp_kernel_desc* kernels;
  size_t n_kernels;
  /* The BP_RUN_* flags begin() honours. */
  uint32_t run_flags;
  uint32_t reserved_; /* zero */

  /* Errors created by this plugin. */
  bp_status_code (*error_code)(void* plugin, const bp_error* error);
  bp_string (*error_message)(void* plugin, const bp_error* error); /* lives until error_destroy */
  void (*error_destroy)(void* plugin, bp_error* error);
  /* Optional (NULL = never known): for an error returned by synchronize(),
   * the 0-based position of the kernel call whose work failed among the
   * calls of that run; -1 when it belongs to no one call. The host names the
   * node, op and kernel, as for an error a kernel returns itself. */
  int64_t (*error_call_index)(void* plugin, const bp_error* error);

  /* Heavy set-up (instances, pools), called once before any device is used.
   * `self` is the table the entry returned (a plugin with instances finds
   * its instance from it); `host` stays valid until shutdown returns. Writes
   * the plugin's context to *out_plugin. */
  bp_error* (*initialize)(const struct bp_plugin_api* self, const bp_host_api* host, void** out_plugin);
  /* Optional. Releases everything; after it returns the library may be
   * unloaded. Not called when initialize failed. */
  void (*shutdown)(void* plugin);

  /* Devices, valid after initialize. */
  uint32_t (*device_count)(void* plugin);
  bp_error* (*device_get)(void* plugin, uint32_t index, bp_device** out_device);
  /* Strings in out_info live until shutdown. */
  bp_error* (*device_info)(void* plugin, bp_device* device, bp_device_info* out_info);
  /* Optional (NULL = all supported): whether kernel `kernel_index` runs on
   * this device (for features that differ between devices). */
  bp_error* (*device_supports_kernel)(void* plugin, bp_device* device, uint32_t kernel_index,
                                      bool* out_supported);

  /* Memory. Buffers are allocated by the host before a plan runs. */
  bp_error* (*buffer_allocate)(void* plugin, bp_device* device, uint64_t size, bp_buffer* out_buffer);
  void (*buffer_free)(void* plugin, bp_device* device, uint64_t handle);
  bp_error* (*buffer_write)(void* plugin, bp_device* device, uint64_t handle, uint64_t offset,
                            const void* src, uint64_t size);
  bp_error* (*buffer_read)(void* plugin, bp_device* device, uint64_t handle, uint64_t offset, void* dst,
                           uint64_t size);
  /* Optional (NULL = the device cannot): makes `size` bytes of host memory at
   * `host_ptr` a buffer of this device without copying. The memory belongs
   * to the host, which keeps it valid and unchanged-by-others until it calls
   * buffer_free on the returned handle; buffer_free then releases the
   * plugin's wrapper only, never the memory. `host_ptr` is aligned to the
   * device's buffer_alignment. out_buffer->host_ptr must equal host_ptr. The
   * host uses it to hand a value from one device to another that can address
   * the same memory, so nothing is copied. */
  bp_error* (*buffer_import_host)(void* plugin, bp_device* device, void* host_ptr, uint64_t size,
                                  bp_buffer* out_buffer);

  /* Execution. Both optional: NULL for synchronous devices (then every run
   * handle is NULL). begin() opens a run on `device` with BP_RUN_* `flags`
   * and writes its handle to *out_run; the run's kernel calls follow, each
   * with the handle in its context; synchronize() submits what the run
   * enqueued, waits for it, reports errors found on the device, and ends the
   * run: the handle is invalid after it returns, whatever it returns. For a
   * BP_RUN_TIMED run the host passes out_ns with n_calls = the number of
   * kernel calls of the run; on success synchronize() writes each call's
   * device time in nanoseconds there, in call order (UINT64_MAX: not
   * measured). Otherwise out_ns is NULL and n_calls 0. */
  bp_error* (*begin)(void* plugin, bp_device* device, uint32_t flags, bp_run** out_run);
  bp_error* (*synchronize)(void* plugin, bp_device* device, bp_run* run, uint64_t* out_ns, size_t n_calls);

  /* Optional: shape/dtype inference for this plugin's vendor ops ("acme.x").
   * in_layouts give input shapes (strides meaningless). Writes the output
   * dtype and shape into *out_dtype / *out_layout. */
  bp_error* (*infer_custom_op)(void* plugin, bp_string op, const bp_dtype* in_dtypes,
                               const bp_layout* in_layouts, size_t n_inputs, const bp_op_params* params,
                               bp_dtype* out_dtype, bp_layout* out_layout);
} bp_plugin_api;

/* What the host asks the entry symbol. */
typedef struct bp_plugin_query {
  size_t struct_size;
  /* The host speaks every major version in [min_major, max_major], and of
   * max_major every minor up to max_minor. A plugin answers with a table of
   * a major in that range; of a newer minor than max_minor it may answer
   * too (the host reads the table only as far as it knows), unless it needs
   * what max_minor lacks: then it refuses with BP_ERR_INCOMPATIBLE and says
   * what it needs in error_buffer. */
  uint32_t min_major;
  uint32_t max_major;
  uint32_t max_minor;
  /* On failure the plugin writes a NUL-terminated reason here. */
  char* error_buffer;
  size_t error_buffer_size;
  /* Which instance of the plugin this load is for; empty for an
   * ordinary load. The host sets it only for a plugin whose manifest says
   * "instances": true (the `remote` plugin: the text names the server or the
   * private child to talk to). Such a plugin returns a distinct API table for
   * each distinct live instance (its own name, version, devices and, with
   * "dynamic_kernels", kernels); a table stays valid until its shutdown(). */
  bp_string instance;
} bp_plugin_query;

/* The exported entry point, named BP_PLUGIN_ENTRY_SYMBOL. Cheap and pure: no
 * threads, no devices, no I/O. Chooses a version and returns the plugin's API
 * table (static, valid until unload). Returns BP_OK, or an error code with a
 * reason in query->error_buffer (BP_ERR_INCOMPATIBLE when no version fits). */
typedef bp_status_code (*bp_plugin_entry_fn)(const bp_plugin_query* query,
                                             const bp_plugin_api** out_api);
/* A host of major 2 sets min_major to 1: a plugin of major 1 answers with
 * its 1.x table (that header's bp_plugin_api), which the host adapts. */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BACKPLANE_ABI_H_ */
