// CPU kernels the forward pass calls. Activations are f32 rows; weights keep
// their stored type and are dequantized inside the products.
#pragma once

#include <cstdint>

#include "kv/kv_cache.h"
#include "model/batch.h"
#include "model/weights.h"

namespace wick::cpu {

void set_n_threads(int n);  // 0 = all cores
int n_threads();

void embed(const Weight& tok, const int32_t* ids, int64_t n, float* out);  // out [n, n_in]
void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y);
// y[r, o] = sum_i w[o, i] * x[r, i];  x [n_rows, w.n_in], y [n_rows, w.n_out]
void matmul(const Weight& w, const float* x, int64_t n_rows, float* y);
void add_bias(float* y, const float* b, int64_t n_rows, int64_t n);
void add(float* y, const float* x, int64_t n);           // y += x
void silu_mul(float* gate, const float* up, int64_t n);  // gate = silu(gate) * up
// NeoX-style RoPE (pairs i and i + head_dim/2) in place: x [n_rows, n_heads, head_dim].
void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
          const float* inv_freq);

struct AttnShape {
  int64_t n_head, n_head_kv, head_dim;
  int64_t sliding_window;  // 0 = none
};
// Writes k, v [n_tokens, kv_dim] into the cache slots of their positions.
void kv_store(KvCache& kv, int64_t il, const Batch& b, const float* k, const float* v);
// out [n_tokens, n_head * head_dim]: causal attention of q over each token's
// own sequence, through its block table.
void attention(const float* q, const KvCache& kv, int64_t il, const Batch& b, const AttnShape& s,
               float* out);

}  // namespace wick::cpu
