// spnl's marker layout (../shared/design/SPANS.md), for models trained with
// block attention: each independent part of a prompt is padded with PAD to a
// block boundary and starts with PLUS; the part that attends to everything
// before it starts with CROSS at a boundary. Markers are ordinary vocabulary
// ids, so only a marker at a multiple of the block size counts as one.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace wick {

struct SpanMarkers {
  int32_t plus = -1, cross = -1, pad = -1;  // -1: the layout is off
  int32_t block_size = 16;                  // spnl's KV block size, where markers stand
  bool enabled() const { return plus >= 0; }
};

// "PLUS,CROSS,PAD" or "PLUS,CROSS,PAD,BLOCK" (non-negative ids, three
// distinct; BLOCK 1-4096). Throws std::invalid_argument naming what is wrong.
SpanMarkers parse_span_markers(std::string_view text);

// The spans of a marker-laid-out prompt: a PLUS at a multiple of the block
// size opens a span, which runs to the next PLUS or CROSS at a multiple of
// the block size (its PAD tail included). The last part of the prompt (the
// question, the generation prompt) attends to everything and is no span,
// whatever marker opens it. No markers: no spans.
std::vector<std::pair<int32_t, int32_t>> marker_spans(std::span<const int32_t> ids,
                                                      const SpanMarkers& m);

// PAD up to the next block boundary (nothing when ids ends on one).
void pad_to_block(std::vector<int32_t>& ids, const SpanMarkers& m);
// PAD up to the next block boundary, then `marker`, which so starts a block.
void push_marker(std::vector<int32_t>& ids, int32_t marker, const SpanMarkers& m);

}  // namespace wick
