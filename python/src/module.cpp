// backplane._backplane: the core's host API for Python (pybind11).
//
// NumPy arrays go in and come out; device tensors (backplane.Tensor) stay on
// their device and speak DLPack. The GIL is released while a plan runs.
#include <backplane/backplane.hpp>
#include <backplane/sdk/dtype.hpp>

#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#ifdef BACKPLANE_HAVE_ONNX
#include <backplane/onnx.hpp>
#endif

namespace py = pybind11;
using namespace backplane;

namespace {

PyObject* g_error = nullptr;  // backplane.Error

const char* status_name(bp_status_code c) {
  switch (c) {
    case BP_OK: return "OK";
    case BP_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case BP_ERR_OUT_OF_RANGE: return "OUT_OF_RANGE";
    case BP_ERR_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case BP_ERR_UNAVAILABLE: return "UNAVAILABLE";
    case BP_ERR_OUT_OF_MEMORY: return "OUT_OF_MEMORY";
    case BP_ERR_INCOMPATIBLE: return "INCOMPATIBLE";
    case BP_ERR_INTERNAL: return "INTERNAL";
    default: return "UNKNOWN";
  }
}

// NumPy dtype <-> bp_dtype. bf16 has no NumPy type: its values cross as
// float32 (exact when read out; rounded to nearest even when written in),
// as PyTorch's .float() does. PyTorch's own bf16 tensors cross through
// DLPack unchanged.
bp_dtype dtype_of(const py::dtype& d) {
  const char k = d.kind();
  const auto n = d.itemsize();
  if (k == 'f') return n == 4 ? BP_DTYPE_F32 : n == 8 ? BP_DTYPE_F64 : n == 2 ? BP_DTYPE_F16 : BP_DTYPE_INVALID;
  if (k == 'i') return n == 1 ? BP_DTYPE_I8 : n == 2 ? BP_DTYPE_I16 : n == 4 ? BP_DTYPE_I32 : n == 8 ? BP_DTYPE_I64 : BP_DTYPE_INVALID;
  if (k == 'u') return n == 1 ? BP_DTYPE_U8 : BP_DTYPE_INVALID;
  if (k == 'b') return BP_DTYPE_BOOL;
  return BP_DTYPE_INVALID;
}

py::dtype numpy_dtype(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F32: return py::dtype("float32");
    case BP_DTYPE_F64: return py::dtype("float64");
    case BP_DTYPE_F16: return py::dtype("float16");
    case BP_DTYPE_BF16: return py::dtype("float32");  // the values, widened
    case BP_DTYPE_I8: return py::dtype("int8");
    case BP_DTYPE_I16: return py::dtype("int16");
    case BP_DTYPE_I32: return py::dtype("int32");
    case BP_DTYPE_I64: return py::dtype("int64");
    case BP_DTYPE_U8: return py::dtype("uint8");
    case BP_DTYPE_BOOL: return py::dtype("bool");
    default: throw Error("dtype " + std::string(dtype_name(d)) + " has no NumPy type");
  }
}

bp_dtype parse_dtype(const py::handle& h) {
  if (py::isinstance<py::str>(h)) {
    if (auto d = dtype_from_name(h.cast<std::string>())) return *d;
  }
  bp_dtype d = BP_DTYPE_INVALID;
  try {
    d = dtype_of(py::dtype::from_args(py::reinterpret_borrow<py::object>(h)));
  } catch (const py::error_already_set&) {
    // NumPy's TypeError for a name it does not know: a backplane.Error
    // like every other bad argument, naming what was given.
  }
  if (d == BP_DTYPE_INVALID)
    throw Error("no Backplane dtype for " + py::repr(h).cast<std::string>() +
                " (f32, f64, f16, bf16, i8, i16, i32, i64, u8, bool, or the NumPy dtype of one)",
                BP_ERR_INVALID_ARGUMENT);
  return d;
}

// The array in the machine's byte order: a big-endian array ('>f4') is
// converted (its bytes were once read as they were, byte-swapped values).
py::array native_order(py::array a) {
  if (a.dtype().attr("isnative").cast<bool>()) return a;
  return a.attr("astype")(a.dtype().attr("newbyteorder")("=")).cast<py::array>();
}

Shape shape_of(const py::array& a) { return Shape(a.shape(), a.shape() + a.ndim()); }

// Keeps a Python object alive from C++ (the GIL is taken to let it go, from
// whichever thread drops the last reference).
std::shared_ptr<void> hold(py::object o) {
  return std::shared_ptr<void>(new py::object(std::move(o)), [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
}

// float32 values -> a uint16 array of their bf16 bits (C order).
py::array to_bf16_bits(const py::array& floats) {
  py::array_t<float, py::array::c_style | py::array::forcecast> f(floats);
  py::array_t<uint16_t> out(std::vector<py::ssize_t>(f.shape(), f.shape() + f.ndim()));
  const float* src = f.data();
  uint16_t* dst = out.mutable_data();
  for (py::ssize_t i = 0; i < f.size(); ++i) dst[i] = float_to_bf16(src[i]);
  return out;
}

// A NumPy array holding `shape` elements of `dtype`, filled by read(dst,
// bytes) with the elements' bytes (bf16 widened to float32 after reading).
template <typename Read> py::array host_array(bp_dtype dtype, const Shape& shape, Read&& read) {
  py::array out(numpy_dtype(dtype), std::vector<py::ssize_t>(shape.begin(), shape.end()));
  if (dtype != BP_DTYPE_BF16) {
    read(out.mutable_data(), static_cast<uint64_t>(out.nbytes()));
    return out;
  }
  std::vector<uint16_t> bits(static_cast<size_t>(out.size()));
  read(bits.data(), static_cast<uint64_t>(bits.size() * sizeof(uint16_t)));
  auto* dst = static_cast<float*>(out.mutable_data());
  for (size_t i = 0; i < bits.size(); ++i) dst[i] = bf16_to_float(bits[i]);
  return out;
}

// A C-contiguous array of the expected dtype (converted/copied only when
// the given one is not; bf16 takes float values and rounds them).
py::array as_input(const py::handle& value, bp_dtype want, const std::string& name, const char* kind = "input") {
  if (!py::isinstance<py::array>(value) && !py::hasattr(value, "__array__") && !py::isinstance<py::sequence>(value) &&
      !py::isinstance<py::float_>(value) && !py::isinstance<py::int_>(value) && !py::isinstance<py::bool_>(value))
    throw Error(std::string(kind) + " '" + name + "': expected a NumPy array or a backplane.Tensor, got " +
                py::str(py::type::of(value)).cast<std::string>());
  py::array given = py::array::ensure(value, 0);
  if (!given) throw Error(std::string(kind) + " '" + name + "': cannot be read as a NumPy array");
  // NumPy's same_kind casting wraps integers that do not fit (int64 2^40
  // to i32): refuse them instead, naming the range.
  const py::dtype to = numpy_dtype(want);
  if ((given.dtype().kind() == 'i' || given.dtype().kind() == 'u') && (to.kind() == 'i' || to.kind() == 'u') &&
      given.size() > 0) {
    py::module_ np = py::module_::import("numpy");
    if (!np.attr("can_cast")(given.dtype(), to, "safe").cast<bool>()) {
      const py::object info = np.attr("iinfo")(to);
      const py::object lo = given.attr("min")(), hi = given.attr("max")();
      if (lo.attr("__lt__")(info.attr("min")).cast<bool>() || hi.attr("__gt__")(info.attr("max")).cast<bool>())
        throw Error(std::string(kind) + " '" + name + "': values from " + py::str(lo).cast<std::string>() + " to " +
                        py::str(hi).cast<std::string>() + " do not fit " + std::string(dtype_name(want)),
                    BP_ERR_OUT_OF_RANGE);
    }
  }
  auto a = given.attr("astype")(to, py::arg("order") = "C", py::arg("casting") = "same_kind", py::arg("copy") = false)
      .cast<py::array>();
  return want == BP_DTYPE_BF16 ? to_bf16_bits(a) : a;
}

struct PyCompletion {
  Completion c;
  py::object plan;  // keeps the Plan (and its buffers) alive while running
  PyCompletion() = default;
  PyCompletion(PyCompletion&&) = default;
  PyCompletion& operator=(PyCompletion&&) = default;
  // Dropping a Completion whose run goes on waits for the run (its buffers
  // are the plan's): without the GIL, so every other Python thread goes on.
  // (pybind11 destroys it with the GIL held.)
  ~PyCompletion() {
    if (!c.valid() || c.poll()) return;
    py::gil_scoped_release nogil;
    Completion running = std::move(c);
  }
};

// Waits for a submitted run in slices, looking for signals between them,
// so Ctrl-C reaches Python while a long run goes on (it raises
// KeyboardInterrupt; the run itself finishes, and a later wait() or
// dropping the Completion waits for it). The slices grow from 20 µs to 2 ms:
// a short run is not kept waiting, a long one is looked at 500 times a second.
void wait_interruptibly(Completion& c) {
  auto slice = std::chrono::microseconds(20);
  while (!c.poll()) {
    {
      py::gil_scoped_release nogil;
      std::this_thread::sleep_for(slice);
    }
    slice = std::min(slice * 2, std::chrono::microseconds(2000));
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

// Host arrays of at least this many bytes are read in place on a device
// that can import host memory (the cpu; vulkan0 where the driver imports
// host pointers); smaller ones are copied, which is cheaper.
constexpr uint64_t kInPlaceBytes = 16 * 1024;

void set_input(Runtime* rt, Plan& plan, const std::string& name, const py::handle& value, bool copy = false) {
  if (py::isinstance<Tensor>(value)) {
    plan.set_input(name, value.cast<const Tensor&>());
    return;
  }
  const auto [dtype, shape] = plan.value_type(name);
  if (py::isinstance<py::array>(value)) {
    auto a = py::reinterpret_borrow<py::array>(value);
    const bool exact = dtype_of(a.dtype()) == dtype && (a.flags() & py::array::c_style) &&
                       a.dtype().attr("isnative").cast<bool>();
    if (exact && !copy && static_cast<uint64_t>(a.nbytes()) >= kInPlaceBytes && rt) {
      Device& dev = plan.input_device(name);
      if (dev.imports_host_memory() && shape_of(a) == shape &&
          reinterpret_cast<uintptr_t>(a.data()) % std::max<size_t>(a.itemsize(), 1) == 0) {
        try {
          plan.set_input(name, rt->wrap_host(const_cast<void*>(a.data()), static_cast<uint64_t>(a.nbytes()), dtype,
                                             shape, dev, hold(a)));
          return;
        } catch (const Error&) {
          // This pointer refused (alignment the driver needs): copy below.
        }
      }
    }
    if (exact) {
      if (shape_of(a) != shape)
        throw Error("input '" + name + "': expected " + std::string(dtype_name(dtype)) + shape_str(shape) + ", got " +
                    std::string(dtype_name(dtype)) + shape_str(shape_of(a)));
      plan.set_input(name, a.data(), static_cast<uint64_t>(a.nbytes()));
      return;
    }
  }
  py::array a = as_input(value, dtype, name);
  if (shape_of(a) != shape)
    throw Error("input '" + name + "': expected " + std::string(dtype_name(dtype)) + shape_str(shape) + ", got shape " +
                shape_str(shape_of(a)));
  plan.set_input(name, a.data(), static_cast<uint64_t>(a.nbytes()));
}

py::array read_output(const Plan& plan, const std::string& name) {
  const auto [dtype, shape] = plan.value_type(name);
  return host_array(dtype, shape, [&](void* dst, uint64_t bytes) { plan.output_into(name, dst, bytes); });
}

py::dict outputs(const Plan& plan, const std::vector<std::string>& names) {
  py::dict d;
  for (const auto& n : names) d[py::str(n)] = read_output(plan, n);
  return d;
}

// What a Python Plan keeps: the plan, its runtime (for wrap_host) and its
// output names.
struct PyPlan {
  Plan plan;
  std::shared_ptr<Runtime> rt;
  std::vector<std::string> ins, outs;
  // Inputs with dynamic dims: their dim names ("" for a static dim).
  std::map<std::string, std::vector<std::string>> dim_names;
  // plan(...) is atomic (its inputs, run and outputs), as Plan::run is in
  // C++: taken with the GIL released, so a thread waiting for it never
  // holds the GIL that the running call needs.
  std::shared_ptr<std::mutex> call_mu = std::make_shared<std::mutex>();
};

// The sizes of dynamic dims that inputs (name -> array or Tensor) give: the
// plan moves there before any of them is set, so no input is set at sizes
// the next one changes.
void follow_dims(PyPlan& p, const std::vector<std::pair<std::string, py::handle>>& inputs) {
  if (p.dim_names.empty()) return;
  std::map<std::string, int64_t> dims;
  for (const auto& [name, v] : inputs) {
    auto it = p.dim_names.find(name);
    if (it == p.dim_names.end() || !py::hasattr(v, "shape")) continue;
    const auto shape = v.attr("shape").cast<std::vector<int64_t>>();
    if (shape.size() != it->second.size()) continue;
    for (size_t i = 0; i < shape.size(); ++i)
      if (!it->second[i].empty()) dims[it->second[i]] = shape[i];
  }
  if (dims.empty()) return;
  py::gil_scoped_release nogil;
  p.plan.set_dims(dims);
}

std::unique_lock<std::mutex> lock_call(PyPlan& p) {
  std::unique_lock<std::mutex> lk(*p.call_mu, std::try_to_lock);
  if (!lk.owns_lock()) {
    py::gil_scoped_release nogil;
    lk.lock();
  }
  return lk;
}

// A DLManagedTensor from Python: its deleter runs with the GIL held, from
// whatever thread lets the memory go.
struct GilManaged {
  DLManagedTensor m{};
  DLManagedTensor* inner = nullptr;
};

DLManagedTensor* take_capsule(py::object obj) {
  py::object cap = obj;
  if (!PyCapsule_CheckExact(obj.ptr())) {
    if (!py::hasattr(obj, "__dlpack__"))
      throw Error("from_dlpack: expected an object with __dlpack__ (NumPy >= 1.22, PyTorch) or a DLPack capsule, got " +
                  py::str(py::type::of(obj)).cast<std::string>());
    cap = obj.attr("__dlpack__")();
  }
  if (!PyCapsule_IsValid(cap.ptr(), "dltensor"))
    throw Error("from_dlpack: the capsule is not an unused 'dltensor' (consumed already?)");
  auto* inner = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
  PyCapsule_SetName(cap.ptr(), "used_dltensor");  // ours now: the capsule will not call the deleter
  auto* w = new GilManaged;
  w->inner = inner;
  w->m.dl_tensor = inner->dl_tensor;
  w->m.manager_ctx = w;
  w->m.deleter = [](DLManagedTensor* m) {
    auto* self = static_cast<GilManaged*>(m->manager_ctx);
    {
      py::gil_scoped_acquire gil;
      if (self->inner->deleter) self->inner->deleter(self->inner);
    }
    delete self;
  };
  return &w->m;
}

py::capsule make_capsule(const Tensor& t) {
  DLManagedTensor* m = t.to_dlpack();
  return py::capsule(m, "dltensor", [](PyObject* cap) {
    // Still named "dltensor": nobody consumed it; the deleter is ours to call.
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      if (m && m->deleter) m->deleter(m);
    } else {
      PyErr_Clear();
    }
  });
}

Json to_json(const py::handle& h) {
  if (h.is_none()) return nullptr;
  return Json::parse(py::module_::import("json").attr("dumps")(h).cast<std::string>());
}

}  // namespace

PYBIND11_MODULE(_backplane, m) {
  m.doc() = "Backplane: plugin-based tensor runtime (C++ core bindings)";

  g_error = PyErr_NewException("backplane.Error", PyExc_RuntimeError, nullptr);
  m.add_object("Error", py::handle(g_error));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object err = py::reinterpret_borrow<py::object>(g_error)(py::str(e.what()));
      err.attr("code") = static_cast<int>(e.code());
      err.attr("status") = status_name(e.code());
      PyErr_SetObject(g_error, err.ptr());
    }
  });
  py::dict codes;
  for (int c = 0; c <= BP_ERR_INTERNAL; ++c) codes[status_name(static_cast<bp_status_code>(c))] = c;
  m.attr("STATUS_CODES") = codes;

  py::class_<Device, std::unique_ptr<Device, py::nodelete>>(m, "Device")
      .def_property_readonly("name", &Device::name)
      .def_property_readonly("kind", &Device::kind)
      .def_property_readonly("description", &Device::description)
      .def_property_readonly("plugin", &Device::plugin_name)
      .def_property_readonly("imports_host_memory", &Device::imports_host_memory,
                             "whether the device can use application memory in place (wrap_host, DLPack)")
      .def("__repr__", [](const Device& d) { return "<backplane.Device " + d.name() + " (" + d.kind() + ")>"; });

  py::class_<Tensor>(m, "Tensor")
      .def_property_readonly("device", &Tensor::device, py::return_value_policy::reference_internal)
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape())); })
      .def_property_readonly("strides", [](const Tensor& t) { return py::tuple(py::cast(t.layout().strides())); })
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()); },
                             "host address of the elements (0 when the device's memory is not host-addressable)")
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("numpy", [](const Tensor& t) {
        return host_array(t.dtype(), t.shape(), [&](void* dst, uint64_t bytes) {
          py::gil_scoped_release nogil;
          t.download_into(dst, bytes);
        });
      }, "copies to a new NumPy array (bf16 as float32)")
      .def("to", &Tensor::to, py::arg("device"), "copy to another device")
      .def("shares_storage_with", &Tensor::shares_storage_with)
      .def("__dlpack__", [](const Tensor& t, py::object stream, py::object max_version, py::object dl_device,
                            py::object copy) {
        if (!stream.is_none() && !(py::isinstance<py::int_>(stream) && stream.cast<long>() == -1))
          throw Error("__dlpack__: stream must be None for host memory");
        // The array API's newer keywords: max_version is accepted and an
        // unversioned 'dltensor' capsule returned (Debian's dlpack.h is 0.6,
        // before versioned tensors), as the protocol allows a producer that
        // lacks them; only the CPU can be asked for; a copy is never made.
        (void)max_version;
        if (!dl_device.is_none()) {
          auto dev = dl_device.cast<std::pair<int, int>>();
          if (dev.first != static_cast<int>(kDLCPU) || dev.second != 0)
            throw Error("__dlpack__: the tensor can be exported to (kDLCPU, 0) only", BP_ERR_UNIMPLEMENTED);
        }
        if (!copy.is_none() && copy.cast<bool>())
          throw Error("__dlpack__: copy=True is not supported; the export is always in place (Tensor.numpy() copies)",
                      BP_ERR_UNIMPLEMENTED);
        return make_capsule(t);
      }, py::arg("stream") = py::none(), py::kw_only(), py::arg("max_version") = py::none(),
         py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](const Tensor& t) {
        if (!t.data()) throw Error("__dlpack_device__: the tensor is on '" + t.device().name() + "', not host-addressable", BP_ERR_UNIMPLEMENTED);
        return py::make_tuple(static_cast<int>(kDLCPU), 0);
      })
      .def("__repr__", [](const Tensor& t) {
        return t ? "<backplane.Tensor " + std::string(dtype_name(t.dtype())) + shape_str(t.shape()) + " on " + t.device().name() + ">"
                 : std::string("<backplane.Tensor empty>");
      });

  py::class_<Graph>(m, "Graph")
      .def(py::init<>())
      .def("input", [](Graph& g, const std::string& name, py::object dtype, py::sequence shape) {
        // Ints, or names for dynamic dims: [1, "seq", 64].
        Shape dims;
        std::vector<std::string> names;
        bool dynamic = false;
        for (const auto& d : shape) {
          if (py::isinstance<py::str>(d)) {
            names.push_back(d.cast<std::string>());
            dims.push_back(0);
            dynamic = true;
          } else {
            names.emplace_back();
            dims.push_back(d.cast<int64_t>());
          }
        }
        if (dynamic)
          g.input(name, parse_dtype(dtype), dims, names);
        else
          g.input(name, parse_dtype(dtype), dims);
      }, py::arg("name"), py::arg("dtype"), py::arg("shape"),
         "a graph input; a dim given as a name (\"seq\") is dynamic")
      .def("constant", [](Graph& g, const std::string& name, py::object value, py::object dtype) {
        py::array a;
        bp_dtype d = BP_DTYPE_INVALID;
        if (dtype.is_none()) {
          a = native_order(py::array::ensure(value, py::array::c_style | py::array::forcecast));
          d = dtype_of(a.dtype());
          if (d == BP_DTYPE_INVALID) throw Error("constant '" + name + "': no Backplane dtype for this array's dtype");
        } else {
          // Converted as an input of that dtype would be ("bf16" rounds
          // float values to nearest even).
          d = parse_dtype(dtype);
          a = native_order(as_input(value, d, name, "constant"));
        }
        a = py::array::ensure(a, py::array::c_style);
        HostTensor t(d, shape_of(a));
        std::memcpy(t.data(), a.data(), t.nbytes());
        g.constant(name, std::move(t));
      }, py::arg("name"), py::arg("value"), py::arg("dtype") = py::none(),
         "a constant (weights); `dtype` converts first, as upload does (\"bf16\" rounds float values)")
      .def("node", [](Graph& g, const std::string& name, const std::string& op, std::vector<std::string> inputs,
                      py::object params, const std::string& device) {
        Json p = params.is_none() ? Json::object() : to_json(params);
        g.node(name, op, std::move(inputs), std::move(p), device);
      }, py::arg("name"), py::arg("op"), py::arg("inputs"), py::arg("params") = py::none(), py::arg("device") = "")
      .def("output", &Graph::output)
      .def("pin", &Graph::pin)
      .def_property_readonly("inputs", [](const Graph& g) {
        std::vector<std::string> n;
        for (const auto& i : g.inputs()) if (!i.constant) n.push_back(i.name);
        return n;
      })
      .def_property_readonly("outputs", &Graph::outputs);

  m.def("_load_graph", [](const std::filesystem::path& path) {
    GraphFile gf = load_graph_file(path);
    py::dict inputs;
    for (auto& [name, t] : gf.inputs) {
      inputs[py::str(name)] =
          host_array(t.dtype, t.shape, [&](void* dst, uint64_t bytes) { std::memcpy(dst, t.data(), bytes); });
    }
    return py::make_tuple(std::move(gf.graph), inputs);
  });

#ifdef BACKPLANE_HAVE_ONNX
  // ONNX import: (graph, inputs, outputs, {graph name: ONNX name}, notes).
  auto imported = [](onnx::ImportedModel im) {
    return py::make_tuple(std::move(im.graph), im.inputs, im.outputs, im.onnx_names, im.notes);
  };
  auto options = [](const std::map<std::string, Shape>& shapes, const std::map<std::string, int64_t>& dims) {
    onnx::ImportOptions o;
    o.input_shapes = shapes;
    o.dims = dims;
    return o;
  };
  m.def("_onnx_import_file", [=](const std::filesystem::path& path, const std::map<std::string, Shape>& shapes,
                                 const std::map<std::string, int64_t>& dims) {
    return imported(onnx::import_file(path, options(shapes, dims)));
  });
  m.def("_onnx_import_bytes", [=](py::bytes data, const std::map<std::string, Shape>& shapes,
                                  const std::map<std::string, int64_t>& dims, const std::string& label) {
    char* p = nullptr;
    Py_ssize_t n = 0;
    if (PyBytes_AsStringAndSize(data.ptr(), &p, &n) != 0) throw py::error_already_set();
    return imported(onnx::import_bytes(std::string_view(p, static_cast<size_t>(n)), options(shapes, dims), label));
  });
  m.attr("_HAVE_ONNX") = true;
#else
  m.attr("_HAVE_ONNX") = false;
#endif

  py::class_<PyCompletion>(m, "Completion")
      .def("wait", [](PyCompletion& c) {
        const std::map<std::string, HostTensor>* kept = nullptr;
        wait_interruptibly(c.c);
        {
          py::gil_scoped_release nogil;
          kept = &c.c.outputs();  // the run has ended: its error, if any
        }
        py::dict d;
        for (const auto& [name, t] : *kept)
          d[py::str(name)] = host_array(t.dtype, t.shape, [&](void* dst, uint64_t bytes) {
            std::memcpy(dst, t.data(), static_cast<size_t>(bytes));
          });
        return d;
      }, "waits for the run (raises its error); this run's outputs as NumPy arrays (read when the run ended, "
         "so another submission cannot have overwritten them)")
      .def("poll", [](const PyCompletion& c) { return c.c.poll(); })
      .def("error", [](PyCompletion& c) -> py::object {
        std::exception_ptr e;
        wait_interruptibly(c.c);
        {
          py::gil_scoped_release nogil;
          e = c.c.error();
        }
        if (!e) return py::none();
        try {
          std::rethrow_exception(e);
        } catch (const Error& err) {
          py::object o = py::reinterpret_borrow<py::object>(g_error)(py::str(err.what()));
          o.attr("code") = static_cast<int>(err.code());
          o.attr("status") = status_name(err.code());
          return o;
        } catch (const std::exception& err) {
          return py::reinterpret_borrow<py::object>(PyExc_RuntimeError)(py::str(err.what()));
        }
      });

  py::class_<PyPlan>(m, "Plan")
      .def("__call__", [](PyPlan& p, py::kwargs kw) {
        auto lk = lock_call(p);
        std::vector<std::pair<std::string, py::handle>> given;
        for (auto [k, v] : kw) given.emplace_back(k.cast<std::string>(), v);
        follow_dims(p, given);
        for (auto [k, v] : kw) set_input(p.rt.get(), p.plan, k.cast<std::string>(), v);
        {
          py::gil_scoped_release nogil;
          p.plan.execute();
        }
        return outputs(p.plan, p.outs);
      }, "runs with the given inputs (NumPy arrays or Tensors); a dict of NumPy outputs")
      .def("set_input", [](PyPlan& p, const std::string& name, py::object v, bool copy) {
        follow_dims(p, {{name, v}});
        set_input(p.rt.get(), p.plan, name, v, copy);
      }, py::arg("name"), py::arg("value"), py::arg("copy") = false,
         "a NumPy array (copied; large C-contiguous ones read in place on the cpu unless copy=True) or a Tensor")
      .def("execute", [](PyPlan& p) {
        py::gil_scoped_release nogil;
        p.plan.execute();
      })
      .def("compile_stats", [](const PyPlan& p) {
        const auto s = p.plan.compile_stats();
        py::dict d;
        d["placement_seconds"] = s.placement_seconds;
        d["build_seconds"] = s.build_seconds;
        d["buffer_bytes"] = s.buffer_bytes;
        d["unoptimized_buffer_bytes"] = s.unoptimized_buffer_bytes;
        d["baseline_seconds"] = s.baseline_seconds;
        return d;
      }, "compile times, and the plan's device buffer bytes per device (with the unoptimized graph's when "
         "compiled with memory_baseline=True)")
      .def("output", [](const PyPlan& p, const std::string& name) { return read_output(p.plan, name); })
      .def("outputs", [](const PyPlan& p) { return outputs(p.plan, p.outs); })
      .def("output_tensor", [](const PyPlan& p, const std::string& name) { return p.plan.output_tensor(name); })
      .def("bind_output", [](PyPlan& p, const std::string& name, py::object buf) {
        if (buf.is_none()) return p.plan.bind_output(name, Tensor{});
        if (py::isinstance<Tensor>(buf)) return p.plan.bind_output(name, buf.cast<const Tensor&>());
        if (!py::isinstance<py::array>(buf)) throw Error("bind_output '" + name + "': expected a NumPy array, a Tensor or None");
        auto a = py::reinterpret_borrow<py::array>(buf);
        const auto [dtype, shape] = p.plan.value_type(name);
        if (!(a.flags() & py::array::c_style) || !a.writeable())
          throw Error("bind_output '" + name + "': the array must be C-contiguous and writeable");
        if (!a.dtype().attr("isnative").cast<bool>())
          throw Error("bind_output '" + name + "': the array's byte order is not this machine's (kernels write native values)");
        if (dtype_of(a.dtype()) != dtype || shape_of(a) != shape)
          throw Error("bind_output '" + name + "': expected " + std::string(dtype_name(dtype)) + shape_str(shape) +
                      ", got " + std::string(dtype_name(dtype_of(a.dtype()))) + shape_str(shape_of(a)));
        p.plan.bind_output(name, a.mutable_data(), static_cast<uint64_t>(a.nbytes()), hold(a));
      }, py::arg("name"), py::arg("buffer"))
      .def("submit", [](py::object self, py::kwargs kw) {
        auto& p = self.cast<PyPlan&>();
        auto lk = lock_call(p);
        for (auto [k, v] : kw) set_input(p.rt.get(), p.plan, k.cast<std::string>(), v);
        PyCompletion c;
        {
          py::gil_scoped_release nogil;
          c.c = p.plan.submit_keeping_outputs();
        }
        c.plan = self;
        return c;
      })
      .def("input_device", [](const PyPlan& p, const std::string& n) { return &p.plan.input_device(n); },
           py::return_value_policy::reference_internal)
      .def("describe", [](const PyPlan& p) { return p.plan.describe(); })
      .def("explain", [](const PyPlan& p) { return p.plan.explain(); })
      .def("profile", [](const PyPlan& p) {
        return py::module_::import("json").attr("loads")(p.plan.profile_json().dump());
      })
      .def("profile_table", [](const PyPlan& p) { return p.plan.profile_table(); })
      .def("output_dtype", [](const PyPlan& p, const std::string& name) {
        return std::string(dtype_name(p.plan.value_type(name).first));
      }, "the dtype name of a graph output (\"bf16\" outputs come out as float32 values)")
      .def_property_readonly("output_names", [](const PyPlan& p) { return p.outs; })
      .def_property_readonly("input_names", [](const PyPlan& p) { return p.ins; })
      .def_property_readonly("devices", [](const PyPlan& p) { return p.plan.devices(); })
      .def("placement", [](const PyPlan& p) {
        py::list out;
        for (const auto& pl : p.plan.placement()) {
          py::dict e;
          e["node"] = pl.node;
          e["op"] = pl.op;
          e["device"] = pl.device;
          e["reason"] = pl.reason;
          out.append(e);
        }
        return out;
      }, "each node's device and why: [{node, op, device, reason}]")
      .def("set_dims", [](PyPlan& p, const std::map<std::string, int64_t>& dims) {
        py::gil_scoped_release nogil;
        p.plan.set_dims(dims);
      }, py::arg("dims"), "moves a plan with dynamic dims to these sizes (compiled once per set of sizes)")
      .def_property_readonly("dims", [](const PyPlan& p) { return p.plan.dims(); })
      .def_property_readonly("specializations", [](const PyPlan& p) { return p.plan.specializations(); });

  py::class_<Runtime, std::shared_ptr<Runtime>>(m, "Runtime")
      .def(py::init([](std::vector<std::filesystem::path> plugin_paths, bool use_environment, int num_threads) {
        RuntimeOptions o;
        o.plugin_paths = std::move(plugin_paths);
        o.use_environment = use_environment;
        o.num_threads = num_threads;
        return std::shared_ptr<Runtime>(Runtime::create(o));
      }), py::arg("plugin_paths") = std::vector<std::filesystem::path>{}, py::arg("use_environment") = true,
          py::arg("num_threads") = 0)
      .def("devices", [](Runtime& rt, bool load) {
        if (load) rt.load_all();
        py::list out;
        for (const auto& d : rt.devices()) {
          py::dict e;
          e["name"] = d.name;
          e["kind"] = d.kind;
          e["description"] = d.description;
          e["plugin"] = d.plugin;
          e["state"] = d.state == PluginState::Loaded ? "loaded" : d.state == PluginState::Rejected ? "rejected" : "not loaded";
          e["rejection"] = d.rejection;
          e["kernels"] = d.kernel_count;
          out.append(e);
        }
        return out;
      }, py::arg("load") = true)
      .def("device", &Runtime::device, py::return_value_policy::reference_internal)
      .def("compile", [](std::shared_ptr<Runtime> rt, const Graph& g, const std::string& device,
                         std::vector<std::string> keep, bool profile, bool prepare, bool optimize, bool memory_baseline,
                         std::map<std::string, int64_t> dims) {
        CompileOptions o;
        o.dims = std::move(dims);
        o.keep = std::move(keep);
        o.profile = profile;
        o.prepare = prepare;
        o.optimize = optimize;
        o.memory_baseline = memory_baseline;
        PyPlan p;
        {
          py::gil_scoped_release nogil;
          p.plan = rt->compile(g, rt->select_devices(device), o);
        }
        p.rt = rt;
        p.outs = g.outputs();
        for (const auto& i : g.inputs()) {
          if (!i.constant) p.ins.push_back(i.name);
          if (!i.dim_names.empty()) p.dim_names[i.name] = i.dim_names;
        }
        return p;
      }, py::arg("graph"), py::arg("device") = "auto", py::arg("keep") = std::vector<std::string>{},
          py::arg("profile") = false, py::arg("prepare") = true, py::arg("optimize") = true,
          py::arg("memory_baseline") = false, py::arg("dims") = std::map<std::string, int64_t>{})
      .def("upload", [](Runtime& rt, py::object value, const std::string& device, py::object dtype) {
        py::array a = py::array::ensure(value, py::array::c_style);
        if (!a) throw Error("upload: expected a NumPy array");
        a = py::array::ensure(native_order(a), py::array::c_style);
        const bp_dtype d = dtype.is_none() ? dtype_of(a.dtype()) : parse_dtype(dtype);
        if (d == BP_DTYPE_INVALID) throw Error("upload: no Backplane dtype for this array's dtype");
        if (!dtype.is_none()) a = as_input(a, d, "upload");
        return rt.upload(a.data(), static_cast<uint64_t>(a.nbytes()), d, shape_of(a), rt.device(device));
      }, py::arg("array"), py::arg("device") = "auto", py::arg("dtype") = py::none(),
         "copies a NumPy array to a device; `dtype` converts first (\"bf16\" rounds float values)")
      .def("from_dlpack", [](Runtime& rt, py::object obj, py::object device) {
        Device* dev = device.is_none() ? nullptr : &rt.device(device.cast<std::string>());
        return rt.from_dlpack(take_capsule(obj), dev);
      }, py::arg("obj"), py::arg("device") = py::none())
      .def("num_threads", &Runtime::num_threads);
}
