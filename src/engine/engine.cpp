#include "engine/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/span_layout.h"

namespace wick {

namespace {

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

// The config with n_ctx at most the model's training context and the step's
// tokens resolved.
EngineConfig clamped(EngineConfig cfg, const LoadedModel& m) {
  cfg.n_ctx = std::min<int32_t>(cfg.n_ctx, int32_t(m.config().n_ctx_train));
  cfg.max_batch_tokens = step_tokens(cfg, m.backend());
  return cfg;
}

RunnerLimits runner_limits(const EngineConfig& cfg, int32_t n_blocks) {
  RunnerLimits l;
  l.n_blocks = n_blocks;
  l.block_size = cfg.block_size;
  l.n_ctx = cfg.n_ctx;
  l.max_tokens = cfg.reserve_scratch ? cfg.max_batch_tokens : 0;
  l.max_logit_rows = cfg.max_seqs;
  if (cfg.spec.method != SpecMethod::Off || cfg.spec.draft)  // a row per draft token too
    l.max_logit_rows = std::max(
        cfg.max_seqs, std::min(cfg.max_batch_tokens, cfg.max_seqs * (1 + cfg.spec.draft_max)));
  l.pre_rope = cfg.span_cache;
  return l;
}

// The config checked: speculative decoding's limits, a draft of the same vocabulary.
const EngineConfig& checked(const EngineConfig& cfg, const LoadedModel& m) {
  if (auto err = cfg.spec.validate(); !err.empty()) throw std::runtime_error(err);
  if (!(cfg.span_blend >= 0.f && cfg.span_blend <= 1.f))
    throw std::runtime_error(fmt::format("span_blend must be in [0, 1] (got {})", cfg.span_blend));
  if (cfg.spec.draft) check_same_vocab(m, *cfg.spec.draft);
  return cfg;
}

// Positions of a span layout: text as it comes; each span starts a block
// and the text after it starts the next, the slots between left empty
// (kHole). The spans' positions and each block's valid slots are recorded.
void lay_out_spans(const GenerateRequest& req, int32_t bs, Sequence& s) {
  std::vector<int32_t>& t = s.tokens;
  t.clear();
  auto pad = [&] {
    while (t.size() % size_t(bs)) t.push_back(kHole);
  };
  int32_t at = 0;
  for (const auto& [b, e] : req.spans) {
    t.insert(t.end(), req.prompt.begin() + at, req.prompt.begin() + b);
    pad();
    Sequence::Span sp;
    sp.pos = int32_t(t.size());
    sp.tokens.assign(req.prompt.begin() + b, req.prompt.begin() + e);
    s.spans.push_back(std::move(sp));
    t.insert(t.end(), req.prompt.begin() + b, req.prompt.begin() + e);
    pad();
    at = e;
  }
  t.insert(t.end(), req.prompt.begin() + at, req.prompt.end());
  s.commit_limit = s.spans.front().pos;
  s.fills = block_fills(t, bs);
}

}  // namespace

int32_t step_tokens(const EngineConfig& cfg, const Backend& be) {
  return cfg.max_batch_tokens > 0 ? cfg.max_batch_tokens : be.default_step_tokens();
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

Engine::Engine(std::shared_ptr<const LoadedModel> model, const EngineConfig& cfg)
    : model_(std::move(model)),
      cfg_(clamped(checked(cfg, *model_), *model_)),
      scheduler_(blocks_for(*model_, cfg_), cfg_.block_size, model_identity(*model_),
                 cfg_.prefix_cache, {cfg_.max_batch_tokens, cfg_.max_seqs}),
      runner_(model_, runner_limits(cfg_, scheduler_.blocks().n_blocks())),
      ngram_(cfg_.spec.ngram_min, cfg_.spec.ngram_max),
      output_(model_, cfg_.n_ctx) {
  if (cfg_.kv_events) scheduler_.set_kv_event_log(&kv_events_);
  if (cfg_.spec.draft)
    draft_ = std::make_unique<DraftModelProposer>(cfg_.spec.draft, scheduler_.blocks().n_blocks(),
                                                  cfg_.block_size, cfg_.max_batch_tokens,
                                                  cfg_.spec.draft_p_min);
}

Engine::~Engine() = default;

void Engine::check_adapter(int32_t adapter) const {
  const auto& names = model_->model->adapter_names;
  if (adapter < 0 || adapter > int32_t(names.size()))
    throw GenerateError(
        fmt::format("adapter {}: the model has {} named LoRA adapter(s)", adapter, names.size()));
  if (adapter > 0 && names[size_t(adapter - 1)].empty())
    throw GenerateError(fmt::format("LoRA adapter {} was unloaded", adapter));
}

bool Engine::uses_adapter(int32_t adapter) const {
  return scheduler_.uses_adapter(adapter);
}

int64_t Engine::add_request(const GenerateRequest& req, StreamCallbacks cb) {
  validate_request(req, int32_t(model_->config().n_vocab));
  if (req.spec == SpecMethod::Draft && !draft_)
    throw GenerateError("speculative decoding with a draft model: this engine has none (--draft)");
  check_adapter(req.adapter);
  if (!req.spans.empty() && !cfg_.span_cache)
    throw GenerateError("spans need the engine's span cache (span_cache, --span-cache)");
  const std::vector<int32_t> prompt = fit_prompt(req, cfg_.n_ctx);
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->req = req;
  s->cb = std::move(cb);
  s->tokens = prompt;
  if (!req.spans.empty()) {
    lay_out_spans(req, cfg_.block_size, *s);
    s->span_recompute = req.span_recompute >= 0 ? req.span_recompute : cfg_.span_recompute;
    s->span_blend = req.span_blend >= 0.f ? req.span_blend : cfg_.span_blend;
    const int32_t n_ctx = req.span_context >= 0 ? req.span_context
                          : cfg_.span_context   ? req.spans.front().first
                                                : 0;
    s->span_ctx.assign(req.prompt.begin(), req.prompt.begin() + n_ctx);
    if (int32_t(s->tokens.size()) >= cfg_.n_ctx)
      throw GenerateError(fmt::format(
          "the prompt's span layout takes {} positions (spans start blocks of {}) but the "
          "context holds {}",
          s->tokens.size(), cfg_.block_size, cfg_.n_ctx));
  }
  const int32_t need = int32_t(s->tokens.size()) / cfg_.block_size + 1;
  if (need > scheduler_.blocks().n_blocks())
    throw GenerateError(fmt::format("the prompt needs {} KV blocks but the cache has {}", need,
                                    scheduler_.blocks().n_blocks()));
  s->n_prompt = int32_t(s->tokens.size());
  output_.start(*s);
  s->result.n_prompt = int32_t(prompt.size());  // tokens, not positions
  if (req.prompt_logprobs >= 0) s->result.prompt_logprobs.resize(prompt.size());
  const int64_t id = s->id;
  if (req.max_tokens == 0)
    finish(*s, "length");
  else
    scheduler_.add(std::move(s));
  return id;
}

void Engine::cancel(int64_t id) {
  if (auto s = scheduler_.remove(id)) finish(*s, "cancelled");
}

void Engine::finish(Sequence& s, const std::string& reason) {
  if (draft_) draft_->forget(s.id);
  output_.finish(s, reason);
}

SpecMethod Engine::method_of(const Sequence& s) const {
  return s.req.spec == SpecMethod::Default ? cfg_.spec.method : s.req.spec;
}

void Engine::propose_drafts() {
  struct Ask {
    std::vector<Sequence*> seqs;
    std::vector<int32_t> n_max;
  } ngram, draft;
  const int32_t n_min = std::max(1, cfg_.spec.draft_min);
  for (Sequence* s : scheduler_.running()) {
    const SpecMethod m = method_of(*s);
    if (m != SpecMethod::Ngram && m != SpecMethod::Draft) continue;
    if (s->matcher) continue;  // drafts are not checked against a grammar: none proposed
    // decoding: the last token is the only one left to compute
    if (!s->got_first || s->n_draft || s->n_computed + 1 != int32_t(s->tokens.size())) continue;
    // every token the step may give fits max_tokens and the context (the
    // last position computed stays below n_ctx - 1, as in plain decoding)
    const int32_t asked = s->req.draft_max >= 0 ? s->req.draft_max : cfg_.spec.draft_max;
    const int32_t k =
        std::min({asked, s->req.max_tokens - s->n_generated() - 1, cfg_.n_ctx - 2 - s->n_computed});
    if (k < n_min) continue;
    Ask& a = m == SpecMethod::Ngram ? ngram : draft;
    a.seqs.push_back(s);
    a.n_max.push_back(k);
  }
  auto ask = [&](Proposer& p, Ask& a) {
    if (a.seqs.empty()) return;
    std::vector<Proposal> out(a.seqs.size());
    try {
      p.propose(a.seqs, a.n_max, out);
    } catch (const std::exception& ex) {  // the proposer's fault: end what it was asked for
      for (Sequence* s : a.seqs)
        if (auto done = scheduler_.remove(s->id)) fail(std::move(done), ex.what());
      return;
    }
    for (size_t i = 0; i < a.seqs.size(); ++i) {
      Sequence& s = *a.seqs[i];
      if (int32_t(out[i].tokens.size()) < n_min) continue;
      s.tokens.insert(s.tokens.end(), out[i].tokens.begin(), out[i].tokens.end());
      s.n_draft = int32_t(out[i].tokens.size());
      s.draft_q = std::move(out[i].q);
    }
  };
  ask(ngram_, ngram);
  if (draft_) ask(*draft_, draft);
}

bool Engine::step() {
  if (!scheduler_.has_work()) return false;
  ++n_steps_;
  propose_drafts();
  SchedulerOutput plan = scheduler_.schedule();
  if (plan.rejected) {
    finish(*plan.rejected, "error: the KV cache is too small for this request");
    return true;
  }
  if (plan.seqs.empty()) return scheduler_.has_work();
  try {
    if (cfg_.before_execute) cfg_.before_execute(plan.seqs);
    runner_.copy_blocks(plan.copies);
    runner_.run(plan.seqs);
    scheduler_.update(plan, runner_.deviations());
    const std::vector<Sequence*> ended = output_.update(plan.seqs, runner_);
    for (const auto& w : plan.seqs)
      if (w.n_draft) scheduler_.settle_drafts(*w.seq);  // the accepted drafts' K/V stays
    for (Sequence* s : ended) {
      auto done = scheduler_.remove(s->id);  // frees its blocks before on_done
      finish(*done, done->result.stop_reason);
    }
  } catch (const std::exception& ex) {
    // Retrying would fail the same way: end this step's requests (a span
    // job's: its parent's), keep the rest.
    std::vector<int64_t> ids;
    for (const auto& w : plan.seqs) ids.push_back(w.seq->parent ? w.seq->parent->id : w.seq->id);
    for (int64_t id : ids)
      if (auto s = scheduler_.remove(id)) fail(std::move(s), ex.what());
  }
  return true;
}

void Engine::fail(std::unique_ptr<Sequence> s, const std::string& reason) {
  s->result.internal_error = true;
  finish(*s, "error: " + reason);
}

void Engine::abort_all(const std::string& reason) {
  while (auto s = scheduler_.remove_any()) fail(std::move(s), reason);
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

}  // namespace wick
