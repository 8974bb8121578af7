#include "engine/session.h"

#include <algorithm>

namespace wick {

namespace {

// One sequence of up to n_ctx tokens: blocks for exactly that (and, with the
// span cache, for the private copies of a span's repaired blocks while they
// are copied), a step as long as the whole prompt (req.prefill_chunk sets the
// chunks), buffers grown as needed.
EngineConfig session_config(const LoadedModel& m, int32_t n_ctx, bool span_cache,
                            int32_t span_recompute, SpecConfig spec, float span_blend) {
  EngineConfig c;
  c.n_ctx = std::max<int32_t>(1, std::min<int32_t>(n_ctx, int32_t(m.config().n_ctx_train)));
  c.n_blocks = (c.n_ctx + c.block_size - 1) / c.block_size;
  c.span_cache = span_cache;
  c.span_recompute = span_recompute;
  c.span_blend = span_blend;
  // blended tokens may lie in any of a span's blocks: room to copy them all
  const int32_t n_copied = span_blend > 0.f ? c.n_ctx : std::min(span_recompute, c.n_ctx);
  if (span_cache) c.n_blocks += (n_copied + c.block_size - 1) / c.block_size;
  c.max_seqs = 1;
  c.max_batch_tokens = c.n_ctx;
  c.reserve_scratch = false;
  c.prefix_cache = true;  // the conversation's blocks wait there for the next turn
  c.spec = std::move(spec);
  return c;
}

}  // namespace

Session::Session(std::shared_ptr<const LoadedModel> model, int32_t n_ctx, bool span_cache,
                 int32_t span_recompute, SpecConfig spec, float span_blend)
    : model_(std::move(model)),
      engine_(std::make_unique<Engine>(
          model_, session_config(*model_, n_ctx, span_cache, span_recompute, std::move(spec),
                                 span_blend))) {}

Session::~Session() = default;

GenerateResult Session::generate(const GenerateRequest& req,
                                 const std::function<bool(std::string_view)>& on_text) {
  GenerateResult res;
  bool done = false;
  const int64_t id = engine_->add_request(req, {on_text, [&](const GenerateResult& r) {
                                                  res = r;
                                                  done = true;
                                                }});
  try {
    engine_->run_until_idle();
  } catch (...) {
    engine_->cancel(id);  // frees its blocks; the session stays usable
    computed_.clear();
    throw;
  }
  if (!done) throw std::logic_error("Session: the engine went idle before the request ended");
  if (res.stop_reason.rfind("error", 0) == 0) throw GenerateError(res.stop_reason);
  if (!res.tokens.empty()) {
    // every token but the last generated one went through the model
    computed_ = fit_prompt(req, n_ctx());
    if (!req.spans.empty()) {  // only the text before the first span is kept in order
      computed_.resize(size_t(req.spans.front().first));
    } else {
      computed_.insert(computed_.end(), res.tokens.begin(), res.tokens.end() - 1);
    }
  }
  return res;
}

std::vector<int32_t> Session::cached_tokens() const {
  const size_t bs = size_t(engine_->config().block_size);
  return {computed_.begin(), computed_.begin() + long(computed_.size() / bs * bs)};
}

}  // namespace wick
