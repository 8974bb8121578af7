// Fill-in-the-middle: the tokens code models are trained with to write the
// text between a prefix and a suffix, and the prompt they lay out (prefix,
// suffix, middle: the "PSM" order that StarCoder, Qwen2.5-Coder, DeepSeek-Coder
// and CodeLlama share).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace wick {

struct FimTokens {
  int32_t prefix = -1, suffix = -1, middle = -1;
  int32_t file_sep = -1;  // separates context files (repository-level FIM); -1: none
};

// From the GGUF metadata, else by the token names of the families above;
// nullopt when the vocabulary has no complete set.
std::optional<FimTokens> find_fim_tokens(const Tokenizer& tk);

struct InfillFile {
  std::string name, text;
};

// [BOS] [files] PRE prefix SUF suffix MID middle: the model writes on after
// `middle` (usually empty). Each file (context from other files of the
// project) is FILE_SEP name "\n" text; without a separator in the vocabulary
// the files' texts stand before the prefix, each ending in a newline.
std::vector<int32_t> infill_prompt(const Tokenizer& tk, const FimTokens& fim,
                                   const std::string& prefix, const std::string& suffix,
                                   const std::string& middle = "",
                                   const std::vector<InfillFile>& files = {});

}  // namespace wick
