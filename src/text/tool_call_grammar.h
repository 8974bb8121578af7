// The grammar that forces a tool call (tool_choice "required" or a named
// function): GBNF text, llama.cpp's grammar format, for a grammar engine to
// constrain decoding with. Each function's arguments are any JSON object.
#pragma once

#include <string>
#include <vector>

#include "text/tool_calls.h"

namespace wick {

// A GBNF string literal: "..." with quotes, backslashes and control bytes escaped.
std::string gbnf_literal(const std::string& s);

// Output that is one call (parallel: one or more) in format f (None: the
// Hermes markup, which the server parses for templates without tool markup)
// whose name is one of `names` (not empty).
std::string tool_call_gbnf(ToolFormat f, const std::vector<std::string>& names, bool parallel);

}  // namespace wick
