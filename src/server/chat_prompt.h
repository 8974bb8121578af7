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
// continue_final (vLLM's continue_final_message): no generation prompt; the
// prompt ends inside the last message, the assistant's, which the answer
// continues (a prefilled reply).
std::vector<int32_t> chat_prompt(const ModelView& m, const json& messages, const json& tools,
                                 const json& extra, bool continue_final = false);
// The same prompt as text, before encoding (POST /apply-template).
std::string chat_prompt_text(const ModelView& m, const json& messages, const json& tools,
                             const json& extra, bool continue_final = false);
// `rendered` (a conversation rendered without the generation prompt) cut right
// after the last occurrence of `content`, its final message's text, so that
// generation continues that message; `param` names the field in the 400 for a
// template that does not write the content as it is.
std::string cut_after_final_content(const std::string& rendered, const std::string& content,
                                    const std::string& param);

}  // namespace wick::server
