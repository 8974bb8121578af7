#include "text/tool_call_grammar.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

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

// name ::= alternatives, each the JSON string of a name (quoted: true) or the bare name.
std::string name_rule(const std::vector<std::string>& names, bool quoted) {
  std::string alts;
  for (const auto& n : names) {
    if (!alts.empty()) alts += " | ";
    alts += gbnf_literal(quoted ? nlohmann::json(n).dump() : n);
  }
  return "name ::= " + alts + "\n";
}

}  // namespace

std::string gbnf_literal(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

std::string tool_call_gbnf(ToolFormat f, const std::vector<std::string>& names, bool parallel) {
  if (names.empty()) throw std::invalid_argument("tool_call_gbnf: no function names");
  // {"name": N, "<key>": {...}}: the body every JSON format shares
  auto body = [](const char* args_key) {
    return fmt::format(
        R"(call-json ::= "{{" ws "\"name\"" ws ":" ws name ws "," ws "\"{}\"" ws ":" ws object ws "}}")"
        "\n",
        args_key);
  };
  std::string g;
  switch (f) {
    case ToolFormat::None:
    case ToolFormat::Hermes:
      g = parallel ? "root ::= call ( ws call )*\n" : "root ::= call\n";
      g += R"(call ::= "<tool_call>" ws call-json ws "</tool_call>")"
           "\n";
      g += body("arguments");
      g += name_rule(names, true);
      break;
    case ToolFormat::Llama3Json:
      g = parallel ? "root ::= call-json ( ws \";\" ws call-json )*\n" : "root ::= call-json\n";
      g += body("parameters");
      g += name_rule(names, true);
      break;
    case ToolFormat::Mistral:
      g = parallel
              ? R"(root ::= "[TOOL_CALLS]" ws "[" ws call-json ( ws "," ws call-json )* ws "]")"
              : R"(root ::= "[TOOL_CALLS]" ws "[" ws call-json ws "]")";
      g += "\n" + body("arguments");
      g += name_rule(names, true);
      break;
    case ToolFormat::MistralArgs:
      g = parallel ? "root ::= call+\n" : "root ::= call\n";
      g += R"(call ::= "[TOOL_CALLS]" name "[ARGS]" object)"
           "\n";
      g += name_rule(names, false);
      break;
  }
  return g + kJsonRules;
}

}  // namespace wick
