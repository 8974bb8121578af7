// Continuous batching over a paged KV cache, in the shape of vLLM v1's
// EngineCore: each step the Scheduler picks what to compute (on counts and
// blocks), the ModelRunner runs it as one flat batch, and the
// OutputProcessor turns the logits into tokens, text and finished results.
// Every generation (the server's, and the CLI's through Session) goes
// through this one path.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/draft_proposer.h"
#include "engine/model_pool.h"
#include "engine/model_runner.h"
#include "engine/ngram_proposer.h"
#include "engine/output_processor.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "kv/block_pool.h"

namespace wick {

struct EngineConfig {
  int32_t block_size = 16;
  size_t kv_bytes = 0;   // KV memory budget; 0: 512 MiB on the CPU, the GPU's free budget on a GPU
  int32_t n_blocks = 0;  // if > 0, overrides kv_bytes
  // tokens per step (decodes + prefill chunks); 0: the backend's default
  // (512 on the CPU, 2,048 on a GPU: step_tokens below)
  int32_t max_batch_tokens = 0;
  int32_t max_seqs = 64;     // running sequences at once
  int32_t n_ctx = 4096;      // longest sequence (prompt + generated)
  bool prefix_cache = true;  // WICK_PREFIX_CACHE=0 turns it off
  // Activation buffers sized for max_batch_tokens up front (a server: no
  // allocation under load); false grows them as steps need (a session).
  bool reserve_scratch = true;
  // Called before each step's forward pass with what it computes; for tests
  // (an exception thrown here fails the step like a failing kernel would).
  std::function<void(std::span<const ScheduledSeq>)> before_execute;
  // The span cache: keys kept before RoPE, so that a request's independent
  // spans (GenerateRequest::spans) are computed once and reused anywhere.
  bool span_cache = false;
  // Span repair (defaults from docs/perf.md's 50-query measurement): no fixed
  // prefix, and the 15 % of each span's tokens whose K/V deviates most
  int32_t span_recompute = 16;  // tokens computed again at the start of each span
  float span_blend = 0.f;       // and this fraction of each span, where K/V deviates most (0: off)
  // Spans are computed after all the text before the first span (e.g. the
  // system prompt), for requests that leave GenerateRequest::span_context at -1.
  bool span_context = false;
  // Speculative decoding: the method for requests that leave it to the
  // engine, the draft model (its KV cache gets as many blocks as the
  // target's), the proposers' limits.
  SpecConfig spec;
  // Record the prefix cache's stored / removed blocks for take_kv_events
  // (wick serve --kv-events publishes them).
  bool kv_events = false;
  static EngineConfig from_env();  // defaults with WICK_PREFIX_CACHE applied
};

// The tokens a step an engine of this config runs on this backend:
// cfg.max_batch_tokens, or when 0 the backend's default.
int32_t step_tokens(const EngineConfig& cfg, const Backend& be);

// How embeddings pool a sequence's final hidden states (after the final norm).
enum class Pooling { Mean, Last };
const char* pooling_name(Pooling p);  // "mean", "last"
std::optional<Pooling> pooling_from_name(std::string_view name);

// One input's embedding: L2-normalised, n_embd values.
struct Embedding {
  std::vector<float> values;
  int32_t n_tokens = 0;
};

class Engine {
 public:
  Engine(std::shared_ptr<const LoadedModel> model, const EngineConfig& cfg);
  ~Engine();

  // Queues a request; throws GenerateError for a bad one (nothing is queued).
  int64_t add_request(const GenerateRequest& req, StreamCallbacks cb);
  void cancel(int64_t id);  // frees its blocks at once; on_done gets "cancelled"
  // Schedule, execute, update; false when there is nothing to do. When the
  // execution or update fails, the step's requests end with "error: ..."
  // (internal_error set) and the others go on.
  bool step();
  void run_until_idle();
  // Embeddings of token sequences, run now (between steps) through the
  // runner's hidden-state output: the inputs go as one flat batch per
  // max_batch_tokens (an input longer goes alone) on KV blocks borrowed from
  // the free ones and given back. Each row depends on its own input only, so
  // an input gives the same vector alone and in a batch (on the CPU, bit for
  // bit). Throws GenerateError for an empty input, one longer than n_ctx or
  // an id outside the vocabulary; std::runtime_error when the free blocks
  // cannot hold an input (the cache is full of running requests). `adapter`:
  // a named LoRA adapter, as GenerateRequest's.
  std::vector<Embedding> embed(const std::vector<std::vector<int32_t>>& inputs, Pooling pooling,
                               int32_t adapter = 0);
  // Whether a request waiting or running asks for named adapter `adapter`.
  bool uses_adapter(int32_t adapter) const;
  // Ends every request with "error: reason" (internal_error set), frees their blocks.
  void abort_all(const std::string& reason);

  // counters
  int32_t n_running() const { return scheduler_.n_running(); }
  int32_t n_waiting() const { return scheduler_.n_waiting(); }
  const BlockPool& blocks() const { return scheduler_.blocks(); }
  const KvStore& kv() const { return runner_.kv(); }  // the blocks' K/V (on the CPU: readable)
  // The KV-cache events since the last call (config().kv_events), oldest first.
  std::vector<BlockPool::Event> take_kv_events() { return std::exchange(kv_events_, {}); }
  // Empties the prefix cache (an idle engine about to be freed).
  void drop_cached_blocks() { scheduler_.drop_cached_blocks(); }
  uint64_t n_preemptions() const { return scheduler_.n_preemptions(); }
  uint64_t n_steps() const { return n_steps_; }
  const EngineConfig& config() const { return cfg_; }
  // the draft model's KV blocks (null without a draft model)
  const BlockPool* draft_blocks() const { return draft_ ? &draft_->blocks() : nullptr; }

 private:
  void check_adapter(int32_t adapter) const;  // GenerateError unless 0 or one of the model's
  std::shared_ptr<const LoadedModel> model_;
  EngineConfig cfg_;
  Scheduler scheduler_;
  std::vector<BlockPool::Event> kv_events_;
  ModelRunner runner_;
  NgramProposer ngram_;
  std::unique_ptr<DraftModelProposer> draft_;  // with a draft model
  void fail(std::unique_ptr<Sequence> s, const std::string& reason);
  // Ends a sequence taken out of the scheduler: its draft state goes, on_done runs.
  void finish(Sequence& s, const std::string& reason);
  // Asks the proposers for draft tokens of the decoding sequences that
  // speculate; they go after each one's last token (Sequence::n_draft).
  void propose_drafts();
  SpecMethod method_of(const Sequence& s) const;

  OutputProcessor output_;
  int64_t next_id_ = 1;
  uint64_t n_steps_ = 0;
};

}  // namespace wick
