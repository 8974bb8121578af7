#include "sampling/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace wick {

std::string SamplingParams::validate() const {
  auto finite = [](float x) { return std::isfinite(x); };
  if (!finite(temperature) || temperature < 0 || temperature > 100)
    return fmt::format("temperature must be in [0, 100] (got {})", temperature);
  if (top_k < 0) return fmt::format("top_k must be >= 0 (got {})", top_k);
  if (!finite(top_p) || top_p <= 0 || top_p > 1)
    return fmt::format("top_p must be in (0, 1] (got {})", top_p);
  if (!finite(min_p) || min_p < 0 || min_p > 1)
    return fmt::format("min_p must be in [0, 1] (got {})", min_p);
  if (!finite(repeat_penalty) || repeat_penalty <= 0 || repeat_penalty > 100)
    return fmt::format("repeat_penalty must be in (0, 100] (got {})", repeat_penalty);
  if (repeat_last_n < 0) return fmt::format("repeat_last_n must be >= 0 (got {})", repeat_last_n);
  if (!finite(presence_penalty) || std::fabs(presence_penalty) > 100)
    return fmt::format("presence_penalty must be in [-100, 100] (got {})", presence_penalty);
  if (!finite(frequency_penalty) || std::fabs(frequency_penalty) > 100)
    return fmt::format("frequency_penalty must be in [-100, 100] (got {})", frequency_penalty);
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return fmt::format("logit_bias ids must be >= 0 (got {})", id);
    if (!finite(bias) || std::fabs(bias) > 100)
      return fmt::format("logit_bias values must be in [-100, 100] (got {})", bias);
  }
  return "";
}

Sampler::Sampler(const SamplingParams& p, int32_t n_vocab) : p_(p), rng_(p.seed) {
  cand_.reserve(size_t(n_vocab));
  counts_.assign(size_t(n_vocab), 0);
  touched_.reserve(1024);
}

void Sampler::apply_bias(std::span<float> logits) const {
  for (const auto& [id, bias] : p_.logit_bias)
    if (size_t(id) < logits.size())
      logits[size_t(id)] += bias;  // a draft model's vocab may be smaller
}

void Sampler::apply_penalties(std::span<float> logits, std::span<const int32_t> history) {
  const bool rep = p_.repeat_penalty != 1.0f;
  const bool pf = p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  if (!rep && !pf) return;
  size_t n = history.size();
  if (p_.repeat_last_n > 0) n = std::min(n, size_t(p_.repeat_last_n));
  for (int32_t id : history.subspan(history.size() - n)) {
    if (id < 0 || size_t(id) >= counts_.size()) continue;
    if (counts_[size_t(id)]++ == 0) touched_.push_back(id);
  }
  for (int32_t id : touched_) {
    float& l = logits[size_t(id)];
    if (rep) l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
    if (pf) l -= p_.presence_penalty + float(counts_[size_t(id)]) * p_.frequency_penalty;
    counts_[size_t(id)] = 0;
  }
  touched_.clear();
}

void Sampler::apply_mask(std::span<float> logits, std::span<const uint64_t> allowed) {
  if (allowed.empty()) return;
  for (size_t i = 0; i < logits.size(); ++i)
    if (!((allowed[i >> 6] >> (i & 63)) & 1)) logits[i] = -INFINITY;
}

void Sampler::load_candidates(std::span<const float> logits) {
  cand_.clear();
  const float inv_t = 1.0f / p_.temperature;
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] != -INFINITY) cand_.push_back({logits[i] * inv_t, 0.f, int32_t(i)});
  if (cand_.empty())  // every logit -inf: all ids, as before masks existed
    for (size_t i = 0; i < logits.size(); ++i) cand_.push_back({logits[i], 0.f, int32_t(i)});
}

namespace {
bool by_logit(const Sampler::Cand& a, const Sampler::Cand& b) {
  return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
}
}  // namespace

void Sampler::top_k(int32_t k) {
  if (k <= 0 || size_t(k) >= cand_.size()) return;
  std::nth_element(cand_.begin(), cand_.begin() + k - 1, cand_.end(), by_logit);
  cand_.resize(size_t(k));
}

void Sampler::softmax() {
  std::sort(cand_.begin(), cand_.end(), by_logit);  // descending: top-p and min-p need the order
  const float mx = cand_.front().logit;
  double sum = 0;
  for (auto& c : cand_) sum += (c.p = std::exp(c.logit - mx));
  for (auto& c : cand_) c.p = float(c.p / sum);
}

void Sampler::top_p(float p) {
  if (p >= 1.0f) return;
  double acc = 0;
  size_t keep = cand_.size();
  for (size_t i = 0; i < cand_.size(); ++i) {
    acc += cand_[i].p;
    if (acc >= p) {
      keep = i + 1;
      break;
    }
  }
  cand_.resize(keep);
}

void Sampler::min_p(float p) {
  if (p <= 0.0f || cand_.empty()) return;
  const float floor = cand_.front().p * p;
  size_t keep = 1;
  while (keep < cand_.size() && cand_[keep].p >= floor) ++keep;
  cand_.resize(keep);
}

namespace {
size_t argmax(std::span<const float> x) {
  size_t best = 0;
  for (size_t i = 1; i < x.size(); ++i)
    if (x[i] > x[best]) best = i;
  return best;
}
}  // namespace

const std::vector<Sampler::Cand>& Sampler::distribution(std::span<float> logits,
                                                        std::span<const int32_t> history,
                                                        std::span<const uint64_t> allowed) {
  apply_bias(logits);
  apply_penalties(logits, history);
  apply_mask(logits, allowed);
  if (p_.temperature == 0.0f) {
    const size_t best = argmax(logits);
    cand_.assign(1, {logits[best], 1.0f, int32_t(best)});
    return cand_;
  }
  keep_candidates(logits);
  double total = 0;
  for (auto& c : cand_) total += c.p;
  for (auto& c : cand_) c.p = float(c.p / total);
  return cand_;
}

void Sampler::keep_candidates(std::span<const float> logits) {
  load_candidates(logits);
  top_k(p_.top_k);
  softmax();
  top_p(p_.top_p);
  min_p(p_.min_p);
}

double Sampler::uniform() {
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
}

int32_t Sampler::draw(std::span<const int32_t> ids, std::span<const float> weights) {
  double total = 0;
  for (float w : weights) total += w;
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (size_t i = 0; i < ids.size(); ++i) {
    r -= weights[i];
    if (r < 0) return ids[i];
  }
  return ids.back();
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history,
                        std::span<const uint64_t> allowed) {
  apply_bias(logits);
  apply_penalties(logits, history);
  apply_mask(logits, allowed);
  if (p_.temperature == 0.0f) return int32_t(argmax(logits));
  keep_candidates(logits);
  double total = 0;
  for (auto& c : cand_) total += c.p;
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (auto& c : cand_) {
    r -= c.p;
    if (r < 0) return c.id;
  }
  return cand_.back().id;
}

}  // namespace wick
