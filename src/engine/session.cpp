#include "engine/session.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "text/detokenizer.h"

namespace wick {

namespace {
using clk = std::chrono::steady_clock;
double secs(clk::time_point a, clk::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

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
}

std::vector<int32_t> fit_prompt(const GenerateRequest& req, int32_t n_ctx) {
  std::vector<int32_t> prompt = req.prompt;
  if (int32_t(prompt.size()) < n_ctx) return prompt;
  if (!req.truncate)
    throw GenerateError(fmt::format(
        "the prompt has {} tokens but the context holds {} (leave room to generate, or truncate)",
        prompt.size(), n_ctx));
  const int32_t keep =
      std::max<int32_t>(1, n_ctx - std::max<int32_t>(1, std::min(req.max_tokens, n_ctx / 2)));
  prompt.erase(prompt.begin(), prompt.end() - keep);
  return prompt;
}

bool StopFilter::feed(const std::string& delta, bool final, std::string& out) {
  pending_ += delta;
  for (const auto& st : stops_)
    if (auto p = pending_.find(st); p != std::string::npos) {
      out = pending_.substr(0, p);
      pending_.clear();
      return true;
    }
  // hold back the longest suffix that is a proper prefix of a stop string
  size_t hold = 0;
  if (!final)
    for (const auto& st : stops_)
      for (size_t n = std::min(pending_.size(), st.size() - 1); n > hold; --n)
        if (pending_.compare(pending_.size() - n, n, st, 0, n) == 0) {
          hold = n;
          break;
        }
  out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return false;
}

Session::Session(std::shared_ptr<const LoadedModel> model, int32_t n_ctx)
    : model_(std::move(model)),
      n_ctx_(std::max<int32_t>(
          1, std::min<int32_t>(n_ctx, int32_t(model_->model->config.n_ctx_train)))),
      runner_(model_, RunnerLimits{1, n_ctx_, n_ctx_, 0, 1}) {
  logits_.resize(size_t(model_->model->config.n_vocab));
}

void Session::run(const int32_t* ids, int32_t n, bool want_logits) {
  batch_.clear();
  batch_.block_tables = {{0}};
  const int32_t start = int32_t(tokens_.size());
  for (int32_t i = 0; i < n; ++i) batch_.add(ids[i], start + i, 0, want_logits && i == n - 1);
  std::span<float> out = runner_.execute(batch_);
  if (want_logits) std::copy(out.begin(), out.end(), logits_.begin());
  tokens_.insert(tokens_.end(), ids, ids + n);
}

GenerateResult Session::generate(const GenerateRequest& req,
                                 const std::function<bool(std::string_view)>& on_text) {
  const int32_t n_vocab = int32_t(model_->model->config.n_vocab);
  validate_request(req, n_vocab);
  if (req.top_logprobs >= 0)
    throw GenerateError("top_logprobs is served by the engine (wick serve), not by a session");
  const std::vector<int32_t> prompt = fit_prompt(req, n_ctx_);

  GenerateResult res;
  res.n_prompt = int32_t(prompt.size());
  const auto t0 = clk::now();
  // Reuse the cached prefix, verified token by token; always recompute the
  // last prompt token, whose logits start the generation.
  size_t common = 0;
  while (common < tokens_.size() && common < prompt.size() && tokens_[common] == prompt[common])
    ++common;
  common = std::min(common, prompt.size() - 1);
  tokens_.resize(common);  // K/V past this point is overwritten
  res.n_reused = int32_t(common);
  const int32_t chunk = req.prefill_chunk > 0 ? req.prefill_chunk : int32_t(prompt.size());
  for (size_t pos = common; pos < prompt.size(); pos += size_t(chunk)) {
    const int32_t n = int32_t(std::min<size_t>(size_t(chunk), prompt.size() - pos));
    run(prompt.data() + pos, n, pos + size_t(n) == prompt.size());
  }
  res.n_prefilled = int32_t(prompt.size() - common);
  const auto t_prefill = clk::now();

  Sampler sampler(req.sampling, n_vocab);
  std::vector<int32_t> history = prompt;
  history.reserve(prompt.size() + size_t(req.max_tokens) + 1);
  std::unique_ptr<StreamDecoder> detok;
  if (model_->tokenizer) detok = std::make_unique<StreamDecoder>(*model_->tokenizer, true);
  StopFilter stops(req.stop);
  // Passes text on; false when generation must end (a stop string or a cancel).
  auto feed_text = [&](const std::string& delta, bool final) {
    std::string out;
    const bool stopped = stops.feed(delta, final, out);
    res.text += out;
    if (on_text && !out.empty() && !on_text(out)) {
      res.stop_reason = "cancelled";
      return false;
    }
    if (stopped) res.stop_reason = "stop";
    return !stopped;
  };

  clk::time_point t_first{};
  if (req.keep_first_logits) res.first_logits = logits_;
  for (int32_t i = 0; i < req.max_tokens; ++i) {
    const int32_t id = sampler.sample(logits_, history);
    if (i == 0) t_first = clk::now();
    res.tokens.push_back(id);
    history.push_back(id);
    if (!req.ignore_eos && model_->is_eog(id)) {
      res.stop_reason = "eos";
      break;
    }
    if (detok && !feed_text(detok->push(id), false)) break;
    if (i + 1 == req.max_tokens) {
      res.stop_reason = "length";
      break;
    }
    if (int32_t(tokens_.size()) >= n_ctx_) {
      res.stop_reason = "context";
      break;
    }
    run(&id, 1, true);
  }
  if (req.max_tokens == 0) res.stop_reason = "length";
  if (detok && res.stop_reason != "stop" && res.stop_reason != "cancelled")
    feed_text(detok->finish(), true);
  const auto t_end = clk::now();
  res.ttft_ms = secs(t0, t_first == clk::time_point{} ? t_prefill : t_first) * 1e3;
  res.prefill_tok_s = res.n_prefilled / std::max(1e-9, secs(t0, t_prefill));
  const size_t n_decoded = res.tokens.empty() ? 0 : res.tokens.size() - 1;
  res.decode_tok_s = n_decoded ? double(n_decoded) / std::max(1e-9, secs(t_first, t_end)) : 0;
  return res;
}

}  // namespace wick
