// Reasoning in a model's output: the text between <think> and </think> at the
// start of an answer (Qwen3, QwQ, DeepSeek-R1 and its distills), split from
// the content as it is generated, so that servers can answer it apart
// (OpenAI-style reasoning_content, Ollama's thinking, a Responses reasoning item).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace wick {

// Whether a chat template's models think in <think> tags (its text names them).
bool template_has_reasoning(std::string_view chat_template);
// Whether a rendered prompt ends inside an open <think> (templates that start
// the answer's reasoning themselves): the output then begins as reasoning.
bool prompt_opens_reasoning(std::string_view prompt_tail);

struct ReasoningPiece {
  bool reasoning = false;
  std::string text;
};

class ReasoningParser {
 public:
  // open: the prompt ended inside <think>.
  explicit ReasoningParser(bool open) : state_(open ? State::Reasoning : State::Start) {}
  // Text as it is generated; returns what is now certain. Bytes that may
  // start a tag are held back until they turn out not to.
  std::vector<ReasoningPiece> push(std::string_view text);
  // The end of the output: what was held back (reasoning never closed stays reasoning).
  std::vector<ReasoningPiece> finish();

 private:
  // Start: whitespace before a possible <think>; Reasoning: inside it;
  // AfterEnd: whitespace after </think> (not content); Content: the rest.
  enum class State { Start, Reasoning, AfterEnd, Content };
  void emit(bool reasoning, std::string_view s, std::vector<ReasoningPiece>& out);
  State state_;
  std::string held_;  // undecided bytes
};

// The whole output at once (a non-streaming answer): the same as pushing it
// all and finishing.
struct SplitReasoning {
  std::string reasoning, content;
};
SplitReasoning split_reasoning(std::string_view text, bool open);

}  // namespace wick
