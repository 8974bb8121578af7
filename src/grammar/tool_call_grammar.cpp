#include "grammar/tool_call_grammar.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "grammar/grammar.h"

namespace wick {

namespace {

// Any JSON value, for arguments the grammar leaves free (RFC 8259's syntax;
// whitespace and digits bounded, so that a model cannot loop on them).
constexpr const char* kJsonRules =
    R"(object ::= "{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"
array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
value ::= object | array | string | number | "true" | "false" | "null"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" hex hex hex hex ) )* "\""
hex ::= [0-9a-fA-F]
number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
ws ::= [ \t\n\r]{0,16}
)";

}  // namespace

std::string tool_call_gbnf_with_args(ToolFormat f, const std::vector<ToolGrammar>& tools,
                                     bool parallel) {
  if (tools.empty()) throw std::invalid_argument("tool_call_gbnf: no functions");
  // fn-i: function i's call, {"name": N, "<key>": ARGS} for the JSON formats,
  // N[ARGS]ARGS for Mistral's newer one. call-json / call picks one of them.
  const bool json_call = f != ToolFormat::MistralArgs;
  const char* key = f == ToolFormat::Llama3Json ? "parameters" : "arguments";
  std::string fns, alts;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolGrammar& t = tools[i];
    const std::string args = t.args_rule.empty() ? "object" : t.args_rule;
    if (json_call)
      fns += fmt::format(
          R"(fn-{} ::= "{{" ws "\"name\"" ws ":" ws {} ws "," ws "\"{}\"" ws ":" ws {} ws "}}")"
          "\n",
          i, grammar::gbnf_literal(nlohmann::json(t.name).dump()), key, args);
    else
      fns += fmt::format(R"(fn-{} ::= {} "[ARGS]" {})"
                         "\n",
                         i, grammar::gbnf_literal(t.name), args);
    fns += t.rules;
    if (!fns.empty() && fns.back() != '\n') fns += '\n';
    alts += fmt::format("{}fn-{}", i ? " | " : "", i);
  }
  std::string g;
  switch (f) {
    case ToolFormat::None:
    case ToolFormat::Hermes:
      g = parallel ? "root ::= call ( ws call )*\n" : "root ::= call\n";
      g += R"(call ::= "<tool_call>" ws call-json ws "</tool_call>")"
           "\n";
      break;
    case ToolFormat::Llama3Json:
      g = parallel ? "root ::= call-json ( ws \";\" ws call-json )*\n" : "root ::= call-json\n";
      break;
    case ToolFormat::Mistral:
      g = parallel
              ? R"(root ::= "[TOOL_CALLS]" ws "[" ws call-json ( ws "," ws call-json )* ws "]")"
              : R"(root ::= "[TOOL_CALLS]" ws "[" ws call-json ws "]")";
      g += "\n";
      break;
    case ToolFormat::Granite:
      g = parallel
              ? R"(root ::= "<|tool_call|>" ws "[" ws call-json ( ws "," ws call-json )* ws "]")"
              : R"(root ::= "<|tool_call|>" ws "[" ws call-json ws "]")";
      g += "\n";
      break;
    case ToolFormat::MistralArgs:
      g = parallel ? "root ::= call+\n" : "root ::= call\n";
      g += R"(call ::= "[TOOL_CALLS]" ( )" + alts + " )\n";
      break;
  }
  if (json_call) g += "call-json ::= " + alts + "\n";
  return g + fns + kJsonRules;
}

std::string tool_call_gbnf(ToolFormat f, const std::vector<std::string>& names, bool parallel) {
  std::vector<ToolGrammar> tools;
  for (const auto& n : names) tools.push_back({n, "", ""});
  return tool_call_gbnf_with_args(f, tools, parallel);
}

}  // namespace wick
