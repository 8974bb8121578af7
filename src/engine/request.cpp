#include "engine/request.h"

#include <fmt/format.h>

#include <algorithm>

namespace wick {

void validate_request(const GenerateRequest& req, int32_t n_vocab) {
  if (auto err = req.sampling.validate(); !err.empty()) throw GenerateError(err);
  if (req.max_tokens < 0)
    throw GenerateError(fmt::format("max_tokens must be >= 0 (got {})", req.max_tokens));
  if (req.prefill_chunk < 0)
    throw GenerateError(fmt::format("prefill chunk must be >= 0 (got {})", req.prefill_chunk));
  if (req.prompt.empty()) throw GenerateError("the prompt is empty");
  for (int32_t id : req.prompt)
    if (id < 0 || id >= n_vocab)
      throw GenerateError(
          fmt::format("prompt token id {} is outside the vocabulary [0, {})", id, n_vocab));
  for (const auto& st : req.stop)
    if (st.empty()) throw GenerateError("stop strings must not be empty");
  int32_t prev_end = 0;
  for (const auto& [b, e] : req.spans) {
    if (b < prev_end || e <= b || e > int32_t(req.prompt.size()))
      throw GenerateError(fmt::format(
          "span [{}, {}) is empty, overlaps the one before or leaves the prompt of {} tokens", b,
          e, req.prompt.size()));
    if (e >= int32_t(req.prompt.size()))
      throw GenerateError("a span cannot end the prompt: the question (or text) comes after it");
    prev_end = e;
  }
  if (req.span_recompute < -1)
    throw GenerateError(fmt::format("span_recompute must be >= 0 (got {})", req.span_recompute));
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
