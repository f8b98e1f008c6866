// fused_elementwise (ABI 2.2) on Vulkan, f32: one GLSL compute shader per
// program, generated here and compiled at run time with glslang's C++
// library. The shader includes the plugin's own prelude and element
// functions (shaders/common.glsl, dtypes.glsl, elementwise.glsl, math.glsl,
// and unary.comp's and binary.comp's op() through unary_op.glsl and
// binary_op.glsl, instantiated once per opcode with `#define OP <code>`), so
// each instruction computes exactly what its op's own Vulkan kernel does;
// clamp's and affine's constants travel in the argument block as theirs do.
// Each instruction is one GLSL statement over registers (float values, bool
// conditions), run on each element an invocation owns (one 4-vector, or
// four on the fast form of a program without transcendentals).
//
// Two forms, each its own generated source (so its own module, as the
// plugin's other fast paths are): the fast one when every operand is dense
// (stride 1, offset a multiple of 4) or a broadcast scalar over one
// coalesced dim (4-vector loads and stores, offsets in pc.p/pc.q), the
// general one for any layout (elementwise.glsl's elem_offsets). A source is
// compiled once per device, when a dispatch first requests its pipeline
// (Pipelines::module: in a preparing run, at the plan's compile()), and its
// SPIR-V is kept on disk in Pipelines::cache_dir(), keyed by a hash of the
// source and glslang's version, so another process does not compile it again.
#include "fused.hpp"

#include "cache_file.hpp"

#include "kernels.hpp"

#include <glslang/Public/ResourceLimits.h>
#include <glslang/Public/ShaderLang.h>
#include <glslang/SPIRV/GlslangToSpv.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <unistd.h>

namespace backplane::vulkan {

namespace {

std::string hex64(uint64_t v) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// ---------------------------------------------------------------------------
// glslang

std::mutex& glslang_mutex() {
  static std::mutex m;
  return m;
}

std::string glslang_version() {
  const glslang::Version v = glslang::GetVersion();
  return "glslang " + std::to_string(v.major) + "." + std::to_string(v.minor) + "." + std::to_string(v.patch) +
         (v.flavor ? v.flavor : "") + " vulkan1.1 spv1.3";
}

// #include "x.glsl" from the embedded copies only.
class Includer : public glslang::TShader::Includer {
 public:
  IncludeResult* includeLocal(const char* name, const char*, size_t) override { return find(name); }
  IncludeResult* includeSystem(const char* name, const char*, size_t) override { return find(name); }
  void releaseInclude(IncludeResult* r) override { delete r; }

 private:
  static IncludeResult* find(const char* name) {
    const char* text = find_glsl(name);
    if (!text) return nullptr;
    return new IncludeResult(name, text, std::strlen(text), nullptr);
  }
};

// What `glslangValidator -V --target-env vulkan1.1 -g0` does for the
// build's shaders (plugins/vulkan/CMakeLists.txt).
std::vector<uint32_t> compile_glsl(const std::string& name, const std::string& source) {
  std::lock_guard<std::mutex> lk(glslang_mutex());
  static const bool initialized = glslang::InitializeProcess();
  (void)initialized;
  glslang::TShader sh(EShLangCompute);
  const char* text = source.c_str();
  const char* file = name.c_str();
  sh.setStringsWithLengthsAndNames(&text, nullptr, &file, 1);
  sh.setEnvInput(glslang::EShSourceGlsl, EShLangCompute, glslang::EShClientVulkan, 100);
  sh.setEnvClient(glslang::EShClientVulkan, glslang::EShTargetVulkan_1_1);
  sh.setEnvTarget(glslang::EShTargetSpv, glslang::EShTargetSpv_1_3);
  const auto msgs = static_cast<EShMessages>(EShMsgSpvRules | EShMsgVulkanRules);
  Includer inc;
  if (!sh.parse(GetDefaultResources(), 450, false, msgs, inc))
    sdk::fail(BP_ERR_INTERNAL, "vulkan: glslang refused the generated shader " + name + ": " + sh.getInfoLog());
  glslang::TProgram prog;
  prog.addShader(&sh);
  if (!prog.link(msgs))
    sdk::fail(BP_ERR_INTERNAL, "vulkan: glslang could not link the generated shader " + name + ": " +
                                   prog.getInfoLog());
  std::vector<unsigned int> words;
  glslang::SpvOptions opt;
  opt.generateDebugInfo = false;
  opt.disableOptimizer = true;
  spv::SpvBuildLogger logger;
  glslang::GlslangToSpv(*prog.getIntermediate(EShLangCompute), words, &logger, &opt);
  BP_SDK_CHECK(!words.empty(), BP_ERR_INTERNAL, "vulkan: glslang gave no SPIR-V for " + name);
  return std::vector<uint32_t>(words.begin(), words.end());
}

// ---------------------------------------------------------------------------
// The disk cache: <dir>/vulkan-fused-<key>.spv, this header then the words.

struct SpvHeader {
  char magic[8];  // "BPVKSPV\1"
  uint32_t header_size;
  uint32_t n_words;
  uint64_t key;   // FNV-1a of glslang's version and the source
  uint64_t key2;  // the same from another basis (a file named by key alone is not trusted)
  uint64_t words_hash;
};
constexpr char kSpvMagic[8] = {'B', 'P', 'V', 'K', 'S', 'P', 'V', '\1'};
constexpr uint32_t kSpirvMagic = 0x07230203u;

std::vector<uint32_t> load_spirv(const std::string& device, const std::string& path, uint64_t key, uint64_t key2) {
  const std::vector<char> file = read_cache_file(path);
  if (file.empty()) return {};
  const auto ignore = [&](const std::string& why) {
    log(BP_LOG_INFO, "vulkan: " + device + ": ignoring the shader cache file " + path + ": " + why);
    return std::vector<uint32_t>();
  };
  SpvHeader h{};
  if (file.size() < sizeof h) return ignore("truncated header");
  std::memcpy(&h, file.data(), sizeof h);
  if (std::memcmp(h.magic, kSpvMagic, sizeof kSpvMagic) != 0 || h.header_size != sizeof h)
    return ignore("not a Backplane SPIR-V cache file");
  if (h.key != key || h.key2 != key2) return ignore("written for another shader or glslang version");
  if (uint64_t{h.n_words} * 4 != file.size() - sizeof h) return ignore("truncated or padded");
  std::vector<uint32_t> words(h.n_words);
  if (!words.empty()) std::memcpy(words.data(), file.data() + sizeof h, words.size() * 4);
  if (words.size() < 5 || words[0] != kSpirvMagic) return ignore("not SPIR-V");
  if (fnv1a(words.data(), words.size() * 4) != h.words_hash) return ignore("corrupt data");
  return words;
}

// Atomic: a temporary file in the same folder, then a rename over the name.
// Best effort: failing costs a compile in the next process only.
bool save_spirv(const std::string& device, const std::string& path, uint64_t key, uint64_t key2,
                const std::vector<uint32_t>& words) {
  SpvHeader h{};
  std::memcpy(h.magic, kSpvMagic, sizeof kSpvMagic);
  h.header_size = sizeof h;
  h.n_words = static_cast<uint32_t>(words.size());
  h.key = key;
  h.key2 = key2;
  h.words_hash = fnv1a(words.data(), words.size() * 4);
  if (write_cache_file(path, &h, sizeof h, words.data(), words.size() * 4)) return true;
  log(BP_LOG_INFO, "vulkan: " + device + ": could not write the shader cache file " + path);
  return false;
}

}  // namespace

std::vector<uint32_t> generated_spirv(const std::string& device, const std::string& name, const std::string& source,
                                      const std::string& dir) {
  const std::string version = glslang_version();
  const uint64_t key = fnv1a(source.data(), source.size(), fnv1a(version.data(), version.size()));
  const uint64_t key2 =
      fnv1a(source.data(), source.size(), fnv1a(version.data(), version.size(), 0x84222325cbf29ce4ull));
  std::string path;
  if (!dir.empty()) {
    path = (std::filesystem::path(dir) / ("vulkan-fused-" + hex64(key) + ".spv")).string();
    std::vector<uint32_t> words = load_spirv(device, path, key, key2);
    if (!words.empty()) {
      log(BP_LOG_DEBUG, "vulkan: " + device + ": fused shader " + name + ": loaded from the disk cache " + path);
      return words;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<uint32_t> words = compile_glsl(name, source);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", ms);
  std::string where = "no disk cache";
  if (!path.empty() && save_spirv(device, path, key, key2, words)) where = "written to the disk cache " + path;
  log(BP_LOG_DEBUG, "vulkan: " + device + ": fused shader " + name + ": compiled by glslang in " + buf + " ms, " +
                        where);
  return words;
}

// ---------------------------------------------------------------------------
// The kernel.

namespace {

constexpr int kWG = 256;       // WG in shaders/common.glsl
constexpr int kPerThread = 4;  // elements per invocation

bool is_unary(uint16_t op) { return op <= BP_FUSED_AFFINE; }
bool is_binary(uint16_t op) { return op >= BP_FUSED_ADD && op <= BP_FUSED_POW; }
bool is_compare(uint16_t op) { return op >= BP_FUSED_EQ && op <= BP_FUSED_GE; }
int n_args(uint16_t op) { return is_unary(op) ? 1 : op == BP_FUSED_WHERE ? 3 : 2; }

// unary.comp's op code of a unary instruction (neg .. softplus share the
// numbering; gelu is 20, its tanh form 21).
int unary_code(const bp_fused_instr& ins) {
  if (ins.op == BP_FUSED_GELU) return ins.imm[0] != 0 ? 21 : 20;
  return ins.op;
}

// exp log sin cos tanh erf sigmoid silu softplus gelu pow: the ops whose
// code is long (unary.comp's modules of their own).
bool has_transcendental(const bp_fused_params& f) {
  for (uint32_t k = 0; k < f.n_code; ++k) {
    const bp_fused_instr& ins = f.code[k];
    const int u = is_unary(ins.op) ? unary_code(ins) : -1;
    if ((u >= 7 && u <= 12) || (u >= 17 && u <= 21) || ins.op == BP_FUSED_POW) return true;
  }
  return false;
}

struct Form {
  bool fast = false;
  uint32_t bcast = 0;  // fast: bit k, input k is a broadcast scalar
  bool tail = false;   // fast: n % 4 != 0
  uint32_t vpi = 1;    // 4-vectors per invocation
};

std::string offset_expr(size_t k) {
  static const char* const c[] = {"x", "y", "z", "w"};
  return std::string("uint(pc.") + (k < 4 ? "p." : "q.") + c[k % 4] + ")";
}

// The shader for one program, input dtypes and form (without its #version
// line). Clamp's and affine's constants are read from the argument block
// after the header (PARAMS), two words per such instruction in program
// order (fused_impl writes them), so the source does not depend on them.
std::string generate(const bp_fused_params& f, const std::vector<bool>& is_bool, const Form& form) {
  const size_t n_in = is_bool.size();
  std::string s;
  s += "// fused_elementwise (plugins/vulkan/fused.cpp):";
  for (uint32_t k = 0; k < f.n_code; ++k) {
    const bp_fused_instr& ins = f.code[k];
    s += " r" + std::to_string(n_in + k) + "=op" + std::to_string(ins.op);
    if (ins.op == BP_FUSED_GELU) s += ins.imm[0] != 0 ? "t" : "e";
    if (ins.op == BP_FUSED_CLAMP) s += std::string(std::isnan(ins.imm[0]) ? "" : "L") + (std::isnan(ins.imm[1]) ? "" : "H");
    s += "(";
    for (int a = 0; a < n_args(ins.op); ++a) s += (a ? "," : "") + std::to_string(ins.args[a]);
    s += ")";
  }
  s += "\n// inputs:";
  for (size_t k = 0; k < n_in; ++k) s += is_bool[k] ? " bool" : " f32";
  s += form.fast ? "; fast form" : "; general form";
  if (form.fast) {
    s += ", scalars " + std::to_string(form.bcast) + ", " + std::to_string(form.vpi) + " 4-vectors an invocation";
    if (form.tail) s += ", tail";
  }
  s += "\n#define NREC " + std::to_string(n_in + 1) + "\n#define IN_DT 1\n#define OUT_DT 1\n";
  s += "#include \"common.glsl\"\n#include \"elementwise.glsl\"\n#include \"math.glsl\"\n";
  s += "layout(local_size_x = WG) in;\n#define CT float\n#define HAS_OP(k) (UOP == (k))\n";
  // Each op's element function, instantiated once per code.
  std::set<int> unary, binary, compare;
  for (uint32_t k = 0; k < f.n_code; ++k) {
    const bp_fused_instr& ins = f.code[k];
    if (is_unary(ins.op) && ins.op != BP_FUSED_CLAMP && ins.op != BP_FUSED_AFFINE) unary.insert(unary_code(ins));
    if (is_binary(ins.op)) binary.insert(ins.op - BP_FUSED_ADD);
    if (is_compare(ins.op)) compare.insert(ins.op - BP_FUSED_EQ);
  }
  for (int u : unary) {
    const std::string c = std::to_string(u);
    s += "#define OP " + c + "\n#define UOP " + c + "\n#define op fu" + c + "\n#include \"unary_op.glsl\"\n";
    s += "#undef op\n#undef UOP\n#undef OP\n";
  }
  for (int b : binary) {
    const std::string c = std::to_string(b);
    s += "#define OT float\n#define OP " + c + "\n#define op fb" + c + "\n";
    if (b == BP_FUSED_POW - BP_FUSED_ADD) s += "#define POW 1\n";
    s += "#include \"binary_op.glsl\"\n#undef op\n#undef OP\n#undef OT\n#undef POW\n";
  }
  for (int b : compare) {
    const std::string c = std::to_string(b);
    s += "#define OT int\n#define CMP 1\n#define OP " + c + "\n#define op fc" + c + "\n";
    s += "#include \"binary_op.glsl\"\n#undef op\n#undef OP\n#undef CMP\n#undef OT\n";
  }
  // Operands: inputs at slots 2.., the output last.
  for (size_t k = 0; k < n_in; ++k)
    s += "DECL_RO(" + std::to_string(2 + k) + ", x" + std::to_string(k) + (is_bool[k] ? ", DT_BOOL)\n" : ", DT_F32)\n");
  s += "DECL_RW(" + std::to_string(2 + n_in) + ", o, DT_F32)\n";

  const size_t main_at = s.size();
  std::string params_decl;
  const std::string V = std::to_string(form.vpi) + "u";
  s += "void main() {\n  const uint n = pc.n;\n";
  s += "  const uint jb = (group_linear() * uint(WG) + gl_LocalInvocationID.x) * " + V + ";\n";
  s += "  for (uint h = 0u; h < " + V + "; ++h) {\n  const uint j = jb + h;\n";
  s += "  const uint i0 = j * 4u;\n  if (i0 >= n) return;\n  const int cnt = int(min(4u, n - i0));\n";
  for (size_t k = 0; k < n_in; ++k)
    s += is_bool[k] ? "  bvec4 in" + std::to_string(k) + " = bvec4(false);\n"
                    : "  vec4 in" + std::to_string(k) + " = vec4(0.0);\n";
  const std::string out_off = offset_expr(n_in);
  if (form.fast) {
    s += std::string("  const bool whole = ") + (form.tail ? "i0 + 4u <= n" : "true") + ";\n";
    for (size_t k = 0; k < n_in; ++k) {
      const std::string K = std::to_string(k), off = offset_expr(k);
      if ((form.bcast >> k) & 1u) {
        s += is_bool[k] ? "  in" + K + " = bvec4(uint(x" + K + ".v[" + off + "]) != 0u);\n"
                        : "  in" + K + " = vec4(x" + K + ".v[" + off + "]);\n";
      } else if (is_bool[k]) {
        s += "  if (whole) in" + K + " = notEqual(uvec4(x" + K + "4.v[" + off + " / 4u + j]), uvec4(0u));\n";
        s += "  else for (int c = 0; c < cnt; ++c) in" + K + "[c] = uint(x" + K + ".v[" + off +
             " + i0 + uint(c)]) != 0u;\n";
      } else {
        s += "  if (whole) in" + K + " = x" + K + "4.v[" + off + " / 4u + j];\n";
        s += "  else for (int c = 0; c < cnt; ++c) in" + K + "[c] = x" + K + ".v[" + off + " + i0 + uint(c)];\n";
      }
    }
  } else {
    s += "  int dst[4] = int[4](0, 0, 0, 0);\n  for (int c = 0; c < cnt; ++c) {\n    int off[NREC];\n";
    s += "    elem_offsets(int(i0) + c, off);\n";
    for (size_t k = 0; k < n_in; ++k) {
      const std::string K = std::to_string(k);
      s += is_bool[k] ? "    in" + K + "[c] = uint(x" + K + ".v[off[" + K + "]]) != 0u;\n"
                      : "    in" + K + "[c] = x" + K + ".v[off[" + K + "]];\n";
    }
    s += "    dst[c] = off[" + std::to_string(n_in) + "];\n  }\n";
  }
  // The program, one statement per instruction, on each of the 4 elements.
  std::vector<bool> cond(n_in + f.n_code, false);
  for (size_t k = 0; k < n_in; ++k) cond[k] = is_bool[k];
  const auto value = [&](uint16_t r) {
    const std::string R = "r" + std::to_string(r);
    return cond[r] ? "(" + R + " ? 1.0 : 0.0)" : R;
  };
  const auto condition = [&](uint16_t r) {
    const std::string R = "r" + std::to_string(r);
    return cond[r] ? R : "(" + R + " != 0.0)";
  };
  // clamp's and affine's constants from the argument block, read once
  // (globals the program function reads).
  for (uint32_t k = 0, w = 0; k < f.n_code; ++k)
    if (f.code[k].op == BP_FUSED_CLAMP || f.code[k].op == BP_FUSED_AFFINE) {
      const std::string K = std::to_string(n_in + k);
      params_decl += "float p" + K + "a, p" + K + "b;\n";
      s += "  p" + K + "a = Af(PARAMS + " + std::to_string(w) + ");\n  p" + K + "b = Af(PARAMS + " +
           std::to_string(w + 1) + ");\n";
      w += 2;
    }
  // The program on one element: a function called once per element, at
  // four call sites (inlined four times: no loop, no indexing by a variable)
  // unless it holds a transcendental, whose code lavapipe compiles once per
  // inlined copy (unary.comp's reason for one call site in a loop).
  std::string fn = "float program(";
  for (size_t k = 0; k < n_in; ++k) fn += std::string(k ? ", " : "") + (is_bool[k] ? "bool r" : "float r") + std::to_string(k);
  fn += ") {\n";
  for (uint32_t k = 0; k < f.n_code; ++k) {
    const bp_fused_instr& ins = f.code[k];
    const size_t r = n_in + k;
    const std::string R = "r" + std::to_string(r);
    const std::string a = value(ins.args[0]);
    std::string e;
    if (ins.op == BP_FUSED_CLAMP) {
      // unary.comp's clamp (op 22) on floats: NaN stays, then each bound.
      const std::string lo = "p" + std::to_string(r) + "a", hi = "p" + std::to_string(r) + "b";
      fn += "    float " + R + " = " + a + ";\n";
      fn += "    if (!isnan(" + R + ")) {\n";
      if (!std::isnan(ins.imm[0])) fn += "      if (" + R + " < " + lo + ") " + R + " = " + lo + ";\n";
      if (!std::isnan(ins.imm[1])) fn += "      if (" + R + " > " + hi + ") " + R + " = " + hi + ";\n";
      fn += "    }\n";
      continue;
    }
    if (ins.op == BP_FUSED_AFFINE) {
      // unary.comp's affine (op 23): param_in(0) * x + param_in(1).
      e = "p" + std::to_string(r) + "a * " + a + " + p" + std::to_string(r) + "b";
    } else if (is_unary(ins.op)) {
      e = "fu" + std::to_string(unary_code(ins)) + "(" + a + ")";
    } else if (is_binary(ins.op)) {
      e = "fb" + std::to_string(ins.op - BP_FUSED_ADD) + "(" + a + ", " + value(ins.args[1]) + ")";
    } else if (is_compare(ins.op)) {
      e = "fc" + std::to_string(ins.op - BP_FUSED_EQ) + "(" + a + ", " + value(ins.args[1]) + ") != 0";
      cond[r] = true;
    } else {  // where
      e = condition(ins.args[0]) + " ? " + value(ins.args[1]) + " : " + value(ins.args[2]);
    }
    fn += std::string("    const ") + (cond[r] ? "bool " : "float ") + R + " = " + e + ";\n";
  }
  fn += "    return " + value(static_cast<uint16_t>(n_in + f.n_code - 1)) + ";\n}\n";
  const bool heavy = has_transcendental(f);
  const auto call = [&](const std::string& c) {
    std::string e = "program(";
    for (size_t k = 0; k < n_in; ++k) e += std::string(k ? ", " : "") + "in" + std::to_string(k) + c;
    return e + ")";
  };
  if (heavy) {
    s += "  vec4 res = vec4(0.0);\n  for (int c = 0; c < 4; ++c) res[c] = " + call("[c]") + ";\n";
  } else {
    s += "  const vec4 res = vec4(" + call(".x") + ", " + call(".y") + ", " + call(".z") + ", " + call(".w") + ");\n";
  }
  if (form.fast) {
    s += "  if (whole) o4.v[" + out_off + " / 4u + j] = res;\n";
    s += "  else for (int c = 0; c < cnt; ++c) o.v[" + out_off + " + i0 + uint(c)] = res[c];\n";
  } else {
    s += "  for (int c = 0; c < cnt; ++c) o.v[dst[c]] = res[c];\n";
  }
  s += "  }\n}\n";
  return s.substr(0, main_at) + params_decl + fn + s.substr(main_at);
}

void fused_impl(Call& c) {
  const bp_fused_params& f = c.params_of(BP_PARAMS_FUSED).u.fused;
  const std::string op = c.op();
  BP_SDK_CHECK(f.code != nullptr && f.n_code >= 1 && f.n_code <= BP_FUSED_MAX_CODE, BP_ERR_INVALID_ARGUMENT,
               op + ": the program is empty or longer than BP_FUSED_MAX_CODE");
  // Operands per dispatch: pc.addr and set 1 hold kMaxOperands, the output one of them.
  BP_SDK_CHECK(c.n_in + 1 <= kMaxOperands, BP_ERR_UNIMPLEMENTED,
               op + ": " + std::to_string(c.n_in) + " inputs; the vulkan plugin's kernel takes at most " +
                   std::to_string(kMaxOperands - 1));
  BP_SDK_CHECK(c.n_in >= 1 && c.in[0].dtype == BP_DTYPE_F32 && c.out[0].dtype == BP_DTYPE_F32,
               BP_ERR_INVALID_ARGUMENT, op + ": x0 and the output must be f32");
  const bp_layout& ol = c.lout();
  std::vector<bool> is_bool(c.n_in);
  for (size_t k = 0; k < c.n_in; ++k) {
    BP_SDK_CHECK(c.present(k) && (c.in[k].dtype == BP_DTYPE_F32 || c.in[k].dtype == BP_DTYPE_BOOL),
                 BP_ERR_INVALID_ARGUMENT, op + ": input " + std::to_string(k) + " must be f32 or bool");
    is_bool[k] = c.in[k].dtype == BP_DTYPE_BOOL;
    const bp_layout& l = c.lin(k);
    bool same = l.rank == ol.rank;
    for (uint32_t d = 0; same && d < ol.rank; ++d) same = l.shape[d] == ol.shape[d];
    BP_SDK_CHECK(same, BP_ERR_INVALID_ARGUMENT,
                 op + ": input " + std::to_string(k) + " is not broadcast to the output's shape");
  }
  for (uint32_t k = 0; k < f.n_code; ++k) {
    const bp_fused_instr& ins = f.code[k];
    BP_SDK_CHECK(is_unary(ins.op) || is_binary(ins.op) || is_compare(ins.op) || ins.op == BP_FUSED_WHERE,
                 BP_ERR_INVALID_ARGUMENT, op + ": instruction " + std::to_string(k) + ": unknown opcode " +
                                              std::to_string(ins.op));
    for (int a = 0; a < n_args(ins.op); ++a)
      BP_SDK_CHECK(ins.args[a] < c.n_in + k, BP_ERR_INVALID_ARGUMENT,
                   op + ": instruction " + std::to_string(k) + " reads register " + std::to_string(ins.args[a]) +
                       ", not defined before it");
  }
  const int64_t n = numel(ol);
  if (n == 0) return;
  BP_SDK_CHECK(n < (int64_t{1} << 31), BP_ERR_UNIMPLEMENTED, op + ": more than 2^31 elements (vulkan plugin limit)");

  std::vector<Binding> bindings;
  std::vector<int64_t> offsets;
  std::vector<const int64_t*> strides;
  for (size_t k = 0; k < c.n_in; ++k) {
    Operand o = bind(c, c.in[k], c.lin(k), c.in[k].dtype, false);
    bindings.push_back(o.binding);
    offsets.push_back(o.offset);
    strides.push_back(c.lin(k).strides);
  }
  Operand oo = bind(c, c.out[0], ol, BP_DTYPE_F32, true);
  bindings.push_back(oo.binding);
  offsets.push_back(oo.offset);
  strides.push_back(ol.strides);
  const Coalesced co = coalesce(ol.rank, ol.shape, strides);

  // The fast form: one coalesced dim, every input dense or a scalar, the
  // output dense, dense ones at 4-aligned offsets (elementwise_dispatch's rule).
  Form form;
  form.fast = co.rank <= 1;
  for (size_t k = 0; k < offsets.size() && form.fast; ++k) {
    const int64_t st = co.rank ? co.strides[k][0] : 0;
    const bool is_out = k + 1 == offsets.size();
    if (st == 0 && !is_out) form.bcast |= 1u << k;
    else if (!(st == 1 && offsets[k] % 4 == 0)) form.fast = false;
  }
  if (!form.fast) form.bcast = 0;
  form.tail = form.fast && n % kPerThread != 0;
  // Four 4-vectors an invocation on the fast form of a cheap program: on
  // lavapipe chain8_16M (8 cheap ops) went from 1.42x add_16M's time to
  // 1.24x (one 4-vector: 67-70 ms, four: 59 ms, eight: 67-72, add 47-48).
  // A program with transcendentals keeps one (compute dominates; its code
  // is compiled once per unrolled copy).
  if (form.fast && !has_transcendental(f)) form.vpi = 4;

  Args a;
  elementwise_header(a, co, offsets, form.fast);
  for (uint32_t k = 0; k < f.n_code; ++k) {
    const bp_fused_instr& ins = f.code[k];
    if (ins.op == BP_FUSED_CLAMP) {
      a.f32(std::isnan(ins.imm[0]) ? 0.0 : ins.imm[0]);
      a.f32(std::isnan(ins.imm[1]) ? 0.0 : ins.imm[1]);
    } else if (ins.op == BP_FUSED_AFFINE) {
      a.f32(ins.imm[0]);
      a.f32(ins.imm[1]);
    }
  }
  std::array<int32_t, 4> pw{}, qw{};
  for (size_t k = 0; k < offsets.size(); ++k) (k < 4 ? pw[k] : qw[k - 4]) = static_cast<int32_t>(offsets[k]);

  // One module per distinct source (program, input dtypes, form), and its
  // descriptor twin; generated once per device.
  const std::string body = generate(f, is_bool, form);
  static const std::string head = "#version 450\n#extension GL_GOOGLE_include_directive : require\n";
  const std::string name = "fused_" + hex64(fnv1a(body.data(), body.size()));
  Pipelines& pl = c.dev.pipelines;
  if (!pl.has_generated(name)) {
    pl.add_generated(name, head + body);
    pl.add_generated(name + "_dsc", head + "#define BP_DESC 1\n" + body);
  }
  const Pipeline& p = pl.get(name, {}, static_cast<uint32_t>(bindings.size()));
  c.dev.exec.dispatch(c.stream, p, bindings, a.w, static_cast<uint32_t>(n), 0, ceil_div(n, kWG * kPerThread * form.vpi),
                      c.op(), pw, qw);
}

}  // namespace

void register_fused(Registry& r) {
  // Inputs after x0 may be bool (conditions): fused_impl checks each one's
  // dtype itself (Row::own_input_dtypes).
  r.add("fused_elementwise", {BP_DTYPE_F32, BP_DTYPE_F32}, {S}, fused_impl, 0, 0, true);
}

}  // namespace backplane::vulkan
