// A structure-aware libFuzzer mutator for the JSON harnesses (graphs,
// plans, manifests). Byte-level mutations of JSON text mostly break the
// syntax, so the fuzzer would spend its time in the JSON parser; this one
// parses the input, changes the tree (numbers to edge values, strings to op
// and dtype names or to names the graph already uses, elements copied,
// dropped or swapped, keys added from the graph and manifest vocabularies,
// types changed) and writes it back. One mutation in four, and any input
// that is not JSON, goes to libFuzzer's own byte-level mutator.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using Json = nlohmann::json;

const char* const kWords[] = {
    // graph files
    "inputs", "nodes", "outputs", "name", "op", "params", "device", "value", "dtype", "shape", "file", "slot",
    // ops
    "neg", "abs", "sign", "sqr", "sqrt", "rsqrt", "recip", "exp", "log", "sin", "cos", "tanh", "erf", "floor", "ceil",
    "round", "relu", "sigmoid", "silu", "softplus", "gelu", "clamp", "affine", "cast", "add", "sub", "mul", "div",
    "maximum", "minimum", "pow", "eq", "ne", "lt", "le", "gt", "ge", "where", "reshape", "permute", "transpose",
    "broadcast_to", "slice", "squeeze", "unsqueeze", "contiguous", "view", "view_owned", "sum", "prod", "max", "min",
    "mean", "argmax", "argmin", "softmax", "log_softmax", "cumsum", "layer_norm", "matmul", "conv2d", "max_pool2d",
    "avg_pool2d", "gather", "index_select", "concat", "topk", "var_mean", "selective_scan", "partial.scale_shift",
    "partial.minmax", "partial.norm_rows", "partial.first_half", "acme.op",
    // params
    "dims", "dim", "dim0", "dim1", "keepdim", "start", "end", "step", "k", "largest", "sorted", "approximate", "tanh",
    "none", "mul", "min", "max", "eps", "correction", "exclusive", "reverse", "select_last_index", "stride", "padding",
    "dilation", "groups", "kernel_size", "ceil_mode", "count_include_pad", "delta_softplus", "scale", "shift",
    "times",
    // dtypes, devices
    "f32", "f16", "bf16", "f64", "i8", "i16", "i32", "i64", "u8", "bool", "cpu", "partial0", "vulkan0",
    // manifests
    "file_format_version", "1.0.0", "plugin", "version", "library_path", "abi_version", "1.3", "device_kind",
    "device_kinds", "description", "kernels", "dtypes", "layouts", "strided", "bundle_slots", "variadic", "vendor_ops",
    "decomposition", "test_shapes", "test_params", "test_range", "test_ranges", "tolerance", "elementwise", "reduction", "accelerator",
    "gpu", "$x.shape[-1] / 2", "$scale", "$times * 2 - 1", "x", "y", "lib.so", "../lib.so", "/abs.so"};

const double kNumbers[] = {0, 1, -1, 2, 3, 8, 0.5, -0.5, 1e-5, 65504, 65505, 1e38, 3.5e38, -3.5e38, 1e308,
                           127, 128, -128, -129, 255, 256, 32767, 32768, 2147483647, 2147483648.0, -2147483649.0,
                           4294967296.0, 9007199254740993.0};
const int64_t kInts[] = {0, 1, -1, 2, 3, 4, 7, 8, 9, 16, 64, 100, 1000, 65536, 1 << 20, 1 << 30,
                         int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 40, int64_t{1} << 61, int64_t{1} << 62,
                         (int64_t{1} << 61) + 1, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
                         -2, -3, -8, -9};

class Mutator {
 public:
  explicit Mutator(unsigned seed) : rng_(seed) {}

  void mutate(Json& root) {
    collect(root);
    if (values_.size() < 2) return;
    // Not the root; mostly an edit that keeps the value's type (a graph stays
    // a graph, most of the time a valid one), sometimes any value at all.
    Json& v = *values_[1 + pick(values_.size() - 1)];
    if (pick(5) == 0) {
      v = pick(2) ? small_value() : Json(*values_[pick(values_.size())]);
      return;
    }
    if (v.is_number()) {
      switch (pick(4)) {
        case 0: v = number(); break;
        case 1: v = static_cast<int64_t>(pick(12)) - 3; break;
        case 2:
          if (v.is_number_integer())  // wrapping, in unsigned arithmetic
            v = static_cast<int64_t>(static_cast<uint64_t>(v.get<int64_t>()) + (pick(2) ? 1u : ~uint64_t{0}));
          else
            v = v.get<double>() * (pick(2) ? 2.0 : -0.5);
          break;
        default: v = std::ldexp(static_cast<double>(pick(64)) - 32, -static_cast<int>(pick(4))); break;
      }
    } else if (v.is_string()) {
      v = pick(2) ? word() : name();
    } else if (v.is_boolean()) {
      v = !v.get<bool>();
    } else if (v.is_array()) {
      const int how = static_cast<int>(pick(5));
      if (v.empty() || how == 0) {
        v.push_back(v.empty() ? small_value() : Json(v[pick(v.size())]));
      } else if (how == 1) {
        v.erase(pick(v.size()));
      } else if (how == 2) {
        std::swap(v[pick(v.size())], v[pick(v.size())]);
      } else if (how == 3) {
        v.insert(v.begin() + static_cast<std::ptrdiff_t>(pick(v.size() + 1)), Json(v[pick(v.size())]));
      } else {
        v = Json::array();  // a list of small ints (shapes, dims)
        for (size_t n = pick(5); n > 0; --n) v.push_back(static_cast<int64_t>(pick(7)) - 2);
      }
    } else if (v.is_object()) {
      if (!v.empty() && pick(2)) {
        auto it = v.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(pick(v.size())));
        v.erase(it);
      } else {
        v[word().get<std::string>()] = small_value();
      }
    } else {
      v = small_value();
    }
  }

 private:
  size_t pick(size_t n) { return n ? std::uniform_int_distribution<size_t>(0, n - 1)(rng_) : 0; }

  void collect(Json& v) {
    values_.push_back(&v);
    if (v.is_object()) {
      for (auto it = v.begin(); it != v.end(); ++it) {
        names_.push_back(it.key());
        // An inline constant's elements would outnumber everything else: the
        // list is one candidate, its elements one more (the first).
        if (it.key() == "value" && it.value().is_array()) {
          values_.push_back(&it.value());
          Json* first = &it.value();
          while (first->is_array() && !first->empty()) first = &first->front();
          values_.push_back(first);
          continue;
        }
        collect(it.value());
      }
    } else if (v.is_array()) {
      for (auto& e : v) collect(e);
    } else if (v.is_string()) {
      names_.push_back(v.get<std::string>());
    }
  }

  Json number() {
    switch (pick(3)) {
      case 0: return kInts[pick(std::size(kInts))];
      case 1: return kNumbers[pick(std::size(kNumbers))];
      default: return std::numeric_limits<uint64_t>::max() - pick(2);
    }
  }
  Json word() { return std::string(kWords[pick(std::size(kWords))]); }
  Json name() { return names_.empty() ? word() : Json(names_[pick(names_.size())]); }
  Json small_value() {
    switch (pick(6)) {
      case 0: return number();
      case 1: return word();
      case 2: return name();
      case 3: return pick(2) == 1;
      case 4: return nullptr;
      default: return Json::array({static_cast<int64_t>(pick(4)), static_cast<int64_t>(pick(4))});
    }
  }

  std::mt19937 rng_;
  std::vector<Json*> values_;
  std::vector<std::string> names_;
};

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  if (seed % 4 == 0) return LLVMFuzzerMutate(data, size, max_size);
  Json j;
  try {
    // Nesting bounded as the core bounds it (deeper input is refused anyway).
    int deepest = 0;
    j = Json::parse(reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + size,
                    [&](int depth, Json::parse_event_t, Json&) {
                      deepest = std::max(deepest, depth);
                      return deepest <= 64;
                    });
  } catch (const std::exception&) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  if (j.is_discarded()) return LLVMFuzzerMutate(data, size, max_size);
  const unsigned rounds = seed % 4 == 1 ? 2 : 1;
  for (unsigned r = 0; r < rounds; ++r) Mutator(seed + r).mutate(j);
  const std::string text = j.dump();
  if (text.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, text.data(), text.size());
  return text.size();
}
