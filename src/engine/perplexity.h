// Perplexity of a model on a token sequence, computed as llama.cpp's
// llama-perplexity does: non-overlapping windows of n_ctx tokens, each
// evaluated from an empty cache, the first token replaced by BOS when the
// tokenizer adds one, and only the second half of each window scored (each
// scored token then has at least n_ctx/2 tokens of context). With a base
// model, also the KL divergence of the model's next-token distribution from
// the base's and how often their top tokens agree (llama.cpp's
// --kl-divergence statistics) on the same windows.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "engine/model_pool.h"

namespace wick {

struct PerplexityOptions {
  int32_t n_ctx = 512;
  int32_t n_chunks = -1;  // windows to score; -1: all that fit
  bool add_bos = false;   // the tokenizer adds BOS: each window starts with it
  int32_t bos_id = 0;
};

// Mean of x and its standard error, from sum x, sum x^2 and the count.
struct MeanErr {
  double mean = 0, err = 0;
};

struct KlStats {
  double ppl_base = 0, ppl_base_err = 0;
  MeanErr kld;  // nats per token
  double kld_p99 = 0, kld_median = 0, kld_max = 0;
  MeanErr same_top;  // fraction of tokens whose argmax agrees
};

struct PerplexityResult {
  double ppl = 0, ppl_err = 0;  // exp(mean NLL) and its standard error
  int64_t n_scored = 0;         // tokens scored
  int32_t n_chunks = 0;
  int64_t n_tokens = 0;         // in the text
  std::vector<double> running;  // the estimate after each chunk
  std::optional<KlStats> kl;
};

// Gets (chunks done, chunks in all, running perplexity) after each window.
using PerplexityProgress = std::function<void(int32_t, int32_t, double)>;

// Throws std::invalid_argument when the text is shorter than 2 * n_ctx
// tokens (as llama-perplexity refuses it) or the vocabularies differ.
PerplexityResult perplexity(const std::shared_ptr<const LoadedModel>& model,
                            const std::shared_ptr<const LoadedModel>& base,
                            std::span<const int32_t> tokens, const PerplexityOptions& opt,
                            const PerplexityProgress& progress = {});

}  // namespace wick
