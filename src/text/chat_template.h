// Chat templates as transformers renders them (apply_chat_template):
// trim_blocks and lstrip_blocks on, raise_exception and strftime_now defined,
// tojson without ASCII escaping.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "text/jinja.h"

namespace wick {

class ChatTemplate {
 public:
  // Throws jinja::TemplateError (naming the line) on a syntax error.
  ChatTemplate(const std::string& source, const std::string& name);
  // vars: messages, tools, add_generation_prompt, bos_token, eos_token and any
  // template-specific keys (enable_thinking, ...). Throws jinja::TemplateError.
  std::string render(const nlohmann::ordered_json& vars) const;
  // The variables render's caller sets (messages, tools, add_generation_prompt,
  // bos_token, eos_token) and the template's functions (range, raise_exception,
  // ...): names that user-supplied template variables must not replace.
  static bool is_reserved(const std::string& name);

 private:
  jinja::Template tmpl_;
};

}  // namespace wick
