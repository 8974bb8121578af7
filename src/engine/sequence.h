// One request as the engine tracks it: what the scheduler counts (tokens,
// blocks) and what output processing keeps (sampler, text, result).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/request.h"
#include "engine/stop_filter.h"
#include "sampling/sampler.h"
#include "text/detokenizer.h"

namespace wick {

struct Sequence {
  using clock = std::chrono::steady_clock;

  int64_t id = 0;
  GenerateRequest req;
  StreamCallbacks cb;

  // the scheduler's: counts and blocks
  std::vector<int32_t> tokens;  // prompt, then generated
  int32_t n_prompt = 0;
  int32_t n_computed = 0;  // leading tokens whose K/V is in the cache
  std::vector<int32_t> block_table;
  int32_t n_committed = 0;  // leading blocks registered in the prefix cache
  uint64_t last_hash = 0;   // chain hash of the last committed block

  // output processing's
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamDecoder> detok;  // null when the model has no tokenizer
  std::unique_ptr<StopFilter> stops;
  GenerateResult result;
  clock::time_point arrival, first_scheduled, first_token;
  bool was_scheduled = false, got_first = false;

  int32_t n_generated() const { return int32_t(result.tokens.size()); }
};

}  // namespace wick
