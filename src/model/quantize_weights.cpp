#include "model/quantize_weights.h"

#include <string>
#include <unordered_map>

#include "backend/cpu/ops.h"
#include "io/error.h"
#include "io/quantize.h"

namespace wick {

namespace {

class Quantizer {
 public:
  Quantizer(Model& m, const QuantPlan& plan, bool tied) : m_(m), plan_(plan), tied_(tied) {
    for (size_t i = 0; i < m_.owned.size(); ++i)
      if (!m_.owned[i].empty()) owned_[m_.owned[i].data()] = i;
  }

  // `w` (n_stack stacked matrices for MoE experts, each its own Weight)
  // named as in GGUF, for the plan's rules.
  void matrix(Weight& w, const std::string& name, std::vector<int64_t> shape) {
    if (w.empty()) return;
    if (w.dtype != DType::F32 && w.dtype != DType::F16 && w.dtype != DType::BF16)
      throw_model(
          "--quantize: {} is already {}; quantize-on-load takes f32, f16 or bf16 models "
          "(write another type from it with `wick quantize`)",
          name, dtype_name(w.dtype));
    const ModelConfig& c = m_.config;
    const DType t = plan_.type_of(name, shape, c.n_layer, c.n_expert, tied_,
                                  c.n_head_kv > 0 ? c.n_head / c.n_head_kv : 0);
    if (t == w.dtype) return;
    const size_t rb = row_bytes(t, w.n_in);
    std::vector<uint8_t> out(size_t(w.n_out) * rb);
#pragma omp parallel num_threads(cpu::n_threads())
    {
      std::vector<float> row(static_cast<size_t>(w.n_in));
#pragma omp for schedule(dynamic, 16)
      for (int64_t r = 0; r < w.n_out; ++r) {
        dequantize_row_ref(w.dtype, w.row(r), row.data(), w.n_in);
        quantize_row(t, row.data(), out.data() + size_t(r) * rb, w.n_in);
      }
    }
    m_.owned.push_back(std::move(out));
    release(w.data);
    w.data = m_.owned.back().data();
    w.dtype = t;
    ++n_done_;
  }
  int64_t n_done() const {
    return n_done_;
  }

 private:
  // Frees the loader's copy a matrix was quantized from (FP8 checkpoints'
  // bf16, GGUF's reordered q/k rows), which nothing else points into: each
  // owned buffer holds one tensor, and a tied output is reset to the
  // quantized embedding before it is read. A mapped file's bytes are not
  // in `owned` and stay mapped.
  void release(const void* data) {
    auto it = owned_.find(data);
    if (it == owned_.end()) return;
    std::vector<uint8_t>().swap(m_.owned[it->second]);
    owned_.erase(it);
  }

  Model& m_;
  const QuantPlan& plan_;
  bool tied_;
  int64_t n_done_ = 0;
  std::unordered_map<const void*, size_t> owned_;  // the loader's buffers' indices, by address
};

}  // namespace

int64_t quantize_weights(Model& m, const QuantPlan& plan) {
  ModelWeights& W = m.weights;
  const bool tied = W.output.data == W.tok_embd.data;
  Quantizer q(m, plan, tied);
  q.matrix(W.tok_embd, "token_embd.weight", {W.tok_embd.n_out, W.tok_embd.n_in});
  if (tied)
    W.output = W.tok_embd;
  else
    q.matrix(W.output, "output.weight", {W.output.n_out, W.output.n_in});
  for (size_t il = 0; il < W.layers.size(); ++il) {
    LayerWeights& l = W.layers[il];
    const std::string p = "blk." + std::to_string(il) + ".";
    auto mat = [&](Weight& w, const char* name) { q.matrix(w, p + name, {w.n_out, w.n_in}); };
    mat(l.wq, "attn_q.weight");
    mat(l.wk, "attn_k.weight");
    mat(l.wv, "attn_v.weight");
    mat(l.wo, "attn_output.weight");
    mat(l.w_gate, "ffn_gate.weight");
    mat(l.w_up, "ffn_up.weight");
    mat(l.w_down, "ffn_down.weight");
    // routers stay as loaded (the plan keeps them f32)
    const int64_t n_expert = int64_t(l.experts.size());
    for (auto& e : l.experts) {
      q.matrix(e.gate, p + "ffn_gate_exps.weight", {n_expert, e.gate.n_out, e.gate.n_in});
      q.matrix(e.up, p + "ffn_up_exps.weight", {n_expert, e.up.n_out, e.up.n_in});
      q.matrix(e.down, p + "ffn_down_exps.weight", {n_expert, e.down.n_out, e.down.n_in});
    }
  }
  m.n_params_by_dtype.clear();
  auto count = [&](const Weight& w) {
    if (!w.empty()) m.n_params_by_dtype[dtype_name(w.dtype)] += w.n_out * w.n_in;
  };
  count(W.tok_embd);
  if (!tied) count(W.output);
  count(W.output_norm);
  for_each_layer_weight(W, count, count, [&](std::vector<ExpertWeights>& xs) {
    for (auto& e : xs) {
      count(e.gate);
      count(e.up);
      count(e.down);
    }
  });
  return q.n_done();
}

}  // namespace wick
