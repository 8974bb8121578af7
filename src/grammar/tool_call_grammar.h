// The grammar that forces a tool call (tool_choice "required" or a named
// function): GBNF text, llama.cpp's grammar format, for a grammar engine to
// constrain decoding with. Each function's arguments follow the rule the
// caller gives for it (its parameters' schema), or are any JSON object.
#pragma once

#include <string>
#include <vector>

#include "text/tool_calls.h"

namespace wick {

// A function a forced call may use and the grammar of its arguments.
struct ToolGrammar {
  std::string name;
  std::string args_rule;  // the rule matching its arguments; empty: any JSON object
  std::string rules;      // GBNF defining args_rule (names that do not clash with the others)
};

// Output that is one call (parallel: one or more) in format f (None: the
// Hermes markup, which the server parses for templates without tool markup)
// to one of `tools` (not empty), with arguments its rule matches.
std::string tool_call_gbnf_with_args(ToolFormat f, const std::vector<ToolGrammar>& tools,
                                     bool parallel);
// The same with any JSON object as every function's arguments.
std::string tool_call_gbnf(ToolFormat f, const std::vector<std::string>& names, bool parallel);

}  // namespace wick
