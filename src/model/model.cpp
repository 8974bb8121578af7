#include "model/model.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io/error.h"
#include "model/fp8.h"
#include "model/shaped.h"

namespace wick {

namespace fs = std::filesystem;

namespace {

// Finds, checks and converts tensors for one model; every error names the
// file, the tensor and what was expected.
class Loader {
 public:
  Loader(Model& m, const TensorSet& set, Fp8Scheme fp8 = {})
      : m_(m), set_(set), fp8_(std::move(fp8)) {}

  const TensorView* find(const std::string& name) const { return set_.find(name); }

  const TensorView& require(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorView* t = set_.find(name);
    if (!t)
      throw_model("{}: tensor '{}' is missing (expected shape {})", m_.path, name,
                  shape_str(shape));
    if (!traits(t->dtype).supported && !is_fp8(t->dtype))
      throw_model(
          "{}: tensor '{}' has type {}, which wick does not support (supported: f32, f16, "
          "bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs; "
          "f8_e4m3 and f8_e5m2 for matrices with a scale)",
          t->file, name, dtype_name(t->dtype));
    if (t->shape != shape)
      throw_model("{}: tensor '{}' has shape {}, expected {}", t->file, name, shape_str(t->shape),
                  shape_str(shape));
    count(*t);
    return *t;
  }

  Weight matrix(const std::string& name, int64_t n_out, int64_t n_in) {
    const TensorView& t = require(name, {n_out, n_in});
    if (is_fp8(t.dtype)) return fp8_matrix(t);
    return Weight{t.dtype, n_out, n_in, t.data};
  }

  // An FP8 matrix times its scale, as bf16 (model/fp8.h).
  Weight fp8_matrix(const TensorView& t) {
    const TensorView* scale = set_.find(fp8_scale_inv_name(t.name));
    if (!scale) scale = set_.find(fp8_scale_name(t.name));
    if (!scale)
      throw_model("{}: FP8 tensor '{}' has no scale (expected '{}' or '{}')", t.file, t.name,
                  fp8_scale_inv_name(t.name), fp8_scale_name(t.name));
    auto& buf = m_.owned.emplace_back(size_t(t.numel()) * 2);
    dequantize_fp8(t, *scale, fp8_, reinterpret_cast<uint16_t*>(buf.data()));
    return Weight{DType::BF16, t.shape[0], t.shape[1], buf.data()};
  }

  // Rows of `name` reordered: HF row r comes from stored row src_row(r).
  template <typename F>
  Weight matrix_permuted(const std::string& name, int64_t n_out, int64_t n_in, F src_row) {
    Weight w = matrix(name, n_out, n_in);
    size_t rb = row_bytes(w.dtype, n_in);
    auto& buf = m_.owned.emplace_back(size_t(n_out) * rb);
    for (int64_t r = 0; r < n_out; ++r) std::memcpy(buf.data() + r * rb, w.row(src_row(r)), rb);
    w.data = buf.data();
    return w;
  }

  // A vector converted to f32 (norm weights and biases are tiny).
  Weight vector(const std::string& name, int64_t n) {
    const TensorView& t = require(name, {n});
    if (is_fp8(t.dtype))
      throw_model("{}: tensor '{}' is {}; wick takes FP8 for matrices only", t.file, name,
                  dtype_name(t.dtype));
    auto& buf = m_.owned.emplace_back(size_t(n) * 4);
    dequantize_row_ref(t.dtype, t.data, reinterpret_cast<float*>(buf.data()), n);
    return Weight{DType::F32, 1, n, buf.data()};
  }

  template <typename F>
  Weight vector_permuted(const std::string& name, int64_t n, F src_index) {
    Weight w = vector(name, n);
    auto* p = reinterpret_cast<float*>(const_cast<void*>(w.data));
    std::vector<float> tmp(p, p + n);
    for (int64_t i = 0; i < n; ++i) p[i] = tmp[size_t(src_index(i))];
    return w;
  }

  // One expert's slice of a stacked [n_expert, n_out, n_in] tensor: its rows
  // [row0, row0 + n_rows) (all of them by default).
  Weight expert_slice(const std::string& name, int64_t n_expert, int64_t e, int64_t n_out,
                      int64_t n_in, int64_t row0 = 0, int64_t n_rows = -1) {
    const TensorView& t = require_stacked(name, {n_expert, n_out, n_in});
    if (is_fp8(t.dtype))
      throw_model("{}: tensor '{}' is {}; wick does not load stacked FP8 experts", t.file, name,
                  dtype_name(t.dtype));
    const size_t rb = row_bytes(t.dtype, n_in);
    const auto* base = static_cast<const uint8_t*>(t.data) + (size_t(e) * n_out + row0) * rb;
    return Weight{t.dtype, n_rows < 0 ? n_out : n_rows, n_in, base};
  }

 private:
  const TensorView& require_stacked(const std::string& name, const std::vector<int64_t>& shape) {
    if (!counted_.count(name)) return require(name, shape);  // counts once
    return *set_.find(name);
  }
  void count(const TensorView& t) {
    if (!counted_.insert(t.name).second) return;
    m_.n_params += t.numel();
    m_.n_params_by_dtype[dtype_name(t.dtype)] += t.numel();
  }

  Model& m_;
  const TensorSet& set_;
  Fp8Scheme fp8_;
  std::set<std::string> counted_;
};

void load_hf_weights(Model& m, Loader& L) {
  const ModelConfig& c = m.config;
  auto& W = m.weights;
  W.tok_embd = L.matrix("model.embed_tokens.weight", c.n_vocab, c.n_embd);
  W.output_norm = L.vector("model.norm.weight", c.n_embd);
  W.output = c.tie_embeddings && !L.find("lm_head.weight")
                 ? W.tok_embd
                 : L.matrix("lm_head.weight", c.n_vocab, c.n_embd);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    LayerWeights& l = W.layers.emplace_back();
    std::string p = "model.layers." + std::to_string(il) + ".";
    l.attn_norm = L.vector(p + "input_layernorm.weight", c.n_embd);
    l.ffn_norm = L.vector(p + "post_attention_layernorm.weight", c.n_embd);
    l.wq = L.matrix(p + "self_attn.q_proj.weight", c.q_dim(), c.n_embd);
    l.wk = L.matrix(p + "self_attn.k_proj.weight", c.kv_dim(), c.n_embd);
    l.wv = L.matrix(p + "self_attn.v_proj.weight", c.kv_dim(), c.n_embd);
    l.wo = L.matrix(p + "self_attn.o_proj.weight", c.n_embd, c.q_dim());
    if (c.qkv_bias) {
      l.bq = L.vector(p + "self_attn.q_proj.bias", c.q_dim());
      l.bk = L.vector(p + "self_attn.k_proj.bias", c.kv_dim());
      l.bv = L.vector(p + "self_attn.v_proj.bias", c.kv_dim());
    }
    if (c.o_bias) l.bo = L.vector(p + "self_attn.o_proj.bias", c.n_embd);
    if (c.qk_norm) {
      l.q_norm = L.vector(p + "self_attn.q_norm.weight", c.head_dim);
      l.k_norm = L.vector(p + "self_attn.k_norm.weight", c.head_dim);
    }
    if (!c.layer_is_moe(il)) {
      l.w_gate = L.matrix(p + "mlp.gate_proj.weight", c.n_ff, c.n_embd);
      l.w_up = L.matrix(p + "mlp.up_proj.weight", c.n_ff, c.n_embd);
      l.w_down = L.matrix(p + "mlp.down_proj.weight", c.n_embd, c.n_ff);
      continue;
    }
    if (c.arch == Arch::GraniteMoe) {
      // every expert's gate and up rows stacked in one [n_expert, 2 n_ff, n_embd]
      std::string moe = p + "block_sparse_moe.";
      const int64_t ff = c.n_ff_expert;
      l.router = L.matrix(moe + "router.layer.weight", c.n_expert, c.n_embd);
      for (int64_t e = 0; e < c.n_expert; ++e) {
        ExpertWeights& x = l.experts.emplace_back();
        const std::string in = moe + "input_linear.weight";
        x.gate = L.expert_slice(in, c.n_expert, e, 2 * ff, c.n_embd, 0, ff);
        x.up = L.expert_slice(in, c.n_expert, e, 2 * ff, c.n_embd, ff, ff);
        x.down = L.expert_slice(moe + "output_linear.weight", c.n_expert, e, c.n_embd, ff);
      }
      continue;
    }
    const bool mixtral = c.arch == Arch::Mixtral;
    std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
    l.router = L.matrix(moe + "gate.weight", c.n_expert, c.n_embd);
    for (int64_t e = 0; e < c.n_expert; ++e) {
      std::string q = moe + "experts." + std::to_string(e) + ".";
      ExpertWeights& x = l.experts.emplace_back();
      x.gate = L.matrix(q + (mixtral ? "w1.weight" : "gate_proj.weight"), c.n_ff_expert, c.n_embd);
      x.up = L.matrix(q + (mixtral ? "w3.weight" : "up_proj.weight"), c.n_ff_expert, c.n_embd);
      x.down = L.matrix(q + (mixtral ? "w2.weight" : "down_proj.weight"), c.n_embd, c.n_ff_expert);
    }
  }
}

void load_gguf_weights(Model& m, Loader& L) {
  const ModelConfig& c = m.config;
  auto& W = m.weights;
  W.tok_embd = L.matrix("token_embd.weight", c.n_vocab, c.n_embd);
  W.output_norm = L.vector("output_norm.weight", c.n_embd);
  W.output = L.find("output.weight") ? L.matrix("output.weight", c.n_vocab, c.n_embd) : W.tok_embd;
  // llama.cpp's converter interleaves the two RoPE halves of each q/k head for
  // llama-family models; undo it so one RoPE (the HF layout) serves all files.
  const bool permuted = gguf_rows_interleaved(c.arch);
  const int64_t hd = c.head_dim;
  auto unpermute = [hd](int64_t r) { return gguf_stored_row(r, hd); };
  for (int64_t il = 0; il < c.n_layer; ++il) {
    LayerWeights& l = W.layers.emplace_back();
    std::string p = "blk." + std::to_string(il) + ".";
    l.attn_norm = L.vector(p + "attn_norm.weight", c.n_embd);
    l.ffn_norm = L.vector(p + "ffn_norm.weight", c.n_embd);
    if (permuted) {
      l.wq = L.matrix_permuted(p + "attn_q.weight", c.q_dim(), c.n_embd, unpermute);
      l.wk = L.matrix_permuted(p + "attn_k.weight", c.kv_dim(), c.n_embd, unpermute);
    } else {
      l.wq = L.matrix(p + "attn_q.weight", c.q_dim(), c.n_embd);
      l.wk = L.matrix(p + "attn_k.weight", c.kv_dim(), c.n_embd);
    }
    l.wv = L.matrix(p + "attn_v.weight", c.kv_dim(), c.n_embd);
    l.wo = L.matrix(p + "attn_output.weight", c.n_embd, c.q_dim());
    if (c.qkv_bias) {
      if (permuted) {
        l.bq = L.vector_permuted(p + "attn_q.bias", c.q_dim(), unpermute);
        l.bk = L.vector_permuted(p + "attn_k.bias", c.kv_dim(), unpermute);
      } else {
        l.bq = L.vector(p + "attn_q.bias", c.q_dim());
        l.bk = L.vector(p + "attn_k.bias", c.kv_dim());
      }
      l.bv = L.vector(p + "attn_v.bias", c.kv_dim());
    }
    if (c.o_bias) l.bo = L.vector(p + "attn_output.bias", c.n_embd);
    if (c.qk_norm) {
      l.q_norm = L.vector(p + "attn_q_norm.weight", c.head_dim);
      l.k_norm = L.vector(p + "attn_k_norm.weight", c.head_dim);
    }
    if (!c.layer_is_moe(il)) {
      l.w_gate = L.matrix(p + "ffn_gate.weight", c.n_ff, c.n_embd);
      l.w_up = L.matrix(p + "ffn_up.weight", c.n_ff, c.n_embd);
      l.w_down = L.matrix(p + "ffn_down.weight", c.n_embd, c.n_ff);
      continue;
    }
    l.router = L.matrix(p + "ffn_gate_inp.weight", c.n_expert, c.n_embd);
    for (int64_t e = 0; e < c.n_expert; ++e) {
      ExpertWeights& x = l.experts.emplace_back();
      x.gate = L.expert_slice(p + "ffn_gate_exps.weight", c.n_expert, e, c.n_ff_expert, c.n_embd);
      x.up = L.expert_slice(p + "ffn_up_exps.weight", c.n_expert, e, c.n_ff_expert, c.n_embd);
      x.down = L.expert_slice(p + "ffn_down_exps.weight", c.n_expert, e, c.n_embd, c.n_ff_expert);
    }
  }
}

std::string hf_tokenizer_kind(const fs::path& dir) {
  fs::path tj = dir / "tokenizer.json";
  if (!fs::exists(tj)) return "none";
  try {
    std::ifstream in(tj);
    auto j = nlohmann::json::parse(in);
    return "tokenizer.json:" + j.at("model").value("type", std::string("?"));
  } catch (const std::exception&) {
    return "tokenizer.json:unreadable";
  }
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& path) {
  if (is_shaped_name(path)) return make_shaped_model(path);
  auto m = std::make_unique<Model>();
  m->path = path;
  if (fs::is_directory(path)) {
    m->format = ModelFormat::HfFolder;
    fs::path cfg = fs::path(path) / "config.json";
    if (!fs::exists(cfg)) throw_io("{}: no config.json in this folder", path);
    nlohmann::json j;
    try {
      std::ifstream in(cfg);
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw_io("{}: not valid JSON: {}", cfg.string(), e.what());
    }
    m->config = config_from_hf_json(j, cfg.string());
    Fp8Scheme fp8 = fp8_scheme_from_hf(j, cfg.string());
    m->tensors = read_safetensors_dir(path);
    Loader L(*m, m->tensors, std::move(fp8));
    load_hf_weights(*m, L);
    m->tokenizer_kind = hf_tokenizer_kind(path);
  } else {
    if (!fs::exists(path)) throw_io("{}: no such file or folder", path);
    m->format = ModelFormat::Gguf;
    m->gguf = std::make_unique<GgufFile>(path);
    m->config = config_from_gguf(*m->gguf);
    Loader L(*m, m->gguf->tensors());
    load_gguf_weights(*m, L);
    auto tm = m->gguf->get_str("tokenizer.ggml.model");
    auto pre = m->gguf->get_str("tokenizer.ggml.pre");
    m->tokenizer_kind = tm ? "gguf:" + *tm + (pre ? "/" + *pre : "") : "none";
  }
  return m;
}

}  // namespace wick
