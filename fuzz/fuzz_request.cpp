// Request bodies as the server parses them, without a socket: the body, then
// every endpoint's parser on it (OpenAI chat, completions and responses,
// Ollama chat, generate and show) against the Qwen3 tokenizer and its chat template. Bad
// bodies must be an ApiError with a 4xx status (anything else would reach the
// client as a 500); a parsed request stays within the limits.
#include <cmath>

#include "fuzz_input.h"
#include "server/llamacpp_api.h"
#include "server/parse_ollama.h"
#include "server/parse_openai.h"
#include "server/parse_responses.h"

using namespace wick;
using namespace wick::server;

namespace {

template <typename F>
void expect_4xx_or_ok(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    if (e.status < 400 || e.status >= 500) std::abort();
  }
}

void check(const GenerateRequest& g, const ModelView& m) {
  if (g.max_tokens < 0) std::abort();
  if (!g.truncate && int64_t(g.prompt.size()) + g.max_tokens > m.n_ctx) std::abort();
  if (g.stop.size() > 16) std::abort();
  for (int32_t id : g.prompt)
    if (id < 0 || id >= m.tokenizer.n_vocab()) std::abort();
  if (g.min_tokens < 0 || g.min_tokens > g.max_tokens) std::abort();
  for (const auto& [id, bias] : g.sampling.logit_bias)
    if (id < 0 || id >= m.tokenizer.n_vocab() || !(std::fabs(bias) <= 100)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)fuzz::shared_tokenizer("qwen3");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer& qwen3 = fuzz::shared_tokenizer("qwen3");
  const ModelView m{qwen3, "qwen3", 512};
  json body;
  try {
    body = parse_body(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const ApiError& e) {
    if (e.status != 400) std::abort();
    return 0;
  }
  for (bool chat : {true, false}) {
    expect_4xx_or_ok([&] {
      (void)openai_model_name(body);
      OpenAiRequest r = parse_openai(body, chat, m, 7);
      if (r.n_choices < 1 || r.n_choices > kMaxChoices) std::abort();
      check(r.gen, m);
      for (const auto& p : r.more_prompts)
        if (int64_t(p.size()) > m.n_ctx) std::abort();
      if (r.echo.on() && r.echo.texts.size() != r.more_prompts.size() + 1) std::abort();
    });
    expect_4xx_or_ok([&] {
      (void)ollama_model_name(body);
      OllamaRequest r = parse_ollama(body, chat, m, 7);
      check(r.gen, m);
    });
    expect_4xx_or_ok([&] {  // llama.cpp's /infill (chat) and /completion
      check(parse_llamacpp(body, chat, m, 7).gen, m);
    });
  }
  // the Responses API, alone and after a previous response's conversation
  const json previous = json::parse(R"([{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
       "function": {"name": "f", "arguments": "{}"}}]}])");
  for (const json& prev : {json::array(), previous})
    expect_4xx_or_ok([&] {
      (void)previous_response_id(body);
      ResponsesRequest r = parse_responses(body, m, 7, prev);
      if (r.chat.n_choices != 1 || !r.conversation.is_array()) std::abort();
      check(r.chat.gen, m);
    });
  expect_4xx_or_ok([&] { (void)ollama_show_model_name(body); });
  return 0;
}
