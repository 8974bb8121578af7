// Prompts made of independent documents and a question (requests for the
// span cache): each document is tokenized on its own, so that it has the
// same ids wherever it appears (and is found in the span cache), and is
// marked as a span of the prompt.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/tokenizer.h"

namespace wick {

struct SpanPrompt {
  std::vector<int32_t> ids;
  std::vector<std::pair<int32_t, int32_t>> spans;  // [begin, end) of each document in ids
};

// The text that stands for document i until the prompt is tokenized.
std::string span_placeholder(size_t i);
// A user message asking `question` about n_docs documents: their
// placeholders, then the question.
std::string span_message(size_t n_docs, std::string_view question);
// A document as a span of such a message: its text and the blank line that
// parts it from what follows. The separator belongs to the span, so that no
// text stands between spans (text after a span starts a KV block of its own).
std::string span_document(std::string_view text);
// The ids of `text`, in which span_placeholder(0), (1), ... each appear
// once and in order, with docs[i] in place of placeholder i. The text around
// the documents is tokenized with `opt` (BOS/EOS, add_special, only where
// the text begins), each document alone with opt.parse_special. Throws
// std::runtime_error when a placeholder is missing (a template that
// rewrites its messages).
SpanPrompt tokenize_span_prompt(const Tokenizer& tk, std::string_view text,
                                std::span<const std::string> docs, const EncodeOptions& opt);

}  // namespace wick
