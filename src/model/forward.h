// The forward pass shared by every supported architecture and backend.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "model/model.h"

namespace wick {

// A model's weights prepared for one backend: what forward() runs on. The
// backend owns the prepared memory (and the KV stores made from it).
struct DeviceModel {
  std::unique_ptr<Backend> backend;
  ModelWeights weights;
};
// Prepares every weight of `m` on `be` (uploads them to a GPU).
std::unique_ptr<DeviceModel> prepare_model(const Model& m, std::unique_ptr<Backend> be);

// Activation buffers in backend memory, grown on demand and reused.
struct ForwardScratch {
  Backend* be = nullptr;
  int64_t n_tok = 0, n_out = 0;                 // capacity in tokens and logit rows
  Buffer x, xn, q, k, v, attn, proj, gate, up;  // [n_tokens, ...]
  Buffer router, moe_w, moe_ids;                // [n_tokens, n_expert], [n_tokens, k] x 2
  Buffer final_rows;                            // [n_logits, n_embd]
  Buffer inv_freq;                              // [head_dim / 2]
  void reserve(Backend& be, const ModelConfig& c, int64_t n_tokens, int64_t n_logits);
};

// Runs `b` through the model on `be`: writes each token's K/V into `kv` and
// the logits of b.logit_rows into `logits` ([n_logits, n_vocab], backend
// memory). Throws ModelError for a batch the model cannot take (token id out
// of range). `w` must have been prepared on `be`.
void forward(Backend& be, const ModelConfig& c, const ModelWeights& w, Batch& b, KvStore& kv,
             ForwardScratch& s, float* logits);
inline void forward(const DeviceModel& dm, const ModelConfig& c, Batch& b, KvStore& kv,
                    ForwardScratch& s, float* logits) {
  forward(*dm.backend, c, dm.weights, b, kv, s, logits);
}

// The RoPE inverse frequencies of a config (with its scaling factors).
std::vector<float> rope_inv_freq(const ModelConfig& c);

}  // namespace wick
