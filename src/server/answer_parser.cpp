#include "server/answer_parser.h"

namespace wick::server {

AnswerParser::AnswerParser(const ReasoningSetup& reasoning, const ToolSetup& tools,
                           const std::string& call_id_prefix) {
  if (reasoning.split) reasoning_ = std::make_unique<ReasoningParser>(reasoning.open);
  if (tools.format != ToolFormat::None)
    tools_ = std::make_unique<ToolCallParser>(tools.format, call_id_prefix);
}

void AnswerParser::add(const std::vector<ToolEvent>& evs, std::vector<AnswerEvent>& out) {
  for (const ToolEvent& e : evs)
    out.push_back(e.is_call ? AnswerEvent{AnswerEvent::Kind::Call, "", e.index}
                            : AnswerEvent{AnswerEvent::Kind::Content, e.content, 0});
}

void AnswerParser::add(const std::vector<ReasoningPiece>& pieces, std::vector<AnswerEvent>& out) {
  for (const ReasoningPiece& p : pieces) {
    if (p.reasoning)
      out.push_back({AnswerEvent::Kind::Reasoning, p.text, 0});
    else if (tools_)
      add(tools_->push(p.text), out);
    else
      out.push_back({AnswerEvent::Kind::Content, p.text, 0});
  }
}

std::vector<AnswerEvent> AnswerParser::push(std::string_view text) {
  std::vector<AnswerEvent> out;
  if (reasoning_)
    add(reasoning_->push(text), out);
  else
    add({ReasoningPiece{false, std::string(text)}}, out);
  return out;
}

std::vector<AnswerEvent> AnswerParser::finish() {
  std::vector<AnswerEvent> out;
  if (reasoning_) add(reasoning_->finish(), out);
  if (tools_) add(tools_->finish(), out);
  return out;
}

const std::vector<ToolCall>& AnswerParser::calls() const {
  static const std::vector<ToolCall> none;
  return tools_ ? tools_->calls() : none;
}

ParsedAnswer parse_answer(const ReasoningSetup& reasoning, const ToolSetup& tools,
                          const std::string& text, const std::string& call_id_prefix) {
  AnswerParser p(reasoning, tools, call_id_prefix);
  ParsedAnswer out;
  auto take = [&](const std::vector<AnswerEvent>& evs) {
    for (const AnswerEvent& e : evs) {
      if (e.kind == AnswerEvent::Kind::Reasoning) out.reasoning += e.text;
      if (e.kind == AnswerEvent::Kind::Content) out.content += e.text;
      if (e.kind == AnswerEvent::Kind::Call && (tools.parallel || out.calls.empty()))
        out.calls.push_back(p.calls()[e.index]);
    }
  };
  take(p.push(text));
  take(p.finish());
  return out;
}

}  // namespace wick::server
