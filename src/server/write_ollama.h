// Ollama response bodies: /api/generate and /api/chat results and their
// NDJSON lines, /api/tags, /api/show, /api/version and errors.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/model_pool.h"
#include "server/answer_parser.h"
#include "server/api_types.h"
#include "server/parse_common.h"
#include "server/submit.h"

namespace wick::server {

using Clock = std::chrono::steady_clock;

std::string iso_now();  // 2024-01-02T03:04:05.123456Z
json ollama_error(const ApiError& e);
json ollama_version();
// (name, file bytes) per stored model.
json ollama_tags(const std::vector<std::pair<std::string, int64_t>>& models);
json ollama_show(const LoadedModel& m);
// The last object of a response (the whole one without streaming, text
// included, split into content and message.tool_calls with tools);
// durations run from t0, when the request was submitted.
json ollama_final(const OllamaRequest& r, Clock::time_point t0, const GenerateResult& g,
                  bool with_text);
// The whole response without streaming: the final object with the text, and
// the logprobs when asked ([{token, logprob, bytes, top_logprobs}]).
json ollama_response(const OllamaRequest& r, const Tokenizer& tk, Clock::time_point t0,
                     const GenerateResult& g);

// NDJSON: one object per piece of text, then the final one. With tools or
// reasoning, text goes through an AnswerParser: reasoning comes as
// message.thinking (generate: thinking), each call as its own object
// (message.tool_calls, empty content) once complete, as Ollama sends them.
// With logprobs each object carries those of the tokens computed since the
// last one (the final object the rest: an end token's, a stop string's).
class OllamaStream : public StreamWriter {
 public:
  OllamaStream(const OllamaRequest& r, std::shared_ptr<const LoadedModel> model,
               Clock::time_point t0);
  std::string text(size_t i, const std::string& piece,
                   const std::vector<TokenLogprob>& logprobs) override;
  std::string done(size_t i, const GenerateResult& g) override;
  std::string end() override { return ""; }

 private:
  std::string lines(const std::vector<AnswerEvent>& evs);
  void take_logprobs(json& o);  // the pending ones onto o

  OllamaRequest req_;  // its prompt is not needed: cleared
  std::shared_ptr<const LoadedModel> model_;
  Clock::time_point t0_;
  std::vector<TokenLogprob> pending_;     // computed, not yet sent
  size_t n_logprobs_seen_ = 0;            // arrived with text
  std::unique_ptr<AnswerParser> parser_;  // with tools or reasoning
  size_t n_calls_ = 0;
};

}  // namespace wick::server
