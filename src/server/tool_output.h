// Tool calls in responses: the answer split into content and calls as the
// request's ToolSetup says, and the calls in each API's JSON (OpenAI:
// arguments as a JSON string; Ollama: as an object).
#pragma once

#include <string>

#include "server/api_types.h"
#include "server/parse_common.h"
#include "text/tool_calls.h"

namespace wick::server {

// The whole answer at once; with parallel off only the first call is kept.
ParsedOutput split_tool_calls(const ToolSetup& t, const std::string& text,
                              const std::string& id_prefix);

// message.tool_calls[i]: {id, type, function: {name, arguments}}.
json openai_tool_call(const ToolCall& c);
// A streamed call: the first delta (index, id, type, name, empty arguments),
// then the arguments.
json openai_call_start(const ToolCall& c, size_t index);
json openai_call_arguments(const ToolCall& c, size_t index);
// Ollama's message.tool_calls[i]: {function: {name, arguments: {...}}}.
json ollama_tool_call(const ToolCall& c);

}  // namespace wick::server
