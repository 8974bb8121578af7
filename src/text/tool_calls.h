// Tool calls in a model's output: which markup a chat template teaches
// (decided from the template's text), and a parser that splits the output
// into content and calls, incrementally for streaming.
//
// Formats (each also read with its special tokens hidden, as wick's
// detokenizer shows output: then the JSON stands at the start of the answer):
//   Hermes      <tool_call>{"name": N, "arguments": {...}}</tool_call>, several
//               in a row for parallel calls (Qwen2.5, Qwen3, Hermes, ...)
//   Llama3Json  {"name": N, "parameters": {...}} at the start of the answer,
//               after <|python_tag|> or not; several separated by ';'
//   Mistral     [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]
//   MistralArgs [TOOL_CALLS]N[ARGS]{...}, repeated for parallel calls
//   Granite     <|tool_call|>[{"name": N, "arguments": {...}}, ...] (IBM
//               Granite 3.x: Mistral's array after its own special token)
// A call is reported once its JSON is complete and valid; markup that does
// not hold a valid call is kept as content, markup and all. Whitespace
// between content and a call, or at the end after one, is not content.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace wick {

enum class ToolFormat { None, Hermes, Llama3Json, Mistral, MistralArgs, Granite };

const char* tool_format_name(ToolFormat f);  // "none", "hermes", "llama3_json", ...
// The format whose markup the template renders for tools; None when it
// renders none of them.
ToolFormat detect_tool_format(std::string_view chat_template);

struct ToolCall {
  std::string id;         // call_<prefix><index>, unique within the server
  std::string name;       // as the model wrote it
  std::string arguments;  // a JSON object, compact
};

// One piece of parsed output, in order: content text, or call `index` of calls().
struct ToolEvent {
  bool is_call = false;
  std::string content;  // when !is_call
  size_t index = 0;     // when is_call
};

class ToolCallParser {
 public:
  // id_prefix makes call ids unique (the server passes a request counter).
  ToolCallParser(ToolFormat f, std::string id_prefix);
  // Text as it is generated; returns what is now certain. Bytes that may
  // start markup are held back until they turn out to be content.
  std::vector<ToolEvent> push(std::string_view text);
  // The end of the output: whatever was held back.
  std::vector<ToolEvent> finish();
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  enum class Step { NeedMore, Progress };
  Step step(bool final, std::vector<ToolEvent>& out);
  Step content_step(bool final, std::vector<ToolEvent>& out);
  Step call_step(bool final, std::vector<ToolEvent>& out);
  // Where a call may start at or after pos_ (npos: none); *partial: it is
  // only a prefix of a marker, or bare JSON whose start is not yet certain.
  size_t find_call_start(bool final, bool* partial) const;
  void emit_content(std::string_view s, std::vector<ToolEvent>& out);
  void add_call(std::string name, std::string arguments, std::vector<ToolEvent>& out);

  ToolFormat format_;
  std::string id_prefix_;
  std::string text_;  // everything pushed so far
  size_t pos_ = 0;    // text_ before this is settled
  bool in_call_ = false;
  size_t call_from_ = 0;     // where the call's text starts, whitespace before it included
  bool at_slot_ = true;      // a bare call may start here: the answer's start, or after a call
  bool after_call_ = false;  // whitespace at pos_ follows a call: not content
  std::vector<ToolCall> calls_;
};

// Output split at once (the non-streaming answer): the same as pushing it
// all and finishing.
struct ParsedOutput {
  std::string content;
  std::vector<ToolCall> calls;
};
ParsedOutput parse_tool_calls(ToolFormat f, std::string_view text, const std::string& id_prefix);

}  // namespace wick
