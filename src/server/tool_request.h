// A chat request's tools: the definitions checked, tool_choice and
// parallel_tool_calls read, and the grammar that forces a call when one is
// required. Both APIs (Ollama has tools but neither of the two fields).
#pragma once

#include "server/api_types.h"
#include "server/parse_common.h"

namespace wick::server {

// Reads body's "tools" (400 naming tools[i]... when malformed) and, with
// openai, "tool_choice" and "parallel_tool_calls". Sets setup (the format to
// parse, None with no tools or tool_choice "none") and, for "required" or a
// named function, g.grammar (the call's markup around JSON: grammar/tool_call_grammar.h). Returns
// the tools to render with the chat template: null when none are offered.
json parse_tools(const json& body, const ModelView& m, bool openai, ToolSetup& setup,
                 GenerateRequest& g);

}  // namespace wick::server
