// Ollama request bodies -> OllamaRequest. Pure: no model lookup, no engine.
#pragma once

#include <cstdint>
#include <string>

#include "server/api_types.h"
#include "server/parse_common.h"

namespace wick::server {

// Ollama's options and defaults (top-k 40, top-p 0.9, repeat penalty 1.1 over 64).
extern const SamplingSpec kOllamaSampling;

// The body's "model" (required); /api/show also takes "name".
std::string ollama_model_name(const json& body);
std::string ollama_show_model_name(const json& body);
// A chat (messages) or generate (prompt) body for model m; throws ApiError.
// random_seed is used when the options have no seed.
OllamaRequest parse_ollama(const json& body, bool chat, const ModelView& m, uint64_t random_seed);

}  // namespace wick::server
