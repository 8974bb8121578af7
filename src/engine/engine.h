// Continuous batching over a paged KV cache. Each step the scheduler packs
// the decodes of running sequences and chunks of prefills under a token
// budget and a sequence cap (first come, first served), reusing cached
// prefix blocks; when blocks run out it preempts the newest sequence, which
// is recomputed later. The scheduler works on counts: a sequence has
// num_computed of its tokens in the cache and catches up; prefill, chunked
// prefill, prefix hits and decode are the same step.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_pool.h"
#include "engine/model_runner.h"
#include "engine/session.h"
#include "kv/block_pool.h"
#include "sampling/sampler.h"
#include "text/detokenizer.h"

namespace wick {

struct EngineConfig {
  int32_t block_size = 16;
  size_t kv_bytes = 0;   // KV memory budget; 0: 512 MiB on the CPU, the GPU's free budget on a GPU
  int32_t n_blocks = 0;  // if > 0, overrides kv_bytes
  int32_t max_batch_tokens = 512;  // tokens per step (decodes + prefill chunks)
  int32_t max_seqs = 64;           // running sequences at once
  int32_t n_ctx = 4096;            // longest sequence (prompt + generated)
  bool prefix_cache = true;        // WICK_PREFIX_CACHE=0 turns it off
  static EngineConfig from_env();  // defaults with WICK_PREFIX_CACHE applied
};

struct StreamCallbacks {
  std::function<bool(std::string_view)> on_text;       // false cancels
  std::function<void(const GenerateResult&)> on_done;  // always called once
};

class Engine {
 public:
  Engine(std::shared_ptr<const LoadedModel> model, const EngineConfig& cfg);
  ~Engine();

  // Queues a request; throws GenerateError for a bad one (nothing is queued).
  int64_t add_request(const GenerateRequest& req, StreamCallbacks cb);
  void cancel(int64_t id);  // frees its blocks at once; on_done gets "cancelled"
  bool step();              // one scheduler step; false when there is nothing to do
  void run_until_idle();

  // counters
  int32_t n_running() const { return int32_t(running_.size()); }
  int32_t n_waiting() const { return int32_t(waiting_.size()); }
  const BlockPool& blocks() const { return pool_; }
  uint64_t n_preemptions() const { return n_preemptions_; }
  uint64_t n_steps() const { return n_steps_; }
  const EngineConfig& config() const { return cfg_; }

 private:
  struct Sequence;
  bool ensure_blocks(Sequence& s, int32_t n_tokens);
  int32_t catch_up(const Sequence& s) const;
  void admit(Sequence& s);
  void preempt(Sequence& s);
  void free_blocks(Sequence& s);
  void finish(Sequence& s, const std::string& reason);
  void commit_full_blocks(Sequence& s);
  bool on_token(Sequence& s, int32_t id);  // false when the sequence ends

  std::shared_ptr<const LoadedModel> model_;
  EngineConfig cfg_;
  BlockPool pool_;
  ModelRunner runner_;
  Batch batch_;
  std::vector<int32_t> order_;  // scratch for top log-probabilities
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  int64_t next_id_ = 1;
  uint64_t n_preemptions_ = 0, n_steps_ = 0;
};

}  // namespace wick
