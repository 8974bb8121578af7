#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/ops.h"
#include "io/error.h"

namespace wick {

namespace ops = cpu;

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  std::vector<float> f(size_t(c.head_dim / 2));
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    // float32 throughout, as the reference computes it
    const float e = float(2 * i) / float(c.head_dim);
    f[i] = 1.f / std::pow(c.rope_theta, e);
    if (!c.rope_freq_factors.empty()) f[i] /= c.rope_freq_factors[i];
  }
  return f;
}

namespace {

void grow(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
}

void dense_mlp(const ModelConfig& c, const LayerWeights& l, int64_t n_tok, ForwardScratch& s) {
  ops::matmul(l.w_gate, s.xn.data(), n_tok, s.gate.data());
  ops::matmul(l.w_up, s.xn.data(), n_tok, s.up.data());
  ops::silu_mul(s.gate.data(), s.up.data(), n_tok * c.n_ff);
  ops::matmul(l.w_down, s.gate.data(), n_tok, s.proj.data());
}

// Top-k routed experts: softmax over all experts, keep the k largest
// (renormalised when norm_topk_prob), run each expert on its tokens.
void moe_mlp(const ModelConfig& c, const LayerWeights& l, int64_t n_tok, ForwardScratch& s) {
  const int64_t E = c.n_expert, K = c.n_expert_used, D = c.n_embd, F = c.n_ff_expert;
  grow(s.router, n_tok * E);
  ops::matmul(l.router, s.xn.data(), n_tok, s.router.data());
  // chosen[t*K + j] = expert, weight[t*K + j] = its weight
  s.moe_chosen.resize(size_t(n_tok * K));
  s.moe_weight.resize(size_t(n_tok * K));
  s.moe_order.resize(size_t(E));
  auto& chosen = s.moe_chosen;
  auto& weight = s.moe_weight;
  auto& order = s.moe_order;
  for (int64_t t = 0; t < n_tok; ++t) {
    float* r = s.router.data() + t * E;
    const float mx = *std::max_element(r, r + E);
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += (r[e] = std::exp(r[e] - mx));
    for (int64_t e = 0; e < E; ++e) r[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [r](int32_t a, int32_t b) { return r[a] > r[b]; });
    float top = 0.f;
    for (int64_t j = 0; j < K; ++j) top += r[order[j]];
    for (int64_t j = 0; j < K; ++j) {
      chosen[t * K + j] = order[j];
      weight[t * K + j] = c.norm_topk_prob ? r[order[j]] / top : r[order[j]];
    }
  }
  std::fill(s.proj.begin(), s.proj.begin() + n_tok * D, 0.f);
  grow(s.moe_x, n_tok * D);
  grow(s.moe_gate, n_tok * F);
  grow(s.moe_up, n_tok * F);
  grow(s.moe_out, n_tok * D);
  auto& rows = s.moe_rows;
  auto& row_w = s.moe_row_w;
  for (int64_t e = 0; e < E; ++e) {
    rows.clear();
    row_w.clear();
    for (int64_t i = 0; i < n_tok * K; ++i)
      if (chosen[i] == e) {
        rows.push_back(int32_t(i / K));
        row_w.push_back(weight[i]);
      }
    if (rows.empty()) continue;
    const int64_t n = int64_t(rows.size());
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(s.xn.data() + rows[i] * D, D, s.moe_x.data() + i * D);
    const ExpertWeights& x = l.experts[size_t(e)];
    ops::matmul(x.gate, s.moe_x.data(), n, s.moe_gate.data());
    ops::matmul(x.up, s.moe_x.data(), n, s.moe_up.data());
    ops::silu_mul(s.moe_gate.data(), s.moe_up.data(), n * F);
    ops::matmul(x.down, s.moe_gate.data(), n, s.moe_out.data());
    for (int64_t i = 0; i < n; ++i) {
      float* dst = s.proj.data() + rows[i] * D;
      const float* src = s.moe_out.data() + i * D;
      for (int64_t j = 0; j < D; ++j) dst[j] += src[j] * row_w[i];
    }
  }
}

}  // namespace

void forward(const Model& m, const Batch& b, KvCache& kv, ForwardScratch& s, float* logits) {
  const ModelConfig& c = m.config;
  const ModelWeights& W = m.weights;
  const int64_t T = b.n_tokens(), D = c.n_embd, hd = c.head_dim;
  for (int32_t id : b.token_ids)
    if (id < 0 || id >= c.n_vocab)
      throw_model("token id {} is outside the vocabulary [0, {})", id, c.n_vocab);
  const int64_t n_ff_max = std::max(c.n_ff, c.n_ff_expert);
  grow(s.x, T * D);
  grow(s.xn, T * D);
  grow(s.q, T * c.q_dim());
  grow(s.k, T * c.kv_dim());
  grow(s.v, T * c.kv_dim());
  grow(s.attn, T * c.q_dim());
  grow(s.proj, T * D);
  grow(s.gate, T * n_ff_max);
  grow(s.up, T * n_ff_max);
  if (int64_t(s.inv_freq.size()) != hd / 2) s.inv_freq = rope_inv_freq(c);
  const ops::AttnShape shape{c.n_head, c.n_head_kv, hd, c.sliding_window};

  ops::embed(W.tok_embd, b.token_ids.data(), T, s.x.data());
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& l = W.layers[size_t(il)];
    // attention block
    ops::rmsnorm(s.x.data(), l.attn_norm.f32(), T, D, c.rms_eps, s.xn.data());
    ops::matmul(l.wq, s.xn.data(), T, s.q.data());
    ops::matmul(l.wk, s.xn.data(), T, s.k.data());
    ops::matmul(l.wv, s.xn.data(), T, s.v.data());
    if (c.qkv_bias) {
      ops::add_bias(s.q.data(), l.bq.f32(), T, c.q_dim());
      ops::add_bias(s.k.data(), l.bk.f32(), T, c.kv_dim());
      ops::add_bias(s.v.data(), l.bv.f32(), T, c.kv_dim());
    }
    if (c.qk_norm) {
      ops::rmsnorm(s.q.data(), l.q_norm.f32(), T * c.n_head, hd, c.rms_eps, s.q.data());
      ops::rmsnorm(s.k.data(), l.k_norm.f32(), T * c.n_head_kv, hd, c.rms_eps, s.k.data());
    }
    ops::rope(s.q.data(), b.positions.data(), T, c.n_head, hd, s.inv_freq.data());
    ops::rope(s.k.data(), b.positions.data(), T, c.n_head_kv, hd, s.inv_freq.data());
    ops::kv_store(kv, il, b, s.k.data(), s.v.data());
    ops::attention(s.q.data(), kv, il, b, shape, s.attn.data());
    ops::matmul(l.wo, s.attn.data(), T, s.proj.data());
    if (c.o_bias) ops::add_bias(s.proj.data(), l.bo.f32(), T, D);
    ops::add(s.x.data(), s.proj.data(), T * D);
    // feed-forward block
    ops::rmsnorm(s.x.data(), l.ffn_norm.f32(), T, D, c.rms_eps, s.xn.data());
    if (c.layer_is_moe(il))
      moe_mlp(c, l, T, s);
    else
      dense_mlp(c, l, T, s);
    ops::add(s.x.data(), s.proj.data(), T * D);
  }
  // Only the rows whose logits are wanted go through the norm and the head.
  const int64_t n_out = int64_t(b.logit_rows.size());
  if (n_out == 0) return;
  grow(s.final_rows, n_out * D);
  for (int64_t i = 0; i < n_out; ++i)
    std::copy_n(s.x.data() + b.logit_rows[size_t(i)] * D, D, s.xn.data() + i * D);
  ops::rmsnorm(s.xn.data(), W.output_norm.f32(), n_out, D, c.rms_eps, s.final_rows.data());
  ops::matmul(W.output, s.final_rows.data(), n_out, logits);
}

}  // namespace wick
