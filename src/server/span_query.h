// spnl's span queries (../shared/design/SPANS.md): the query tree parsed from
// its JSON, flattened into chat-message pieces, and laid out as prompt ids
// with the independent pieces (the children of `plus`) marked as spans.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/span_markers.h"
#include "server/parse_common.h"

namespace wick::server {

struct SpanNode {
  // `par` inside an input reads as `plus`, except in the marker layout,
  // which lays it out as `seq` (as spnl's tokenize_query does)
  enum class Kind { Message, Seq, Cross, Plus, Par };
  Kind kind = Kind::Message;
  std::string role, content;       // Message
  std::vector<SpanNode> children;  // Seq, Cross, Plus
};

// One generation: spnl's `g` (max_tokens 0 means 2,048; temperature 0.6 unless given).
struct SpanGenerate {
  std::string model;
  SpanNode input;
  int32_t max_tokens = 2048;
  float temperature = 0.6f;
  // wick's extras span_recompute, span_blend and prompt_logprobs (those fields alone)
  GenerateRequest repair;
  // vLLM's continue_final_message: the answer continues the input's last
  // message, the assistant's, instead of starting a new one
  bool continue_final = false;
  // wick's extra span_context: each span computed after the text before the
  // first span (true) or alone (false); unset: the server's --span-context
  std::optional<bool> span_context;
};

struct SpanQuery {
  enum class Top { G, Repeat, Map };
  Top top = Top::G;
  SpanGenerate g;                   // G and Repeat; Map: model, max_tokens, temperature
  int32_t n = 1;                    // Repeat: samples
  std::vector<std::string> inputs;  // Map: one completion per input
};

// A 400 naming the path of the first bad node ("g.input.cross[1].plus[0]").
SpanQuery parse_span_query(const json& body);

// Messages in order; an independent piece (a plus child) becomes a span.
struct PromptPiece {
  json messages = json::array();
  bool independent = false;
};
std::vector<PromptPiece> flatten(const SpanNode& input);

// The ids of a chat prompt laid out piece by piece: each message rendered by
// the chat template as the difference it makes to the conversation before it
// (an independent piece: to the system messages before it alone, so its ids
// are the same wherever it stands), then the generation prompt. spans gets
// each independent piece's [begin, end) in the ids.
// With continue_final the prompt ends inside the last message (an assistant's,
// not in a plus) instead of with the generation prompt.
std::vector<int32_t> span_prompt(const ModelView& m, std::vector<PromptPiece> pieces,
                                 std::vector<std::pair<int32_t, int32_t>>& spans,
                                 bool continue_final = false);

// The same prompt in spnl's marker layout, for models trained with block
// attention (wick serve --span-markers): the tree walked in order, each
// message rendered as span_prompt renders it (a plus child's after the
// system messages alone); before each plus child PAD to a block boundary and
// PLUS; in a cross, before its last child PAD and CROSS; PAD and PLUS again
// before the generation prompt when the last marker was a PLUS. The spans are
// marker_spans(ids). Assistant messages are kept whole (spnl's tokenizer
// drops their end token and crops them to a block boundary).
std::vector<int32_t> marker_prompt(const ModelView& m, const SpanNode& input,
                                   const SpanMarkers& mk);
// A map input in the marker layout: PLUS, the input as a user message, PAD
// to a block boundary (as spnl's tokenize_query lays out a map).
std::vector<int32_t> marker_map_prompt(const ModelView& m, const std::string& input,
                                       const SpanMarkers& mk);

}  // namespace wick::server
