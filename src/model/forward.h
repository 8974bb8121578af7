// The forward pass shared by every supported architecture.
#pragma once

#include <vector>

#include "kv/kv_cache.h"
#include "model/batch.h"
#include "model/model.h"

namespace wick {

// Activation buffers, grown on demand and reused across calls.
struct ForwardScratch {
  std::vector<float> x, xn, q, k, v, attn, proj, gate, up;  // [n_tokens, ...]
  std::vector<float> router;                                // [n_tokens, n_expert]
  std::vector<float> moe_x, moe_gate, moe_up, moe_out;      // gathered rows of one expert
  std::vector<int32_t> moe_chosen, moe_order,
      moe_rows;  // routing: [n_tokens * k], [n_expert], rows of one expert
  std::vector<float> moe_weight, moe_row_w;  // routing weights
  std::vector<float> final_rows;             // [n_logit_rows, n_embd]
  std::vector<float> inv_freq;               // [head_dim / 2]
};

// Runs `b` through the model: writes each token's K/V into `kv` and the
// logits of b.logit_rows into `logits` ([b.logit_rows.size(), n_vocab]).
// Throws ModelError for a batch the model cannot take (token id out of range).
void forward(const Model& m, const Batch& b, KvCache& kv, ForwardScratch& s, float* logits);

// The RoPE inverse frequencies of a config (with its scaling factors).
std::vector<float> rope_inv_freq(const ModelConfig& c);

}  // namespace wick
