// Entry point, device and memory of the CPU plugin. Kernels live in the
// family files and are registered through kernels.hpp.
#include "kernels.hpp"
#include "onednn.hpp"
#include "packed.hpp"

#include <backplane/sdk/api.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <deque>
#include <string>

struct bp_device {
  int index;
};

namespace backplane::cpu {
namespace {

Isa g_isa = Isa::baseline;
const bp_host_api* g_host = nullptr;
bp_device g_device{0};
// Plain storage, not std::string: a host that keeps its Runtime in a static
// shuts plugins down after this library's own static destructors have run.
char g_description[128] = "host CPU";

constexpr std::string_view kName = "cpu";
constexpr std::string_view kVersion = "0.1.0";
constexpr uint64_t kAlign = 64;
constexpr uint64_t kHugeBlock = uint64_t{2} << 20;
// Every block starts with a header that records its size, so buffer_read and
// buffer_write can refuse ranges outside the block. The data starts kAlign
// bytes after the header start, which keeps it 64-byte aligned.
constexpr uint64_t kMagic = 0x42504350552d6d65ull;
struct BlockHeader {
  uint64_t magic;
  uint64_t size;
};
static_assert(sizeof(BlockHeader) <= kAlign);

// BACKPLANE_CPU_ISA picks the path:
//   baseline | avx2 | avx512   the plugin's own kernels only, at that level
//                              (oneDNN off), so each stays tested;
//   avx512_bf16                the plugin's best kernels, and oneDNN capped
//                              at AVX512-BF16 (no AMX);
//   amx | native | unset       the plugin's best kernels, and oneDNN with
//                              whatever the processor has (AMX included).
// A forced level never exceeds what the processor has: the run falls back
// to the best it has. BACKPLANE_CPU_ONEDNN=0 turns oneDNN off alone;
// BACKPLANE_CPU_ONEDNN=always gives it every product it runs fast, however
// small (so the conformance suite's small shapes reach it).
struct IsaChoice {
  Isa isa;
  onednn::Cap cap;
  bool always = false;  // BACKPLANE_CPU_ONEDNN=always: oneDNN for small products too (tests)
};

IsaChoice detect_isa() {
  onednn::Cap cap = onednn::Cap::native;
  bool always = false;
  if (const char* env = std::getenv("BACKPLANE_CPU_ONEDNN")) {
    if (std::string_view(env) == "0") cap = onednn::Cap::off;
    always = std::string_view(env) == "always";
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  Isa best = Isa::baseline;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::avx2;
  if (best == Isa::avx2 && __builtin_cpu_supports("avx512f")) best = Isa::avx512;
  if (const char* env = std::getenv("BACKPLANE_CPU_ISA")) {
    const std::string_view want(env);
    if (want == "baseline") return {Isa::baseline, onednn::Cap::off};
    if (want == "avx2") return {best >= Isa::avx2 ? Isa::avx2 : best, onednn::Cap::off};
    if (want == "avx512") return {best, onednn::Cap::off};
    if (want == "avx512_bf16" && cap != onednn::Cap::off) cap = onednn::Cap::avx512_bf16;
  }
  return {best, cap, always};
#else
  return {Isa::baseline, cap, always};
#endif
}

std::string_view isa_name(Isa i) {
  switch (i) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    default: return "baseline";
  }
}

const sdk::KernelTable& table() {
  static const sdk::KernelTable t = [] {
    sdk::KernelTable k;
    register_elementwise(k);
    register_reduce(k);
    register_linalg(k);
    register_pool(k);
    register_index(k);
    register_scan(k);
    register_quant(k);
    register_attention(k);
    register_fused(k);
    return k;
  }();
  return t;
}

bp_error* initialize(const bp_plugin_api*, const bp_host_api* host, void** out_plugin) {
  return sdk::guard([&] {
    // One instance: its state is this library's; the context is the device.
    *out_plugin = &g_device;
    g_host = host;
    const char* pack = std::getenv("BACKPLANE_CPU_PACK");
    packed::g_enabled.store(!(pack && std::string_view(pack) == "0"), std::memory_order_relaxed);
    const IsaChoice choice = detect_isa();
    g_isa = choice.isa;
    char engines[64];
    onednn::configure(choice.cap, choice.always, engines, sizeof engines);
    const uint32_t threads = host && host->num_threads ? host->num_threads(host->host_ctx) : 1;
    const std::string_view isa_text = isa_name(g_isa);
    std::snprintf(g_description, sizeof g_description, "host CPU (%.*s%s%s, %u threads)", static_cast<int>(isa_text.size()),
                  isa_text.data(), engines[0] ? ", " : "", engines, threads);
  });
}

void shutdown(void*) {
  packed::clear();  // before oneDNN goes: kept primitives belong to its engine
  onednn::release();
  g_host = nullptr;
  std::snprintf(g_description, sizeof g_description, "host CPU");
}

uint32_t device_count(void*) { return 1; }

bp_error* device_get(void*, uint32_t index, bp_device** out_device) {
  return sdk::guard([&] {
    BP_SDK_CHECK(out_device != nullptr, BP_ERR_INVALID_ARGUMENT, "device_get: out_device is NULL");
    BP_SDK_CHECK(index == 0, BP_ERR_OUT_OF_RANGE, "device_get: the cpu plugin has one device, asked for " + std::to_string(index));
    *out_device = &g_device;
  });
}

bp_error* device_info(void*, bp_device* device, bp_device_info* out_info) {
  return sdk::guard([&] {
    BP_SDK_CHECK(device == &g_device, BP_ERR_INVALID_ARGUMENT, "device_info: not a cpu device");
    BP_SDK_CHECK(out_info != nullptr, BP_ERR_INVALID_ARGUMENT, "device_info: out_info is NULL");
    // Fill only the fields the host's struct has room for.
    bp_device_info info{};
    info.struct_size = sizeof(bp_device_info);
    info.name = sdk::to_bp("cpu");
    info.kind = sdk::to_bp("cpu");
    info.description = sdk::to_bp(std::string_view(g_description));
    info.memory_kind = BP_MEMORY_HOST;
    info.buffer_alignment = kAlign;
    info.max_buffer_size = 0;
    const size_t n = std::min(out_info->struct_size ? out_info->struct_size : sizeof(bp_device_info), sizeof(bp_device_info));
    std::memcpy(out_info, &info, n);
    out_info->struct_size = n;
  });
}

// Imported host memory (buffer_import_host) has no header in front of it:
// its handle is the address of a separate record, tagged with the low bit
// (allocated handles are 64-byte aligned, so the bit is free).
constexpr uint64_t kImportMagic = 0x42504350552d696dull;
struct ImportRecord {
  BlockHeader header;  // magic kImportMagic, the size
  char* data;
};
bool is_import(uint64_t handle) { return (handle & 1u) != 0; }

BlockHeader* header_of(uint64_t handle) {
  if (is_import(handle)) return &reinterpret_cast<ImportRecord*>(static_cast<uintptr_t>(handle & ~uint64_t{1}))->header;
  return reinterpret_cast<BlockHeader*>(static_cast<uintptr_t>(handle) - kAlign);
}

char* data_of(uint64_t handle) {
  if (is_import(handle)) return reinterpret_cast<ImportRecord*>(static_cast<uintptr_t>(handle & ~uint64_t{1}))->data;
  return reinterpret_cast<char*>(static_cast<uintptr_t>(handle));
}

BlockHeader* checked_header(uint64_t handle, const char* what) {
  BP_SDK_CHECK(handle != 0, BP_ERR_INVALID_ARGUMENT, std::string(what) + ": buffer handle is 0");
  BlockHeader* h = header_of(handle);
  BP_SDK_CHECK(h->magic == (is_import(handle) ? kImportMagic : kMagic), BP_ERR_INVALID_ARGUMENT,
             std::string(what) + ": not a cpu buffer");
  return h;
}

// Freed large blocks, kept for the next allocation of the same size: a
// fresh block's first touch costs a page fault and the kernel zeroing each
// page, which for a large upload costs more than copying the bytes. At most
// kKeptBytes are kept; the oldest go first. Off under the sanitizers, which
// must see every free.
// kKeptBytes: 512 MiB, or a sixteenth of the machine's memory when less.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define BP_CPU_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(BP_CPU_SANITIZED)
const uint64_t kKeptBytes = 0;
#else
const uint64_t kKeptBytes = std::min<uint64_t>(
    uint64_t{512} << 20, static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) / 16);
#endif
struct Kept {
  std::mutex mu;
  std::deque<std::pair<uint64_t, void*>> blocks;  // total bytes, block; oldest first
  uint64_t bytes = 0;
  ~Kept() {
    for (auto& b : blocks) std::free(b.second);
  }
};
Kept& kept() {
  static Kept k;
  return k;
}
void* take_kept(uint64_t total) {
  Kept& k = kept();
  std::lock_guard<std::mutex> lk(k.mu);
  for (auto it = k.blocks.begin(); it != k.blocks.end(); ++it)
    if (it->first == total) {
      void* p = it->second;
      k.bytes -= total;
      k.blocks.erase(it);
      return p;
    }
  return nullptr;
}
// Frees every kept block; false when there was none.
bool drop_kept() {
  Kept& k = kept();
  std::lock_guard<std::mutex> lk(k.mu);
  if (k.blocks.empty()) return false;
  for (auto& b : k.blocks) std::free(b.second);
  k.blocks.clear();
  k.bytes = 0;
  return true;
}
// False when the block is not kept (the caller frees it).
bool keep(void* p, uint64_t total) {
  if (total > kKeptBytes) return false;
  Kept& k = kept();
  std::lock_guard<std::mutex> lk(k.mu);
  while (k.bytes + total > kKeptBytes && !k.blocks.empty()) {
    std::free(k.blocks.front().second);
    k.bytes -= k.blocks.front().first;
    k.blocks.pop_front();
  }
  k.blocks.emplace_back(total, p);
  k.bytes += total;
  return true;
}

bp_error* buffer_allocate(void*, bp_device* device, uint64_t size, bp_buffer* out_buffer) {
  return sdk::guard([&] {
    BP_SDK_CHECK(device == &g_device, BP_ERR_INVALID_ARGUMENT, "buffer_allocate: not a cpu device");
    BP_SDK_CHECK(out_buffer != nullptr, BP_ERR_INVALID_ARGUMENT, "buffer_allocate: out_buffer is NULL");
    BP_SDK_CHECK(size <= (uint64_t{1} << 62), BP_ERR_OUT_OF_MEMORY, "buffer_allocate: " + std::to_string(size) + " bytes is too large");
    const bool huge = size >= kHugeBlock;
    // Large blocks start on a 2 MiB boundary so transparent huge pages can
    // back them: first touches of fresh memory cost more than the arithmetic.
    const uint64_t align = huge ? kHugeBlock : kAlign;
    const uint64_t total = (size + kAlign + kAlign - 1) / kAlign * kAlign;
    void* p = huge ? take_kept(total) : nullptr;
    if (!p) {
      // Short of memory (or of address space, under `ulimit -v`): the kept
      // blocks go back first, then the allocation is tried again.
      if ((posix_memalign(&p, align, total) != 0 || p == nullptr) &&
          (!drop_kept() || posix_memalign(&p, align, total) != 0 || p == nullptr))
        sdk::fail(BP_ERR_OUT_OF_MEMORY, "buffer_allocate: cannot allocate " + std::to_string(size) + " bytes");
#ifdef MADV_HUGEPAGE
      if (huge) madvise(p, total, MADV_HUGEPAGE);  // advisory; failure is harmless
#endif
    }
    auto* h = static_cast<BlockHeader*>(p);
    h->magic = kMagic;
    h->size = size;
    char* data = static_cast<char*>(p) + kAlign;
    out_buffer->handle = reinterpret_cast<uintptr_t>(data);
    out_buffer->host_ptr = data;
    out_buffer->size = size;
  });
}

bp_error* buffer_import_host(void*, bp_device* device, void* host_ptr, uint64_t size, bp_buffer* out_buffer) {
  return sdk::guard([&] {
    BP_SDK_CHECK(device == &g_device, BP_ERR_INVALID_ARGUMENT, "buffer_import_host: not a cpu device");
    BP_SDK_CHECK(out_buffer != nullptr && host_ptr != nullptr, BP_ERR_INVALID_ARGUMENT, "buffer_import_host: NULL pointer");
    BP_SDK_CHECK(reinterpret_cast<uintptr_t>(host_ptr) % kAlign == 0, BP_ERR_INVALID_ARGUMENT,
               "buffer_import_host: memory not aligned to " + std::to_string(kAlign) + " bytes");
    auto* r = new ImportRecord{{kImportMagic, size}, static_cast<char*>(host_ptr)};
    out_buffer->handle = reinterpret_cast<uintptr_t>(r) | 1u;
    out_buffer->host_ptr = host_ptr;
    out_buffer->size = size;
  });
}

void buffer_free(void*, bp_device*, uint64_t handle) {
  if (handle == 0) return;
  packed::drop(handle);  // what kernels derived from it, if it held constants
  BlockHeader* h = header_of(handle);
  if (is_import(handle)) {
    if (h->magic != kImportMagic) return;
    h->magic = 0;
    delete reinterpret_cast<ImportRecord*>(static_cast<uintptr_t>(handle & ~uint64_t{1}));
    return;
  }
  if (h->magic != kMagic) return;
  h->magic = 0;
  const uint64_t total = (h->size + kAlign + kAlign - 1) / kAlign * kAlign;
  if (h->size < kHugeBlock || !keep(h, total)) std::free(h);
}

bp_error* buffer_write(void*, bp_device*, uint64_t handle, uint64_t offset, const void* src, uint64_t size) {
  return sdk::guard([&] {
    BlockHeader* h = checked_header(handle, "buffer_write");
    BP_SDK_CHECK(offset <= h->size && size <= h->size - offset, BP_ERR_OUT_OF_RANGE,
               "buffer_write: range [" + std::to_string(offset) + ", +" + std::to_string(size) +
                   ") outside a buffer of " + std::to_string(h->size) + " bytes");
    if (size) std::memcpy(data_of(handle) + offset, src, size);
  });
}

bp_error* buffer_read(void*, bp_device*, uint64_t handle, uint64_t offset, void* dst, uint64_t size) {
  return sdk::guard([&] {
    BlockHeader* h = checked_header(handle, "buffer_read");
    BP_SDK_CHECK(offset <= h->size && size <= h->size - offset, BP_ERR_OUT_OF_RANGE,
               "buffer_read: range [" + std::to_string(offset) + ", +" + std::to_string(size) +
                   ") outside a buffer of " + std::to_string(h->size) + " bytes");
    if (size) std::memcpy(dst, data_of(handle) + offset, size);
  });
}

const bp_plugin_api* api() {
  static const bp_plugin_api a = [] {
    bp_plugin_api x = sdk::api_table(kName, kVersion, table());
    x.initialize = initialize;
    x.shutdown = shutdown;
    x.device_count = device_count;
    x.device_get = device_get;
    x.device_info = device_info;
    x.buffer_allocate = buffer_allocate;
    x.buffer_free = buffer_free;
    x.buffer_write = buffer_write;
    x.buffer_read = buffer_read;
    x.buffer_import_host = buffer_import_host;
    // No device_supports_kernel, begin, synchronize or infer_custom_op: every
    // kernel runs on the one device, synchronously, and there are no vendor ops.
    return x;
  }();
  return &a;
}

}  // namespace

Isa isa() { return g_isa; }

const char* op_name(uint32_t index) noexcept {
  const sdk::KernelTable& t = table();
  // Table names are std::strings, so data() is NUL-terminated.
  return index < t.size() ? t.data()[index].op.data : "?";
}

}  // namespace backplane::cpu

extern "C" BP_EXPORT bp_status_code backplane_plugin_entry(const bp_plugin_query* query, const bp_plugin_api** out_api) {
  // Building the table only fills vectors; an allocation failure here must
  // not escape as an exception.
  const bp_plugin_api* a = nullptr;
  try {
    a = backplane::cpu::api();
  } catch (...) {
    if (out_api) *out_api = nullptr;
    return BP_ERR_OUT_OF_MEMORY;
  }
  return backplane::sdk::negotiate(query, a, out_api);
}
