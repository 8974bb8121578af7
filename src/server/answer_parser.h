// A chat answer read as it arrives: reasoning first (when the request splits
// it: text/reasoning.h), then content and tool calls (with tools:
// text/tool_calls.h). Each API's writer answers the pieces in its own shape.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_types.h"
#include "text/reasoning.h"
#include "text/tool_calls.h"

namespace wick::server {

struct AnswerEvent {
  enum class Kind { Reasoning, Content, Call } kind = Kind::Content;
  std::string text;  // Reasoning, Content
  size_t index = 0;  // Call: of calls()
};

class AnswerParser {
 public:
  AnswerParser(const ReasoningSetup& reasoning, const ToolSetup& tools,
               const std::string& call_id_prefix);
  std::vector<AnswerEvent> push(std::string_view text);
  std::vector<AnswerEvent> finish();
  const std::vector<ToolCall>& calls() const;

 private:
  void add(const std::vector<ReasoningPiece>& pieces, std::vector<AnswerEvent>& out);
  void add(const std::vector<ToolEvent>& evs, std::vector<AnswerEvent>& out);
  std::unique_ptr<ReasoningParser> reasoning_;  // when split
  std::unique_ptr<ToolCallParser> tools_;       // with tools
};

// The whole answer at once (non-streaming): the same as pushing it all and
// finishing; parallel_tool_calls false keeps the first call only.
struct ParsedAnswer {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};
ParsedAnswer parse_answer(const ReasoningSetup& reasoning, const ToolSetup& tools,
                          const std::string& text, const std::string& call_id_prefix);

}  // namespace wick::server
