// Tool calls in responses, in each API's JSON (OpenAI: arguments as a JSON
// string; Ollama: as an object); answer_parser.h splits them from the text.
#pragma once

#include <string>

#include "server/api_types.h"
#include "server/parse_common.h"
#include "text/tool_calls.h"

namespace wick::server {

// message.tool_calls[i]: {id, type, function: {name, arguments}}.
json openai_tool_call(const ToolCall& c);
// A streamed call: the first delta (index, id, type, name, empty arguments),
// then the arguments.
json openai_call_start(const ToolCall& c, size_t index);
json openai_call_arguments(const ToolCall& c, size_t index);
// Ollama's message.tool_calls[i]: {function: {name, arguments: {...}}}.
json ollama_tool_call(const ToolCall& c);

}  // namespace wick::server
