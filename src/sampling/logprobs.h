// Log-probabilities of the model's distribution over the vocabulary, as the
// logits give it (before penalties and sampling filters).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace wick {

// log(sum(exp(row))), computed from the row's maximum.
float log_sum_exp(std::span<const float> row);
// The n most likely ids with their log-probabilities (row[id] - lse), best
// first, ties to the lower id. `order` is scratch, reused between calls.
std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> row, float lse, size_t n,
                                                    std::vector<int32_t>& order);
// id's place in the row, best first, ties to the lower id (1: top_logprobs' first).
int32_t rank_of(std::span<const float> row, int32_t id);

}  // namespace wick
