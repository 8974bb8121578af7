#include "text/detokenizer.h"

#include <span>

namespace wick {

namespace {
bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xef\xbf\xbd") == 0;
}
}  // namespace

std::string StreamDecoder::delta(bool final) {
  std::span<const int32_t> all(ids_);
  const std::string before = tk_.decode(all.subspan(prefix_, read_ - prefix_), skip_special_);
  const std::string now = tk_.decode(all.subspan(prefix_), skip_special_);
  // Hold back while the text ends in an unfinished UTF-8 sequence (decoded as U+FFFD).
  if (now.size() <= before.size() || (!final && ends_with_replacement(now))) return "";
  // Keep a few ids of context so the next window decodes as it would in full.
  prefix_ = read_;
  read_ = ids_.size();
  // Where a later byte token turned earlier bytes into U+FFFD, `before` is not
  // a prefix of `now` and its length may fall inside a character: start at
  // the next character so that every piece stays valid UTF-8.
  size_t start = before.size();
  while (start < now.size() && (uint8_t(now[start]) & 0xc0) == 0x80) ++start;
  return now.substr(start);
}

std::string StreamDecoder::push(int32_t id) {
  // a model's padding rows past the tokenizer's ids (Qwen's 151,936 rows for
  // 151,669 tokens) have no text: they decode to nothing, as in HF
  if (id < 0 || id >= tk_.n_vocab()) return "";
  ids_.push_back(id);
  return delta(false);
}

std::string StreamDecoder::finish() {
  return delta(true);
}

void StreamDecoder::reset() {
  ids_.clear();
  prefix_ = read_ = 0;
}

}  // namespace wick
