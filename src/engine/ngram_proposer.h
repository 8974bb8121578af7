// Prompt lookup: guesses that the sequence goes on as it did after the last
// earlier occurrence of its newest n tokens (the longest n from n_max down
// to n_min that occurs). No second model; strong where the answer copies
// from the prompt (summaries, edits, answers over documents).
#pragma once

#include "engine/speculative.h"

namespace wick {

class NgramProposer : public Proposer {
 public:
  NgramProposer(int32_t n_min, int32_t n_max) : n_min_(n_min), n_max_(n_max) {}
  void propose(std::span<Sequence* const> seqs, std::span<const int32_t> n_max,
               std::span<Proposal> out) override;

  // At most k tokens that followed the latest earlier occurrence of the
  // last n tokens of `tokens` (n from n_max down to n_min); stops at a hole.
  static std::vector<int32_t> lookup(std::span<const int32_t> tokens, int32_t n_min, int32_t n_max,
                                     int32_t k);

 private:
  int32_t n_min_, n_max_;
};

}  // namespace wick
