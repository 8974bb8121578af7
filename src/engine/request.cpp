#include "engine/request.h"

#include <fmt/format.h>

#include <algorithm>

namespace wick {

const char* spec_method_name(SpecMethod m) {
  switch (m) {
    case SpecMethod::Default:
      return "default";
    case SpecMethod::Off:
      return "off";
    case SpecMethod::Ngram:
      return "ngram";
    case SpecMethod::Draft:
      return "draft";
  }
  return "?";
}

std::optional<SpecMethod> spec_method_from_name(std::string_view name) {
  for (SpecMethod m : {SpecMethod::Default, SpecMethod::Off, SpecMethod::Ngram, SpecMethod::Draft})
    if (name == spec_method_name(m)) return m;
  return std::nullopt;
}

void validate_request(const GenerateRequest& req, int32_t n_vocab) {
  if (auto err = req.sampling.validate(); !err.empty()) throw GenerateError(err);
  if (req.max_tokens < 0)
    throw GenerateError(fmt::format("max_tokens must be >= 0 (got {})", req.max_tokens));
  if (req.min_tokens < 0)
    throw GenerateError(fmt::format("min_tokens must be >= 0 (got {})", req.min_tokens));
  for (const auto& [id, bias] : req.sampling.logit_bias)
    if (id >= n_vocab)
      throw GenerateError(
          fmt::format("logit_bias token id {} is outside the vocabulary [0, {})", id, n_vocab));
  if (req.prefill_chunk < 0)
    throw GenerateError(fmt::format("prefill chunk must be >= 0 (got {})", req.prefill_chunk));
  if (req.prompt.empty()) throw GenerateError("the prompt is empty");
  for (int32_t id : req.prompt)
    if (id < 0 || id >= n_vocab)
      throw GenerateError(
          fmt::format("prompt token id {} is outside the vocabulary [0, {})", id, n_vocab));
  for (const auto& st : req.stop)
    if (st.empty()) throw GenerateError("stop strings must not be empty");
  const int32_t n = int32_t(req.prompt.size());
  for (size_t i = 0; i < req.spans.size(); ++i) {
    const auto [b, e] = req.spans[i];
    if (b < 0 || e > n)
      throw GenerateError(
          fmt::format("span {} [{}, {}) is outside the prompt of {} tokens", i, b, e, n));
    if (e <= b) throw GenerateError(fmt::format("span {} [{}, {}) is empty", i, b, e));
    if (e == n)
      throw GenerateError(fmt::format(
          "span {} [{}, {}) ends the prompt: text (the question) must come after the spans", i, b,
          e));
    if (i > 0 && b < req.spans[i - 1].second)
      throw GenerateError(fmt::format("span {} [{}, {}) overlaps or precedes span {} [{}, {})", i,
                                      b, e, i - 1, req.spans[i - 1].first,
                                      req.spans[i - 1].second));
  }
  if (req.prompt_logprobs < -1 || req.prompt_logprobs > kMaxPromptLogprobs)
    throw GenerateError(fmt::format("prompt_logprobs must be in [0, {}] (got {})",
                                    kMaxPromptLogprobs, req.prompt_logprobs));
  if (req.draft_max < -1 || req.draft_max > kMaxDraft)
    throw GenerateError(
        fmt::format("draft_max must be in [0, {}] (got {})", kMaxDraft, req.draft_max));
  if (req.span_recompute < -1)
    throw GenerateError(fmt::format("span_recompute must be >= 0 (got {})", req.span_recompute));
  if (req.span_blend != -1.f && !(req.span_blend >= 0.f && req.span_blend <= 1.f))
    throw GenerateError(fmt::format("span_blend must be in [0, 1] (got {})", req.span_blend));
  if (req.span_context < -1)
    throw GenerateError(fmt::format("span_context must be >= 0 (got {})", req.span_context));
  if (req.span_context > 0 && req.spans.empty())
    throw GenerateError("span_context needs spans: the tokens each span is computed after");
  if (!req.spans.empty() && req.span_context > req.spans.front().first)
    throw GenerateError(
        fmt::format("span_context {} reaches past the first span's begin {}: the context must "
                    "come before every span",
                    req.span_context, req.spans.front().first));
}

std::vector<int32_t> fit_prompt(const GenerateRequest& req, int32_t n_ctx) {
  std::vector<int32_t> prompt = req.prompt;
  if (int32_t(prompt.size()) < n_ctx) return prompt;
  if (!req.truncate || !req.spans.empty())
    throw GenerateError(fmt::format(
        "the prompt has {} tokens but the context holds {} (leave room to generate, or truncate)",
        prompt.size(), n_ctx));
  const int32_t keep =
      std::max<int32_t>(1, n_ctx - std::max<int32_t>(1, std::min(req.max_tokens, n_ctx / 2)));
  prompt.erase(prompt.begin(), prompt.end() - keep);
  return prompt;
}

}  // namespace wick
