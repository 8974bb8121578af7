// Incremental detokenizer for streaming: push ids one at a time, get back
// only text that is complete UTF-8. Concatenating every push() and finish()
// equals decode() of all the ids, except where byte tokens form invalid
// UTF-8: decode() then replaces the whole run of bytes (as HF's ByteFallback
// does), while the stream may already have sent a valid prefix of it
// (found by fuzz_detokenizer; both are valid UTF-8). Ids past the
// tokenizer's (a model's padding rows) give no text.
#pragma once

#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace wick {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tk, bool skip_special = true)
      : tk_(tk), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string finish();  // whatever is still held back (an unfinished UTF-8 sequence)
  void reset();

 private:
  std::string delta(bool final);
  const Tokenizer& tk_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0;  // decoding starts here, so SentencePiece's first-space rule applies once
  size_t read_ = 0;    // ids before this have been emitted
};

}  // namespace wick
