#include "server/tool_request.h"

#include <algorithm>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/tool_call_grammar.h"

namespace wick::server {

namespace {

// Each tool: {"type": "function", "function": {"name": ..., "parameters": {...}}}.
std::vector<std::string> tool_names(const json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be an array", "invalid_type");
  if (tools.size() > kMaxTools)
    bad("tools", fmt::format("'tools' takes at most {} tools", kMaxTools));
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string p = fmt::format("tools[{}]", i);
    if (!t.is_object()) bad(p, p + " must be an object", "invalid_type");
    if (t.contains("type") && t["type"] != "function")
      bad(p + ".type", p + ".type must be \"function\"");
    if (!t.contains("function") || !t["function"].is_object())
      bad(p + ".function", p + ".function must be an object", "invalid_type");
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      bad(p + ".function.name", p + ".function.name must be a non-empty string", "invalid_type");
    if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
      bad(p + ".function.parameters", p + ".function.parameters must be an object", "invalid_type");
    names.push_back(f["name"]);
  }
  return names;
}

// The grammar of a forced call to one of `forced`: each function's arguments
// follow its parameters' schema, so that a forced call is also a valid one.
// A schema the compiler does not support leaves that function's arguments
// any JSON object: the call is still forced, only less constrained.
std::string forced_call_gbnf(ToolFormat format, const json& tools,
                             const std::vector<std::string>& forced, bool parallel) {
  std::vector<ToolGrammar> fns;
  for (const json& t : tools) {
    const json& f = t["function"];
    const std::string name = f["name"];
    if (std::find(forced.begin(), forced.end(), name) == forced.end()) continue;
    ToolGrammar tg{name, "", ""};
    if (f.contains("parameters") && f["parameters"].is_object()) {
      const size_t i = fns.size();
      grammar::SchemaOptions opt;
      opt.root_name = fmt::format("args-{}", i);
      opt.rule_prefix = fmt::format("a{}-", i);
      try {
        tg.rules = grammar::json_schema_to_gbnf(f["parameters"], opt);
        tg.args_rule = opt.root_name;
      } catch (const grammar::GrammarError&) {
      }
    }
    fns.push_back(std::move(tg));
  }
  return tool_call_gbnf_with_args(format, fns, parallel);
}

}  // namespace

json parse_tools(const json& b, const ModelView& m, bool openai, ToolSetup& setup,
                 GenerateRequest& g) {
  const json tools = b.value("tools", json());
  const bool has_tools = !tools.is_null() && !(tools.is_array() && tools.empty());
  const std::vector<std::string> names =
      tools.is_null() ? std::vector<std::string>{} : tool_names(tools);
  // A template without tool markup gets Hermes parsing, the most common format.
  const ToolFormat format = m.tool_format == ToolFormat::None ? ToolFormat::Hermes : m.tool_format;
  setup = {};
  if (openai) {
    if (auto p = field<bool>(b, "parallel_tool_calls")) setup.parallel = *p;
  }
  std::vector<std::string> forced;  // names a call must use ("required" or a named function)
  std::string choice = "auto";
  if (openai && b.contains("tool_choice") && !b["tool_choice"].is_null()) {
    const json& c = b["tool_choice"];
    const std::string what =
        "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
        "\"function\": {\"name\": ...}}";
    if (c.is_string()) {
      choice = c;
      if (choice != "none" && choice != "auto" && choice != "required") bad("tool_choice", what);
      if (choice == "required") forced = names;
    } else if (c.is_object() && c.contains("type") && c["type"] == "function" &&
               c.contains("function") && c["function"].is_object() &&
               c["function"].contains("name") && c["function"]["name"].is_string()) {
      choice = "function";
      const std::string name = c["function"]["name"];
      if (std::find(names.begin(), names.end(), name) == names.end())
        bad("tool_choice", fmt::format("tool_choice names '{}', which is not in 'tools'", name));
      forced = {name};
    } else {
      bad("tool_choice", what, "invalid_type");
    }
    if ((choice == "required" || choice == "function") && !has_tools)
      bad("tool_choice", "tool_choice \"" + choice + "\" needs 'tools'");
  }
  if (!has_tools || choice == "none") return json();  // nothing offered, nothing parsed
  setup.format = format;
  if (!forced.empty())
    g.grammar = grammar::compile_gbnf(forced_call_gbnf(format, tools, forced, setup.parallel));
  return tools;
}

}  // namespace wick::server
