// Per-architecture weights as plain data, in HF layout. A Model holds them as
// views into the mapped files (or buffers it owns); a DeviceModel holds the
// same struct with every weight prepared by a backend.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/weight.h"

namespace wick {

struct LayerWeights {
  Weight attn_norm;   // [n_embd] f32
  Weight wq;          // [n_head * head_dim, n_embd]
  Weight wk;          // [n_head_kv * head_dim, n_embd]
  Weight wv;          // [n_head_kv * head_dim, n_embd]
  Weight wo;          // [n_embd, n_head * head_dim]
  Weight bq, bk, bv;  // [q_dim], [kv_dim], [kv_dim] f32 (qkv_bias)
  Weight bo;          // [n_embd] f32 (o_bias)
  Weight q_norm;      // [head_dim] f32 (qk_norm)
  Weight k_norm;      // [head_dim] f32 (qk_norm)
  Weight ffn_norm;    // [n_embd] f32
  // dense MLP
  Weight w_gate;  // [n_ff, n_embd]
  Weight w_up;    // [n_ff, n_embd]
  Weight w_down;  // [n_embd, n_ff]
  // mixture of experts
  Weight router;                       // [n_expert, n_embd]
  std::vector<ExpertWeights> experts;  // n_expert
};

struct ModelWeights {
  Weight tok_embd;     // [n_vocab, n_embd]
  Weight output_norm;  // [n_embd] f32
  Weight output;       // [n_vocab, n_embd] (tok_embd when tied)
  std::vector<LayerWeights> layers;
};

// Calls f(Weight&) on every matrix of the layers, g(Weight&) on every vector,
// and e(experts) on each MoE layer's experts, in a fixed order.
template <typename F, typename G, typename E>
void for_each_layer_weight(ModelWeights& w, F&& f, G&& g, E&& e) {
  for (auto& l : w.layers) {
    for (auto* v : {&l.attn_norm, &l.bq, &l.bk, &l.bv, &l.bo, &l.q_norm, &l.k_norm, &l.ffn_norm})
      if (!v->empty()) g(*v);
    for (auto* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.router})
      if (!m->empty()) f(*m);
    if (!l.experts.empty()) e(l.experts);
  }
}

}  // namespace wick
