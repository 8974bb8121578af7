#include "engine/speculative.h"

#include <fmt/format.h>

namespace wick {

std::string SpecConfig::validate() const {
  if (draft_max < 1 || draft_max > kMaxDraft)
    return fmt::format("draft_max must be in [1, {}] (got {})", kMaxDraft, draft_max);
  if (draft_min < 0 || draft_min > draft_max)
    return fmt::format("draft_min must be in [0, draft_max {}] (got {})", draft_max, draft_min);
  if (!(draft_p_min >= 0 && draft_p_min <= 1))
    return fmt::format("draft_p_min must be in [0, 1] (got {})", draft_p_min);
  if (ngram_min < 1 || ngram_max < ngram_min || ngram_max > 64)
    return fmt::format("n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= 64 (got {}, {})",
                       ngram_min, ngram_max);
  if (method == SpecMethod::Draft && !draft)
    return "speculative decoding with a draft model needs one (--draft MODEL)";
  return "";
}

void residual(std::span<const Sampler::Cand> p, std::span<const float> q_dense,
              std::vector<int32_t>& ids, std::vector<float>& weights) {
  ids.clear();
  weights.clear();
  for (const auto& c : p) {
    const float w = c.p - q_dense[size_t(c.id)];
    if (w > 0) {
      ids.push_back(c.id);
      weights.push_back(w);
    }
  }
  // p == q (to rounding) leaves nothing, and then no draft is ever rejected
  // but by rounding: draw from p itself
  if (ids.empty())
    for (const auto& c : p) {
      ids.push_back(c.id);
      weights.push_back(c.p);
    }
}

}  // namespace wick
