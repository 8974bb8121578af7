#include "text/chat_template.h"

namespace wick {

ChatTemplate::ChatTemplate(const std::string& source, const std::string& name)
    : tmpl_(source, name, jinja::Template::Options{.trim_blocks = true, .lstrip_blocks = true}) {}

std::string ChatTemplate::render(const nlohmann::ordered_json& vars) const {
  return tmpl_.render(vars);
}

}  // namespace wick
