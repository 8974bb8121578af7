// One request as the engine tracks it: what the scheduler counts (tokens,
// blocks) and what output processing keeps (sampler, text, result).
#pragma once

#include <chrono>
#include <climits>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine/request.h"
#include "engine/stop_filter.h"
#include "sampling/sampler.h"
#include "text/detokenizer.h"

namespace wick {

namespace grammar {
class Matcher;  // grammar/matcher.h, for output processing alone
}

constexpr int32_t kHole = -1;  // a position with no token

// A distribution over a few ids: (id, probability), the rest 0.
using SparseDist = std::vector<std::pair<int32_t, float>>;

struct Sequence {
  using clock = std::chrono::steady_clock;

  int64_t id = 0;
  GenerateRequest req;
  StreamCallbacks cb;

  // the scheduler's: counts and blocks
  std::vector<int32_t> tokens;  // by position: prompt, then generated; kHole where a span layout
                                // leaves a slot empty (before a span, after its end)
  int32_t n_prompt = 0;
  int32_t n_computed = 0;  // leading tokens whose K/V is in the cache
  std::vector<int32_t> block_table;
  int32_t n_committed = 0;  // leading blocks registered in the prefix cache
  uint64_t last_hash = 0;   // chain hash of the last committed block

  // span layouts (the engine's span cache): each span starts a block; its
  // blocks come from the span cache, or from a span job computing it alone
  struct Span {
    int32_t pos = 0;              // first position; a multiple of the block size
    std::vector<int32_t> tokens;  // the span's tokens
    // its blocks once known (referenced, so they stay while the sequence
    // waits to reach the span): found in the span cache, or a job's
    std::vector<int32_t> ready;
    bool hit = false;  // ready came from the span cache
    bool job_running = false;
  };
  std::vector<Span> spans;           // in position order
  size_t next_span = 0;              // the first span not placed in the block table yet
  int32_t commit_limit = INT32_MAX;  // blocks past this position stay out of the prefix cache
  int32_t span_recompute = 0;        // tokens recomputed at the start of each placed span
  float span_blend = 0.f;  // and this fraction of each span's tokens, those whose K/V deviates most
  // the prompt's first req.span_context tokens: each span is computed after
  // them (and cached under them); empty: alone
  std::vector<int32_t> span_ctx;
  // The span being placed: its blocks are in the block table and n_computed
  // stays at its first position until its tokens are settled. The cached
  // K/V stands but for `redo`, positions computed again (as rows at their
  // positions, attention over everything before them) into private copies
  // of their blocks. With span_blend they are chosen once every token's
  // deviation is measured (the measure pass: ForwardOptions::kv_deviation).
  struct Placing {
    int32_t pos = -1, end = -1;    // the span's first position and its last block's end; -1: none
    int32_t n_tokens = 0;          // the span's tokens, from pos on
    bool hit = false;              // its blocks came from the span cache
    bool exact = false;            // its cached K/V is a full prefill's: nothing to repair
    std::vector<int32_t> measure;  // positions still to measure, in order
    std::vector<float> deviation;  // per span token: its layer-1 K/V's distance from the cache's
    std::vector<int32_t> redo;     // positions still to compute again, in order
    bool chosen = false, copied = false;  // redo is final; its blocks are private copies
  } placing;
  std::vector<std::pair<int32_t, int32_t>> fills;  // per block: valid slots (empty: all full)
  // KV blocks to copy (shared span block, private copy) before this sequence
  // next runs; the shared ones stay referenced until then
  std::vector<std::pair<int32_t, int32_t>> pending_copies;
  // span jobs: the sequence and span they compute for
  Sequence* parent = nullptr;
  size_t parent_span = 0;

  // speculative decoding: this step's draft tokens stand at the end of
  // `tokens` until verified (the scheduler counts them, then drops them if
  // they do not fit); verification replaces them with what the target
  // accepts, and the scheduler keeps the K/V of those alone
  int32_t n_draft = 0;
  // the distribution each draft token was drawn from, when a draft model
  // sampled it (else empty: accepted only when the target draws the same)
  std::vector<SparseDist> draft_q;
  int32_t n_accepted = 0;  // draft tokens the last verification accepted

  // output processing's
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamDecoder> detok;  // null when the model has no tokenizer
  std::unique_ptr<StopFilter> stops;
  // with req.grammar: where the output is in it (shared_ptr: the type stays incomplete here)
  std::shared_ptr<grammar::Matcher> matcher;
  GenerateResult result;
  clock::time_point arrival, first_scheduled, first_token;
  bool was_scheduled = false, got_first = false;

  int32_t n_generated() const { return int32_t(result.tokens.size()); }
  // The row at pos gives logits for the prompt's log-probabilities: a prompt
  // position before the last (whose logits sample), not an empty slot.
  bool gives_prompt_logprobs(int32_t pos) const {
    return req.prompt_logprobs >= 0 && pos < n_prompt - 1 && tokens[size_t(pos)] != kHole;
  }
  bool is_span_job() const { return parent != nullptr; }
};

}  // namespace wick
