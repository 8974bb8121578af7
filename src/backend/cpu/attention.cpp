// Causal attention through the batch's block table, on f32 K/V.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"

namespace wick::cpu {

void attention(const float* q, const float* kl, const float* vl, int64_t kv_dim, const BatchArgs& b,
               const AttnShape& s, float* out) {
  const auto& k = simd();
  const int64_t n_tok = b.n_tokens, hd = s.head_dim, group = s.n_head / s.n_head_kv;
  const int64_t d = kv_dim, bs = b.block_size;
  const float scale = 1.f / std::sqrt(float(hd));
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(n_threads())
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t h = 0; h < s.n_head; ++h) {
      const int64_t p = b.positions[t];
      const int64_t lo = s.sliding_window > 0 ? std::max<int64_t>(0, p - s.sliding_window + 1) : 0;
      const int32_t* table = b.block_table + int64_t(b.seq_of[t]) * b.max_blocks;
      auto slot = [&](int64_t j) { return int64_t(table[j / bs]) * bs + j % bs; };
      const int64_t kv_off = (h / group) * hd;
      const float* qh = q + (t * s.n_head + h) * hd;
      float* scores = thread_buf(size_t(p - lo + 1));
      float mx = -INFINITY;
      for (int64_t j = lo; j <= p; ++j) {
        const float sc = k.dot(qh, kl + slot(j) * d + kv_off, hd) * scale;
        scores[j - lo] = sc;
        mx = std::max(mx, sc);
      }
      float sum = 0.f;
      for (int64_t j = lo; j <= p; ++j) sum += (scores[j - lo] = std::exp(scores[j - lo] - mx));
      float* o = out + (t * s.n_head + h) * hd;
      std::fill(o, o + hd, 0.f);
      const float inv = 1.f / sum;
      for (int64_t j = lo; j <= p; ++j)
        k.axpy(scores[j - lo] * inv, vl + slot(j) * d + kv_off, o, hd);
    }
  }
}

}  // namespace wick::cpu
