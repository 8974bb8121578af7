#include "engine/perplexity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "engine/model_runner.h"

namespace wick {

namespace {

MeanErr mean_err(double sum, double sum2, int64_t n) {
  MeanErr m;
  if (n <= 0) return m;
  m.mean = sum / double(n);
  const double var = sum2 / double(n) - m.mean * m.mean;
  m.err = (var > 0 && n > 1) ? std::sqrt(var / double(n - 1)) : 0;
  return m;
}

// log-softmax of one logits row into out; returns the argmax.
int32_t log_softmax(std::span<const float> logits, std::vector<double>& out) {
  out.resize(logits.size());
  const auto top = std::max_element(logits.begin(), logits.end());
  const double mx = *top;
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - mx);
  const double lse = mx + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - lse;
  return int32_t(top - logits.begin());
}

struct Sums {
  double nll = 0, nll2 = 0;
  int64_t n = 0;
  void add(double v) {
    nll += v;
    nll2 += v * v;
    ++n;
  }
};

}  // namespace

PerplexityResult perplexity(const std::shared_ptr<const LoadedModel>& model,
                            const std::shared_ptr<const LoadedModel>& base,
                            std::span<const int32_t> tokens, const PerplexityOptions& opt,
                            const PerplexityProgress& progress) {
  const int32_t n_ctx = opt.n_ctx;
  if (n_ctx < 4) throw std::invalid_argument(fmt::format("--ctx {}: at least 4", n_ctx));
  if (int64_t(tokens.size()) < 2 * int64_t(n_ctx))
    throw std::invalid_argument(
        fmt::format("the text has {} tokens; perplexity with a context of {} needs at least {}",
                    tokens.size(), n_ctx, 2 * int64_t(n_ctx)));
  const int64_t n_vocab = model->config().n_vocab;
  if (base && base->config().n_vocab != n_vocab)
    throw std::invalid_argument(fmt::format(
        "--kl-divergence: the base model's vocabulary ({} tokens) differs from the model's ({})",
        base->config().n_vocab, n_vocab));
  for (int32_t t : tokens)
    if (t < 0 || t >= n_vocab)
      throw std::invalid_argument(fmt::format("token id {} is outside the vocabulary", t));

  const int32_t n_max = int32_t(int64_t(tokens.size()) / n_ctx);
  const int32_t n_chunks = opt.n_chunks < 0 ? n_max : std::min(opt.n_chunks, n_max);
  if (n_chunks <= 0) throw std::invalid_argument("--chunks: at least 1");
  const int32_t first = n_ctx / 2;

  PerplexityResult res;
  res.n_tokens = int64_t(tokens.size());
  res.n_chunks = n_chunks;
  ModelRunner runner(model, 1, n_ctx);
  std::unique_ptr<ModelRunner> base_runner;
  if (base) base_runner = std::make_unique<ModelRunner>(base, 1, n_ctx);
  Sums sums, base_sums, kld_sums;
  int64_t n_same = 0;
  std::vector<float> klds;
  std::vector<double> lp, lp_base;
  std::vector<float> base_logits;

  for (int32_t c = 0; c < n_chunks; ++c) {
    const int64_t start = int64_t(c) * n_ctx;
    auto window_batch = [&] {
      Batch b;
      b.block_tables = {{0}};
      for (int32_t j = 0; j < n_ctx; ++j) {
        int32_t id = tokens[size_t(start + j)];
        if (j == 0 && opt.add_bos) id = opt.bos_id;
        b.add(id, j, 0, j >= first && j < n_ctx - 1);  // row j predicts token j + 1
      }
      return b;
    };
    if (base_runner) {
      Batch bb = window_batch();
      auto l = base_runner->execute(bb);
      base_logits.assign(l.begin(), l.end());
    }
    Batch b = window_batch();
    std::span<float> logits = runner.execute(b);
    for (int32_t j = first; j < n_ctx - 1; ++j) {
      const size_t r = size_t(j - first);
      const int32_t next = tokens[size_t(start + j + 1)];
      const int32_t top = log_softmax(logits.subspan(r * size_t(n_vocab), size_t(n_vocab)), lp);
      sums.add(-lp[size_t(next)]);
      if (!base_runner) continue;
      const int32_t top_base = log_softmax(
          std::span<const float>(base_logits).subspan(r * size_t(n_vocab), size_t(n_vocab)),
          lp_base);
      base_sums.add(-lp_base[size_t(next)]);
      double kld = 0;
      for (int64_t v = 0; v < n_vocab; ++v)
        kld += std::exp(lp_base[size_t(v)]) * (lp_base[size_t(v)] - lp[size_t(v)]);
      kld = std::max(kld, 0.0);  // rounding can take it a hair below zero
      kld_sums.add(kld);
      klds.push_back(float(kld));
      n_same += top == top_base;
    }
    res.running.push_back(std::exp(sums.nll / double(sums.n)));
    if (progress) progress(c + 1, n_chunks, res.running.back());
  }

  const MeanErr nll = mean_err(sums.nll, sums.nll2, sums.n);
  res.ppl = std::exp(nll.mean);
  res.ppl_err = res.ppl * nll.err;
  res.n_scored = sums.n;
  if (base_runner) {
    KlStats k;
    const MeanErr nb = mean_err(base_sums.nll, base_sums.nll2, base_sums.n);
    k.ppl_base = std::exp(nb.mean);
    k.ppl_base_err = k.ppl_base * nb.err;
    k.kld = mean_err(kld_sums.nll, kld_sums.nll2, kld_sums.n);
    std::sort(klds.begin(), klds.end());
    auto percentile = [&](double f) {  // linear between neighbours, as llama.cpp
      const double p = f * double(klds.size() - 1);
      const size_t i = size_t(p);
      const double w = p - double(i);
      return (1 - w) * klds[i] + w * klds[std::min(i + 1, klds.size() - 1)];
    };
    const size_t n = klds.size();
    k.kld_median = n % 2 ? klds[n / 2] : 0.5 * (klds[n / 2] + klds[n / 2 - 1]);
    k.kld_p99 = percentile(0.99);
    k.kld_max = klds.back();
    const double p = double(n_same) / double(n);
    k.same_top = {p, n > 1 ? std::sqrt(p * (1 - p) / double(n - 1)) : 0};
    res.kl = k;
  }
  return res;
}

}  // namespace wick
