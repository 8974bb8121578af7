// Model hyper-parameters, from a HF config.json or GGUF metadata.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace wick {

class GgufFile;

enum class Arch { Llama, Mistral, Qwen2, Qwen3, Qwen3Moe, Mixtral, Granite, GraniteMoe };
const char* arch_name(Arch a);
// IBM Granite 3.x, dense or mixture of experts: Llama's layers with four multipliers.
inline bool is_granite(Arch a) {
  return a == Arch::Granite || a == Arch::GraniteMoe;
}
// general.architecture of the family's GGUF files ("llama" for Mistral and Mixtral too).
std::string gguf_arch(Arch a);
// llama.cpp's GGUF files of llama-family models interleave the two RoPE
// halves of each q/k head; HF row r of such a matrix is stored at row
// gguf_stored_row(r, head_dim).
bool gguf_rows_interleaved(Arch a);
int64_t gguf_stored_row(int64_t r, int64_t head_dim);
int64_t gguf_hf_row(int64_t stored, int64_t head_dim);  // its inverse

struct ModelConfig {
  Arch arch = Arch::Llama;
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t n_ff = 0;         // dense MLP width
  int64_t n_ctx_train = 0;  // max_position_embeddings / context_length
  float rms_eps = 1e-6f;
  float rope_theta = 10000.f;
  // Per-frequency divisors (head_dim / 2 of them) from rope scaling: llama3,
  // linear or yarn. Empty when the model uses plain RoPE.
  std::vector<float> rope_freq_factors;
  std::string rope_type = "default";
  // YaRN: the scale the trained context is stretched by, that context (0:
  // not known, n_ctx_train), the
  // ramp's bounds in rotations, and HF's attention_factor (cos and sin are
  // multiplied by it, so attention scores by its square).
  float rope_scale = 1.f;
  int64_t rope_orig_ctx = 0;
  float yarn_beta_fast = 32.f, yarn_beta_slow = 1.f;
  bool yarn_truncate = true;
  float rope_attn_factor = 1.f;
  bool tie_embeddings = false;
  bool qkv_bias = false;       // Qwen2, or Llama with attention_bias
  bool o_bias = false;         // Llama with attention_bias
  bool qk_norm = false;        // Qwen3: RMSNorm per head on q and k before RoPE
  int64_t sliding_window = 0;  // 0 = full attention (Mistral: each token sees this many)
  // Mixture of experts (Mixtral, Qwen3-MoE, GraniteMoe).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_expert = 0;
  bool norm_topk_prob = true;         // renormalise the chosen experts' weights
  std::vector<int64_t> dense_layers;  // Qwen3-MoE mlp_only_layers / sparse step
  // Granite's multipliers (HF embedding_multiplier, residual_multiplier,
  // attention_multiplier, logits_scaling; GGUF granite.embedding_scale,
  // .residual_scale, .attention.scale, .logit_scale): the embeddings are
  // multiplied by embd_scale, each block's output by resid_scale before its
  // residual add, q.k by attn_scale (0: 1 / sqrt(head_dim)) and the logits
  // divided by logit_scale. 1 (0) elsewhere.
  float embd_scale = 1.f;
  float resid_scale = 1.f;
  float attn_scale = 0.f;
  float logit_scale = 1.f;

  bool is_moe() const { return n_expert > 0; }
  bool layer_is_moe(int64_t il) const;
  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }

  // Throws ModelError naming `source` when a value is missing or inconsistent.
  void validate(const std::string& source) const;
};

ModelConfig config_from_hf_json(const nlohmann::json& j, const std::string& source);
ModelConfig config_from_gguf(const GgufFile& f);

// llama3 rope scaling: the divisor of each inverse frequency.
std::vector<float> llama3_freq_factors(int64_t head_dim, float theta, float factor,
                                       float low_freq_factor, float high_freq_factor,
                                       float original_max_pos);

// YaRN rope scaling (rope_type "yarn"), as transformers computes it: the
// frequencies' divisors and n_ctx_train of at least orig_ctx * factor.
// attention_factor <= 0 takes the paper's 0.1 ln(factor) + 1.
void set_yarn(ModelConfig& c, const std::string& source, float factor, int64_t orig_ctx,
              float beta_fast = 32.f, float beta_slow = 1.f, bool truncate = true,
              float attention_factor = 0.f);
// YaRN's attention factor for a scale (1 at or below 1).
float yarn_mscale(float factor, float mscale = 1.f);

// The command line's rope scaling over the model's (llama.cpp's --rope-scaling,
// --rope-scale, --yarn-orig-ctx): type "none", "linear" or "yarn"; "" keeps
// the model's. orig_ctx 0 = the model's trained context.
void override_rope(ModelConfig& c, const std::string& type, float scale, int64_t orig_ctx,
                   const std::string& source);

}  // namespace wick
