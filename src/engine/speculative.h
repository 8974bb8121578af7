// Speculative decoding: a proposer guesses the next tokens of a decoding
// sequence, the scheduler puts them in the step after its last token, the
// target model computes them all in that one forward pass (the same flat
// batch as every other sequence), and output processing keeps the guesses
// the target agrees with plus one token of its own; the K/V of the rest is
// dropped (their slots are overwritten later, whole blocks go back).
//
// Greedy: a guess is kept when it is the target's argmax, so the output is
// plain decoding's, token for token. Sampling with a draft model: the
// rejection rule of speculative sampling (Leviathan et al. 2023, Chen et al.
// 2023) keeps the target's distribution. Guesses with no distribution
// (n-grams) are kept only when the target's own sampler draws them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/model_pool.h"
#include "engine/request.h"
#include "engine/sequence.h"
#include "sampling/sampler.h"

namespace wick {

// The engine's speculative decoding: the method for requests that leave it
// to the engine, the draft model, and the proposers' limits.
struct SpecConfig {
  SpecMethod method = SpecMethod::Off;
  std::shared_ptr<const LoadedModel> draft;  // must share the target's vocabulary
  int32_t draft_max = 8;                     // guesses per step, at most
  int32_t draft_min = 1;                     // fewer guessed: the step decodes plainly
  float draft_p_min = 0;  // a draft model stops guessing below this probability of its choice
  int32_t ngram_min = 2, ngram_max = 4;  // n-gram sizes prompt lookup matches, longest first
  // Empty when valid, else a message naming the bad field.
  std::string validate() const;
};

// One sequence's guesses for this step.
struct Proposal {
  std::vector<int32_t> tokens;
  std::vector<SparseDist> q;  // per token, when drawn from a distribution (else empty)
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Guesses at most n_max[i] tokens to follow seqs[i]->tokens, for
  // decoding sequences (their last token not computed yet) into out[i].
  virtual void propose(std::span<Sequence* const> seqs, std::span<const int32_t> n_max,
                       std::span<Proposal> out) = 0;
  virtual void forget(int64_t /*seq_id*/) {}  // the sequence ended: drop what is kept for it
};

// The rule for a draft token drawn with probability q that the target gives
// probability p: kept when u < min(1, p / q), u uniform in [0, 1).
inline bool accept_draft(float p, float q, double u) {
  return u * double(q) < double(p);
}
// Where a draft token was rejected the token comes from max(0, p - q),
// normalised: its support and weights (unnormalised) into ids, weights.
// p: the target's distribution; q_dense: the draft's, indexed by id.
void residual(std::span<const Sampler::Cand> p, std::span<const float> q_dense,
              std::vector<int32_t>& ids, std::vector<float>& weights);

}  // namespace wick
