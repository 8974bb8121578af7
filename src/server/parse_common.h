// What the per-API request parsers share: the API error, typed field access,
// the model facts a parser needs, and the sampling and limit fields both APIs
// read (under their own names and defaults, described by a SamplingSpec).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "engine/session.h"
#include "grammar/grammar.h"
#include "server/api_types.h"
#include "text/infill.h"
#include "text/tokenizer.h"
#include "text/tool_calls.h"

namespace wick::server {

using json = nlohmann::ordered_json;

// What one request may hold, checked before the work it asks for (README,
// "Limits"); the body's size is the server's --max-body.
inline constexpr size_t kMaxJsonDepth = 64;          // nested arrays and objects
inline constexpr size_t kMaxMessages = 4096;         // chat messages
inline constexpr size_t kMaxTools = 128;             // tool definitions
inline constexpr size_t kMaxStopBytes = 512;         // each stop string
inline constexpr int64_t kMaxChoices = 8;            // OpenAI's n
inline constexpr size_t kMaxChoicesOfFormat = 4096;  // vLLM's guided_choice strings
inline constexpr int64_t kMaxTokensAsked =
    1 << 24;  // max_tokens, num_predict (then clamped to the context)

// An error answered to the client (each API writes it in its own shape).
struct ApiError {
  int status;
  std::string message, type = "invalid_request_error", param, code;
};

// Throws a 400 naming the field.
[[noreturn]] void bad(const std::string& param, const std::string& msg,
                      const std::string& code = "invalid_value");

// Typed optional field access; a wrong type is a 400 naming the field.
template <typename T>
std::optional<T> field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) bad(key, fmt::format("'{}' must be a boolean", key), "invalid_type");
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) bad(key, fmt::format("'{}' must be a string", key), "invalid_type");
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer())
      bad(key, fmt::format("'{}' must be an integer", key), "invalid_type");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) bad(key, fmt::format("'{}' must be a number", key), "invalid_type");
  }
  return it->get<T>();
}

// A request body: a JSON object, else a 400 (invalid UTF-8 and nesting past
// kMaxJsonDepth name the byte offset).
json parse_body(std::string_view body);

// What a parser needs to know of the model a request names.
struct ModelView {
  const Tokenizer& tokenizer;
  std::string name;                           // for template error messages
  int32_t n_ctx = 0;                          // the context one request may fill
  ToolFormat tool_format = ToolFormat::None;  // the markup its template teaches
  bool reasoning = false;  // its answers' <think> reasoning is split from the content
};

// One API's names, defaults and bounds for the sampling and limit fields.
struct SamplingSpec {
  // Before a field's name in range errors: "options." for Ollama.
  std::string param_prefix;
  SamplingParams defaults;  // the seed is not used
  // Whether repeat_last_n is a field (-1 = the whole history); else the default.
  bool has_repeat_last_n = false;
  // Tighter than validate()'s bounds: OpenAI's temperature <= 2, |penalties| <= 2.
  float max_temperature = std::numeric_limits<float>::infinity();
  float max_abs_penalty = std::numeric_limits<float>::infinity();  // presence, frequency
  // The max-tokens fields; the first one present is read.
  std::vector<const char*> max_tokens_keys;
  bool negative_max_tokens_is_no_limit = false;  // Ollama's -1 and -2
  std::string max_tokens_error;                  // the message for an out-of-range limit
  const char* stop_key = "stop";
  size_t n_stop_max = 4;
};

// The sampling fields of obj; no "seed" field takes random_seed.
SamplingParams parse_sampling(const json& obj, const SamplingSpec& spec, uint64_t random_seed);
// Sets r.max_tokens (at most room, the context left after the prompt) and r.stop.
void parse_limits(const json& obj, const SamplingSpec& spec, int64_t room, GenerateRequest& r);
// wick's speculative decoding extras: "spec" ("off", "ngram", "draft") and
// "draft_max" (0-64) of obj; param_prefix goes before their names in errors.
void parse_spec(const json& obj, const std::string& param_prefix, GenerateRequest& r);
// The token controls of OpenAI's and vLLM's APIs, after parse_limits:
// "logit_bias" ({"<id>": bias in [-100, 100]}, ids in m's vocabulary),
// "min_tokens" (0 to r.max_tokens: end-of-generation ids masked until then)
// and "ignore_eos".
void parse_token_controls(const json& obj, const ModelView& m, GenerateRequest& r);
// The span cache's repair extras: span_recompute (tokens at each span's
// start, >= 0) and span_blend (fraction of each span, in [0, 1]).
void parse_span_repair(const json& obj, const std::string& param_prefix, GenerateRequest& r);
// An array of token ids of m's vocabulary (a prompt, /detokenize's tokens):
// a non-integer is a 400 with type_error, an id outside the vocabulary one
// naming it; both name param.
std::vector<int32_t> parse_token_ids(const json& arr, const ModelView& m, const std::string& param,
                                     const std::string& type_error);
// Fill-in-the-middle (completions' and Ollama's suffix, llama.cpp's /infill):
// the prefix, suffix and middle laid out with the model's FIM tokens
// (text/infill.h); a model without them is a 400 naming `param`.
std::vector<int32_t> fim_prompt(const ModelView& m, const std::string& param,
                                const std::string& prefix, const std::string& suffix,
                                const std::string& middle = "",
                                const std::vector<InfillFile>& files = {});
// "logprobs" (bool) and "top_logprobs" (0-20) as OpenAI's chat and Ollama
// take them; top_logprobs without logprobs is a 400. Returns the engine's
// top_logprobs: -1 when off.
int32_t parse_top_logprobs(const json& obj);
// vLLM's prompt_logprobs: null or 0-20 (the top alternatives per prompt
// token); answered in non-streamed responses alone, so `stream` true is a 400.
void parse_prompt_logprobs(const json& obj, const std::string& param_prefix, bool stream,
                           GenerateRequest& r);
// Constrained decoding: the "grammar" extra (GBNF text) and the API's own
// field: OpenAI's "response_format" ({"type": "text" | "json_object" |
// "json_schema", "json_schema": {"name", "schema", "strict"}}) with vLLM's
// guided_json / guided_regex / guided_choice / guided_grammar and
// structured_outputs {json | regex | choice | grammar | json_object}, or
// Ollama's "format" ("json" or a schema object). Null when none asks for
// one; two are a 400; a bad grammar, regex or schema (unsupported keywords
// named) is a 400 naming the field.
// The field naming an output format besides "grammar" (GBNF): OpenAI's
// response_format (and vLLM's guided_*), Ollama's format, llama.cpp's
// json_schema.
enum class FormatField { OpenAiResponseFormat, OllamaFormat, LlamaCppJsonSchema };
std::shared_ptr<const grammar::Grammar> parse_grammar(const json& obj, FormatField which);
// How an answer to a prompt rendered through m's chat template is read for reasoning.
ReasoningSetup reasoning_setup(const ModelView& m, const std::vector<int32_t>& prompt);
// A string or an array of at most max_n non-empty strings of at most kMaxStopBytes.
std::vector<std::string> parse_stop(const json& obj, const char* key, size_t max_n);

}  // namespace wick::server
