#include "text/chat_template.h"

#include <algorithm>
#include <array>

namespace wick {

ChatTemplate::ChatTemplate(const std::string& source, const std::string& name)
    : tmpl_(source, name, jinja::Template::Options{.trim_blocks = true, .lstrip_blocks = true}) {}

std::string ChatTemplate::render(const nlohmann::ordered_json& vars) const {
  return tmpl_.render(vars);
}

bool ChatTemplate::is_reserved(const std::string& name) {
  static constexpr std::array<const char*, 5> kSet = {"messages", "tools", "add_generation_prompt",
                                                      "bos_token", "eos_token"};
  return std::find(kSet.begin(), kSet.end(), name) != kSet.end() || jinja::is_global(name);
}

}  // namespace wick
