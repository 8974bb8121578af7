// A draft model guesses: a smaller model of the same vocabulary runs ahead
// of each sequence, one token at a time, in a KV cache of its own (its own
// block pool and ModelRunner, the same forward path). Before guessing it
// rolls its cache back to what the target kept (the longest common prefix
// of the tokens it computed and the sequence's) and catches up in one
// batch. Greedy requests get its argmax; sampled ones a draw from its
// distribution under the request's sampling parameters (kept, for the
// acceptance rule). It stops early where its choice's probability is below
// p_min.
#pragma once

#include <map>

#include "engine/model_runner.h"
#include "engine/speculative.h"
#include "kv/block_pool.h"

namespace wick {

// Throws std::runtime_error unless the draft has the target's vocabulary:
// the same number of tokens and, where both have tokenizers, the same token
// at every id (the message names the first that differs).
void check_same_vocab(const LoadedModel& target, const LoadedModel& draft);

class DraftModelProposer : public Proposer {
 public:
  // n_blocks KV blocks of block_size tokens for the draft; catch-up passes
  // of at most max_batch_tokens tokens.
  DraftModelProposer(std::shared_ptr<const LoadedModel> draft, int32_t n_blocks, int32_t block_size,
                     int32_t max_batch_tokens, float p_min);
  void propose(std::span<Sequence* const> seqs, std::span<const int32_t> n_max,
               std::span<Proposal> out) override;
  void forget(int64_t seq_id) override;

  const BlockPool& blocks() const { return pool_; }

 private:
  struct DraftSeq {
    std::vector<int32_t> tokens;  // those whose K/V is in the draft's cache, by position
    std::vector<int32_t> block_table;
    std::unique_ptr<Sampler> sampler;
  };
  // One guessing sequence this step.
  struct Guess {
    size_t index;  // into seqs / out
    DraftSeq* d;
    std::vector<int32_t> history;  // the sequence's tokens, then the guesses so far
    int32_t n_max;
    bool stopped = false;
  };
  bool prepare(DraftSeq& d, const Sequence& s, int32_t n_max);  // roll back, blocks
  void trim(DraftSeq& d, size_t n_keep);
  // Runs batch_ and adds a guess from each logits row to guesses[rows[r]].
  void run_and_guess(std::vector<Guess>& guesses, const std::vector<size_t>& rows,
                     std::span<Proposal> out);

  std::shared_ptr<const LoadedModel> model_;
  BlockPool pool_;
  ModelRunner runner_;
  int32_t max_batch_tokens_;
  float p_min_;
  std::map<int64_t, DraftSeq> seqs_;
  Batch batch_;
};

}  // namespace wick
