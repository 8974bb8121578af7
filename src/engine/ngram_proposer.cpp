#include "engine/ngram_proposer.h"

#include <algorithm>

namespace wick {

std::vector<int32_t> NgramProposer::lookup(std::span<const int32_t> tokens, int32_t n_min,
                                           int32_t n_max, int32_t k) {
  const int64_t len = int64_t(tokens.size());
  for (int64_t n = std::min<int64_t>(n_max, len - 1); n >= n_min; --n) {
    const auto suffix = tokens.subspan(size_t(len - n));
    if (std::find(suffix.begin(), suffix.end(), kHole) != suffix.end()) continue;
    // newest first: j + n <= len - 1, so at least one token follows
    for (int64_t j = len - n - 1; j >= 0; --j) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + j)) continue;
      std::vector<int32_t> out;
      for (int64_t i = j + n; i < len && int64_t(out.size()) < k && tokens[size_t(i)] != kHole; ++i)
        out.push_back(tokens[size_t(i)]);
      if (!out.empty()) return out;
    }
  }
  return {};
}

void NgramProposer::propose(std::span<Sequence* const> seqs, std::span<const int32_t> n_max,
                            std::span<Proposal> out) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    out[i] = {};
    if (n_max[i] > 0) out[i].tokens = lookup(seqs[i]->tokens, n_min_, n_max_, n_max[i]);
  }
}

}  // namespace wick
