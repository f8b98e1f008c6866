// `backplane ops`: the standard op vocabulary from the core's own table (the
// one that checks every node), as text, Markdown or JSON; and the check that
// keeps docs/ops.md's generated tables equal to it.
#include <backplane/backplane.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.hpp"

namespace backplane::cli {

namespace {

// The generated part of a document lies between a line starting with
// kBegin and one starting with kEnd.
const char* const kBegin = "<!-- ops-table:begin";
const char* const kEnd = "<!-- ops-table:end";

struct Split {
  std::string before, generated, after;
};

Split split_document(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  Split s;
  int state = 0;  // 0 before, 1 inside, 2 after
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const std::string with_nl = line + "\n";
    if (state == 0) {
      s.before += with_nl;
      if (line.rfind(kBegin, 0) == 0) state = 1;
    } else if (state == 1) {
      if (line.rfind(kEnd, 0) == 0) {
        state = 2;
        s.after += with_nl;
      } else {
        s.generated += with_nl;
      }
    } else {
      s.after += with_nl;
    }
  }
  if (state != 2)
    throw Error(path + ": no generated op tables (a line starting with '" + kBegin +
                "', then one starting with '" + kEnd + "')");
  return s;
}

// The first line where a and b differ (1-based, within the generated part).
std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  for (size_t n = 1;; ++n) {
    const bool ha = static_cast<bool>(std::getline(sa, la)), hb = static_cast<bool>(std::getline(sb, lb));
    if (!ha && !hb) return "";
    if (!ha) la = "(end)";
    if (!hb) lb = "(end)";
    if (la != lb || !ha || !hb)
      return "line " + std::to_string(n) + " of the generated part:\n  file: " + la + "\n  now:  " + lb;
  }
}

void print_text() {
  std::string family;
  for (const auto& op : op_reference()) {
    if (op.family != family) {
      family = op.family;
      std::printf("%s%s\n", family == op_reference().front().family ? "" : "\n", family.c_str());
    }
    std::string ins, params, outs;
    for (const auto& i : op.inputs)
      ins += (ins.empty() ? "" : "; ") + i.name + (i.variadic ? "..." : "") + (i.optional ? "?" : "") + ": " +
             i.dtypes;
    for (const auto& p : op.params) {
      params += (params.empty() ? "" : ", ") + p.name;
      if (p.required)
        params += " (required)";
      else if (!p.default_value.is_null())
        params += "=" + p.default_value.dump();
    }
    for (const auto& o : op.outputs)
      outs += (outs.empty() ? "" : "; ") + (op.outputs.size() > 1 ? o.name + ": " : "") + o.dtype;
    std::printf("  %-15s (%s) -> %s%s\n", op.name.c_str(), ins.c_str(), outs.c_str(),
                params.empty() ? "" : ("   " + params).c_str());
  }
  std::printf("\n(`backplane ops --markdown` or `--json` for params' kinds, ranges and the semantics)\n");
}

}  // namespace

int cmd_ops(const Args& in) {
  Args args = in;
  const bool markdown = take_switch(args, "--markdown");
  const bool json = take_switch(args, "--json");
  const std::string check = take_option(args, "--check");
  const std::string update = take_option(args, "--update");
  reject_leftovers(args);
  if (markdown + json + !check.empty() + !update.empty() > 1)
    throw Error("ops: give one of --markdown, --json, --check FILE, --update FILE");
  if (markdown) {
    std::cout << op_reference_markdown();
    return 0;
  }
  if (json) {
    std::cout << op_reference_json().dump(2) << "\n";
    return 0;
  }
  if (!check.empty()) {
    const Split s = split_document(check);
    const std::string now = "\n" + op_reference_markdown() + "\n";
    if (s.generated == now) {
      std::printf("%s: the op tables match the core's op table\n", check.c_str());
      return 0;
    }
    std::fprintf(stderr,
                 "backplane: error: %s: the op tables differ from `backplane ops --markdown` (%s)\n"
                 "  run `backplane ops --update %s` and review the change\n",
                 check.c_str(), first_difference(s.generated, now).c_str(), check.c_str());
    return 1;
  }
  if (!update.empty()) {
    const Split s = split_document(update);
    const std::string text = s.before + "\n" + op_reference_markdown() + "\n" + s.after;
    std::ofstream f(update, std::ios::binary | std::ios::trunc);
    if (!(f << text)) throw Error(update + ": cannot write");
    std::printf("%s: op tables written\n", update.c_str());
    return 0;
  }
  print_text();
  return 0;
}

}  // namespace backplane::cli
