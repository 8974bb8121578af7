// One conversation on one model: its KV cache and the tokens whose K/V it
// holds. Each generate() reuses the longest common prefix of the cached
// tokens and the new prompt (checked token by token), prefills the rest in
// chunks, then decodes until a stop. The model itself holds no state.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model_pool.h"
#include "engine/model_runner.h"
#include "sampling/sampler.h"

namespace wick {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 256;
  std::vector<std::string> stop;  // stop strings (not included in the text)
  bool ignore_eos = false;
  int32_t prefill_chunk = 512;     // 0 = the whole prompt in one pass
  bool truncate = false;           // drop the oldest prompt tokens instead of failing when too long
  bool keep_first_logits = false;  // return the logits the first token was sampled from
  int32_t top_logprobs =
      -1;  // engine only: -1 off, else log-probabilities of each chosen token and the top N
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;                           // of the chosen token, before sampling filters
  std::vector<std::pair<int32_t, float>> top;  // the most likely tokens, best first
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (an end-of-generation id included)
  std::string text;             // without special tokens and stop strings
  std::string stop_reason;      // "eos", "stop", "length", "context", "cancelled"
  int32_t n_prompt = 0;         // prompt tokens
  int32_t n_reused = 0;         // prompt tokens whose K/V came from the cache
  int32_t n_prefilled = 0;      // prompt tokens computed
  double ttft_ms = 0, prefill_tok_s = 0, decode_tok_s = 0;
  std::vector<float> first_logits;     // with keep_first_logits
  std::vector<TokenLogprob> logprobs;  // with top_logprobs >= 0, one per generated token
};

struct GenerateError : std::runtime_error {  // bad request (too long, bad parameters)
  using std::runtime_error::runtime_error;
};

// Throws GenerateError naming what is wrong: sampling values, limits, token ids.
void validate_request(const GenerateRequest& req, int32_t n_vocab);
// The prompt that fits a context of n_ctx tokens: the request's own, or with
// req.truncate its newest tokens (room left to generate); else GenerateError.
std::vector<int32_t> fit_prompt(const GenerateRequest& req, int32_t n_ctx);

// Passes generated text through the stop strings: holds back what could be
// the start of one, and cuts the text where one appears.
class StopFilter {
 public:
  explicit StopFilter(const std::vector<std::string>& stops) : stops_(stops) {}
  // Appends delta; sets `out` to the text that can be passed on. Returns true
  // when a stop string appeared (out ends before it). final flushes all.
  bool feed(const std::string& delta, bool final, std::string& out);

 private:
  const std::vector<std::string>& stops_;
  std::string pending_;
};

class Session {
 public:
  // n_ctx: tokens the session can hold (at most the model's training context).
  Session(std::shared_ptr<const LoadedModel> model, int32_t n_ctx);
  // on_text receives text as it forms; returning false cancels.
  GenerateResult generate(const GenerateRequest& req,
                          const std::function<bool(std::string_view)>& on_text = {});
  const std::vector<int32_t>& cached_tokens() const { return tokens_; }
  int32_t n_ctx() const { return n_ctx_; }
  const LoadedModel& model() const { return *model_; }

 private:
  void run(const int32_t* ids, int32_t n, bool want_logits);  // appends to the cache

  std::shared_ptr<const LoadedModel> model_;
  int32_t n_ctx_;
  ModelRunner runner_;           // one block of n_ctx tokens
  std::vector<int32_t> tokens_;  // tokens whose K/V is in the runner, in order
  Batch batch_;
  std::vector<float> logits_;
};

}  // namespace wick
