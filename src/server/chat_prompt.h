// Chat messages -> prompt ids through the model's chat template (both APIs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/parse_common.h"

namespace wick::server {

// Checks the messages (400 naming messages[i].role etc.), joins text content
// parts, renders the template with the generation prompt and encodes it.
// tools: null or an array; extra: template variables (chat_template_kwargs).
std::vector<int32_t> chat_prompt(const ModelView& m, const json& messages, const json& tools,
                                 const json& extra);
// The same prompt as text, before encoding (POST /apply-template).
std::string chat_prompt_text(const ModelView& m, const json& messages, const json& tools,
                             const json& extra);

}  // namespace wick::server
