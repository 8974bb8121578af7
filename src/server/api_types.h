// Requests as the per-API parsers leave them: the engine's request plus what
// the server itself does with it (streaming, choices, the response's shape).
#pragma once

#include <cstdint>
#include <string>

#include "engine/session.h"
#include "text/tool_calls.h"

namespace wick::server {

// How a chat answer is read for tool calls.
struct ToolSetup {
  ToolFormat format = ToolFormat::None;  // None: not parsed (no tools, or tool_choice "none")
  bool parallel = true;                  // parallel_tool_calls: false keeps the first call only
};

// How a chat answer is read for reasoning (<think>...</think>: text/reasoning.h).
struct ReasoningSetup {
  bool split = false;  // the model thinks in tags and the server splits them out
  bool open = false;   // the prompt ended inside <think>: the answer starts as reasoning
};

// Completions' echo: each choice's text starts with its prompt's, and with
// logprobs its logprobs with the prompt tokens' (the first null), as OpenAI's
// legacy API and vLLM answer it (lm-evaluation-harness scores with it).
// vLLM's chat echo: each choice's content starts with the final message's
// text (one entry in texts; no logprobs for it).
struct EchoSetup {
  std::vector<std::string> texts;  // prompt k's text for its choices; empty: no echo
  bool prompt_only = false;        // max_tokens 0: the engine's one token is left out
  // the prompt_logprobs field as asked (the engine's may be raised to
  // top_logprobs for the echoed tokens' alternatives)
  int32_t prompt_logprobs = -1;
  bool on() const { return !texts.empty(); }
};

// /v1/chat/completions and /v1/completions. Logprobs are asked for when
// gen.top_logprobs >= 0 (the engine computes them).
struct OpenAiRequest {
  bool chat = false;
  std::string model;  // as the body names it; empty: the server's default
  GenerateRequest gen;
  // Completions with a list of prompts: the ones after gen.prompt (choices
  // prompt by prompt, n_choices each, as OpenAI orders them).
  std::vector<std::vector<int32_t>> more_prompts;
  int32_t n_choices = 1;         // each its own request, choice i seeded seed + i
  bool stream = false;           // SSE
  bool usage_in_stream = false;  // stream_options.include_usage
  ToolSetup tools;               // chat only
  ReasoningSetup reasoning;      // chat only
  EchoSetup echo;
  // The prompts are ids the client laid out (completions' token ids, span
  // queries in the marker layout): with --span-markers, their markers lay
  // out their spans.
  bool token_prompts = false;
};

// /api/chat and /api/generate.
struct OllamaRequest {
  bool chat = false;
  std::string model;  // as the body names it (":latest" kept for the response)
  GenerateRequest gen;
  bool stream = true;        // NDJSON; Ollama streams unless told not to
  ToolSetup tools;           // chat only
  ReasoningSetup reasoning;  // through the chat template (not raw)
};

}  // namespace wick::server
