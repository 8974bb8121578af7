// Per-request sampling: penalties, temperature, top-k, top-p, min-p, and a
// seeded RNG. The processors run in this order (as HF transformers does,
// with llama.cpp's and vLLM's logit bias first):
//   0. logit bias (OpenAI's logit_bias: added to the listed ids' logits);
//   1. repeat penalty over the last repeat_last_n tokens (divides positive
//      logits, multiplies negative ones), then presence and frequency
//      penalties over the same window (logit -= presence + count * frequency);
//      then an allowed-token mask when given (a grammar's): the others -inf;
//   2. temperature 0 -> greedy (argmax; ties to the lowest id);
//   3. temperature scaling; 4. top-k; 5. softmax; 6. top-p (smallest set whose
//      probability reaches p); 7. min-p (drop below min_p x the top probability);
//   8. renormalise and draw.
// Buffers are sized once; sampling a token allocates nothing.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace wick {

struct SamplingParams {
  float temperature = 0.8f;
  int32_t top_k = 40;           // 0 = off
  float top_p = 0.95f;          // 1 = off
  float min_p = 0.05f;          // 0 = off
  float repeat_penalty = 1.0f;  // 1 = off
  int32_t repeat_last_n = 64;   // 0 = the whole history
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0xC0FFEE;  // the default seed makes runs reproducible
  // (id, bias) added to the logit of id before the penalties, |bias| <= 100
  // (-100 bans a token in practice, +100 all but forces it)
  std::vector<std::pair<int32_t, float>> logit_bias;

  // Empty when valid, else a message naming the bad field.
  std::string validate() const;
  static SamplingParams greedy() {
    SamplingParams p;
    p.temperature = 0;
    return p;
  }
};

class Sampler {
 public:
  Sampler(const SamplingParams& p, int32_t n_vocab);
  // Chooses the next token from logits (modified in place by the penalties
  // and the mask). `history` is every token of the sequence so far (prompt
  // and generated). `allowed`, when not empty, is a bit per id (bit id % 64
  // of word id / 64): only those may be chosen; at least one must be set.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history,
                 std::span<const uint64_t> allowed = {});
  const SamplingParams& params() const { return p_; }

  // The processors one by one (public for tests). Each works on cand_.
  void apply_bias(std::span<float> logits) const;
  void apply_penalties(std::span<float> logits, std::span<const int32_t> history);
  static void apply_mask(std::span<float> logits, std::span<const uint64_t> allowed);
  struct Cand {
    float logit;
    float p;
    int32_t id;
  };
  const std::vector<Cand>& candidates() const { return cand_; }
  // the filters in order: the candidates that survive, with softmax weights (not renormalised)
  void keep_candidates(std::span<const float> logits);
  void load_candidates(std::span<const float> logits);  // ids not at -inf, logits / temperature
  void top_k(int32_t k);
  void softmax();
  void top_p(float p);
  void min_p(float p);

  // The distribution sample() draws from, normalised: the candidates left
  // after the processors, best first (greedy: the argmax alone, p = 1).
  // Modifies logits like sample(); consumes no randomness. For speculative
  // decoding, which needs p and q, not only a draw.
  const std::vector<Cand>& distribution(std::span<float> logits, std::span<const int32_t> history,
                                        std::span<const uint64_t> allowed = {});
  double uniform();  // a draw in [0, 1) from this sampler's generator
  // An id drawn with probability proportional to weights[i] (ids[i]); the
  // last one when rounding leaves the draw past the total.
  int32_t draw(std::span<const int32_t> ids, std::span<const float> weights);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<Cand> cand_;        // reserved to n_vocab
  std::vector<int32_t> counts_;   // n_vocab, for presence/frequency penalties
  std::vector<int32_t> touched_;  // ids whose count is non-zero
};

}  // namespace wick
