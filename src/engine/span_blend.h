// Which tokens of a placed span are computed again (the span cache's quality
// repair): a fixed number at its start (EPIC-style) and, CacheBlend-style, a
// fraction of the span chosen by how far each token's K/V at an early layer
// lies from the cached value once the span sees what precedes it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace wick {

// Offsets into a span of n_tokens: the first n_first, then the
// ceil(fraction * n_tokens) others whose deviation is largest (ties to the
// earlier), in increasing order. deviation is empty or has n_tokens entries
// (empty: the first n_first alone).
std::vector<int32_t> choose_span_rows(std::span<const float> deviation, int32_t n_tokens,
                                      int32_t n_first, float fraction);

}  // namespace wick
