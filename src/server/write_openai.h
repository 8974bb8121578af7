// OpenAI response bodies: chat.completion / text_completion objects, their
// SSE chunks, the model list and errors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/api_types.h"
#include "server/parse_common.h"
#include "server/submit.h"

namespace wick::server {

// What every object of one response repeats.
struct OpenAiMeta {
  std::string id;  // chatcmpl-N or cmpl-N
  int64_t created = 0;
  std::string model;
};

int64_t unix_now();
json openai_error(const ApiError& e);
json openai_models(const std::vector<std::string>& names);
// The non-streaming response: one choice per result, with logprobs when asked.
json openai_response(const OpenAiRequest& r, const OpenAiMeta& meta,
                     const std::vector<GenerateResult>& results, const Tokenizer& tk);

// SSE: "data: {chunk}\n\n" per event, a role chunk first for chat, the usage
// chunk when asked, then "data: [DONE]".
class OpenAiStream : public StreamWriter {
 public:
  OpenAiStream(const OpenAiRequest& r, OpenAiMeta meta);
  std::string text(size_t i, const std::string& piece) override;
  std::string done(size_t i, const GenerateResult& r) override;
  std::string end() override;

 private:
  std::string chunk(size_t i, const json& delta_or_text, const json& finish) const;

  bool chat_, usage_in_stream_;
  OpenAiMeta meta_;
  std::vector<bool> started_;  // chat: the role chunk was sent
  int64_t n_prompt_ = 0, n_gen_ = 0, n_cached_ = 0;
  SpecTotals spec_;
};

}  // namespace wick::server
