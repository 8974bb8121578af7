#include "model/forward.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "io/error.h"

namespace wick {

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

// Appends the terms of `src` (a host weight's list) that `keep` accepts,
// prepared on dm's backend, to the end of x's list.
template <class Keep>
void link_terms(Backend& be, DeviceModel& dm, const LoraDelta* src, Weight& x, Keep keep) {
  const LoraDelta** tail = &x.lora;
  while (*tail) tail = const_cast<const LoraDelta**>(&(*tail)->next);
  bool linked = false;
  for (; src; src = src->next) {
    if (!keep(*src)) continue;
    LoraDelta& d =
        dm.lora.emplace_back(LoraDelta{be.prepare_matrix(src->a), be.prepare_matrix(src->b),
                                       be.prepare_vector(src->scale), src->adapter});
    *tail = &d;
    tail = &d.next;
    linked = true;
  }
  if (linked) be.lora_changed(x);
}

// Calls f(host term list, device weight) for each layer matrix of m and dm,
// side by side.
template <class F>
void for_each_matrix_pair(const Model& m, DeviceModel& dm, F&& f) {
  ModelWeights host = m.weights;  // views: a copy to walk
  std::vector<const LoraDelta*> lists;
  auto none = [](auto&) {};
  for_each_layer_weight(
      host, [&](Weight& x) { lists.push_back(x.lora); }, none, none);
  size_t i = 0;
  for_each_layer_weight(
      dm.weights, [&](Weight& x) { f(lists.at(i++), x); }, none, none);
}

void check_applies_lora(const Model& m, const Backend& be) {
  if (!be.applies_lora())
    throw_model("{}: this backend ({}) does not apply LoRA adapters", m.path, be.name());
}

}  // namespace

std::unique_ptr<DeviceModel> prepare_model(const Model& m, std::unique_ptr<Backend> be) {
  if (!m.lora.empty()) check_applies_lora(m, *be);
  auto dm = std::make_unique<DeviceModel>();
  dm->weights = m.weights;
  ModelWeights& w = dm->weights;
  const bool tied = w.output.data == w.tok_embd.data;
  w.tok_embd = be->prepare_matrix(w.tok_embd);
  w.output = tied ? w.tok_embd : be->prepare_matrix(w.output);
  w.output_norm = be->prepare_vector(w.output_norm);
  // an adapted matrix points at its terms as this backend prepared them
  auto matrix = [&](Weight& x) {
    const LoraDelta* lora = std::exchange(x.lora, nullptr);
    x = be->prepare_matrix(x);
    link_terms(*be, *dm, lora, x, [](const LoraDelta&) { return true; });
  };
  for_each_layer_weight(
      w, matrix, [&](Weight& x) { x = be->prepare_vector(x); },
      [&](std::vector<ExpertWeights>& e) {
        std::vector<ExpertWeights> out(e.size());
        be->prepare_experts(e, out);
        e = std::move(out);
      });
  dm->backend = std::move(be);
  return dm;
}

void prepare_adapter(const Model& m, DeviceModel& dm, int32_t adapter) {
  check_applies_lora(m, *dm.backend);
  for_each_matrix_pair(m, dm, [&](const LoraDelta* host, Weight& x) {
    link_terms(*dm.backend, dm, host, x, [&](const LoraDelta& d) { return d.adapter == adapter; });
  });
}

void drop_adapter(DeviceModel& dm, int32_t adapter) {
  auto none = [](auto&) {};
  for_each_layer_weight(
      dm.weights,
      [&](Weight& x) {
        bool has = false;
        for (const LoraDelta* d = x.lora; d; d = d->next) has |= d->adapter == adapter;
        if (!has) return;
        unlink_lora(x, adapter);
        dm.backend->lora_changed(x);
      },
      none, none);
  dm.lora.remove_if([&](const LoraDelta& d) {
    if (d.adapter != adapter) return false;
    dm.backend->release_matrix(d.a);
    dm.backend->release_matrix(d.b);
    dm.backend->release_vector(d.scale);
    return true;
  });
}

void ForwardScratch::reserve(Backend& b, const ModelConfig& c, int64_t n_tokens, int64_t n_logits) {
  if (be != &b) {  // buffers belong to one backend
    *this = ForwardScratch{};
    be = &b;
    inv_freq = b.alloc(size_t(c.head_dim / 2) * 4);
    const auto f = rope_inv_freq(c);
    b.copy_to_device(inv_freq.data(), f.data(), f.size() * 4);
  }
  if (n_tokens > n_tok) {
    n_tok = std::max(n_tokens, n_tok * 2);
    const int64_t n_ff = std::max(c.n_ff, c.n_ff_expert), T = n_tok;
    auto f32 = [&](int64_t n) { return b.alloc(size_t(n) * 4); };
    x = f32(T * c.n_embd);
    xn = f32(T * c.n_embd);
    q = f32(T * c.q_dim());
    k = f32(T * c.kv_dim());
    v = f32(T * c.kv_dim());
    attn = f32(T * c.q_dim());
    proj = f32(T * c.n_embd);
    gate = f32(T * n_ff);
    up = f32(T * n_ff);
    if (c.is_moe()) {
      router = f32(T * c.n_expert);
      moe_w = f32(T * c.n_expert_used);
      moe_ids = f32(T * c.n_expert_used);
    }
  }
  if (n_logits > n_out) {
    n_out = std::max(n_logits, n_out * 2);
    final_rows = b.alloc(size_t(n_out * c.n_embd) * 4);
  }
}

namespace {

// A named intermediate, copied to the host for the trace hook.
void trace(Backend& be, const char* name, int64_t il, const Buffer& t, int64_t rows, int64_t cols) {
  if (!be.trace) return;
  std::vector<float> h(size_t(rows * cols));
  be.copy_to_host(h.data(), t.data(), h.size() * 4);
  be.trace(name, il, h.data(), rows, cols);
}

// next_norm: the next layer's attention norm, taken with the residual add
// after the down product (xn then holds its output); null: proj only.
void dense_mlp(Backend& be, const LayerWeights& l, int64_t n_tok, ForwardScratch& s,
               const float* next_norm, float eps) {
  be.matmul_gate_up(l.w_gate, l.w_up, s.xn.as<float>(), n_tok, s.gate.as<float>(),
                    s.up.as<float>());
  if (next_norm)
    be.matmul_add_rmsnorm(l.w_down, s.gate.as<float>(), n_tok, s.proj.as<float>(), s.x.as<float>(),
                          next_norm, eps, s.xn.as<float>());
  else
    be.matmul(l.w_down, s.gate.as<float>(), n_tok, s.proj.as<float>());
}

// Top-k routed experts: softmax over all experts, keep the k largest
// (renormalised when norm_topk_prob), run each expert on its tokens.
void moe_mlp(Backend& be, const ModelConfig& c, const LayerWeights& l, int64_t n_tok,
             ForwardScratch& s) {
  be.matmul(l.router, s.xn.as<float>(), n_tok, s.router.as<float>());
  be.moe_route(s.router.as<float>(), n_tok, c.n_expert, c.n_expert_used, c.norm_topk_prob,
               s.moe_ids.as<int32_t>(), s.moe_w.as<float>());
  be.moe_mlp(l.experts, s.xn.as<float>(), n_tok, c.n_expert_used, s.moe_ids.as<int32_t>(),
             s.moe_w.as<float>(), s.proj.as<float>());
}

}  // namespace

namespace {

// The rows of the products in a step are the batch's tokens: each adds the
// LoRA terms of its own request's adapter (none outside the step).
struct AdapterRows {
  Backend& be;
  AdapterRows(Backend& be, const BatchArgs& b) : be(be) {
    be.set_adapter_rows(b.adapter_of, b.n_tokens);
  }
  ~AdapterRows() { be.set_adapter_rows(nullptr, 0); }
};

// The kernels of one step (no host synchronisation: it may be recorded).
void run_layers(Backend& be, const ModelConfig& c, const ModelWeights& W, const BatchArgs& b,
                KvStore& kv, ForwardScratch& s, float* logits, bool hidden_states = false,
                bool deviation = false) {
  const int64_t T = b.n_tokens, D = c.n_embd, hd = c.head_dim, n_out = b.n_logits;
  // HF's attention factor multiplies cos and sin, so q.k by its square;
  // Granite's multiplier replaces 1 / sqrt(head_dim)
  const float score_factor = c.rope_attn_factor * c.rope_attn_factor *
                             (c.attn_scale > 0.f ? c.attn_scale * std::sqrt(float(hd)) : 1.f);
  const AttnShape shape{c.n_head,    c.n_head_kv, hd, c.sliding_window, s.inv_freq.as<float>(),
                        score_factor};
  // Granite scales each block's output by resid_scale before the residual
  // add. The stream is kept divided by it instead (x / r: the embeddings
  // times embd_scale / r, blocks added as they come), which the norms cannot
  // tell apart once their epsilon is eps / r^2: rmsnorm(x / r) with it is
  // rmsnorm(x). So no kernel changes, and no extra pass per block.
  const float r = c.resid_scale, eps = c.rms_eps / (r * r), embd_scale = c.embd_scale / r;
  float *x = s.x.as<float>(), *xn = s.xn.as<float>(), *q = s.q.as<float>(), *k = s.k.as<float>(),
        *v = s.v.as<float>(), *attn = s.attn.as<float>(), *proj = s.proj.as<float>();

  const AdapterRows adapters(be, b);
  be.embed(W.tok_embd, b, x);
  if (embd_scale != 1.f) be.scale(x, embd_scale, T * D);
  trace(be, "embd", -1, s.x, T, D);
  bool normed = false;  // xn holds this layer's attention norm already
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& l = W.layers[size_t(il)];
    // attention block; the previous layer's residual add is fused into this
    // norm, or both into the previous layer's down product
    if (il == 0)
      be.rmsnorm(x, l.attn_norm.f32(), T, D, eps, xn);
    else if (!normed)
      be.add_rmsnorm(x, proj, l.attn_norm.f32(), T, D, eps, xn);
    trace(be, "attn_norm", il, s.xn, T, D);
    const Weight* wqkv[3] = {&l.wq, &l.wk, &l.wv};
    const float* bqkv[3] = {nullptr, nullptr, nullptr};
    if (c.qkv_bias) bqkv[0] = l.bq.f32(), bqkv[1] = l.bk.f32(), bqkv[2] = l.bv.f32();
    float* qkv[3] = {q, k, v};
    if (!c.qk_norm && !deviation) {  // products, RoPE and cache write (one kernel on a GPU)
      be.qkv_rope_kv_write(wqkv, bqkv, xn, qkv, kv, il, b, shape);
    } else {
      be.matmul_qkv(wqkv, bqkv, xn, T, qkv);
      if (c.qk_norm) {
        be.rmsnorm(q, l.q_norm.f32(), T * c.n_head, hd, c.rms_eps, q);  // per head: the model's eps
        be.rmsnorm(k, l.k_norm.f32(), T * c.n_head_kv, hd, c.rms_eps, k);
      }
      if (deviation && il == 1) {  // measure mode: how far these K/V lie from the cache's
        be.kv_deviation(kv, il, b, k, v, logits);
        return;
      }
      if (deviation)  // layer 0 of cached tokens: the cache holds these K/V already
        be.rope(q, b, c.n_head, hd, s.inv_freq.as<float>());
      else
        be.rope_kv_write(q, k, v, kv, il, b, shape, s.inv_freq.as<float>());
    }
    trace(be, "q_rope", il, s.q, T, c.q_dim());
    be.attention(q, kv, il, b, shape, attn);
    trace(be, "attn_out", il, s.attn, T, c.q_dim());
    if (c.o_bias) {
      be.matmul(l.wo, attn, T, proj);
      be.add_bias(proj, l.bo.f32(), T, D);
      be.add_rmsnorm(x, proj, l.ffn_norm.f32(), T, D, eps, xn);
    } else {
      be.matmul_add_rmsnorm(l.wo, attn, T, proj, x, l.ffn_norm.f32(), eps, xn);
    }
    // feed-forward block
    trace(be, "ffn_norm", il, s.xn, T, D);
    normed = !c.layer_is_moe(il) && il + 1 < c.n_layer;
    if (c.layer_is_moe(il))
      moe_mlp(be, c, l, T, s);
    else
      dense_mlp(be, l, T, s, normed ? W.layers[size_t(il + 1)].attn_norm.f32() : nullptr, eps);
    trace(be, "ffn_out", il, s.proj, T, D);
  }
  // Only the rows whose logits are wanted go through the last add, the norm
  // and the head.
  if (n_out == 0) return;
  be.add(x, proj, T * D);
  trace(be, "out", -1, s.x, T, D);
  be.gather_logit_rows(x, b, D, xn);
  if (hidden_states) {  // the same rows the head would read, in the caller's buffer
    be.rmsnorm(xn, W.output_norm.f32(), n_out, D, eps, logits);
    return;
  }
  be.rmsnorm(xn, W.output_norm.f32(), n_out, D, eps, s.final_rows.as<float>());
  be.matmul(W.output, s.final_rows.as<float>(), n_out, logits);
  if (c.logit_scale != 1.f) be.scale(logits, 1.f / c.logit_scale, n_out * c.n_vocab);
}

}  // namespace

void forward(Backend& be, const ModelConfig& c, const ModelWeights& W, Batch& batch, KvStore& kv,
             ForwardScratch& s, float* logits, const ForwardOptions& opt) {
  for (int32_t id : batch.token_ids)
    if (id < 0 || id >= c.n_vocab)
      throw_model("token id {} is outside the vocabulary [0, {})", id, c.n_vocab);
  batch.finish(int32_t(kv.block_size), opt.table_width, opt.ctx_round);
  // the hidden-state mode writes its rows to the caller's buffer: final_rows
  // keeps its size (a recorded graph holds its address)
  s.reserve(be, c, batch.n_tokens(), opt.hidden_states ? 0 : int64_t(batch.logit_rows.size()));
  const BatchArgs b = be.upload(batch);
  if (opt.hidden_states) {
    run_layers(be, c, W, b, kv, s, logits, true);
    return;
  }
  if (opt.kv_deviation) {
    if (!kv.pre_rope) throw std::logic_error("forward: measure mode needs keys stored before RoPE");
    if (c.n_layer < 2) {  // one layer: a token's K/V never depends on its context
      const std::vector<float> zeros(size_t(batch.n_tokens()), 0.f);
      be.copy_to_device(logits, zeros.data(), zeros.size() * 4);
      return;
    }
    run_layers(be, c, W, b, kv, s, logits, false, true);
    return;
  }
  const uint64_t key = be.can_graph() && opt.table_width > 0 ? opt.graph_key : 0;
  if (key) {
    if (be.replay(key)) return;
    auto& seen = s.graph_keys_seen;
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      // the second time this shape comes: record it (buffers are sized by now)
      be.capture_begin();
      try {
        run_layers(be, c, W, b, kv, s, logits);
      } catch (const std::exception& e) {
        // nothing ran while recording: the step runs plainly (a real fault
        // throws again there), and the next one tries to record again
        be.capture_abort();
        spdlog::warn("forward: a step could not be recorded as a graph ({}); ran it without",
                     e.what());
        run_layers(be, c, W, b, kv, s, logits);
        return;
      }
      be.capture_end(key);
      be.replay(key);
      return;
    }
    seen.push_back(key);
  }
  run_layers(be, c, W, b, kv, s, logits);
}

}  // namespace wick
