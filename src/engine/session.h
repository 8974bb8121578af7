// One conversation on one model, generated through the Engine like every
// request: a single-sequence engine whose KV cache holds n_ctx tokens. Its
// prefix cache gives the multi-turn reuse: each generate() starts from the
// longest run of full blocks (block_size tokens) shared with what the
// session computed before, checked token by token. Reuse is block-granular:
// the tokens of a last, partial block are computed again. The model itself
// holds no state.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "engine/model_pool.h"
#include "engine/request.h"

namespace wick {

class Session {
 public:
  // n_ctx: tokens the session can hold (at most the model's training context);
  // span_cache: the engine's, for requests with spans, which compute the
  // first span_recompute tokens of each span again (and the span_blend
  // fraction whose K/V deviates most) unless they say otherwise; spec: speculative decoding (the
  // draft model's cache holds n_ctx tokens too).
  Session(std::shared_ptr<const LoadedModel> model, int32_t n_ctx, bool span_cache = false,
          int32_t span_recompute = 16, SpecConfig spec = {}, float span_blend = 0.f);
  ~Session();
  // on_text receives text as it forms; returning false cancels. Throws
  // GenerateError for a bad request.
  GenerateResult generate(const GenerateRequest& req,
                          const std::function<bool(std::string_view)>& on_text = {});
  // The tokens whose K/V the session keeps for the next turn: the full blocks
  // of the last conversation that the engine computed (prompt and answer,
  // all but the last generated token, which is never fed back).
  std::vector<int32_t> cached_tokens() const;
  int32_t n_ctx() const { return engine_->config().n_ctx; }
  const LoadedModel& model() const { return *model_; }
  const Engine& engine() const { return *engine_; }

 private:
  std::shared_ptr<const LoadedModel> model_;
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> computed_;  // the last conversation's tokens with K/V in the cache
};

}  // namespace wick
