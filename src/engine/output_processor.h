// The update part of an engine step: turns the logits rows of the sequences
// that sample into tokens (log-probabilities, sampling on the backend when
// it can, else with the host Sampler), streams their text through the
// detokenizer and the stop strings, decides which sequences end, and
// completes their results.
//
// At the context limit a sequence ends with "context" once its prompt and
// generated tokens together number n_ctx: the last generated token is not
// fed back, so the KV cache never holds more than n_ctx - 1 of them.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model_pool.h"
#include "engine/model_runner.h"
#include "engine/sequence.h"

namespace wick {

namespace grammar {
class TokenTrie;
}

class OutputProcessor {
 public:
  OutputProcessor(std::shared_ptr<const LoadedModel> model, int32_t n_ctx)
      : model_(std::move(model)), n_ctx_(n_ctx) {}

  // Readies a new sequence: its sampler, detokenizer, stop filter, grammar
  // matcher, clock. Throws GenerateError for a grammar without a tokenizer.
  void start(Sequence& s);
  // The prompt log-probabilities the plan's prompt rows give, then the
  // tokens of each sequence of the plan that samples (logits rows of the
  // runner's last step in plan order, 1 + n_draft each): one token, or
  // with draft tokens, those the target accepts and one of its own (the
  // drafts are taken off s.tokens first; s.n_accepted says how many were
  // kept). Returns the sequences that ended, stop_reason set.
  std::vector<Sequence*> update(std::span<const ScheduledSeq> plan, ModelRunner& runner);
  // Completes the result and calls on_done (once per sequence).
  void finish(Sequence& s, const std::string& reason) const;

 private:
  int32_t sample_on_host(Sequence& s, std::span<float> row);
  // Appends the target's tokens for s from rows row0.. (row_of gives one,
  // choose the target's choice from it); false when the sequence ends.
  bool verify(Sequence& s, int32_t n_draft, size_t row0,
              const std::function<int32_t(size_t)>& choose,
              const std::function<std::span<float>(size_t)>& row_of);
  // The rejection rule for one draft token drawn from q: the draft, or a
  // draw from the residual max(0, p - q) (accepted says which).
  int32_t rejection_step(Sequence& s, std::span<float> row, int32_t draft, const SparseDist& q,
                         bool& accepted);
  TokenLogprob logprob_of(std::span<const float> raw, int32_t id, int32_t n_top);
  // Each prompt row's log-probability of the prompt token after it, from
  // logits rows row0.. (GenerateRequest::prompt_logprobs).
  void add_prompt_logprobs(const ScheduledSeq& w, size_t row0, ModelRunner& runner);
  bool append(Sequence& s, int32_t id);  // false when the sequence ends
  // The tokens s may take now: its grammar's (end-of-generation ids where it
  // may end), without end-of-generation ids before min_tokens; empty when
  // neither applies, all zero when the grammar allows nothing.
  std::span<const uint64_t> allowed_mask(Sequence& s);

  std::shared_ptr<const LoadedModel> model_;
  int32_t n_ctx_;
  std::vector<int32_t> order_;  // scratch for top log-probabilities
  std::vector<float> q_dense_;  // scratch: a draft distribution by id (zeros between uses)
  std::vector<int32_t> ids_;    // scratch: a residual distribution
  std::vector<float> weights_;
  // the vocabulary as a trie of token bytes, built on the first request with
  // a grammar; a mask of this step's constrained sequence
  std::shared_ptr<const grammar::TokenTrie> trie_;
  std::vector<uint64_t> mask_;
  std::vector<float> raw_;  // a row before sampling changes it
};

}  // namespace wick
