#include "server/tool_output.h"

namespace wick::server {

json openai_tool_call(const ToolCall& c) {
  return {{"id", c.id},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

json openai_call_start(const ToolCall& c, size_t index) {
  return {{"index", index},
          {"id", c.id},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", ""}}}};
}

json openai_call_arguments(const ToolCall& c, size_t index) {
  return {{"index", index}, {"function", {{"arguments", c.arguments}}}};
}

json ollama_tool_call(const ToolCall& c) {
  // the parser checked it: a JSON object
  return {{"function", {{"name", c.name}, {"arguments", json::parse(c.arguments)}}}};
}

}  // namespace wick::server
