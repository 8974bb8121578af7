// llama.cpp server's native generation endpoints, for the editors' and
// scripts' clients written against it: POST /completion (a prompt) and
// POST /infill (fill in the middle: input_prefix, input_suffix, input_extra
// files). Bodies, whole answers and their SSE events.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "server/parse_common.h"
#include "server/submit.h"

namespace wick::server {

struct LlamaCppRequest {
  std::string model;  // wick's extra: the body's "model" (empty: the served one)
  GenerateRequest gen;
  bool stream = false;
};

// llama.cpp's names and defaults: n_predict (-1: no limit), temperature
// (0.8), top_k (40), top_p (0.95), min_p (0.05), repeat_penalty (1.0),
// repeat_last_n (64), presence_penalty, frequency_penalty, seed, stop,
// grammar, json_schema, ignore_eos, logit_bias; others (cache_prompt,
// samplers, ...) are ignored. n_probs > 0 is a 400 (not answered yet).
LlamaCppRequest parse_llamacpp(const json& body, bool infill, const ModelView& m,
                               uint64_t random_seed);

// The answer: {content, stop: true, stop_type ("eos", "word", "limit"),
// tokens_predicted, tokens_evaluated, tokens_cached, truncated, model,
// timings}; with_text false leaves content empty (the stream's last event).
json llamacpp_final(const std::string& model, std::chrono::steady_clock::time_point t0,
                    const GenerateResult& g, bool with_text);

// SSE: "data: {content, stop: false}" per piece of text, then the final
// object with empty content; no [DONE], as llama.cpp ends it.
class LlamaCppStream : public StreamWriter {
 public:
  LlamaCppStream(std::string model, std::chrono::steady_clock::time_point t0)
      : model_(std::move(model)), t0_(t0) {}
  std::string text(size_t i, const std::string& piece,
                   const std::vector<TokenLogprob>& logprobs) override;
  std::string done(size_t i, const GenerateResult& g) override;
  std::string end() override { return ""; }

 private:
  std::string model_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace wick::server
