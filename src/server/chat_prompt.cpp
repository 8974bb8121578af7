#include "server/chat_prompt.h"

#include "text/chat_template.h"

namespace wick::server {

namespace {

void check_messages(const json& messages) {
  if (!messages.is_array()) bad("messages", "'messages' must be an array", "invalid_type");
  if (messages.empty()) bad("messages", "'messages' must not be empty");
  if (messages.size() > kMaxMessages)
    bad("messages", fmt::format("'messages' takes at most {} messages", kMaxMessages));
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& msg = messages[i];
    const std::string p = fmt::format("messages[{}]", i);
    if (!msg.is_object()) bad(p, p + " must be an object", "invalid_type");
    if (!msg.contains("role") || !msg["role"].is_string())
      bad(p + ".role", p + ".role must be a string", "invalid_type");
    const std::string role = msg["role"];
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        role != "developer")
      bad(p + ".role",
          fmt::format("{}.role '{}' is not one of system, user, assistant, tool", p, role));
    if (msg.contains("content") && !msg["content"].is_null() && !msg["content"].is_string() &&
        !msg["content"].is_array())
      bad(p + ".content", p + ".content must be a string or an array of parts", "invalid_type");
  }
}

// What templates expect: string content (text parts joined), "developer" as "system".
json normalise_messages(const json& messages) {
  json msgs = messages;
  for (auto& msg : msgs) {
    if (msg.contains("content") && msg["content"].is_array()) {
      std::string text;
      for (auto& part : msg["content"])
        if (part.is_object() && part.contains("type") && part["type"] == "text" &&
            part.contains("text") && part["text"].is_string())
          text += part["text"].get<std::string>();
        else
          bad("messages", "only text content parts are supported");
      msg["content"] = text;
    }
    if (!msg.contains("content") || msg["content"].is_null()) msg["content"] = "";
    if (msg["role"] == "developer") msg["role"] = "system";
    // OpenAI sends a call's arguments as a JSON string; templates that write
    // them with tojson (Llama 3.1's, Mistral's) want the object, as Ollama sends it.
    if (msg.contains("tool_calls") && msg["tool_calls"].is_array())
      for (auto& call : msg["tool_calls"])
        if (call.is_object() && call.contains("function") && call["function"].is_object()) {
          auto args = call["function"].find("arguments");
          if (args != call["function"].end() && args->is_string())
            if (json parsed = json::parse(args->get<std::string>(), nullptr, false);
                parsed.is_object())
              *args = std::move(parsed);
        }
  }
  return msgs;
}

// Template variables a client may add; those the server sets and the
// template's own functions are not the client's to replace.
void check_template_kwargs(const json& extra) {
  if (extra.is_null()) return;
  if (!extra.is_object())
    bad("chat_template_kwargs", "'chat_template_kwargs' must be an object", "invalid_type");
  for (auto& [k, v] : extra.items())
    if (ChatTemplate::is_reserved(k))
      bad("chat_template_kwargs",
          fmt::format("chat_template_kwargs.{} is reserved: the server sets it", k));
}

}  // namespace

PromptEnd prompt_end(const json& body) {
  const auto gen_prompt = field<bool>(body, "add_generation_prompt");  // null: absent
  if (field<bool>(body, "continue_final_message").value_or(false)) {
    if (gen_prompt.value_or(false))
      bad("continue_final_message",
          "continue_final_message and add_generation_prompt cannot both be true");
    return PromptEnd::ContinueFinal;
  }
  return gen_prompt.value_or(true) ? PromptEnd::NewTurn : PromptEnd::AsRendered;
}

std::string final_message_text(const json& messages) {
  check_messages(messages);
  return normalise_messages(json::array({messages.back()}))[0]["content"].get<std::string>();
}

std::vector<int32_t> chat_prompt(const ModelView& m, const json& messages, const json& tools,
                                 const json& extra, PromptEnd end) {
  return m.tokenizer.encode(chat_prompt_text(m, messages, tools, extra, end),
                            {.add_special = false, .parse_special = true});
}

std::string cut_after_final_content(const std::string& rendered, const std::string& content,
                                    const std::string& param) {
  const size_t at = content.empty() ? std::string::npos : rendered.rfind(content);
  if (at == std::string::npos)
    bad(param, content.empty() ? "continuing the final message needs it to have content"
                               : "this model's chat template does not write the final message's "
                                 "content as it is, so it cannot be continued");
  return rendered.substr(0, at + content.size());
}

std::string chat_prompt_text(const ModelView& m, const json& messages, const json& tools,
                             const json& extra, PromptEnd end) {
  check_messages(messages);
  const bool continue_final = end == PromptEnd::ContinueFinal;
  if (continue_final && messages.back()["role"] != "assistant")
    bad("continue_final_message",
        "continue_final_message needs the last message to be the assistant's");
  check_template_kwargs(extra);
  if (!tools.is_null()) {
    if (!tools.is_array()) bad("tools", "'tools' must be an array", "invalid_type");
    if (tools.size() > kMaxTools)
      bad("tools", fmt::format("'tools' takes at most {} tools", kMaxTools));
  }
  json msgs = normalise_messages(messages);
  const Tokenizer& tk = m.tokenizer;
  if (tk.chat_template.empty())
    bad("messages", "this model has no chat template; use the completions endpoint");
  json vars = {{"messages", msgs},
               {"add_generation_prompt", end == PromptEnd::NewTurn},
               {"bos_token", tk.bos_token},
               {"eos_token", tk.eos_token}};
  if (!tools.is_null()) vars["tools"] = tools;
  if (extra.is_object())
    for (auto& [k, v] : extra.items()) vars[k] = v;
  std::string text;
  try {
    text = ChatTemplate(tk.chat_template, m.name).render(vars);
  } catch (const jinja::TemplateError& e) {
    bad("messages", e.what(), "template_error");
  }
  if (continue_final)
    text = cut_after_final_content(text, msgs.back()["content"], "continue_final_message");
  return text;
}

}  // namespace wick::server
