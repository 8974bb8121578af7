#include "engine/span_prompt.h"

#include <fmt/format.h>

#include <stdexcept>

namespace wick {

std::string span_placeholder(size_t i) {
  return fmt::format("\x1f<wick-span-{}>\x1f", i);  // unit separators: not in real text
}

std::string span_message(size_t n_docs, std::string_view question) {
  std::string out;
  for (size_t i = 0; i < n_docs; ++i) out += span_placeholder(i);
  return out + std::string(question);
}

std::string span_document(std::string_view text) {
  return std::string(text) + "\n\n";
}

SpanPrompt tokenize_span_prompt(const Tokenizer& tk, std::string_view text,
                                std::span<const std::string> docs, const EncodeOptions& opt) {
  SpanPrompt out;
  auto append = [&](std::string_view piece, EncodeOptions o) {
    auto ids = tk.encode(piece, o);
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
  };
  size_t at = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::string ph = span_placeholder(i);
    const size_t found = text.find(ph, at);
    if (found == std::string_view::npos)
      throw std::runtime_error(fmt::format(
          "document {} is not in the rendered prompt (the chat template rewrites messages?)", i));
    append(text.substr(at, found - at),
           {.add_special = opt.add_special && at == 0, .parse_special = opt.parse_special});
    const int32_t begin = int32_t(out.ids.size());
    append(docs[i], {.add_special = false, .parse_special = opt.parse_special});
    out.spans.push_back({begin, int32_t(out.ids.size())});
    at = found + ph.size();
  }
  append(text.substr(at),
         {.add_special = opt.add_special && at == 0, .parse_special = opt.parse_special});
  return out;
}

}  // namespace wick
