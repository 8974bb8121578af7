#include "engine/output_processor.h"

#include <algorithm>

#include "sampling/logprobs.h"

namespace wick {

namespace {

double ms_since(Sequence::clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Sequence::clock::now() - t).count();
}

// The backend's sampling parameters for one sequence, with the distinct
// tokens of its penalty window and their counts appended to `pairs`.
SampleRow device_sample_row(const SamplingParams& p, std::span<const int32_t> history,
                            int32_t n_generated, std::vector<int32_t>& pairs) {
  SampleRow r;
  r.temperature = p.temperature;
  r.top_k = p.top_k;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.repeat_penalty = p.repeat_penalty;
  r.presence_penalty = p.presence_penalty;
  r.frequency_penalty = p.frequency_penalty;
  r.seed = p.seed;
  r.counter = uint64_t(n_generated);
  r.penalty_first = int32_t(pairs.size() / 2);
  if (p.repeat_penalty != 1.f || p.presence_penalty != 0.f || p.frequency_penalty != 0.f) {
    size_t n = history.size();
    if (p.repeat_last_n > 0) n = std::min(n, size_t(p.repeat_last_n));
    std::vector<int32_t> window;
    for (int32_t id : history.subspan(history.size() - n))
      if (id >= 0) window.push_back(id);  // span layouts have holes
    std::sort(window.begin(), window.end());
    for (size_t i = 0; i < window.size();) {
      size_t j = i;
      while (j < window.size() && window[j] == window[i]) ++j;
      pairs.push_back(window[i]);
      pairs.push_back(int32_t(j - i));
      i = j;
    }
  }
  r.n_penalty = int32_t(pairs.size() / 2) - r.penalty_first;
  return r;
}

// Sequences whose distribution is wanted on the host (log-probabilities, first logits).
bool needs_host(const Sequence& s) {
  return s.req.top_logprobs >= 0 || (s.req.keep_first_logits && !s.got_first);
}

bool has_penalties(const SamplingParams& p) {
  return p.repeat_penalty != 1 || p.presence_penalty != 0 || p.frequency_penalty != 0;
}

}  // namespace

void OutputProcessor::start(Sequence& s) const {
  s.sampler = std::make_unique<Sampler>(s.req.sampling, int32_t(model_->config().n_vocab));
  s.stops = std::make_unique<StopFilter>(s.req.stop);
  if (model_->tokenizer) s.detok = std::make_unique<StreamDecoder>(*model_->tokenizer, true);
  s.result.n_prompt = s.n_prompt;
  s.arrival = Sequence::clock::now();
}

std::vector<Sequence*> OutputProcessor::update(std::span<Sequence* const> sampling,
                                               ModelRunner& runner) {
  // On a backend that samples, rows needed on the host are copied first,
  // then the backend samples every row in place (host rows use the host's choice).
  std::vector<int32_t> chosen(sampling.size(), -1);
  std::vector<std::vector<float>> host_rows(sampling.size());
  if (runner.can_sample()) {
    std::vector<SampleRow> rows(sampling.size());
    std::vector<int32_t> pairs;
    for (size_t r = 0; r < sampling.size(); ++r) {
      const Sequence& s = *sampling[r];
      if (needs_host(s)) {
        auto row = runner.logits_row(r);
        host_rows[r].assign(row.begin(), row.end());
      }
      rows[r] = device_sample_row(s.req.sampling, s.tokens, s.n_generated(), pairs);
    }
    runner.sample(rows, pairs, chosen.data());
  }
  std::vector<Sequence*> ended;
  for (size_t r = 0; r < sampling.size(); ++r) {
    Sequence& s = *sampling[r];
    int32_t id = chosen[r];
    if (id < 0 || needs_host(s))
      id = sample_on_host(
          s, host_rows[r].empty() ? runner.logits_row(r) : std::span<float>(host_rows[r]));
    if (!append(s, id)) ended.push_back(&s);
  }
  return ended;
}

int32_t OutputProcessor::sample_on_host(Sequence& s, std::span<float> row) {
  if (s.req.keep_first_logits && !s.got_first) s.result.first_logits.assign(row.begin(), row.end());
  if (s.req.top_logprobs < 0) return s.sampler->sample(row, s.tokens);
  // log-probabilities of the model's distribution, before penalties and filters
  const float lse = log_sum_exp(row);
  auto top = top_logprobs(row, lse, size_t(s.req.top_logprobs), order_);
  std::vector<float> raw;
  if (has_penalties(s.req.sampling)) raw.assign(row.begin(), row.end());  // sample() changes row
  const int32_t id = s.sampler->sample(row, s.tokens);
  const float logit = raw.empty() ? row[size_t(id)] : raw[size_t(id)];
  s.result.logprobs.push_back({id, logit - lse, std::move(top)});
  return id;
}

bool OutputProcessor::append(Sequence& s, int32_t id) {
  if (!s.got_first) {
    s.got_first = true;
    s.first_token = Sequence::clock::now();
    s.result.ttft_ms = ms_since(s.arrival);
    const double prefill_ms = ms_since(s.first_scheduled);
    s.result.prefill_tok_s = s.result.n_prefilled / std::max(1e-9, prefill_ms / 1e3);
  }
  s.tokens.push_back(id);
  s.result.tokens.push_back(id);
  // Passes text through the stop filter; false when the sequence must end.
  auto feed = [&](const std::string& delta, bool final) {
    std::string out;
    const bool stopped = s.stops->feed(delta, final, out);
    s.result.text += out;
    if (s.cb.on_text && !out.empty() && !s.cb.on_text(out)) {
      s.result.stop_reason = "cancelled";
      return false;
    }
    if (stopped) s.result.stop_reason = "stop";
    return !stopped;
  };
  if (!s.req.ignore_eos && model_->is_eog(id)) {
    if (s.detok) feed(s.detok->finish(), true);
    if (s.result.stop_reason.empty()) s.result.stop_reason = "eos";
    return false;
  }
  if (s.detok && !feed(s.detok->push(id), false)) return false;
  const bool at_max = s.n_generated() >= s.req.max_tokens;
  const bool at_ctx = int32_t(s.tokens.size()) >= n_ctx_;
  if (at_max || at_ctx) {
    if (s.detok && !feed(s.detok->finish(), true)) return false;
    s.result.stop_reason = at_max ? "length" : "context";
    return false;
  }
  return true;
}

void OutputProcessor::finish(Sequence& s, const std::string& reason) const {
  s.result.stop_reason = reason;
  if (s.got_first && s.result.tokens.size() > 1)
    s.result.decode_tok_s = double(s.result.tokens.size() - 1) / (ms_since(s.first_token) / 1e3);
  if (s.cb.on_done) s.cb.on_done(s.result);
}

}  // namespace wick
