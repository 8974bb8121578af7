#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "io/error.h"
#include "io/gguf.h"

namespace wick {

using json = nlohmann::json;

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama:
      return "llama";
    case Arch::Mistral:
      return "mistral";
    case Arch::Qwen2:
      return "qwen2";
    case Arch::Qwen3:
      return "qwen3";
    case Arch::Qwen3Moe:
      return "qwen3_moe";
    case Arch::Mixtral:
      return "mixtral";
    case Arch::Granite:
      return "granite";
    case Arch::GraniteMoe:
      return "granitemoe";
  }
  return "?";
}

std::string gguf_arch(Arch a) {
  switch (a) {
    case Arch::Llama:
    case Arch::Mistral:
    case Arch::Mixtral:
      return "llama";
    case Arch::Qwen2:
      return "qwen2";
    case Arch::Qwen3:
      return "qwen3";
    case Arch::Qwen3Moe:
      return "qwen3moe";
    case Arch::Granite:
      return "granite";
    case Arch::GraniteMoe:
      return "granitemoe";
  }
  return "?";
}

bool gguf_rows_interleaved(Arch a) {
  return gguf_arch(a) == "llama" || is_granite(a);  // llama.cpp converts Granite as Llama
}

int64_t gguf_stored_row(int64_t r, int64_t head_dim) {
  const int64_t h = r / head_dim, j = r % head_dim, half = j / (head_dim / 2),
                i = j % (head_dim / 2);
  return h * head_dim + 2 * i + half;
}

int64_t gguf_hf_row(int64_t stored, int64_t head_dim) {
  const int64_t h = stored / head_dim, j = stored % head_dim, i = j / 2, half = j % 2;
  return h * head_dim + half * (head_dim / 2) + i;
}

bool ModelConfig::layer_is_moe(int64_t il) const {
  return is_moe() && std::find(dense_layers.begin(), dense_layers.end(), il) == dense_layers.end();
}

void ModelConfig::validate(const std::string& src) const {
  auto pos = [&](int64_t v, const char* name) {
    if (v <= 0) throw_model("{}: {} must be positive (got {})", src, name, v);
  };
  pos(n_vocab, "vocab size");
  pos(n_embd, "hidden size");
  pos(n_layer, "layer count");
  pos(n_head, "attention head count");
  pos(n_head_kv, "key/value head count");
  pos(head_dim, "head dim");
  if (n_head % n_head_kv)
    throw_model("{}: {} attention heads are not a multiple of {} key/value heads", src, n_head,
                n_head_kv);
  if (head_dim % 2) throw_model("{}: head dim {} must be even for RoPE", src, head_dim);
  if (!rope_freq_factors.empty() && int64_t(rope_freq_factors.size()) != head_dim / 2)
    throw_model("{}: {} rope frequency factors, expected {}", src, rope_freq_factors.size(),
                head_dim / 2);
  if (is_moe()) {
    pos(n_ff_expert, "expert feed-forward size");
    if (n_expert_used <= 0 || n_expert_used > n_expert)
      throw_model("{}: {} experts per token with {} experts", src, n_expert_used, n_expert);
  }
  if (!is_moe() || !dense_layers.empty()) pos(n_ff, "feed-forward size");
  auto finite_pos = [&](float v, const char* name) {
    if (!(v > 0.f) || !std::isfinite(v))
      throw_model("{}: {} must be a positive number (got {})", src, name, v);
  };
  finite_pos(embd_scale, "the embedding multiplier");
  finite_pos(resid_scale, "the residual multiplier");
  finite_pos(logit_scale, "the logit scale");
  if (attn_scale != 0.f) finite_pos(attn_scale, "the attention multiplier");
}

std::vector<float> llama3_freq_factors(int64_t head_dim, float theta, float factor,
                                       float low_freq_factor, float high_freq_factor,
                                       float original_max_pos) {
  const double low_wavelen = original_max_pos / low_freq_factor;
  const double high_wavelen = original_max_pos / high_freq_factor;
  std::vector<float> ff(size_t(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    double inv_freq = 1.0 / std::pow(double(theta), double(2 * i) / double(head_dim));
    double wavelen = 2 * M_PI / inv_freq;
    if (wavelen < high_wavelen) {
      ff[i] = 1.f;
    } else if (wavelen > low_wavelen) {
      ff[i] = factor;
    } else {
      double smooth =
          (original_max_pos / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      ff[i] = float(1.0 / ((1 - smooth) / factor + smooth));
    }
  }
  return ff;
}

float yarn_mscale(float factor, float mscale) {
  return factor <= 1.f ? 1.f : float(0.1 * double(mscale) * std::log(double(factor)) + 1.0);
}

void set_yarn(ModelConfig& c, const std::string& src, float factor, int64_t orig_ctx,
              float beta_fast, float beta_slow, bool truncate, float attention_factor) {
  if (!(factor > 0.f) || orig_ctx <= 0 || !(beta_fast > 0.f) || !(beta_slow > 0.f))
    throw_model(
        "{}: yarn rope scaling needs a positive factor, original context and betas "
        "(got factor {}, original context {}, beta_fast {}, beta_slow {})",
        src, factor, orig_ctx, beta_fast, beta_slow);
  if (double(orig_ctx) * factor > double(INT32_MAX) || !(c.rope_theta > 1.f) || c.head_dim <= 0 ||
      c.head_dim > 65536)
    throw_model("{}: yarn rope scaling of {} x {} positions with rope theta {} is out of range",
                src, factor, orig_ctx, c.rope_theta);
  // The pair index at which a frequency turns n_rot times over the trained
  // context: pairs below beta_fast's keep their frequency (extrapolated),
  // pairs above beta_slow's are divided by the factor (interpolated), and a
  // linear ramp joins the two.
  const double dim = double(c.head_dim), base = c.rope_theta;
  auto pair_at = [&](double n_rot) {
    return dim * std::log(double(orig_ctx) / (n_rot * 2 * M_PI)) / (2 * std::log(base));
  };
  double lo = pair_at(beta_fast), hi = pair_at(beta_slow);
  if (truncate) lo = std::floor(lo), hi = std::ceil(hi);
  lo = std::max(lo, 0.0);
  hi = std::min(hi, dim - 1);
  if (lo == hi) hi += 0.001;
  c.rope_freq_factors.resize(size_t(c.head_dim / 2));
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    const double extrapolated = 1.0 - std::clamp((double(i) - lo) / (hi - lo), 0.0, 1.0);
    c.rope_freq_factors[size_t(i)] = float(1.0 / ((1.0 - extrapolated) / factor + extrapolated));
  }
  c.rope_type = "yarn";
  c.rope_scale = factor;
  c.rope_orig_ctx = orig_ctx;
  c.yarn_beta_fast = beta_fast;
  c.yarn_beta_slow = beta_slow;
  c.yarn_truncate = truncate;
  c.rope_attn_factor = attention_factor > 0.f ? attention_factor : yarn_mscale(factor);
  c.n_ctx_train = std::max(c.n_ctx_train, int64_t(double(orig_ctx) * factor));
}

void override_rope(ModelConfig& c, const std::string& type, float scale, int64_t orig_ctx,
                   const std::string& src) {
  if (type.empty()) {
    if (scale > 0.f || orig_ctx > 0)
      throw_model("{}: --rope-scale and --yarn-orig-ctx need --rope-scaling linear or yarn", src);
    return;
  }
  if (type != "none" && type != "linear" && type != "yarn")
    throw_model("{}: --rope-scaling {}: expected none, linear or yarn", src, type);
  if (type != "none" && !(scale > 0.f))
    throw_model("{}: --rope-scaling {} needs --rope-scale F (the context's stretch, e.g. 4)", src,
                type);
  if (double(c.n_ctx_train) * scale > double(INT32_MAX))
    throw_model("{}: --rope-scale {} stretches {} positions past 2^31", src, scale, c.n_ctx_train);
  // The context the model was trained at: a scaled model's original one.
  const int64_t trained = c.rope_orig_ctx > 0 ? c.rope_orig_ctx : c.n_ctx_train;
  c.rope_freq_factors.clear();
  c.rope_type = "default";
  c.rope_scale = 1.f;
  c.rope_orig_ctx = 0;
  c.rope_attn_factor = 1.f;
  c.n_ctx_train = trained;
  if (type == "linear") {
    c.rope_type = "linear";
    c.rope_scale = scale;
    c.rope_orig_ctx = trained;
    c.rope_freq_factors.assign(size_t(c.head_dim / 2), scale);
    c.n_ctx_train = std::max(trained, int64_t(double(trained) * scale));
  } else if (type == "yarn") {
    set_yarn(c, src, scale, orig_ctx > 0 ? orig_ctx : trained);
  }
}

namespace {

template <typename T>
T get_or(const json& j, const char* key, T dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  return it->get<T>();
}

// Reads rope settings from either spelling: transformers 5 `rope_parameters`
// or the hub's `rope_theta` + `rope_scaling`.
void read_rope(const json& j, ModelConfig& c, const std::string& src) {
  json params = json::object();
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    params = j["rope_parameters"];
  } else {
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) params = j["rope_scaling"];
    if (j.contains("rope_theta")) params["rope_theta"] = j["rope_theta"];
  }
  c.rope_theta = get_or<float>(params, "rope_theta", get_or<float>(j, "rope_theta", 10000.f));
  std::string type =
      get_or<std::string>(params, "rope_type", get_or<std::string>(params, "type", "default"));
  c.rope_type = type;
  if (type == "default") return;
  if (type == "llama3") {
    float orig = get_or<float>(params, "original_max_position_embeddings", 8192.f);
    c.rope_freq_factors =
        llama3_freq_factors(c.head_dim, c.rope_theta, get_or<float>(params, "factor", 8.f),
                            get_or<float>(params, "low_freq_factor", 1.f),
                            get_or<float>(params, "high_freq_factor", 4.f), orig);
  } else if (type == "linear") {
    c.rope_scale = get_or<float>(params, "factor", 1.f);
    c.rope_freq_factors.assign(size_t(c.head_dim / 2), c.rope_scale);
  } else if (type == "yarn") {
    // transformers' _compute_yarn_parameters: a missing factor is the ratio
    // of the two contexts; a missing attention_factor comes from the factor
    // (or from mscale / mscale_all_dim where both are given); betas 0 mean
    // the defaults.
    const auto orig =
        int64_t(get_or<double>(params, "original_max_position_embeddings", double(c.n_ctx_train)));
    const float factor = get_or<float>(
        params, "factor", float(double(c.n_ctx_train) / double(std::max<int64_t>(1, orig))));
    float attention = get_or<float>(params, "attention_factor", 0.f);
    const float mscale = get_or<float>(params, "mscale", 0.f),
                mscale_all = get_or<float>(params, "mscale_all_dim", 0.f);
    if (attention <= 0.f && mscale > 0.f && mscale_all > 0.f)
      attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all);
    float beta_fast = get_or<float>(params, "beta_fast", 0.f),
          beta_slow = get_or<float>(params, "beta_slow", 0.f);
    set_yarn(c, src, factor, orig, beta_fast > 0.f ? beta_fast : 32.f,
             beta_slow > 0.f ? beta_slow : 1.f, get_or<bool>(params, "truncate", true), attention);
  } else {
    throw_model(
        "{}: rope scaling type '{}' is not supported (supported: default, linear, llama3, yarn)",
        src, type);
  }
}

}  // namespace

ModelConfig config_from_hf_json(const json& j, const std::string& src) {
  ModelConfig c;
  try {
    std::string mt = get_or<std::string>(j, "model_type", "");
    if (mt == "llama")
      c.arch = Arch::Llama;
    else if (mt == "mistral")
      c.arch = Arch::Mistral;
    else if (mt == "qwen2")
      c.arch = Arch::Qwen2;
    else if (mt == "qwen3")
      c.arch = Arch::Qwen3;
    else if (mt == "qwen3_moe")
      c.arch = Arch::Qwen3Moe;
    else if (mt == "mixtral")
      c.arch = Arch::Mixtral;
    else if (mt == "granite")
      c.arch = Arch::Granite;
    else if (mt == "granitemoe")
      c.arch = Arch::GraniteMoe;
    else
      throw_model(
          "{}: unknown architecture model_type '{}' (supported: llama, mistral, qwen2, "
          "qwen3, qwen3_moe, mixtral, granite, granitemoe)",
          src, mt);
    c.n_vocab = j.at("vocab_size").get<int64_t>();
    c.n_embd = j.at("hidden_size").get<int64_t>();
    c.n_layer = j.at("num_hidden_layers").get<int64_t>();
    c.n_head = j.at("num_attention_heads").get<int64_t>();
    c.n_head_kv = get_or<int64_t>(j, "num_key_value_heads", c.n_head);
    c.head_dim = get_or<int64_t>(j, "head_dim", c.n_head ? c.n_embd / c.n_head : 0);
    c.n_ff = get_or<int64_t>(j, "intermediate_size", 0);
    c.n_ctx_train = get_or<int64_t>(j, "max_position_embeddings", 4096);
    c.rms_eps = get_or<float>(j, "rms_norm_eps", 1e-6f);
    c.tie_embeddings = get_or<bool>(j, "tie_word_embeddings", false);
    read_rope(j, c, src);
    bool attention_bias = get_or<bool>(j, "attention_bias", false);
    c.qkv_bias = c.arch == Arch::Qwen2 || attention_bias;
    c.o_bias =
        (c.arch == Arch::Llama || c.arch == Arch::Mistral || is_granite(c.arch)) && attention_bias;
    if (get_or<bool>(j, "mlp_bias", false)) throw_model("{}: mlp_bias=true is not supported", src);
    if (is_granite(c.arch)) {
      // HF's GraniteConfig and GraniteMoeConfig defaults where absent: all 1 (an
      // attention multiplier of 1, not 1 / sqrt(head_dim), as transformers runs it)
      c.embd_scale = get_or<float>(j, "embedding_multiplier", 1.f);
      c.resid_scale = get_or<float>(j, "residual_multiplier", 1.f);
      c.attn_scale = get_or<float>(j, "attention_multiplier", 1.f);
      c.logit_scale = get_or<float>(j, "logits_scaling", 1.f);
    }
    c.qk_norm = c.arch == Arch::Qwen3 || c.arch == Arch::Qwen3Moe;
    if (c.arch == Arch::Mistral || c.arch == Arch::Mixtral) {
      c.sliding_window = get_or<int64_t>(j, "sliding_window", 0);
    } else if (c.arch == Arch::Qwen2 || c.arch == Arch::Qwen3 || c.arch == Arch::Qwen3Moe) {
      // Qwen declares a window but only uses it with use_sliding_window, which
      // also exempts the lower max_window_layers layers; wick does not run that mode.
      if (get_or<bool>(j, "use_sliding_window", false))
        throw_model("{}: use_sliding_window=true is not supported for {}", src, mt);
    }
    if (c.arch == Arch::Mixtral || c.arch == Arch::GraniteMoe) {
      // GraniteMoe: top-k logits softmaxed, the same weights as Mixtral's renormalised top k
      c.n_expert = get_or<int64_t>(j, "num_local_experts", 0);
      c.n_expert_used = get_or<int64_t>(j, "num_experts_per_tok", 2);
      c.n_ff_expert = c.n_ff;
      c.norm_topk_prob = true;
    } else if (c.arch == Arch::Qwen3Moe) {
      c.n_expert = get_or<int64_t>(j, "num_experts", get_or<int64_t>(j, "num_local_experts", 0));
      c.n_expert_used = get_or<int64_t>(j, "num_experts_per_tok", 8);
      c.n_ff_expert = get_or<int64_t>(j, "moe_intermediate_size", 0);
      c.norm_topk_prob = get_or<bool>(j, "norm_topk_prob", false);
      auto only = get_or<std::vector<int64_t>>(j, "mlp_only_layers", {});
      int64_t step = get_or<int64_t>(j, "decoder_sparse_step", 1);
      for (int64_t il = 0; il < c.n_layer; ++il)
        if (std::count(only.begin(), only.end(), il) || step <= 0 || (il + 1) % step != 0)
          c.dense_layers.push_back(il);
    }
  } catch (const json::exception& e) {
    throw_model("{}: bad or missing config value: {}", src, e.what());
  }
  c.validate(src);
  return c;
}

ModelConfig config_from_gguf(const GgufFile& f) {
  const std::string& src = f.path();
  auto arch = f.get_str("general.architecture");
  if (!arch) throw_model("{}: no general.architecture in the metadata", src);
  ModelConfig c;
  const std::string& a = *arch;
  if (a == "llama")
    c.arch = Arch::Llama;
  else if (a == "qwen2")
    c.arch = Arch::Qwen2;
  else if (a == "qwen3")
    c.arch = Arch::Qwen3;
  else if (a == "qwen3moe")
    c.arch = Arch::Qwen3Moe;
  else if (a == "granite")
    c.arch = Arch::Granite;
  else if (a == "granitemoe")
    c.arch = Arch::GraniteMoe;
  else
    throw_model(
        "{}: unknown architecture '{}' (supported: llama, qwen2, qwen3, qwen3moe, granite, "
        "granitemoe)",
        src, a);
  auto req = [&](const std::string& key) {
    auto v = f.get_int(a + "." + key);
    if (!v) throw_model("{}: metadata {}.{} is missing", src, a, key);
    return *v;
  };
  auto opt_int = [&](const std::string& key, int64_t d) {
    return f.get_int(a + "." + key).value_or(d);
  };
  c.n_embd = req("embedding_length");
  c.n_layer = req("block_count");
  c.n_head = req("attention.head_count");
  c.n_head_kv = opt_int("attention.head_count_kv", c.n_head);
  c.head_dim = opt_int("attention.key_length", c.n_head ? c.n_embd / c.n_head : 0);
  c.n_ff = opt_int("feed_forward_length", 0);
  c.n_ctx_train = opt_int("context_length", 4096);
  c.rms_eps = float(f.get_float(a + ".attention.layer_norm_rms_epsilon").value_or(1e-6));
  c.rope_theta = float(f.get_float(a + ".rope.freq_base").value_or(10000.0));
  c.sliding_window = opt_int("attention.sliding_window", 0);
  if (auto v = f.get_int(a + ".vocab_size")) {
    c.n_vocab = *v;
  } else if (auto* toks = f.get("tokenizer.ggml.tokens"); toks && toks->type == GgufType::ARRAY) {
    c.n_vocab = int64_t(toks->as_array().size());
  } else if (auto* emb = f.tensors().find("token_embd.weight")) {
    c.n_vocab = emb->shape[0];
  }
  c.n_expert = opt_int("expert_count", 0);
  c.n_expert_used = opt_int("expert_used_count", 0);
  c.qkv_bias = c.arch == Arch::Qwen2;
  c.qk_norm = c.arch == Arch::Qwen3 || c.arch == Arch::Qwen3Moe;
  if (c.arch == Arch::Llama && c.n_expert > 0) {
    c.arch = Arch::Mixtral;  // llama.cpp stores Mixtral as llama with experts
    c.n_ff_expert = c.n_ff;
  }
  if (c.arch == Arch::Llama && c.sliding_window > 0) c.arch = Arch::Mistral;
  if (c.arch == Arch::GraniteMoe) {
    if (opt_int("expert_shared_feed_forward_length", 0) > 0)
      throw_model("{}: shared experts (GraniteMoeShared) are not supported", src);
    c.n_ff_expert = c.n_ff;  // feed_forward_length is the experts' width, as Mixtral's
    c.norm_topk_prob = true;
  }
  if (c.arch == Arch::Qwen3Moe) {
    c.n_ff_expert = opt_int("expert_feed_forward_length", 0);
    c.norm_topk_prob = true;  // the GGUF metadata has no flag; Qwen3-MoE releases normalise
    if (auto v = f.get_int(a + ".expert_weights_norm")) c.norm_topk_prob = *v != 0;
  }
  c.tie_embeddings = f.tensors().find("output.weight") == nullptr;
  c.o_bias = f.tensors().find("blk.0.attn_output.bias") != nullptr;
  if (c.arch == Arch::Llama || c.arch == Arch::Mistral || c.arch == Arch::Mixtral ||
      is_granite(c.arch))
    c.qkv_bias = f.tensors().find("blk.0.attn_q.bias") != nullptr;
  if (is_granite(c.arch)) {
    // llama.cpp's keys; absent ones are the plain model's (as llama.cpp reads them)
    auto opt_float = [&](const std::string& key, double d) {
      return float(f.get_float(a + "." + key).value_or(d));
    };
    c.embd_scale = opt_float("embedding_scale", 1.0);
    c.resid_scale = opt_float("residual_scale", 1.0);
    c.attn_scale = opt_float("attention.scale", 0.0);
    c.logit_scale = opt_float("logit_scale", 1.0);
  }
  if (auto type = f.get_str(a + ".rope.scaling.type"); type && *type != "none") {
    c.rope_type = *type;
    float factor = float(f.get_float(a + ".rope.scaling.factor").value_or(1.0));
    if (*type == "linear") {
      c.rope_scale = factor;
      c.rope_freq_factors.assign(size_t(c.head_dim / 2), factor);
    } else if (*type == "yarn") {
      // llama.cpp's keys: cos and sin scaled by yarn_attn_factor times the
      // factor's own 0.1 ln(factor) + 1.
      auto orig = f.get_int(a + ".rope.scaling.original_context_length");
      if (!orig)
        throw_model("{}: yarn rope scaling without {}.rope.scaling.original_context_length", src,
                    a);
      auto key = [&](const char* k, double d) {
        return float(f.get_float(a + ".rope.scaling." + k).value_or(d));
      };
      set_yarn(c, src, factor, *orig, key("yarn_beta_fast", 32.0), key("yarn_beta_slow", 1.0), true,
               key("yarn_attn_factor", 1.0) * yarn_mscale(factor));
    } else if (*type != "llama3") {
      throw_model("{}: rope scaling type '{}' is not supported (supported: linear, llama3, yarn)",
                  src, *type);
    }
  }
  // llama.cpp stores llama3 scaling as a tensor of per-frequency divisors.
  if (auto* rf = f.tensors().find("rope_freqs.weight")) {
    if (rf->dtype != DType::F32 || rf->numel() != c.head_dim / 2)
      throw_model("{}: tensor 'rope_freqs.weight': expected f32 [{}], got {} {}", src,
                  c.head_dim / 2, dtype_name(rf->dtype), shape_str(rf->shape));
    auto* p = static_cast<const float*>(rf->data);
    c.rope_freq_factors.assign(p, p + c.head_dim / 2);
    c.rope_type = "llama3";
  }
  c.validate(src);
  return c;
}

}  // namespace wick
