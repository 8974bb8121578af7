// Chat messages -> prompt ids through the model's chat template (both APIs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/parse_common.h"

namespace wick::server {

// Where the rendered conversation ends (vLLM's add_generation_prompt and
// continue_final_message): a new assistant turn begun, the conversation as the
// template renders it without one, or inside the final message, the
// assistant's, which the answer continues (a prefilled reply).
enum class PromptEnd { NewTurn, AsRendered, ContinueFinal };

// A request's add_generation_prompt (default true) and continue_final_message
// (default false); both true is a 400, as vLLM answers it.
PromptEnd prompt_end(const json& body);

// Checks the messages (400 naming messages[i].role etc.), joins text content
// parts, renders the template and encodes it. tools: null or an array; extra:
// template variables (chat_template_kwargs).
std::vector<int32_t> chat_prompt(const ModelView& m, const json& messages, const json& tools,
                                 const json& extra, PromptEnd end = PromptEnd::NewTurn);
// The same prompt as text, before encoding (POST /apply-template).
std::string chat_prompt_text(const ModelView& m, const json& messages, const json& tools,
                             const json& extra, PromptEnd end = PromptEnd::NewTurn);
// The last message's text (its text parts joined), as the template gets it.
std::string final_message_text(const json& messages);
// `rendered` (a conversation rendered without the generation prompt) cut right
// after the last occurrence of `content`, its final message's text, so that
// generation continues that message; `param` names the field in the 400 for a
// template that does not write the content as it is.
std::string cut_after_final_content(const std::string& rendered, const std::string& content,
                                    const std::string& param);

}  // namespace wick::server
