// fused_elementwise's program (abi.h: bp_fused_instr): the opcode table, the
// program's JSON form in a graph ("program": [["mul", 0, 1], ["exp", 3]]),
// its check, and its one-line text for explain().
#pragma once

#include <backplane/abi.h>
#include <backplane/backplane.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace backplane::detail {

using Program = std::vector<bp_fused_instr>;

enum class FusedArity { Unary, Binary, Compare, Where };

struct FusedOpInfo {
  bp_fused_opcode code;
  const char* name;  // the standard op's name
  FusedArity arity;
};

// Every opcode, in opcode order.
const std::vector<FusedOpInfo>& fused_ops();
// The entry of a standard op name, or nullptr when no opcode has it.
const FusedOpInfo* fused_op(const std::string& op_name);
const FusedOpInfo* fused_op(uint16_t code);

// Reads and checks a program against its inputs: `cond[i]` says input i is
// a condition (bool). Throws std::string-free Error via `fail(msg)`; returns
// the instructions. Checks: 1..BP_FUSED_MAX_CODE instructions, known ops,
// operand counts, registers defined earlier and of the kind the op takes,
// finite params, and the last register a compute value.
Program parse_program(const Json& j, const std::vector<bool>& cond,
                      const std::function<void(const std::string&)>& fail);

// The JSON form parse_program reads. Any instructions (a remote client's):
// an unknown opcode is written as "opcode N", which parse_program refuses.
Json program_json(const bp_fused_instr* code, size_t n);
inline Json program_json(const Program& p) { return program_json(p.data(), p.size()); }

// "r2 = mul(r0, r1); r3 = exp(r2)" with params ("affine(r3; mul=2, add=1)").
std::string program_text(const Program& p, size_t n_inputs);

}  // namespace backplane::detail
