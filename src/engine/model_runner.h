// Runs flat batches through one model on its backend: owns the KV store,
// the activation scratch and the logits, so that the scheduler and output
// processing work without touching tensors. On a GPU, decode steps are
// recorded as CUDA graphs (one per batch size) and replayed.
#pragma once

#include <memory>
#include <span>

#include "engine/model_pool.h"
#include "engine/scheduler.h"

namespace wick {

struct RunnerLimits {
  int64_t n_blocks = 1, block_size = 16;  // the KV store
  int32_t n_ctx = 0;           // longest sequence; > 0 fixes the block-table width (graphs)
  int32_t max_tokens = 0;      // tokens per step, to size buffers up front (0: on demand)
  int32_t max_logit_rows = 0;  // logits rows per step, likewise
  bool pre_rope = false;       // keys stored before RoPE (the span cache)
};

class ModelRunner {
 public:
  ModelRunner(std::shared_ptr<const LoadedModel> model, const RunnerLimits& lim);
  ModelRunner(std::shared_ptr<const LoadedModel> model, int64_t n_blocks, int64_t block_size)
      : ModelRunner(std::move(model), RunnerLimits{n_blocks, block_size}) {}
  ~ModelRunner();

  // Copies KV blocks (source, destination) in every layer.
  void copy_blocks(std::span<const std::pair<int32_t, int32_t>> pairs);
  // Runs `b` (its K/V into the store). The logits of its logit rows stay in
  // backend memory until asked for.
  void run(Batch& b);
  // Runs a scheduler step as one flat batch: each sequence's next n_tokens;
  // logits rows follow the sequences that sample, 1 + n_draft rows each.
  // The rows of a sequence placing a span are its chosen positions; measure
  // rows (ScheduledSeq::measures) run first, as a batch of their own in the
  // forward's measure mode, and leave their deviations in deviations().
  void run(std::span<const ScheduledSeq> seqs);
  // The last step's K/V deviations, one per measure row in plan order.
  std::span<const float> deviations() const { return deviations_; }
  // Row r of the last step's logits on the host (copied on first use).
  std::span<float> logits_row(size_t r);
  // All of them, [n_logits, n_vocab]: run() then every row.
  std::span<float> execute(Batch& b);
  // Runs `b` in the forward's hidden-state mode: the final hidden states of
  // its logit rows on the host, [n_logits, n_embd] (embeddings). The logits
  // of the last step are left as they were.
  std::span<const float> hidden_states(Batch& b);
  // One token per logits row chosen on the backend, when it can
  // (Backend::sample); rows may be sampled after logits_row() copies.
  bool can_sample() const;
  void sample(std::span<const SampleRow> rows, std::span<const int32_t> pairs, int32_t* ids);

  int64_t n_blocks() const { return kv_->n_blocks(); }
  int64_t block_size() const { return kv_->block_size; }
  const KvStore& kv() const { return *kv_; }  // for inspection (tests read cached K/V)

 private:
  float* device_logits(size_t n_rows);
  void measure(Batch& b);  // the measure rows' forward: deviations_

  std::shared_ptr<const LoadedModel> model_;
  RunnerLimits lim_;
  std::unique_ptr<KvStore> kv_;
  ForwardScratch scratch_;
  Batch batch_;                     // the scheduled step's, reused
  Batch measure_batch_;             // its measure rows
  Buffer deviation_dev_;            // their deviations in backend memory (not on the CPU)
  std::vector<float> deviations_;   // on the host
  Buffer logits_dev_;               // backend memory (unused on the CPU)
  std::vector<float> logits_host_;  // [n_logits, n_vocab]
  std::vector<uint8_t> row_on_host_;
  Buffer hidden_dev_;               // hidden_states' output in backend memory (not on the CPU)
  std::vector<float> hidden_host_;  // [n_rows, n_embd]
  size_t n_rows_ = 0;
};

}  // namespace wick
