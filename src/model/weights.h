// Per-architecture weights as plain data: views into the mapped files (or
// into buffers the model owns), in HF layout. Linear weights are
// [n_out, n_in], one contiguous row per output.
#pragma once

#include <cstdint>
#include <vector>

#include "io/dtype.h"

namespace wick {

struct Weight {
  DType dtype = DType::F32;
  int64_t n_out = 0;  // rows (1 for vectors)
  int64_t n_in = 0;   // elements per row
  const void* data = nullptr;

  bool empty() const { return data == nullptr; }
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + size_t(r) * row_bytes(dtype, n_in);
  }
  const float* f32() const { return static_cast<const float*>(data); }  // vectors only
};

struct ExpertWeights {
  Weight gate;  // [n_ff_expert, n_embd]
  Weight up;    // [n_ff_expert, n_embd]
  Weight down;  // [n_embd, n_ff_expert]
};

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

}  // namespace wick
