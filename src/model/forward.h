// The forward pass shared by every supported architecture and backend.
#pragma once

#include <deque>
#include <list>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace wick {

// A model's weights prepared for one backend: what forward() runs on. The
// backend owns the prepared memory (and the KV stores made from it).
struct DeviceModel {
  std::unique_ptr<Backend> backend;
  ModelWeights weights;
  std::list<LoraDelta> lora;  // the adapters' terms as prepared (Weight::lora points here)
};
// Prepares every weight of `m` on `be` (uploads them to a GPU).
std::unique_ptr<DeviceModel> prepare_model(const Model& m, std::unique_ptr<Backend> be);
// A named adapter added to m after it was prepared (add_named_lora): its
// terms, prepared, join dm's weights. ModelError when the backend applies no
// LoRA. drop_adapter unlinks them and gives the backend's copies back. Both
// only while no forward pass runs on dm.
void prepare_adapter(const Model& m, DeviceModel& dm, int32_t adapter);
void drop_adapter(DeviceModel& dm, int32_t adapter);

// Activation buffers in backend memory, grown on demand and reused.
struct ForwardScratch {
  Backend* be = nullptr;
  int64_t n_tok = 0, n_out = 0;                 // capacity in tokens and logit rows
  Buffer x, xn, q, k, v, attn, proj, gate, up;  // [n_tokens, ...]
  Buffer router, moe_w, moe_ids;                // [n_tokens, n_expert], [n_tokens, k] x 2
  Buffer final_rows;                            // [n_logits, n_embd]
  Buffer inv_freq;                              // [head_dim / 2]
  std::vector<uint64_t> graph_keys_seen;        // steps run once: recorded the next time
  void reserve(Backend& be, const ModelConfig& c, int64_t n_tokens, int64_t n_logits);
};

struct ForwardOptions {
  int32_t table_width = 0;  // a fixed block-table width (see Batch::finish); 0 = the batch's
  int32_t ctx_round = 0;    // with it, max_ctx rounded up to a multiple of this (Batch::finish)
  // Non-zero: the step may be recorded as a graph under this key and replayed
  // for later steps with the same key (the caller keys on everything that
  // shapes the step: token count, buffers; table_width must be fixed).
  uint64_t graph_key = 0;
  // Output mode: false writes the logits of b.logit_rows; true writes their
  // final hidden states instead (after the final norm, [n_logits, n_embd]),
  // what embeddings pool. Never recorded as a graph.
  bool hidden_states = false;
  // Measure mode (the span cache's selective recompute): each row is a token
  // whose K/V the cache already holds at its slot. Layer 0 runs without
  // writing K/V (keys stored before RoPE: a token's layer-0 K/V depends on
  // the token alone, so the cache's are the ones it would write); layer 1's
  // K/V of each row is compared with the cache's (Backend::kv_deviation) and
  // `logits` receives those deviations, [n_tokens]. Needs kv.pre_rope; a
  // one-layer model gives zeros. Never recorded as a graph.
  bool kv_deviation = false;
};

// Runs `b` through the model on `be`: writes each token's K/V into `kv` and
// the logits of b.logit_rows into `logits` ([n_logits, n_vocab], backend
// memory; with opt.hidden_states the final hidden states, [n_logits, n_embd]). Throws ModelError
// for a batch the model cannot take (token id out of range). `w` must have been prepared on `be`.
void forward(Backend& be, const ModelConfig& c, const ModelWeights& w, Batch& b, KvStore& kv,
             ForwardScratch& s, float* logits, const ForwardOptions& opt = {});
inline void forward(const DeviceModel& dm, const ModelConfig& c, Batch& b, KvStore& kv,
                    ForwardScratch& s, float* logits, const ForwardOptions& opt = {}) {
  forward(*dm.backend, c, dm.weights, b, kv, s, logits, opt);
}

// The RoPE inverse frequencies of a config (with its scaling factors).
std::vector<float> rope_inv_freq(const ModelConfig& c);

}  // namespace wick
