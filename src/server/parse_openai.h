// OpenAI request bodies -> OpenAiRequest. Pure: no model lookup, no engine.
#pragma once

#include <cstdint>
#include <string>

#include "server/api_types.h"
#include "server/parse_common.h"

namespace wick::server {

// OpenAI's sampling fields and defaults (plain sampling at temperature 1).
extern const SamplingSpec kOpenAiSampling;

// The body's "model" (empty when absent); read before the model is looked up.
std::string openai_model_name(const json& body);
// A chat (messages) or completions (prompt) body for model m; throws ApiError
// (400 naming the field). random_seed is used when the body has no seed.
OpenAiRequest parse_openai(const json& body, bool chat, const ModelView& m, uint64_t random_seed);

}  // namespace wick::server
