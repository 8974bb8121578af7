#include "server/tool_output.h"

namespace wick::server {

ParsedOutput split_tool_calls(const ToolSetup& t, const std::string& text,
                              const std::string& id_prefix) {
  ParsedOutput out = parse_tool_calls(t.format, text, id_prefix);
  if (!t.parallel && out.calls.size() > 1) out.calls.resize(1);
  return out;
}

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
