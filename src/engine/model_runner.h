// Runs flat batches through one model on its backend: owns the KV store,
// the activation scratch and the logits, so that the engine and sessions
// schedule and sample without touching tensors.
#pragma once

#include <memory>
#include <span>

#include "engine/model_pool.h"

namespace wick {

class ModelRunner {
 public:
  // A KV store of n_blocks blocks of block_size tokens on the model's backend.
  ModelRunner(std::shared_ptr<const LoadedModel> model, int64_t n_blocks, int64_t block_size);
  ~ModelRunner();

  // Runs `b` (its K/V into the store); returns the logits of its logit rows
  // on the host, [n_logits, n_vocab], valid until the next call.
  std::span<float> execute(Batch& b);

  int64_t n_blocks() const { return kv_->n_blocks(); }
  int64_t block_size() const { return kv_->block_size; }

 private:
  std::shared_ptr<const LoadedModel> model_;
  std::unique_ptr<KvStore> kv_;
  ForwardScratch scratch_;
  Buffer logits_dev_;               // backend memory (unused on the CPU)
  std::vector<float> logits_host_;  // [n_logits, n_vocab]
};

}  // namespace wick
