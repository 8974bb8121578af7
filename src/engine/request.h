// What a generation is asked for and what it gives back, shared by the
// engine, sessions, the CLI and the server.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/grammar.h"
#include "sampling/sampler.h"

namespace wick {

// Speculative decoding (engine/speculative.h): guessed tokens verified in
// one target pass. Default: the engine's choice (EngineConfig::spec).
enum class SpecMethod { Default, Off, Ngram, Draft };
inline constexpr int32_t kMaxDraft = 64;           // draft tokens per step, at most
inline constexpr int32_t kMaxPromptLogprobs = 20;  // alternatives per prompt token, at most
const char* spec_method_name(SpecMethod m);        // "default", "off", "ngram", "draft"
// The method of a name as above; nullopt for another.
std::optional<SpecMethod> spec_method_from_name(std::string_view name);

struct GenerateRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 256;
  std::vector<std::string> stop;  // stop strings (not included in the text)
  bool ignore_eos = false;
  // End-of-generation ids are masked until this many tokens were generated
  // (vLLM's min_tokens); stop strings still end the generation.
  int32_t min_tokens = 0;
  int32_t prefill_chunk = 512;     // 0 = the whole prompt in one pass
  bool truncate = false;           // drop the oldest prompt tokens instead of failing when too long
  bool keep_first_logits = false;  // return the logits the first token was sampled from
  int32_t top_logprobs = -1;  // -1 off, else log-probabilities of each chosen token and the top N
  // -1 off, else the log-probability of each prompt token under the model's
  // distribution after the tokens before it, with the top N there (vLLM's
  // prompt_logprobs: perplexity and teacher-forced comparisons through the
  // server). Such a request takes nothing from the prefix cache, so that
  // every row is computed; the first token, and tokens a span layout takes
  // from the span cache, have none.
  int32_t prompt_logprobs = -1;
  // Independent spans of the prompt: [begin, end) token ranges, sorted, not
  // overlapping, none reaching the prompt's last token (documents, tool
  // outputs, examples). Each is computed as if it stood alone (at positions
  // from 0), cached, and reused wherever it appears; the text after the spans
  // attends to everything. Each span starts a KV block (the positions between
  // stay empty). Needs the engine's span cache (EngineConfig::span_cache).
  std::vector<std::pair<int32_t, int32_t>> spans;
  // Tokens at the start of each span computed again with attention over
  // everything before them (quality repair; not for a span at position 0,
  // which has nothing before it); -1: the engine's default.
  int32_t span_recompute = -1;
  // And this fraction (0–1) of each span's tokens, those whose K/V deviates
  // most from the cached span's once it sees what precedes it (CacheBlend-
  // style, measured at layer 1 by a cheap pass over the span); 0 off, -1:
  // the engine's default.
  float span_blend = -1.f;
  // Each span is computed as if it followed the prompt's first span_context
  // tokens (at most the first span's begin; 0: alone), e.g. the system
  // prompt: the span keeps the real attention sink and context and misses
  // only the other spans. Its cached K/V is found only after the same
  // context tokens. -1: the engine's default (EngineConfig::span_context).
  int32_t span_context = -1;
  // Speculative decoding: which proposer guesses the next tokens, and at
  // most how many per step (-1: the engine's draft_max). Never changes
  // what greedy decoding gives; sampled output keeps its distribution.
  SpecMethod spec = SpecMethod::Default;
  int32_t draft_max = -1;
  // Constrained decoding: when set, each token keeps the output a prefix of
  // the grammar's language (tokens that break it are masked after the
  // penalties, before temperature and the filters); an end-of-generation
  // token is allowed only where the output is a whole match, and the
  // generation stops ("stop") once nothing may follow. Needs the model's
  // tokenizer. No speculative decoding for such a request (drafts would
  // need checking against the grammar; they are simply not proposed).
  std::shared_ptr<const grammar::Grammar> grammar;
  // A named LoRA adapter of the model (add_named_lora; a server's
  // --lora-modules): 1-based, Model::adapter_names[adapter - 1]; 0: none.
  // Its K/V is cached apart from other adapters'.
  int32_t adapter = 0;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;                           // of the chosen token, before sampling filters
  std::vector<std::pair<int32_t, float>> top;  // the most likely tokens, best first
  int32_t rank = 0;  // prompt tokens: id's place in the distribution (1: the most likely)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (an end-of-generation id included)
  std::string text;             // without special tokens and stop strings
  // "eos", "stop", "length" (max_tokens), "context" (prompt and generated
  // tokens together reached n_ctx), "cancelled", or "error: ..."
  std::string stop_reason;
  bool internal_error = false;      // the error is the engine's (a failed step), not the request's
  int32_t n_prompt = 0;             // prompt tokens
  int32_t n_reused = 0;             // prompt tokens whose K/V came from the cache (spans too)
  int32_t n_prefilled = 0;          // prompt tokens computed (span jobs and repairs too)
  double ttft_ms = 0;               // from add_request to the first token
  double prefill_tok_s = 0;         // prompt tokens computed per second, first step to first token
  double decode_tok_s = 0;          // tokens after the first, per second
  std::vector<float> first_logits;  // with keep_first_logits
  std::vector<TokenLogprob> logprobs;  // with top_logprobs >= 0, one per generated token
  // with prompt_logprobs >= 0, one per prompt token (span layouts' empty
  // slots left out); empty where none was computed (see the request's)
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  // span cache: spans found cached, spans computed (by a span job), span
  // tokens taken from the cache, span tokens computed again in place
  int32_t n_span_hits = 0, n_span_misses = 0, n_span_reused = 0, n_span_recomputed = 0;
  // speculative decoding: draft tokens proposed and verified (guesses past
  // the end of the generation are not counted), those the target accepted, and the target's forward
  // passes that gave this request tokens (tokens per forward = tokens.size() / n_forwards; 1
  // without drafts)
  int32_t n_spec_proposed = 0, n_spec_accepted = 0, n_forwards = 0;
};

struct GenerateError : std::runtime_error {  // bad request (too long, bad parameters)
  using std::runtime_error::runtime_error;
};

struct StreamCallbacks {
  std::function<bool(std::string_view)> on_text;       // false cancels
  std::function<void(const GenerateResult&)> on_done;  // always called once
  // With top_logprobs >= 0: each token's log-probabilities, before the
  // on_text call that carries (some of) its text.
  std::function<void(const TokenLogprob&)> on_logprob;
};

// Throws GenerateError naming what is wrong: sampling values, limits, token ids.
void validate_request(const GenerateRequest& req, int32_t n_vocab);
// The prompt that fits a context of n_ctx tokens: the request's own, or with
// req.truncate its newest tokens (room left to generate); else GenerateError.
std::vector<int32_t> fit_prompt(const GenerateRequest& req, int32_t n_ctx);

}  // namespace wick
