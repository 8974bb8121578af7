// Chat templates come inside GGUF files and tokenizer_config.json: untrusted
// code. The input is a template, then optionally a NUL byte and a JSON object
// of extra variables. Parsing and rendering fail only with a TemplateError;
// a render stays within its bounds (here made small so that runs stay fast).
#include <nlohmann/json.hpp>

#include "fuzz_input.h"
#include "text/jinja.h"

using namespace wick;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [source, vars_text] = fuzz::split_at_nul(data, size);
  nlohmann::ordered_json vars = {
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}},
        {{"role", "user"}, {"content", "Hi <b>there</b> ü"}},
        {{"role", "assistant"},
         {"content", ""},
         {"tool_calls",
          {{{"type", "function"},
            {"function", {{"name", "f"}, {"arguments", {{"x", 1}, {"y", {1.5, nullptr}}}}}}}}}},
        {{"role", "tool"}, {"content", "42"}}}},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {}}}}}}},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"}};
  if (!vars_text.empty()) {
    auto extra = nlohmann::ordered_json::parse(vars_text, nullptr, false);
    if (extra.is_object())
      for (auto& [k, v] : extra.items()) vars[k] = v;
  }
  jinja::Template::Options opt;
  opt.max_output_bytes = 1 << 16;
  opt.max_steps = 20000;
  try {
    jinja::Template t(std::string(source), "fuzz.jinja", opt);
    std::string out = t.render(vars);
    if (out.size() > opt.max_output_bytes) std::abort();
  } catch (const jinja::TemplateError&) {
  }
  return 0;
}
