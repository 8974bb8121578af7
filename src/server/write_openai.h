// OpenAI response bodies: chat.completion / text_completion objects, their
// SSE chunks, the model list and errors.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model_pool.h"
#include "server/answer_parser.h"
#include "server/api_types.h"
#include "server/logprob_json.h"
#include "server/parse_common.h"
#include "server/submit.h"
#include "text/tool_calls.h"

namespace wick::server {

// What every object of one response repeats.
struct OpenAiMeta {
  std::string id;  // chatcmpl-N or cmpl-N
  int64_t created = 0;
  std::string model;
};

int64_t unix_now();
json openai_error(const ApiError& e);
json openai_model(const std::string& name);  // GET /v1/models/NAME
json openai_models(const std::vector<std::string>& names);
// The non-streaming response: one choice per result, with logprobs when asked.
json openai_response(const OpenAiRequest& r, const OpenAiMeta& meta,
                     const std::vector<GenerateResult>& results, const Tokenizer& tk);

// Tool-call ids of choice i: call_<N>_<i>_<k> for chatcmpl-N.
std::string call_id_prefix(const OpenAiMeta& meta, size_t choice);

// SSE: "data: {chunk}\n\n" per event, a role chunk first for chat, the usage
// chunk when asked, then "data: [DONE]". With logprobs each chunk carries
// those of the tokens computed since the last chunk (the last chunk the rest);
// with tools or reasoning the text goes through an AnswerParser per choice
// (reasoning as delta.reasoning_content). Completions' echo sends each
// choice's prompt text first (logprobs with echo need a whole response).
class OpenAiStream : public StreamWriter {
 public:
  OpenAiStream(const OpenAiRequest& r, OpenAiMeta meta, std::shared_ptr<const LoadedModel> model);
  std::string text(size_t i, const std::string& piece,
                   const std::vector<TokenLogprob>& logprobs) override;
  std::string done(size_t i, const GenerateResult& r) override;
  std::string end() override;

 private:
  struct Choice {
    bool started = false;                  // chat: the role chunk was sent
    std::unique_ptr<AnswerParser> parser;  // with tools or reasoning
    size_t n_calls = 0;                    // calls sent
    std::vector<TokenLogprob> pending;     // logprobs not yet sent
    size_t n_logprobs_seen = 0;            // received with text events
    size_t text_offset = 0;                // completions: text before the next logprobs
    bool echoed = false;                   // echo: the prompt's text was sent
  };
  // echo: choice i's prompt text in a chunk of its own, once; else "".
  std::string echo_chunk(size_t i);
  std::string chunk(size_t i, const json& delta_or_text, const json& finish,
                    const json& logprobs = nullptr) const;
  // The pending logprobs of choice i as a chunk's "logprobs" (null when off or none).
  json take_logprobs(size_t i);
  // The chunks of choice i's parsed events (text itself without tools).
  std::string events(size_t i, const std::vector<AnswerEvent>& evs);

  bool chat_, usage_in_stream_, logprobs_;
  ToolSetup tools_;
  EchoSetup echo_;
  int32_t n_choices_;  // per prompt
  OpenAiMeta meta_;
  std::shared_ptr<const LoadedModel> model_;  // its tokenizer names the logprobs' tokens
  std::vector<Choice> choices_;
  // per prompt (its choices share it): its tokens, the most any choice took from the cache
  std::vector<int64_t> prompt_tokens_, cached_;
  int64_t n_gen_ = 0;
  SpecTotals spec_;
};

}  // namespace wick::server
