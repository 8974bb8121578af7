// Tokens' log-probabilities as the APIs write them: OpenAI chat's entries,
// which Ollama's and llama.cpp's answers build on.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "engine/request.h"
#include "server/parse_common.h"
#include "text/tokenizer.h"

namespace wick::server {

// An id's text; "" for an id past the tokenizer's (a model's padding rows).
std::string token_text(const Tokenizer& tk, int32_t id);

// Chat's logprobs.content (and the Responses API's output_text.logprobs):
// [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}].
json logprob_entries(const Tokenizer& tk, std::span<const TokenLogprob> lps);

}  // namespace wick::server
