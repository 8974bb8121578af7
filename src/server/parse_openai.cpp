#include "server/parse_openai.h"

#include <algorithm>

#include "server/chat_prompt.h"
#include "server/tool_request.h"

namespace wick::server {

const SamplingSpec kOpenAiSampling = {
    .param_prefix = "",
    .defaults = {.temperature = 1.0f,
                 .top_k = 0,
                 .top_p = 1.0f,
                 .min_p = 0.0f,
                 .repeat_penalty = 1.0f,
                 .repeat_last_n = 0,
                 .presence_penalty = 0.0f,
                 .frequency_penalty = 0.0f},
    .has_repeat_last_n = false,
    .max_temperature = 2.0f,
    .max_abs_penalty = 2.0f,
    .max_tokens_keys = {"max_completion_tokens", "max_tokens"},
    .negative_max_tokens_is_no_limit = false,
    .max_tokens_error = "max_tokens must be in [1, 16777216]",
    .stop_key = "stop",
    .n_stop_max = 4,
};

namespace {

constexpr size_t kMaxPrompts = 128;  // in one completions request

// A string (encoded with the tokenizer's specials) or an array of token ids.
// suffix: fill in the middle between the prompt's text and it (text only).
std::vector<int32_t> completion_prompt(const json& p, const ModelView& m,
                                       const std::optional<std::string>& suffix) {
  const std::string type_error =
      "'prompt' must be a string, an array of token ids, or an array of either";
  if (suffix) {
    if (!p.is_string()) bad("suffix", "'suffix' needs a text prompt", "invalid_type");
    return fim_prompt(m, "suffix", p.get<std::string>(), *suffix);
  }
  if (p.is_string()) {
    auto prompt = m.tokenizer.encode(p.get<std::string>(), {.add_special = true});
    if (prompt.empty()) bad("prompt", "'prompt' is empty");
    return prompt;
  }
  if (!p.is_array() || p.empty()) bad("prompt", type_error, "invalid_type");
  return parse_token_ids(p, m, "prompt", type_error);
}

void check_fits(size_t n_prompt, int32_t n_ctx, const char* param) {
  if (int64_t(n_prompt) >= n_ctx)
    throw ApiError{
        400,
        fmt::format("This model's maximum context length is {} tokens; the prompt has {} tokens",
                    n_ctx, n_prompt),
        "invalid_request_error", param, "context_length_exceeded"};
}

// Chat takes logprobs: bool and top_logprobs (0-20); completions logprobs: int
// (0-5). Returns the engine's top_logprobs: -1 when off.
int32_t parse_logprobs(const json& b, bool chat) {
  if (chat) return parse_top_logprobs(b);
  const auto n_top = field<int64_t>(b, "logprobs");
  if (!n_top) return -1;
  if (*n_top < 0 || *n_top > 5) bad("logprobs", "logprobs must be in [0, 5]");
  return int32_t(*n_top);
}

// The prompts' texts as the client sent them (token ids decoded, special
// tokens kept); with logprobs, the prompt tokens' computed too.
void set_echo(const json& b, const ModelView& m, OpenAiRequest& r) {
  GenerateRequest& g = r.gen;
  r.echo.prompt_logprobs = g.prompt_logprobs;
  if (g.top_logprobs >= 0) {
    if (r.stream)
      bad("echo", "echo with logprobs is answered in a whole response: it needs stream false");
    g.prompt_logprobs = std::max(g.prompt_logprobs, g.top_logprobs);
  }
  const json& p = b["prompt"];
  auto text_of = [&](const json& one, const std::vector<int32_t>& ids) {
    return one.is_string() ? one.get<std::string>() : m.tokenizer.decode(ids, false);
  };
  if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
    r.echo.texts.push_back(text_of(p[0], g.prompt));
    for (size_t k = 0; k < r.more_prompts.size(); ++k)
      r.echo.texts.push_back(text_of(p[k + 1], r.more_prompts[k]));
  } else {
    r.echo.texts.push_back(text_of(p, g.prompt));
  }
}

// vLLM's chat echo: the answer starts with the final message's text when the
// answer continues that message's role (the assistant's on a new turn).
void set_chat_echo(const json& messages, PromptEnd end, OpenAiRequest& r) {
  if (end == PromptEnd::NewTurn && messages.back()["role"] != "assistant") return;
  if (std::string text = final_message_text(messages); !text.empty())
    r.echo.texts.push_back(std::move(text));
}

}  // namespace

std::string openai_model_name(const json& body) {
  return field<std::string>(body, "model").value_or("");
}

OpenAiRequest parse_openai(const json& b, bool chat, const ModelView& m, uint64_t random_seed) {
  OpenAiRequest r;
  r.chat = chat;
  r.model = openai_model_name(b);
  GenerateRequest& g = r.gen;
  // The cheap fields first: a bad request costs no template render or tokenization.
  const int64_t n = field<int64_t>(b, "n").value_or(1);
  if (n < 1 || n > kMaxChoices) bad("n", fmt::format("'n' must be in [1, {}]", kMaxChoices));
  r.n_choices = int32_t(n);
  r.stream = field<bool>(b, "stream").value_or(false);
  if (b.contains("stream_options") && b["stream_options"].is_object())
    r.usage_in_stream = field<bool>(b["stream_options"], "include_usage").value_or(false);
  g.top_logprobs = parse_logprobs(b, chat);
  g.sampling = parse_sampling(b, kOpenAiSampling, random_seed);
  if (chat) {
    if (!b.contains("messages")) bad("messages", "'messages' is required", "missing_field");
    const json tools = parse_tools(b, m, true, r.tools, g);
    const PromptEnd end = prompt_end(b);
    g.prompt = chat_prompt(m, b["messages"], tools, b.value("chat_template_kwargs", json()), end);
    if (end == PromptEnd::NewTurn) r.reasoning = reasoning_setup(m, g.prompt);
    if (field<bool>(b, "echo").value_or(false)) set_chat_echo(b["messages"], end, r);
  } else {
    if (!b.contains("prompt")) bad("prompt", "'prompt' is required", "missing_field");
    const json& p = b["prompt"];
    const auto suffix = field<std::string>(b, "suffix");
    if (suffix && field<bool>(b, "echo").value_or(false))
      bad("echo", "echo cannot be combined with suffix");
    // one completion per string or per array of ids
    if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
      if (p.size() > kMaxPrompts)
        bad("prompt", fmt::format("at most {} prompts in one request", kMaxPrompts));
      for (size_t i = 0; i < p.size(); ++i) {
        if (p[i].is_string() != p[0].is_string())
          bad("prompt", "a list of prompts holds strings or arrays of token ids, not both",
              "invalid_type");
        auto ids = completion_prompt(p[i], m, suffix);
        check_fits(ids.size(), m.n_ctx, "prompt");
        if (i == 0)
          g.prompt = std::move(ids);
        else
          r.more_prompts.push_back(std::move(ids));
      }
    } else {
      g.prompt = completion_prompt(p, m, suffix);
    }
    r.token_prompts = p.is_array() && !p.empty() && !p[0].is_string();
  }
  check_fits(g.prompt.size(), m.n_ctx, chat ? "messages" : "prompt");
  const bool echo = !chat && field<bool>(b, "echo").value_or(false);
  if (echo && field<int64_t>(b, "max_tokens") == 0 && !b.contains("max_completion_tokens")) {
    r.echo.prompt_only = true;  // OpenAI's way to score a prompt: one token made, left out
    g.max_tokens = 1;
    g.stop = parse_stop(b, kOpenAiSampling.stop_key, kOpenAiSampling.n_stop_max);
  } else {
    parse_limits(b, kOpenAiSampling, int64_t(m.n_ctx) - int64_t(g.prompt.size()), g);
  }
  parse_spec(b, "", g);
  parse_token_controls(b, m, g);
  parse_prompt_logprobs(b, "", r.stream, g);
  if (echo) set_echo(b, m, r);
  if (auto format = parse_grammar(b, FormatField::OpenAiResponseFormat)) {
    if (g.grammar)  // set by tool_choice
      bad(b.contains("grammar") ? "grammar" : "response_format",
          "an output format cannot be combined with tool_choice \"required\" or a named function");
    g.grammar = std::move(format);
  }
  if ((r.more_prompts.size() + 1) * size_t(r.n_choices) > kMaxPrompts)
    bad("n", fmt::format("prompts x n must be at most {}", kMaxPrompts));
  return r;
}

}  // namespace wick::server
