#include "server/parse_ollama.h"

#include <algorithm>

#include "server/chat_prompt.h"
#include "server/tool_request.h"

namespace wick::server {

const SamplingSpec kOllamaSampling = {
    .param_prefix = "options.",
    .defaults = {.temperature = 0.8f,
                 .top_k = 40,
                 .top_p = 0.9f,
                 .min_p = 0.0f,
                 .repeat_penalty = 1.1f,
                 .repeat_last_n = 64,
                 .presence_penalty = 0.0f,
                 .frequency_penalty = 0.0f},
    .has_repeat_last_n = true,
    .max_tokens_keys = {"num_predict"},
    .negative_max_tokens_is_no_limit = true,
    .max_tokens_error = "num_predict must be -1 (no limit) or in [1, 16777216]",
    .stop_key = "stop",
    .n_stop_max = 16,
};

namespace {

// /api/generate: with a suffix, the text between the prompt and it (fill in
// the middle, no template); else the prompt as is with raw, or as one user
// turn (after an optional system turn) through the chat template.
std::vector<int32_t> generate_prompt(const json& b, const ModelView& m, const json& extra) {
  const std::string p = field<std::string>(b, "prompt").value_or("");
  if (const std::string suffix = field<std::string>(b, "suffix").value_or(""); !suffix.empty())
    return fim_prompt(m, "suffix", p, suffix);
  if (p.empty()) bad("prompt", "'prompt' is required");
  if (field<bool>(b, "raw").value_or(false)) return m.tokenizer.encode(p, {.add_special = true});
  json msgs = json::array();
  if (auto sys = field<std::string>(b, "system"))
    msgs.push_back({{"role", "system"}, {"content", *sys}});
  msgs.push_back({{"role", "user"}, {"content", p}});
  return chat_prompt(m, msgs, json(), extra);
}

// Ollama's "think": the template's enable_thinking (Qwen3's switch); true on
// a model that does not think in tags is a 400, as Ollama answers it.
json think_kwargs(const json& b, const ModelView& m) {
  const auto think = field<bool>(b, "think");
  if (!think) return json();
  if (*think && !m.reasoning) bad("think", fmt::format("'{}' does not support thinking", m.name));
  return {{"enable_thinking", *think}};
}

// options.num_ctx narrows the context (never past the server's).
int64_t context_for(const json& options, const ModelView& m, size_t n_prompt) {
  const int64_t num_ctx = field<int64_t>(options, "num_ctx").value_or(m.n_ctx);
  if (num_ctx < 1) bad("options.num_ctx", "num_ctx must be positive");
  const int64_t ctx = std::min<int64_t>(num_ctx, m.n_ctx);
  if (int64_t(n_prompt) >= ctx)
    throw ApiError{400,
                   fmt::format("the prompt has {} tokens but the context holds {}", n_prompt, ctx),
                   "invalid_request_error", "options.num_ctx", "context_length_exceeded"};
  return ctx;
}

}  // namespace

std::string ollama_model_name(const json& body) {
  auto name = field<std::string>(body, "model");
  if (!name) bad("model", "'model' is required", "missing_field");
  return *name;
}

std::string ollama_show_model_name(const json& body) {
  auto name = field<std::string>(body, "model");
  if (!name) name = field<std::string>(body, "name");
  if (!name) bad("model", "'model' is required", "missing_field");
  return *name;
}

OllamaRequest parse_ollama(const json& b, bool chat, const ModelView& m, uint64_t random_seed) {
  OllamaRequest r;
  r.chat = chat;
  r.model = ollama_model_name(b);
  GenerateRequest& g = r.gen;
  g.top_logprobs = parse_top_logprobs(b);
  if (chat) {
    if (!b.contains("messages")) bad("messages", "'messages' is required", "missing_field");
    const json tools = parse_tools(b, m, false, r.tools, g);
    g.prompt = chat_prompt(m, b["messages"], tools, think_kwargs(b, m));
  } else {
    g.prompt = generate_prompt(b, m, think_kwargs(b, m));
  }
  const bool infill = !chat && !field<std::string>(b, "suffix").value_or("").empty();
  if (chat || !(infill || field<bool>(b, "raw").value_or(false)))
    r.reasoning = reasoning_setup(m, g.prompt);
  const json o = b.value("options", json::object());
  if (!o.is_object()) bad("options", "'options' must be an object", "invalid_type");
  g.sampling = parse_sampling(o, kOllamaSampling, random_seed);
  const int64_t ctx = context_for(o, m, g.prompt.size());
  parse_limits(o, kOllamaSampling, ctx - int64_t(g.prompt.size()), g);
  parse_spec(o, "options.", g);
  g.grammar = parse_grammar(b, FormatField::OllamaFormat);
  r.stream = field<bool>(b, "stream").value_or(true);
  return r;
}

}  // namespace wick::server
