// fused_elementwise's program: the opcode table, its JSON form and checks.
#include "fused_program.hpp"

#include <cmath>
#include <cstring>
#include <sstream>

namespace backplane::detail {

const std::vector<FusedOpInfo>& fused_ops() {
  using A = FusedArity;
  static const std::vector<FusedOpInfo> ops = {
      {BP_FUSED_NEG, "neg", A::Unary},         {BP_FUSED_ABS, "abs", A::Unary},
      {BP_FUSED_SIGN, "sign", A::Unary},       {BP_FUSED_SQR, "sqr", A::Unary},
      {BP_FUSED_SQRT, "sqrt", A::Unary},       {BP_FUSED_RSQRT, "rsqrt", A::Unary},
      {BP_FUSED_RECIP, "recip", A::Unary},     {BP_FUSED_EXP, "exp", A::Unary},
      {BP_FUSED_LOG, "log", A::Unary},         {BP_FUSED_SIN, "sin", A::Unary},
      {BP_FUSED_COS, "cos", A::Unary},         {BP_FUSED_TANH, "tanh", A::Unary},
      {BP_FUSED_ERF, "erf", A::Unary},         {BP_FUSED_FLOOR, "floor", A::Unary},
      {BP_FUSED_CEIL, "ceil", A::Unary},       {BP_FUSED_ROUND, "round", A::Unary},
      {BP_FUSED_RELU, "relu", A::Unary},       {BP_FUSED_SIGMOID, "sigmoid", A::Unary},
      {BP_FUSED_SILU, "silu", A::Unary},       {BP_FUSED_SOFTPLUS, "softplus", A::Unary},
      {BP_FUSED_GELU, "gelu", A::Unary},       {BP_FUSED_CLAMP, "clamp", A::Unary},
      {BP_FUSED_AFFINE, "affine", A::Unary},   {BP_FUSED_ADD, "add", A::Binary},
      {BP_FUSED_SUB, "sub", A::Binary},        {BP_FUSED_MUL, "mul", A::Binary},
      {BP_FUSED_DIV, "div", A::Binary},        {BP_FUSED_MAXIMUM, "maximum", A::Binary},
      {BP_FUSED_MINIMUM, "minimum", A::Binary}, {BP_FUSED_POW, "pow", A::Binary},
      {BP_FUSED_EQ, "eq", A::Compare},         {BP_FUSED_NE, "ne", A::Compare},
      {BP_FUSED_LT, "lt", A::Compare},         {BP_FUSED_LE, "le", A::Compare},
      {BP_FUSED_GT, "gt", A::Compare},         {BP_FUSED_GE, "ge", A::Compare},
      {BP_FUSED_WHERE, "where", A::Where},
  };
  return ops;
}

const FusedOpInfo* fused_op(const std::string& op_name) {
  for (const auto& o : fused_ops())
    if (op_name == o.name) return &o;
  return nullptr;
}

const FusedOpInfo* fused_op(uint16_t code) {
  for (const auto& o : fused_ops())
    if (o.code == code) return &o;
  return nullptr;
}

namespace {

int operands(FusedArity a) {
  switch (a) {
    case FusedArity::Unary: return 1;
    case FusedArity::Binary:
    case FusedArity::Compare: return 2;
    case FusedArity::Where: return 3;
  }
  return 0;
}

double number(const Json& params, const char* key, double absent, const std::string& where,
              const std::function<void(const std::string&)>& fail) {
  if (!params.contains(key) || params[key].is_null()) return absent;
  const Json& v = params[key];
  if (!v.is_number()) fail(where + ": '" + key + "' must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail(where + ": '" + key + "' must be finite");
  return d;
}

}  // namespace

Program parse_program(const Json& j, const std::vector<bool>& cond,
                      const std::function<void(const std::string&)>& fail) {
  if (!j.is_array() || j.empty())
    fail("param 'program' must be a non-empty list of instructions ([\"mul\", 0, 1], ...)");
  if (j.size() > BP_FUSED_MAX_CODE)
    fail("param 'program' has " + std::to_string(j.size()) + " instructions; the limit is " +
         std::to_string(BP_FUSED_MAX_CODE));
  std::vector<bool> is_cond = cond;  // per register
  Program prog;
  for (size_t k = 0; k < j.size(); ++k) {
    const Json& ins = j[k];
    const std::string where = "program instruction " + std::to_string(k);
    if (!ins.is_array() || ins.empty() || !ins[0].is_string())
      fail(where + " must be a list [op, register, ...]");
    const std::string name = ins[0].get<std::string>();
    const FusedOpInfo* info = fused_op(name);
    if (!info) {
      std::string known;
      for (const auto& o : fused_ops()) known += (known.empty() ? "" : ", ") + std::string(o.name);
      fail(where + ": '" + name + "' is not an elementwise op a program takes (" + known + ")");
    }
    const int n = operands(info->arity);
    const bool has_params = ins.size() == static_cast<size_t>(n) + 2 && ins.back().is_object();
    if (ins.size() != static_cast<size_t>(n) + 1 + (has_params ? 1 : 0))
      fail(where + " (" + name + ") takes " + std::to_string(n) + (n == 1 ? " register" : " registers"));
    bp_fused_instr out;
    std::memset(&out, 0, sizeof out);
    out.op = static_cast<uint16_t>(info->code);
    const size_t defined = is_cond.size();
    for (int a = 0; a < n; ++a) {
      const Json& r = ins[static_cast<size_t>(a) + 1];
      if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() >= static_cast<int64_t>(defined))
        fail(where + " (" + name + "): operand " + std::to_string(a) + " = " + r.dump() +
             " is not a register defined before it (0 to " + std::to_string(defined - 1) + ")");
      const auto reg = static_cast<size_t>(r.get<int64_t>());
      const bool want_cond = info->arity == FusedArity::Where && a == 0;
      if (is_cond[reg] != want_cond)
        fail(where + " (" + name + "): register " + std::to_string(reg) + " is " +
             (is_cond[reg] ? "a condition (bool)" : "a value") + "; operand " + std::to_string(a) + " must be " +
             (want_cond ? "a condition" : "a value"));
      out.args[a] = static_cast<uint16_t>(reg);
    }
    const Json params = has_params ? ins.back() : Json::object();
    auto only = [&](std::initializer_list<const char*> keys) {
      for (auto it = params.begin(); it != params.end(); ++it) {
        bool ok = false;
        for (const char* key : keys) ok = ok || it.key() == key;
        if (!ok) fail(where + " (" + name + "): unknown param '" + it.key() + "'");
      }
    };
    switch (info->code) {
      case BP_FUSED_GELU: {
        only({"approximate"});
        const std::string a = params.value("approximate", std::string("none"));
        if (a != "none" && a != "tanh") fail(where + " (gelu): 'approximate' must be \"none\" or \"tanh\"");
        out.imm[0] = a == "tanh" ? 1.0 : 0.0;
        break;
      }
      case BP_FUSED_CLAMP:
        only({"min", "max"});
        out.imm[0] = number(params, "min", std::nan(""), where, fail);
        out.imm[1] = number(params, "max", std::nan(""), where, fail);
        break;
      case BP_FUSED_AFFINE:
        only({"mul", "add"});
        out.imm[0] = number(params, "mul", 1.0, where, fail);
        out.imm[1] = number(params, "add", 0.0, where, fail);
        break;
      default:
        only({});
        break;
    }
    prog.push_back(out);
    is_cond.push_back(info->arity == FusedArity::Compare);
  }
  if (is_cond.back()) fail("the program's last instruction gives a condition; its result must be a value");
  return prog;
}

Json program_json(const bp_fused_instr* code, size_t n) {
  Json out = Json::array();
  for (size_t k = 0; k < n && code; ++k) {
    const bp_fused_instr& ins = code[k];
    const FusedOpInfo* info = fused_op(ins.op);
    if (!info) {
      out.push_back(Json::array({"opcode " + std::to_string(ins.op)}));
      continue;
    }
    Json one = Json::array({info->name});
    for (int a = 0; a < operands(info->arity); ++a) one.push_back(ins.args[a]);
    if (ins.op == BP_FUSED_GELU && ins.imm[0] != 0) one.push_back({{"approximate", "tanh"}});
    if (ins.op == BP_FUSED_CLAMP) {
      Json q = Json::object();
      if (!std::isnan(ins.imm[0])) q["min"] = ins.imm[0];
      if (!std::isnan(ins.imm[1])) q["max"] = ins.imm[1];
      one.push_back(q);
    }
    if (ins.op == BP_FUSED_AFFINE) one.push_back({{"mul", ins.imm[0]}, {"add", ins.imm[1]}});
    out.push_back(std::move(one));
  }
  return out;
}

std::string program_text(const Program& p, size_t n_inputs) {
  std::ostringstream s;
  for (size_t k = 0; k < p.size(); ++k) {
    const auto& ins = p[k];
    const FusedOpInfo* info = fused_op(ins.op);
    s << (k ? "; " : "") << "r" << n_inputs + k << " = " << info->name << "(";
    for (int a = 0; a < operands(info->arity); ++a) s << (a ? ", " : "") << "r" << ins.args[a];
    if (ins.op == BP_FUSED_AFFINE) s << "; mul=" << ins.imm[0] << ", add=" << ins.imm[1];
    if (ins.op == BP_FUSED_CLAMP) s << "; min=" << ins.imm[0] << ", max=" << ins.imm[1];
    if (ins.op == BP_FUSED_GELU && ins.imm[0] != 0) s << "; tanh";
    s << ")";
  }
  return s.str();
}

}  // namespace backplane::detail
