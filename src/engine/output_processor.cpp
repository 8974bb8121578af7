#include "engine/output_processor.h"

#include <algorithm>

#include "engine/speculative.h"
#include "grammar/matcher.h"
#include "grammar/token_trie.h"
#include "sampling/logprobs.h"

namespace wick {

namespace {

double ms_since(Sequence::clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Sequence::clock::now() - t).count();
}

// Kept for the result, and passed on at once for streaming.
void add_logprob(Sequence& s, TokenLogprob lp) {
  if (s.cb.on_logprob) s.cb.on_logprob(lp);
  s.result.logprobs.push_back(std::move(lp));
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

// End-of-generation ids are masked for this sequence's next token.
bool holds_eog(const Sequence& s) {
  return s.n_generated() < s.req.min_tokens;
}

// Sequences whose distribution is wanted on the host (log-probabilities, first logits).
// Masks (a grammar's, min_tokens') and logit biases are applied on the host too.
bool needs_host(const Sequence& s) {
  return s.req.top_logprobs >= 0 || (s.req.keep_first_logits && !s.got_first) || s.matcher ||
         holds_eog(s) || !s.req.sampling.logit_bias.empty();
}

// Draft tokens drawn from a draft model's distribution, for a sampled
// request: verified by the rejection rule (else by the target's own choice).
bool rejection_sampled(const Sequence& s) {
  return !s.draft_q.empty() && s.req.sampling.temperature > 0;
}

}  // namespace

void OutputProcessor::start(Sequence& s) {
  if (s.req.grammar) {
    if (!model_->tokenizer) throw GenerateError("a grammar needs the model's tokenizer");
    if (!trie_) trie_ = grammar::TokenTrie::from_tokenizer(*model_->tokenizer);
    s.matcher = std::make_shared<grammar::Matcher>(s.req.grammar);
  }
  s.sampler = std::make_unique<Sampler>(s.req.sampling, int32_t(model_->config().n_vocab));
  s.stops = std::make_unique<StopFilter>(s.req.stop);
  if (model_->tokenizer) s.detok = std::make_unique<StreamDecoder>(*model_->tokenizer, true);
  s.result.n_prompt = s.n_prompt;
  s.arrival = Sequence::clock::now();
}

std::vector<Sequence*> OutputProcessor::update(std::span<const ScheduledSeq> plan,
                                               ModelRunner& runner) {
  // Each sampling sequence's first logits row; drafts add a row each.
  // Prompt rows come first; they are read before the backend samples (in place).
  std::vector<const ScheduledSeq*> sampling;
  std::vector<size_t> first_row;
  size_t n_rows = 0;
  for (const auto& w : plan) {
    if (w.n_prompt_rows > 0) add_prompt_logprobs(w, n_rows, runner);
    n_rows += size_t(w.n_prompt_rows);
    if (w.samples) {
      sampling.push_back(&w);
      first_row.push_back(n_rows);
      n_rows += size_t(1 + w.n_draft);
    }
  }
  // On a backend that samples, rows needed on the host are copied first,
  // then the backend samples every row in place (host rows use the host's
  // choice). A draft row is sampled as if its drafts before it were
  // accepted: that history and counter are the ones plain decoding has.
  std::vector<int32_t> chosen(n_rows, -1);
  std::vector<std::vector<float>> host_rows(n_rows);
  if (runner.can_sample()) {
    std::vector<SampleRow> rows(n_rows);
    std::vector<int32_t> pairs;
    for (size_t k = 0; k < sampling.size(); ++k) {
      const Sequence& s = *sampling[k]->seq;
      const size_t base = s.tokens.size() - size_t(s.n_draft);
      for (int32_t i = 0; i <= sampling[k]->n_draft; ++i) {
        const size_t r = first_row[k] + size_t(i);
        if (needs_host(s) || rejection_sampled(s)) {
          auto row = runner.logits_row(r);
          host_rows[r].assign(row.begin(), row.end());
        }
        rows[r] = device_sample_row(s.req.sampling,
                                    std::span<const int32_t>(s.tokens).first(base + size_t(i)),
                                    s.n_generated() + i, pairs);
      }
    }
    runner.sample(rows, pairs, chosen.data());
  }
  std::vector<Sequence*> ended;
  for (size_t k = 0; k < sampling.size(); ++k) {
    Sequence& s = *sampling[k]->seq;
    ++s.result.n_forwards;
    auto row_of = [&](size_t r) {
      return host_rows[r].empty() ? runner.logits_row(r) : std::span<float>(host_rows[r]);
    };
    auto choose = [&](size_t r) {
      const int32_t id = chosen[r];
      return id >= 0 && !needs_host(s) ? id : sample_on_host(s, row_of(r));
    };
    if (!verify(s, sampling[k]->n_draft, first_row[k], choose, row_of)) ended.push_back(&s);
  }
  return ended;
}

bool OutputProcessor::verify(Sequence& s, int32_t n_draft, size_t row0,
                             const std::function<int32_t(size_t)>& choose,
                             const std::function<std::span<float>(size_t)>& row_of) {
  const std::vector<int32_t> drafts(s.tokens.end() - n_draft, s.tokens.end());
  const bool rejection = rejection_sampled(s);
  const std::vector<SparseDist> q = std::move(s.draft_q);
  s.tokens.resize(s.tokens.size() - size_t(n_draft));
  s.n_draft = 0;
  s.draft_q.clear();
  s.n_accepted = 0;
  for (int32_t i = 0; i <= n_draft; ++i) {
    if (i < n_draft) ++s.result.n_spec_proposed;  // counted as verified: not past an end
    const size_t r = row0 + size_t(i);
    bool accepted = false;
    int32_t id;
    if (rejection && i < n_draft) {
      id = rejection_step(s, row_of(r), drafts[size_t(i)], q[size_t(i)], accepted);
    } else {  // the target's own choice; a draft token is kept when it is that
      id = choose(r);
      accepted = i < n_draft && id == drafts[size_t(i)];
    }
    if (accepted) {
      ++s.n_accepted;
      ++s.result.n_spec_accepted;
    }
    if (!append(s, id)) return false;
    if (!accepted) break;
  }
  return true;
}

int32_t OutputProcessor::rejection_step(Sequence& s, std::span<float> row, int32_t draft,
                                        const SparseDist& q, bool& accepted) {
  std::vector<float> raw;
  if (s.req.top_logprobs >= 0) raw.assign(row.begin(), row.end());  // distribution() changes row
  const auto& p = s.sampler->distribution(row, s.tokens, allowed_mask(s));
  float p_draft = 0, q_draft = 0;
  for (const auto& c : p)
    if (c.id == draft) p_draft = c.p;
  for (const auto& [id, prob] : q)
    if (id == draft) q_draft = prob;
  int32_t id = draft;
  accepted = accept_draft(p_draft, q_draft, s.sampler->uniform());
  if (!accepted) {  // from max(0, p - q), normalised
    if (q_dense_.empty()) q_dense_.assign(size_t(model_->config().n_vocab), 0.f);
    for (const auto& [qid, prob] : q) q_dense_[size_t(qid)] = prob;
    residual(p, q_dense_, ids_, weights_);
    for (const auto& e : q) q_dense_[size_t(e.first)] = 0.f;
    id = s.sampler->draw(ids_, weights_);
  }
  if (s.req.top_logprobs >= 0) add_logprob(s, logprob_of(raw, id, s.req.top_logprobs));
  return id;
}

std::span<const uint64_t> OutputProcessor::allowed_mask(Sequence& s) {
  if (!s.matcher && !holds_eog(s)) return {};
  const size_t n_words = (size_t(model_->config().n_vocab) + 63) / 64;
  if (s.matcher) {
    const auto& allowed = s.matcher->allowed(*trie_);
    mask_.assign(allowed.begin(), allowed.end());
    mask_.resize(n_words, 0);  // ids past the tokenizer's
  } else {
    mask_.assign(n_words, ~uint64_t(0));
  }
  const bool can_end = (!s.matcher || s.matcher->can_end()) && !holds_eog(s);
  for (int32_t id : model_->eog_ids) {  // only where the grammar may end, after min_tokens
    if (id < 0 || size_t(id) >= mask_.size() * 64) continue;
    const uint64_t bit = uint64_t(1) << (id & 63);
    uint64_t& word = mask_[size_t(id) >> 6];
    word = can_end ? word | bit : word & ~bit;
  }
  return mask_;
}

// -1 when a grammar allows no token at all.
int32_t OutputProcessor::sample_on_host(Sequence& s, std::span<float> row) {
  if (s.req.keep_first_logits && !s.got_first) s.result.first_logits.assign(row.begin(), row.end());
  const auto mask = allowed_mask(s);
  if (s.matcher && std::all_of(mask.begin(), mask.end(), [](uint64_t w) { return w == 0; }))
    return -1;
  if (s.req.top_logprobs < 0) return s.sampler->sample(row, s.tokens, mask);
  // log-probabilities of the model's distribution, before penalties, the
  // grammar's mask and the filters
  const float lse = log_sum_exp(row);
  auto top = top_logprobs(row, lse, size_t(s.req.top_logprobs), order_);
  // sample() changes row only through biases, penalties and masks: keep it then
  const SamplingParams& p = s.req.sampling;
  const bool changes_row = !mask.empty() || !p.logit_bias.empty() || p.repeat_penalty != 1 ||
                           p.presence_penalty != 0 || p.frequency_penalty != 0;
  if (changes_row) raw_.assign(row.begin(), row.end());
  const int32_t id = s.sampler->sample(row, s.tokens, mask);
  const float logit = changes_row ? raw_[size_t(id)] : row[size_t(id)];
  add_logprob(s, {id, logit - lse, std::move(top)});
  return id;
}

void OutputProcessor::add_prompt_logprobs(const ScheduledSeq& w, size_t row0, ModelRunner& runner) {
  Sequence& s = *w.seq;
  auto& out = s.result.prompt_logprobs;
  // the prompt token at a position is the index'th (empty slots left out)
  size_t index = 0;
  for (int32_t p = 0; p < w.from; ++p) index += s.tokens[size_t(p)] != kHole;
  size_t row = row0;
  for (int32_t pos = w.from, n = 0; n < w.n_prompt_rows; ++pos) {
    if (s.tokens[size_t(pos)] == kHole) continue;
    int32_t next = pos + 1;  // the token this row predicts
    while (s.tokens[size_t(next)] == kHole) ++next;
    const auto logits = runner.logits_row(row++);
    TokenLogprob lp = logprob_of(logits, s.tokens[size_t(next)], s.req.prompt_logprobs);
    lp.rank = rank_of(logits, lp.id);
    if (index + 1 < out.size()) out[index + 1] = std::move(lp);
    ++index;
    ++n;
  }
}

TokenLogprob OutputProcessor::logprob_of(std::span<const float> raw, int32_t id, int32_t n_top) {
  const float lse = log_sum_exp(raw);
  auto top = top_logprobs(raw, lse, size_t(n_top), order_);
  return {id, raw[size_t(id)] - lse, std::move(top)};
}

bool OutputProcessor::append(Sequence& s, int32_t id) {
  if (id < 0) {  // sample_on_host: the grammar allows nothing here
    if (s.detok) s.result.text += s.detok->finish();
    s.result.stop_reason = "error: the grammar allows no token of the vocabulary here";
    return false;
  }
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
  if (s.matcher && !s.matcher->accept_token(*trie_, id)) {  // the mask rules this out
    s.result.stop_reason = "error: a token outside the grammar was chosen";
    s.result.internal_error = true;
    return false;
  }
  if (s.detok && !feed(s.detok->push(id), false)) return false;
  if (s.matcher && s.matcher->must_end()) {  // the grammar is complete: nothing may follow
    if (s.detok && !feed(s.detok->finish(), true)) return false;
    s.result.stop_reason = "stop";
    return false;
  }
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
