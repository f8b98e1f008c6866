// Device tensors (Tensor), the buffers behind them, and DLPack.
#include <backplane/backplane.hpp>

#include <dlpack/dlpack.h>

#include "checked.hpp"
#include "tensor_impl.hpp"

#include <algorithm>
#include <cstring>

namespace backplane {

struct TensorAccess {
  static Tensor make(std::shared_ptr<Tensor::Impl> impl) {
    Tensor t;
    t.impl_ = std::move(impl);
    return t;
  }
  static const std::shared_ptr<Tensor::Impl>& impl(const Tensor& t) { return t.impl_; }
};

namespace detail {

Tensor make_tensor(std::shared_ptr<Tensor::Impl> impl) { return TensorAccess::make(std::move(impl)); }
const std::shared_ptr<Tensor::Impl>& tensor_impl(const Tensor& t) { return TensorAccess::impl(t); }

std::shared_ptr<Cell> allocate_cell(const std::shared_ptr<Runtime::Impl>& rt, Device& dev, uint64_t size) {
  Plugin& plugin = DeviceAccess::plugin(dev);
  if (!plugin.loaded()) throw Error("device '" + dev.name() + "': its plugin is not loaded");
  const uint64_t limit = DeviceAccess::info(dev).max_buffer_size;
  if (limit && size > limit)
    throw Error("a tensor of " + std::to_string(size) + " bytes: device '" + dev.name() + "' allocates at most " +
                    std::to_string(limit),
                BP_ERR_OUT_OF_MEMORY);
  auto c = std::make_shared<Cell>();
  c->runtime = rt;
  c->plugin = &plugin;
  c->owner = &dev;
  c->device = DeviceAccess::handle(dev);
  c->size = std::max<uint64_t>(size, std::max<uint64_t>(DeviceAccess::info(dev).buffer_alignment, 16));
  bp_buffer b{};
  b.struct_size = sizeof b;
  plugin.check(plugin.api()->buffer_allocate(plugin.ctx(), c->device, c->size, &b),
               "allocating " + std::to_string(c->size) + " bytes on device '" + dev.name() + "'");
  c->handle = b.handle;
  c->host_ptr = b.host_ptr;
  return c;
}

std::shared_ptr<Cell> import_cell(const std::shared_ptr<Runtime::Impl>& rt, Device& dev, void* data, uint64_t size,
                                  std::shared_ptr<void> keepalive, uint64_t& lead) {
  Plugin& plugin = DeviceAccess::plugin(dev);
  if (!plugin.loaded()) throw Error("device '" + dev.name() + "': its plugin is not loaded");
  const bp_plugin_api* api = plugin.api();
  const bp_device_info& info = DeviceAccess::info(dev);
  if (!dev.imports_host_memory())
    throw Error("device '" + dev.name() + "' cannot use host memory in place (its plugin imports none); upload it",
                BP_ERR_UNIMPLEMENTED);
  // The device may want more alignment than the elements have: import from
  // the aligned address below (same page, never read: the tensor's
  // elements start `lead` bytes in).
  const uint64_t align = std::max<uint64_t>(info.buffer_alignment, 1);
  const auto addr = reinterpret_cast<uintptr_t>(data);
  lead = addr % align;
  char* start = static_cast<char*>(data) - lead;
  auto c = std::make_shared<Cell>();
  c->runtime = rt;
  c->plugin = &plugin;
  c->owner = &dev;
  c->device = DeviceAccess::handle(dev);
  c->size = size + lead;
  c->keepalive = std::move(keepalive);
  c->host_memory = true;
  bp_buffer b{};
  b.struct_size = sizeof b;
  bp_error* err = api->buffer_import_host(plugin.ctx(), c->device, start, c->size, &b);
  if (err) {
    const auto code = api->error_code(plugin.ctx(), err);
    throw Error("device '" + dev.name() + "' refused the host memory at " + std::to_string(addr) + ": " +
                    plugin.take_error(err),
                code);
  }
  c->handle = b.handle;
  c->host_ptr = b.host_ptr;
  if (b.host_ptr != start) {
    // Imported, but not in place: not what the caller asked for.
    throw Error("device '" + dev.name() + "' imported host memory by copying it; use upload", BP_ERR_UNIMPLEMENTED);
  }
  return c;
}

namespace {

// Calls f(element index in layout order, element offset) for every element.
template <typename F> void for_each_offset(const Layout& layout, int64_t base, F&& f) {
  const auto& shape = layout.shape();
  const auto& strides = layout.strides();
  const int64_t n = layout.numel();
  std::vector<int64_t> idx(shape.size(), 0);
  int64_t off = base + layout.offset();
  for (int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (size_t d = shape.size(); d-- > 0;) {
      off += strides[d];
      if (++idx[d] < shape[d]) break;
      off -= strides[d] * shape[d];
      idx[d] = 0;
    }
  }
}

}  // namespace

void gather(const Cell& c, uint64_t byte_offset, const Layout& layout, size_t es, void* dst) {
  const int64_t n = layout.numel();
  if (n == 0) return;
  if (layout.is_contiguous()) {
    c.read(byte_offset, dst, static_cast<uint64_t>(n) * es);
    return;
  }
  const auto [lo, hi] = layout.extent();
  const char* span = nullptr;
  std::vector<char> staging;
  if (c.host_ptr) {
    span = static_cast<const char*>(c.host_ptr) + byte_offset + lo * static_cast<int64_t>(es);
  } else {
    staging.resize(static_cast<size_t>(hi - lo + 1) * es);
    c.read(byte_offset + static_cast<uint64_t>(lo) * es, staging.data(), staging.size());
    span = staging.data();
  }
  char* out = static_cast<char*>(dst);
  for_each_offset(layout, -lo, [&](int64_t i, int64_t off) { std::memcpy(out + i * es, span + off * es, es); });
}

void scatter(Cell& c, uint64_t byte_offset, const Layout& layout, size_t es, const void* src) {
  const int64_t n = layout.numel();
  if (n == 0) return;
  if (layout.is_contiguous()) {
    c.write(byte_offset, src, static_cast<uint64_t>(n) * es);
    return;
  }
  const auto [lo, hi] = layout.extent();
  std::vector<char> staging(static_cast<size_t>(hi - lo + 1) * es);
  const uint64_t at = byte_offset + static_cast<uint64_t>(lo) * es;
  c.read(at, staging.data(), staging.size());  // bytes between the elements stay
  const char* in = static_cast<const char*>(src);
  for_each_offset(layout, -lo, [&](int64_t i, int64_t off) { std::memcpy(staging.data() + off * es, in + i * es, es); });
  c.write(at, staging.data(), staging.size());
}

Tensor wrap_host(const std::shared_ptr<Runtime::Impl>& rt, void* data, uint64_t bytes, bp_dtype dtype,
                 const Layout& layout, Device& device, std::shared_ptr<void> owner) {
  const size_t es = dtype_size(dtype);
  if (es == 0) throw Error("wrap_host: invalid dtype");
  const std::string what = "host memory for " + std::string(dtype_name(dtype)) + shape_str(layout.shape());
  checked_numel(layout.shape(), what);
  if (layout.rank() > BP_MAX_RANK) throw Error(what + ": rank above " + std::to_string(BP_MAX_RANK));
  if (!data && layout.numel() > 0) throw Error(what + ": null data pointer");
  if (reinterpret_cast<uintptr_t>(data) % es != 0)
    throw Error(what + ": the address " + std::to_string(reinterpret_cast<uintptr_t>(data)) + " is not aligned to its " +
                std::to_string(es) + "-byte elements");
  uint64_t need = 0;
  if (layout.numel() > 0) {
    const auto [lo, hi] = layout.extent();
    if (lo < 0)
      throw Error(what + ": the layout reaches " + std::to_string(-lo) + " elements before the data pointer");
    need = static_cast<uint64_t>(checked_mul(hi + 1, static_cast<int64_t>(es), what));
  }
  if (bytes < need)
    throw Error(what + ": the buffer holds " + std::to_string(bytes) + " bytes; the layout needs " + std::to_string(need),
                BP_ERR_OUT_OF_RANGE);
  uint64_t lead = 0;
  auto ti = std::make_shared<Tensor::Impl>();
  ti->cell = import_cell(rt, device, data, std::max<uint64_t>(need, 1), std::move(owner), lead);
  ti->dtype = dtype;
  ti->layout = layout;
  ti->byte_offset = lead;
  return make_tensor(std::move(ti));
}

}  // namespace detail

// ---- Tensor -------------------------------------------------------------

namespace {
const Tensor::Impl& need(const std::shared_ptr<Tensor::Impl>& i, const char* what) {
  if (!i) throw Error(std::string(what) + " on an empty Tensor");
  return *i;
}
}  // namespace

Device& Tensor::device() const { return *need(impl_, "device").cell->owner; }
bp_dtype Tensor::dtype() const { return need(impl_, "dtype").dtype; }
const Shape& Tensor::shape() const { return need(impl_, "shape").layout.shape(); }
const Layout& Tensor::layout() const { return need(impl_, "layout").layout; }
int64_t Tensor::numel() const { return need(impl_, "numel").layout.numel(); }
uint64_t Tensor::nbytes() const {
  const auto& i = need(impl_, "nbytes");
  return static_cast<uint64_t>(i.layout.numel()) * dtype_size(i.dtype);
}
uint64_t Tensor::byte_offset() const { return need(impl_, "byte_offset").byte_offset; }
bool Tensor::is_contiguous() const {
  const auto& l = need(impl_, "is_contiguous").layout;
  return l.is_contiguous() && l.offset() == 0;
}
void* Tensor::data() const {
  const auto& i = need(impl_, "data");
  return i.cell->host_ptr ? static_cast<char*>(i.cell->host_ptr) + i.byte_offset : nullptr;
}
bool Tensor::shares_storage_with(const Tensor& other) const {
  return impl_ && other.impl_ && impl_->cell == other.impl_->cell;
}

void Tensor::download_into(void* dst, uint64_t bytes) const {
  const auto& i = need(impl_, "download");
  if (bytes != nbytes())
    throw Error("download: the destination holds " + std::to_string(bytes) + " bytes; the tensor " +
                std::string(dtype_name(i.dtype)) + shape_str(i.layout.shape()) + " needs " + std::to_string(nbytes()));
  if (bytes && !dst) throw Error("download: null destination");
  std::shared_lock<std::shared_mutex> lk(i.cell->mu);
  detail::gather(*i.cell, i.byte_offset, i.layout, dtype_size(i.dtype), dst);
}

HostTensor Tensor::download() const {
  const auto& i = need(impl_, "download");
  HostTensor t(i.dtype, i.layout.shape());
  download_into(t.data(), t.nbytes());
  return t;
}

Tensor Tensor::to(Device& device) const {
  const auto& i = need(impl_, "to");
  auto ti = std::make_shared<Tensor::Impl>();
  ti->cell = detail::allocate_cell(i.cell->runtime, device, nbytes());
  ti->dtype = i.dtype;
  ti->layout = Layout::contiguous(i.layout.shape());
  if (ti->cell->host_ptr) {
    download_into(ti->cell->host_ptr, nbytes());
  } else {
    HostTensor h = download();
    ti->cell->write(0, h.data(), h.nbytes());
  }
  return detail::make_tensor(std::move(ti));
}

Tensor Runtime::upload(const void* data, uint64_t bytes, bp_dtype dtype, const Shape& shape, Device& device) {
  const size_t es = dtype_size(dtype);
  if (es == 0) throw Error("upload: invalid dtype");
  if (shape.size() > BP_MAX_RANK) throw Error("upload: rank " + std::to_string(shape.size()) + " exceeds 8");
  const uint64_t want = detail::checked_bytes(shape, es, "upload");
  if (bytes != want)
    throw Error("upload: got " + std::to_string(bytes) + " bytes; " + std::string(dtype_name(dtype)) + shape_str(shape) +
                " needs " + std::to_string(want));
  if (bytes && !data) throw Error("upload: null data pointer");
  auto ti = std::make_shared<Tensor::Impl>();
  ti->cell = detail::allocate_cell(impl_, device, want);
  ti->dtype = dtype;
  ti->layout = Layout::contiguous(shape);
  ti->cell->write(0, data, want);
  return detail::make_tensor(std::move(ti));
}

Tensor Runtime::upload(const HostTensor& t, Device& device) {
  return upload(t.data(), t.nbytes(), t.dtype, t.shape, device);
}

Tensor Runtime::wrap_host(void* data, uint64_t bytes, bp_dtype dtype, const Layout& layout, Device& device,
                          std::shared_ptr<void> owner) {
  return detail::wrap_host(impl_, data, bytes, dtype, layout, device, std::move(owner));
}

Tensor Runtime::wrap_host(void* data, uint64_t bytes, bp_dtype dtype, const Shape& shape, Device& device,
                          std::shared_ptr<void> owner) {
  if (shape.size() > BP_MAX_RANK) throw Error("wrap_host: rank " + std::to_string(shape.size()) + " exceeds 8");
  detail::checked_numel(shape, "wrap_host");
  return detail::wrap_host(impl_, data, bytes, dtype, Layout::contiguous(shape), device, std::move(owner));
}

// ---- DLPack -------------------------------------------------------------

namespace {

constexpr uint8_t kDLBoolCode = 6;  // kDLBool (DLPack 0.8), absent from older headers

bool to_dl(bp_dtype d, DLDataType& out) {
  out.lanes = 1;
  switch (d) {
    case BP_DTYPE_F32: out.code = kDLFloat; out.bits = 32; return true;
    case BP_DTYPE_F64: out.code = kDLFloat; out.bits = 64; return true;
    case BP_DTYPE_F16: out.code = kDLFloat; out.bits = 16; return true;
    case BP_DTYPE_BF16: out.code = kDLBfloat; out.bits = 16; return true;
    case BP_DTYPE_I8: out.code = kDLInt; out.bits = 8; return true;
    case BP_DTYPE_I16: out.code = kDLInt; out.bits = 16; return true;
    case BP_DTYPE_I32: out.code = kDLInt; out.bits = 32; return true;
    case BP_DTYPE_I64: out.code = kDLInt; out.bits = 64; return true;
    case BP_DTYPE_U8: out.code = kDLUInt; out.bits = 8; return true;
    case BP_DTYPE_BOOL: out.code = kDLBoolCode; out.bits = 8; return true;
    default: return false;
  }
}

bp_dtype from_dl(DLDataType t) {
  if (t.lanes != 1) return BP_DTYPE_INVALID;
  switch (t.code) {
    case kDLFloat: return t.bits == 32 ? BP_DTYPE_F32 : t.bits == 64 ? BP_DTYPE_F64 : t.bits == 16 ? BP_DTYPE_F16 : BP_DTYPE_INVALID;
    case kDLBfloat: return t.bits == 16 ? BP_DTYPE_BF16 : BP_DTYPE_INVALID;
    case kDLInt:
      return t.bits == 8 ? BP_DTYPE_I8 : t.bits == 16 ? BP_DTYPE_I16 : t.bits == 32 ? BP_DTYPE_I32
             : t.bits == 64 ? BP_DTYPE_I64 : BP_DTYPE_INVALID;
    case kDLUInt: return t.bits == 8 ? BP_DTYPE_U8 : BP_DTYPE_INVALID;
    case kDLBoolCode: return t.bits == 8 ? BP_DTYPE_BOOL : BP_DTYPE_INVALID;
    default: return BP_DTYPE_INVALID;
  }
}

// What an exported DLManagedTensor owns: the storage, and the shape and
// strides arrays DLTensor points at.
struct Exported {
  DLManagedTensor managed{};
  std::shared_ptr<Tensor::Impl> tensor;
  std::vector<int64_t> shape, strides;
};

void delete_exported(DLManagedTensor* m) { delete static_cast<Exported*>(m->manager_ctx); }

}  // namespace

DLManagedTensor* Tensor::to_dlpack() const {
  const auto& i = need(impl_, "to_dlpack");
  if (!i.cell->host_ptr)
    throw Error("to_dlpack: the tensor is on device '" + i.cell->owner->name() +
                    "', whose memory the host cannot address; download() it first",
                BP_ERR_UNIMPLEMENTED);
  auto e = std::make_unique<Exported>();
  DLDataType dt{};
  if (!to_dl(i.dtype, dt)) throw Error("to_dlpack: dtype " + std::string(dtype_name(i.dtype)) + " has no DLPack code");
  e->tensor = impl_;
  e->shape = i.layout.shape();
  e->strides = i.layout.strides();
  DLTensor& t = e->managed.dl_tensor;
  // data + byte_offset = element offset 0: DLPack has no element offset, so
  // the layout's offset joins byte_offset (a negative total stays in data).
  char* base = static_cast<char*>(i.cell->host_ptr) + i.byte_offset;
  const int64_t off = i.layout.offset() * static_cast<int64_t>(dtype_size(i.dtype));
  t.data = base + off;
  t.byte_offset = 0;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int32_t>(e->shape.size());
  t.dtype = dt;
  t.shape = e->shape.data();
  t.strides = e->strides.data();
  e->managed.manager_ctx = e.get();
  e->managed.deleter = delete_exported;
  return &e.release()->managed;
}

Tensor Runtime::from_dlpack(DLManagedTensor* managed, Device* device) {
  if (!managed) throw Error("from_dlpack: null DLManagedTensor");
  // Owned from here: the deleter runs when the last Tensor goes, or now on error.
  std::shared_ptr<void> owner(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (m->deleter) m->deleter(m);
  });
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
    throw Error("from_dlpack: memory on DLPack device type " + std::to_string(static_cast<int>(t.device.device_type)) +
                    "; only host memory (kDLCPU, kDLCUDAHost) is imported",
                BP_ERR_UNIMPLEMENTED);
  const bp_dtype dtype = from_dl(t.dtype);
  if (dtype == BP_DTYPE_INVALID)
    throw Error("from_dlpack: DLPack dtype (code " + std::to_string(t.dtype.code) + ", " + std::to_string(t.dtype.bits) +
                " bits, " + std::to_string(t.dtype.lanes) + " lanes) has no Backplane dtype");
  if (t.ndim < 0 || t.ndim > BP_MAX_RANK)
    throw Error("from_dlpack: rank " + std::to_string(t.ndim) + " (at most " + std::to_string(BP_MAX_RANK) + ")");
  if (t.ndim > 0 && !t.shape) throw Error("from_dlpack: null shape");
  Shape shape(t.shape, t.shape + t.ndim);
  detail::checked_numel(shape, "from_dlpack");
  Layout layout = Layout::contiguous(shape);
  if (t.strides) layout = Layout(shape, std::vector<int64_t>(t.strides, t.strides + t.ndim), 0);
  Device& dev = device ? *device : this->device("cpu");
  const size_t es = dtype_size(dtype);
  char* first = static_cast<char*>(t.data) + t.byte_offset;
  if (layout.numel() == 0) return detail::wrap_host(impl_, first, 0, dtype, layout, dev, std::move(owner));
  // Negative strides reach below element 0: start the wrapped span at the
  // lowest element and shift the layout's offset.
  const auto [lo, hi] = layout.extent();
  char* start = first + lo * static_cast<int64_t>(es);
  Layout shifted(shape, layout.strides(), -lo);
  const uint64_t bytes = static_cast<uint64_t>(hi - lo + 1) * es;
  return detail::wrap_host(impl_, start, bytes, dtype, shifted, dev, std::move(owner));
}

}  // namespace backplane
