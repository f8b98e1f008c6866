// The op reference printed from the table (`backplane ops`, docs/ops.md).
#include "ops_spec.hpp"

// ---- the public reference (backplane.hpp) ----------------------------------------------------------

namespace backplane {

namespace {

using detail::Kind;

std::string range_text(const detail::ParamSpec& s) {
  if (s.kind == Kind::Enum) {
    std::string v;
    for (size_t k = 0; k < s.values.size(); ++k)
      v += (k == 0 ? "" : k + 1 == s.values.size() ? " or " : ", ") + ("\"" + s.values[k] + "\"");
    return v;
  }
  const bool list = s.kind == Kind::Ints || s.kind == Kind::Pair || s.kind == Kind::Padding;
  std::string r;
  if (s.nonzero)
    r = "!= 0";
  else if (s.lo != INT64_MIN && s.hi != INT64_MAX)
    r = "in [" + std::to_string(s.lo) + ", " + std::to_string(s.hi) + "]";
  else if (s.lo != INT64_MIN)
    r = ">= " + std::to_string(s.lo);
  else if (s.hi != INT64_MAX)
    r = "<= " + std::to_string(s.hi);
  if (s.kind == Kind::Dims && !s.if_empty.empty()) r = "not []";
  return r.empty() || !list ? r : "each " + r;
}

std::string dtypes_text(const detail::OpSpec& op, const detail::InputSpec& s) {
  if (s.bundle) return "a bundle";
  if (s.like >= 0) return "like " + op.inputs[static_cast<size_t>(s.like)].name;
  return detail::set_name(s.dtypes) + (s.variadic && !s.each_own ? " (one dtype)" : "");
}

std::string output_dtype_text(const detail::OpSpec& op, const detail::OutputSpec& o) {
  switch (o.dtype) {
    case detail::OutDtype::Like:
      return "like " + op.inputs[static_cast<size_t>(o.like)].name + (op.variadic() ? "0" : "");
    case detail::OutDtype::Bool:
      return "bool";
    case detail::OutDtype::I64:
      return "i64";
    case detail::OutDtype::CastParam:
      return "the dtype param";
    case detail::OutDtype::Slot:
      return "the slot's dtype and shape";
  }
  return "?";
}

std::string cell(std::string s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

}  // namespace

std::vector<OpInfo> op_reference() {
  std::vector<OpInfo> v;
  for (const auto& op : detail::table()) {
    OpInfo info;
    info.name = op.name;
    info.family = op.family;
    info.summary = op.summary;
    for (const auto& s : op.inputs)
      info.inputs.push_back({s.name, dtypes_text(op, s), s.shape, s.optional, s.variadic});
    for (const auto& s : op.params) {
      std::string kind = detail::kind_name(s.kind);
      info.params.push_back({s.name, kind, s.required, s.dflt, s.absent, range_text(s), s.doc});
    }
    for (const auto& o : op.outputs) info.outputs.push_back({o.name, output_dtype_text(op, o), o.shape});
    v.push_back(std::move(info));
  }
  return v;
}

std::string op_reference_markdown() {
  std::string md;
  std::string family;
  for (const auto& op : op_reference()) {
    if (op.family != family) {
      family = op.family;
      md += (md.empty() ? "" : "\n") + ("### " + family + "\n\n");
      md += "| op | inputs | params | output | semantics |\n| --- | --- | --- | --- | --- |\n";
    }
    std::string ins;
    for (const auto& i : op.inputs) {
      const std::string name = i.variadic ? "`" + i.name + "0`, `" + i.name + "1`, ..." : "`" + i.name + "`";
      ins += (ins.empty() ? "" : "<br>") + name + (i.optional ? "?" : "") +
             (i.shape.empty() ? "" : " " + i.shape) + ": " + i.dtypes;
    }
    std::string params;
    for (const auto& p : op.params) {
      std::string t = "`" + p.name + "`: " + (p.kind == "string" ? p.range : p.kind);
      if (p.kind != "string" && !p.range.empty()) t += ", " + p.range;
      if (p.required)
        t += "; required";
      else if (!p.default_value.is_null())
        t += "; default `" + p.default_value.dump() + "`";
      else
        t += "; absent: " + p.absent;
      if (!p.doc.empty()) t += "; " + p.doc;
      params += (params.empty() ? "" : "<br>") + t;
    }
    std::string outs;
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      const auto& o = op.outputs[k];
      const std::string head =
          op.outputs.size() > 1 ? "slot " + std::to_string(k) + " `" + o.name + "`: " : "";
      outs += (outs.empty() ? "" : "<br>") + head + o.dtype + (o.shape.empty() ? "" : "; " + o.shape);
    }
    md += "| `" + op.name + "` | " + cell(ins) + " | " + cell(params.empty() ? "—" : params) + " | " +
          cell(outs) + " | " + cell(op.summary) + " |\n";
  }
  return md;
}

Json op_reference_json() {
  Json ops = Json::array();
  for (const auto& op : op_reference()) {
    Json j = {{"name", op.name}, {"family", op.family}, {"summary", op.summary}};
    j["inputs"] = Json::array();
    for (const auto& i : op.inputs)
      j["inputs"].push_back({{"name", i.name},
                             {"dtypes", i.dtypes},
                             {"shape", i.shape},
                             {"optional", i.optional},
                             {"variadic", i.variadic}});
    j["params"] = Json::array();
    for (const auto& p : op.params)
      j["params"].push_back({{"name", p.name},
                             {"kind", p.kind},
                             {"required", p.required},
                             {"default", p.default_value},
                             {"absent", p.absent},
                             {"range", p.range},
                             {"doc", p.doc}});
    j["outputs"] = Json::array();
    for (const auto& o : op.outputs)
      j["outputs"].push_back({{"name", o.name}, {"dtype", o.dtype}, {"shape", o.shape}});
    ops.push_back(std::move(j));
  }
  return {{"ops", ops}};
}

}  // namespace backplane
