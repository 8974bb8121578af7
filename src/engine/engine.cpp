#include "engine/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <numeric>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace wick {

namespace {
using clk = std::chrono::steady_clock;
double ms_since(clk::time_point t) {
  return std::chrono::duration<double, std::milli>(clk::now() - t).count();
}

uint64_t model_identity(const LoadedModel& m) {
  // the file and its size: blocks of different models never match
  std::string key =
      m.path + "#" + std::to_string(m.n_bytes) + "#" + std::to_string(m.model->n_params);
  return XXH3_64bits(key.data(), key.size());
}

// Blocks that fit the KV budget: kv_bytes, or when 0, 512 MiB on the CPU and
// 90% of what the GPU budget leaves after the weights.
int32_t blocks_for(const LoadedModel& m, const EngineConfig& cfg) {
  if (cfg.n_blocks > 0) return cfg.n_blocks;
  const ModelConfig& c = m.config();
  const Backend& be = m.backend();
  const size_t per_block =
      size_t(c.n_layer) * 2 * size_t(cfg.block_size) * row_bytes(be.kv_dtype(), c.kv_dim());
  size_t bytes = cfg.kv_bytes;
  if (bytes == 0) bytes = be.kv_budget() > 0 ? be.kv_budget() / 10 * 9 : size_t(512) << 20;
  return int32_t(std::min<size_t>(std::max<size_t>(1, bytes / per_block), 1 << 24));
}

RunnerLimits runner_limits(const LoadedModel& m, const EngineConfig& cfg, int32_t n_blocks) {
  RunnerLimits l;
  l.n_blocks = n_blocks;
  l.block_size = cfg.block_size;
  l.n_ctx = std::min<int32_t>(cfg.n_ctx, int32_t(m.config().n_ctx_train));
  l.max_tokens = cfg.max_batch_tokens;
  l.max_logit_rows = cfg.max_seqs;
  return l;
}
}  // namespace

// The backend's sampling parameters for one sequence, with the distinct
// tokens of its penalty window and their counts appended to `pairs`.
static SampleRow device_sample_row(const SamplingParams& p, std::span<const int32_t> history,
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
    std::vector<int32_t> window(history.end() - long(n), history.end());
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

EngineConfig EngineConfig::from_env() {
  EngineConfig c;
  if (const char* v = std::getenv("WICK_PREFIX_CACHE"); v && *v) {
    const std::string s = v;
    if (s == "0" || s == "false" || s == "off")
      c.prefix_cache = false;
    else if (s == "1" || s == "true" || s == "on")
      c.prefix_cache = true;
    else
      throw std::runtime_error("WICK_PREFIX_CACHE=" + s + ": expected 0 or 1");
  }
  return c;
}

struct Engine::Sequence {
  int64_t id = 0;
  GenerateRequest req;
  StreamCallbacks cb;
  std::vector<int32_t> tokens;  // prompt, then generated
  int32_t n_prompt = 0;
  int32_t num_computed = 0;
  std::vector<int32_t> block_table;
  int32_t n_committed = 0;  // leading blocks registered in the prefix cache
  uint64_t last_hash = 0;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamDecoder> detok;
  std::unique_ptr<StopFilter> stops;
  GenerateResult result;
  clk::time_point arrival, first_token;
  bool got_first = false;
};

Engine::Engine(std::shared_ptr<const LoadedModel> model, const EngineConfig& cfg)
    : model_(std::move(model)),
      cfg_(cfg),
      pool_(blocks_for(*model_, cfg), cfg.block_size, model_identity(*model_), cfg.prefix_cache),
      runner_(model_, runner_limits(*model_, cfg, pool_.n_blocks())) {
  cfg_.n_ctx = std::min<int32_t>(cfg_.n_ctx, int32_t(model_->model->config.n_ctx_train));
}

Engine::~Engine() = default;

int64_t Engine::add_request(const GenerateRequest& req, StreamCallbacks cb) {
  validate_request(req, int32_t(model_->model->config.n_vocab));
  const std::vector<int32_t> prompt = fit_prompt(req, cfg_.n_ctx);
  const int32_t need = int32_t(prompt.size()) / cfg_.block_size + 1;
  if (need > pool_.n_blocks())
    throw GenerateError(
        fmt::format("the prompt needs {} KV blocks but the cache has {}", need, pool_.n_blocks()));
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->req = req;
  s->cb = std::move(cb);
  s->tokens = prompt;
  s->n_prompt = int32_t(prompt.size());
  s->sampler = std::make_unique<Sampler>(req.sampling, int32_t(model_->model->config.n_vocab));
  s->stops = std::make_unique<StopFilter>(s->req.stop);
  if (model_->tokenizer) s->detok = std::make_unique<StreamDecoder>(*model_->tokenizer, true);
  s->result.n_prompt = s->n_prompt;
  s->arrival = clk::now();
  const int64_t id = s->id;
  if (req.max_tokens == 0) {
    finish(*s, "length");
    return id;
  }
  waiting_.push_back(std::move(s));
  return id;
}

void Engine::free_blocks(Sequence& s) {
  for (int32_t b : s.block_table) pool_.release(b);
  s.block_table.clear();
  s.num_computed = 0;
  s.n_committed = 0;
  s.last_hash = 0;
}

void Engine::finish(Sequence& s, const std::string& reason) {
  free_blocks(s);
  s.result.stop_reason = reason;
  if (s.cb.on_done) s.cb.on_done(s.result);
}

void Engine::cancel(int64_t id) {
  auto take = [id](auto& seqs) -> std::unique_ptr<Sequence> {
    auto it = std::find_if(seqs.begin(), seqs.end(), [id](const auto& s) { return s->id == id; });
    if (it == seqs.end()) return nullptr;
    auto s = std::move(*it);
    seqs.erase(it);
    return s;
  };
  auto s = take(waiting_);
  if (!s) s = take(running_);
  if (s) finish(*s, "cancelled");
}

// Takes the longest verified cached prefix; at least one token is left to
// compute (its logits start the generation).
void Engine::admit(Sequence& s) {
  std::vector<int32_t> hit = pool_.match_prefix(s.tokens);
  if (!hit.empty() && int32_t(hit.size()) * cfg_.block_size >= int32_t(s.tokens.size())) {
    pool_.release(hit.back());
    hit.pop_back();
  }
  s.block_table = hit;
  s.num_computed = int32_t(hit.size()) * cfg_.block_size;
  s.n_committed = int32_t(hit.size());
  s.last_hash = 0;
  for (int32_t k = 0; k < s.n_committed; ++k)
    s.last_hash =
        pool_.chain_hash(s.last_hash, std::span<const int32_t>(s.tokens).subspan(
                                          size_t(k * cfg_.block_size), size_t(cfg_.block_size)));
  if (s.result.n_reused == 0) s.result.n_reused = s.num_computed;
}

void Engine::preempt(Sequence& s) {
  free_blocks(s);  // recomputed from the prompt (and what it generated) when readmitted
  ++n_preemptions_;
}

// Tokens a sequence computes this step: all it lacks, in prefill chunks of
// at most req.prefill_chunk (0 = no limit) while it is still in its prompt.
int32_t Engine::catch_up(const Sequence& s) const {
  const int32_t lack = int32_t(s.tokens.size()) - s.num_computed;
  if (s.req.prefill_chunk > 0 && s.num_computed < s.n_prompt)
    return std::min(lack, s.req.prefill_chunk);
  return lack;
}

bool Engine::ensure_blocks(Sequence& s, int32_t n_tokens) {
  const int32_t need = (s.num_computed + n_tokens + cfg_.block_size - 1) / cfg_.block_size;
  while (int32_t(s.block_table.size()) < need) {
    const int32_t b = pool_.allocate();
    if (b < 0) return false;
    s.block_table.push_back(b);
  }
  return true;
}

void Engine::commit_full_blocks(Sequence& s) {
  const int32_t full = s.num_computed / cfg_.block_size;
  for (; s.n_committed < full; ++s.n_committed) {
    auto toks = std::span<const int32_t>(s.tokens).subspan(size_t(s.n_committed * cfg_.block_size),
                                                           size_t(cfg_.block_size));
    s.last_hash = pool_.commit(s.block_table[size_t(s.n_committed)], s.last_hash, toks);
  }
}

bool Engine::on_token(Sequence& s, int32_t id) {
  if (!s.got_first) {
    s.got_first = true;
    s.first_token = clk::now();
    s.result.ttft_ms = ms_since(s.arrival);
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
  const bool at_max = int32_t(s.result.tokens.size()) >= s.req.max_tokens;
  const bool at_ctx = int32_t(s.tokens.size()) >= cfg_.n_ctx;
  if (at_max || at_ctx) {
    if (s.detok && !feed(s.detok->finish(), true)) return false;
    s.result.stop_reason = at_max ? "length" : "context";
    return false;
  }
  return true;
}

bool Engine::step() {
  if (running_.empty() && waiting_.empty()) return false;
  ++n_steps_;
  int32_t budget = cfg_.max_batch_tokens;
  struct Work {
    Sequence* s;
    int32_t n;
  };
  std::vector<Work> work;
  // Running sequences first, oldest first; preempt the newest when blocks run out.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& s = *running_[i];
    const int32_t n = std::min(catch_up(s), budget);
    if (ensure_blocks(s, n)) {
      work.push_back({&s, n});
      budget -= n;
      ++i;
      continue;
    }
    // out of blocks: preempt the newest running sequence (possibly this one)
    auto victim = std::move(running_.back());
    running_.pop_back();
    for (auto& w : work)
      if (w.s == victim.get()) throw std::logic_error("preempting a scheduled sequence");
    preempt(*victim);
    waiting_.push_front(std::move(victim));
  }
  // Then waiting sequences, first come first served.
  while (!waiting_.empty() && budget > 0 && int32_t(running_.size()) < cfg_.max_seqs) {
    Sequence& s = *waiting_.front();
    admit(s);
    const int32_t n = std::min(catch_up(s), budget);
    if (!ensure_blocks(s, n)) {
      free_blocks(s);  // not enough room yet: wait for blocks to come back
      break;
    }
    work.push_back({&s, n});
    budget -= n;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  if (work.empty()) {
    if (running_.empty() && !waiting_.empty()) {  // cannot fit even alone: fail it
      auto s = std::move(waiting_.front());
      waiting_.pop_front();
      finish(*s, "error: the KV cache is too small for this request");
      return true;
    }
    return !running_.empty() || !waiting_.empty();
  }
  // Build the flat batch.
  batch_.clear();
  batch_.block_tables.resize(work.size());
  std::vector<Sequence*> sampled;
  for (size_t k = 0; k < work.size(); ++k) {
    Sequence& s = *work[k].s;
    batch_.block_tables[k] = s.block_table;
    const bool last = s.num_computed + work[k].n == int32_t(s.tokens.size());
    for (int32_t i = 0; i < work[k].n; ++i) {
      const int32_t pos = s.num_computed + i;
      batch_.add(s.tokens[size_t(pos)], pos, int32_t(k), last && i == work[k].n - 1);
    }
    if (last) sampled.push_back(&s);
  }
  runner_.run(batch_);
  for (auto& w : work) {
    w.s->num_computed += w.n;
    if (w.s->num_computed <= w.s->n_prompt) w.s->result.n_prefilled += w.n;
    commit_full_blocks(*w.s);
  }
  // Sample, stream, and retire finished sequences. Rows that need the
  // distribution on the host (log-probabilities, first logits) are copied
  // before the backend samples the rest in place.
  const size_t V = size_t(model_->model->config.n_vocab);
  auto needs_host = [](const Sequence& s) {
    return s.req.top_logprobs >= 0 || (s.req.keep_first_logits && !s.got_first);
  };
  std::vector<int32_t> chosen(sampled.size(), -1);
  std::vector<std::vector<float>> host_rows(sampled.size());
  if (runner_.can_sample()) {
    std::vector<SampleRow> rows(sampled.size());
    std::vector<int32_t> pairs;
    for (size_t r = 0; r < sampled.size(); ++r) {
      const Sequence& s = *sampled[r];
      if (needs_host(s)) {
        auto row = runner_.logits_row(r);
        host_rows[r].assign(row.begin(), row.end());
      }
      rows[r] = device_sample_row(s.req.sampling, s.tokens, int32_t(s.result.tokens.size()), pairs);
    }
    runner_.sample(rows, pairs, chosen.data());
  }
  std::vector<int64_t> done;
  for (size_t r = 0; r < sampled.size(); ++r) {
    Sequence& s = *sampled[r];
    if (chosen[r] >= 0 && !needs_host(s)) {
      if (!on_token(s, chosen[r])) done.push_back(s.id);
      continue;
    }
    std::span<float> row =
        host_rows[r].empty() ? runner_.logits_row(r) : std::span<float>(host_rows[r]);
    if (s.req.keep_first_logits && !s.got_first)
      s.result.first_logits.assign(row.begin(), row.end());
    // log-probabilities of the model's distribution, before penalties and filters
    float lse = 0;
    std::vector<std::pair<int32_t, float>> top;
    if (s.req.top_logprobs >= 0) {
      const float mx = *std::max_element(row.begin(), row.end());
      double sum = 0;
      for (float x : row) sum += std::exp(double(x - mx));
      lse = mx + float(std::log(sum));
      const size_t k = std::min<size_t>(size_t(s.req.top_logprobs), V);
      order_.resize(V);
      std::iota(order_.begin(), order_.end(), 0);
      std::partial_sort(
          order_.begin(), order_.begin() + long(k), order_.end(), [&](int32_t a, int32_t b) {
            return row[size_t(a)] != row[size_t(b)] ? row[size_t(a)] > row[size_t(b)] : a < b;
          });
      for (size_t j = 0; j < k; ++j) top.emplace_back(order_[j], row[size_t(order_[j])] - lse);
    }
    std::vector<float> raw;
    if (s.req.top_logprobs >= 0 &&
        (s.req.sampling.repeat_penalty != 1 || s.req.sampling.presence_penalty != 0 ||
         s.req.sampling.frequency_penalty != 0))
      raw.assign(row.begin(), row.end());  // the penalties change row in place
    const int32_t id = s.sampler->sample(row, s.tokens);
    if (s.req.top_logprobs >= 0)
      s.result.logprobs.push_back(
          {id, (raw.empty() ? row[size_t(id)] : raw[size_t(id)]) - lse, std::move(top)});
    if (!on_token(s, id)) done.push_back(s.id);
  }
  for (int64_t id : done)
    for (auto it = running_.begin(); it != running_.end(); ++it)
      if ((*it)->id == id) {
        auto s = std::move(*it);
        running_.erase(it);
        if (s->got_first && s->result.tokens.size() > 1)
          s->result.decode_tok_s =
              double(s->result.tokens.size() - 1) / (ms_since(s->first_token) / 1e3);
        finish(*s, s->result.stop_reason);
        break;
      }
  return true;
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

}  // namespace wick
