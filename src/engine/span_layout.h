// Span layouts' positions: tokens by position with kHole where a slot stays
// empty, and the valid slots of each KV block, which attention and RoPE
// read (Batch::block_fills).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace wick {

// Per block of bs positions: its valid slots [begin, end); positions past
// the end of `tokens` count as valid (they are filled later).
std::vector<std::pair<int32_t, int32_t>> block_fills(std::span<const int32_t> tokens, int32_t bs);

// A span job's positions when the span is computed after context tokens:
// the context, holes up to a block boundary, then the span (which starts a
// block, as it does in a request's layout). Without context: the span.
std::vector<int32_t> span_job_tokens(std::span<const int32_t> context,
                                     std::span<const int32_t> span, int32_t bs);

}  // namespace wick
