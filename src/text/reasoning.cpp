#include "text/reasoning.h"

#include <algorithm>

namespace wick {

namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

// The length of the longest suffix of s that is a proper prefix of tag.
size_t partial_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

bool template_has_reasoning(std::string_view chat_template) {
  return chat_template.find(kOpen) != std::string_view::npos &&
         chat_template.find(kClose) != std::string_view::npos;
}

bool prompt_opens_reasoning(std::string_view tail) {
  while (!tail.empty() && is_space(tail.back())) tail.remove_suffix(1);
  return tail.size() >= kOpen.size() && tail.substr(tail.size() - kOpen.size()) == kOpen;
}

void ReasoningParser::emit(bool reasoning, std::string_view s, std::vector<ReasoningPiece>& out) {
  if (s.empty()) return;
  if (!out.empty() && out.back().reasoning == reasoning)
    out.back().text += s;
  else
    out.push_back({reasoning, std::string(s)});
}

std::vector<ReasoningPiece> ReasoningParser::push(std::string_view text) {
  std::vector<ReasoningPiece> out;
  held_ += text;
  std::string_view s = held_;
  for (bool progress = true; progress && !s.empty();) {
    progress = false;
    switch (state_) {
      case State::Start: {
        size_t ws = 0;
        while (ws < s.size() && is_space(s[ws])) ++ws;
        std::string_view rest = s.substr(ws);
        if (rest.empty()) break;  // only whitespace yet
        const size_t n = std::min(rest.size(), kOpen.size());
        if (rest.substr(0, n) == kOpen.substr(0, n)) {
          if (rest.size() < kOpen.size()) break;  // a prefix of <think>: wait
          s = rest.substr(kOpen.size());
          state_ = State::Reasoning;
        } else {
          state_ = State::Content;
        }
        progress = true;
        break;
      }
      case State::Reasoning: {
        const size_t end = s.find(kClose);
        if (end == std::string_view::npos) {
          const size_t keep = partial_suffix(s, kClose);
          emit(true, s.substr(0, s.size() - keep), out);
          s = s.substr(s.size() - keep);
          break;
        }
        emit(true, s.substr(0, end), out);
        s = s.substr(end + kClose.size());
        state_ = State::AfterEnd;
        progress = true;
        break;
      }
      case State::AfterEnd: {
        size_t ws = 0;
        while (ws < s.size() && is_space(s[ws])) ++ws;
        s = s.substr(ws);
        if (!s.empty()) state_ = State::Content, progress = true;
        break;
      }
      case State::Content:
        emit(false, s, out);
        s = {};
        break;
    }
  }
  held_ = std::string(s);
  return out;
}

std::vector<ReasoningPiece> ReasoningParser::finish() {
  std::vector<ReasoningPiece> out;
  if (state_ == State::Reasoning) emit(true, held_, out);
  if (state_ == State::Start || state_ == State::Content) emit(false, held_, out);
  held_.clear();
  return out;
}

SplitReasoning split_reasoning(std::string_view text, bool open) {
  ReasoningParser p(open);
  SplitReasoning out;
  auto add = [&](const std::vector<ReasoningPiece>& pieces) {
    for (const auto& piece : pieces) (piece.reasoning ? out.reasoning : out.content) += piece.text;
  };
  add(p.push(text));
  add(p.finish());
  return out;
}

}  // namespace wick
