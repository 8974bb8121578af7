// llama.cpp server's native generation endpoints, for the editors' and
// scripts' clients written against it: POST /completion (a prompt) and
// POST /infill (fill in the middle: input_prefix, input_suffix, input_extra
// files). Bodies, whole answers and their SSE events.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "engine/model_pool.h"
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
// grammar, json_schema, ignore_eos, logit_bias, n_probs (0-100: each
// generated token's log-probability and the top n_probs of the model's
// distribution, before the samplers, as llama.cpp gives them without
// post_sampling_probs; post_sampling_probs is a 400); others (cache_prompt,
// samplers, ...) are ignored.
LlamaCppRequest parse_llamacpp(const json& body, bool infill, const ModelView& m,
                               uint64_t random_seed);

// GET /props: {default_generation_settings: {n_ctx, params: /completion's
// defaults}, total_slots, model_path, chat_template, modalities,
// build_info, is_sleeping} of model m as the server serves it.
json llamacpp_props(const LoadedModel& m, const std::string& model_path, int32_t n_ctx,
                    int32_t n_slots);

// llama.cpp's completion_probabilities: per token {id, token, bytes,
// logprob, top_logprobs: [{id, token, bytes, logprob}]}.
json llamacpp_probs(const Tokenizer& tk, std::span<const TokenLogprob> lps);

// The answer: {content, stop: true, stop_type ("eos", "word", "limit"),
// tokens_predicted, tokens_evaluated, tokens_cached, truncated, model,
// timings, and completion_probabilities with n_probs}; with_text false
// leaves content empty and the probabilities from first_prob on (the
// stream's last event: the tokens no piece of text carried).
json llamacpp_final(const std::string& model, std::chrono::steady_clock::time_point t0,
                    const GenerateResult& g, bool with_text, const Tokenizer& tk,
                    size_t first_prob = 0);

// SSE: "data: {content, stop: false[, completion_probabilities]}" per piece
// of text, then the final object with empty content; no [DONE], as
// llama.cpp ends it.
class LlamaCppStream : public StreamWriter {
 public:
  LlamaCppStream(std::string model, std::chrono::steady_clock::time_point t0,
                 std::shared_ptr<const LoadedModel> m)
      : model_(std::move(model)), t0_(t0), m_(std::move(m)) {}
  std::string text(size_t i, const std::string& piece,
                   const std::vector<TokenLogprob>& logprobs) override;
  std::string done(size_t i, const GenerateResult& g) override;
  std::string end() override { return ""; }

 private:
  std::string model_;
  std::chrono::steady_clock::time_point t0_;
  std::shared_ptr<const LoadedModel> m_;  // its tokenizer
  size_t n_probs_sent_ = 0;
};

}  // namespace wick::server
