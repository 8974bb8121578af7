#include "model/lora.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "io/error.h"

namespace wick {

namespace {

namespace fs = std::filesystem;

// The projections an adapter may target, by their names in each format.
struct Target {
  const char* gguf;
  const char* hf;
  Weight LayerWeights::*weight;
  bool rope_rows;  // q and k: rows interleaved in llama-family GGUF files
};
constexpr Target kTargets[] = {
    {"attn_q", "self_attn.q_proj", &LayerWeights::wq, true},
    {"attn_k", "self_attn.k_proj", &LayerWeights::wk, true},
    {"attn_v", "self_attn.v_proj", &LayerWeights::wv, false},
    {"attn_output", "self_attn.o_proj", &LayerWeights::wo, false},
    {"ffn_gate", "mlp.gate_proj", &LayerWeights::w_gate, false},
    {"ffn_up", "mlp.up_proj", &LayerWeights::w_up, false},
    {"ffn_down", "mlp.down_proj", &LayerWeights::w_down, false},
};
constexpr const char* kTargetsHelp =
    "wick applies LoRA to the attention (q, k, v, o) and dense MLP (gate, up, down) projections";

// One adapter's pair on one projection, in f32.
struct Term {
  std::vector<float> a, b;  // [rank, n_in], [n_out, rank]
  int64_t rank = 0;
  float scale = 1.f;
};
using Terms = std::map<std::pair<int64_t, size_t>, std::vector<Term>>;  // (layer, target)

// A tensor pair found in a file, before it is checked.
struct Found {
  const TensorView* a = nullptr;
  const TensorView* b = nullptr;
};

// "<prefix>N.<name><suffix>" -> (N, target index), or nullopt.
std::optional<std::pair<int64_t, size_t>> parse_module(const std::string& s,
                                                       const std::string& prefix, bool gguf,
                                                       const std::string& suffix) {
  if (s.rfind(prefix, 0) != 0) return std::nullopt;
  size_t i = prefix.size(), j = i;
  while (j < s.size() && j - i < 9 && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
  if (j == i || j >= s.size() || s[j] != '.') return std::nullopt;
  const int64_t layer = std::stoll(s.substr(i, j - i));
  const std::string rest = s.substr(j + 1);
  for (size_t t = 0; t < std::size(kTargets); ++t)
    if (rest == std::string(gguf ? kTargets[t].gguf : kTargets[t].hf) + suffix)
      return std::make_pair(layer, t);
  return std::nullopt;
}

std::vector<float> to_f32(const TensorView& t) {
  if (!traits(t.dtype).supported)
    throw_model("{}: tensor '{}' has type {}, which wick does not read", t.file, t.name,
                dtype_name(t.dtype));
  std::vector<float> out(size_t(t.numel()));
  dequantize_row_ref(t.dtype, t.data, out.data(), t.numel());
  return out;
}

// Checks one pair against the model's projection and adds it to `terms`.
// scale_of: the pair's scale from its rank.
void add_term(const Model& m, const std::string& module, const Found& f, int64_t layer,
              size_t target, bool interleaved, const std::function<float(int64_t)>& scale_of,
              Terms& terms) {
  const std::string& file = f.a->file;
  if (layer >= m.config.n_layer)
    throw_model("{}: '{}' is for layer {}, but {} has {} layers (an adapter for another model?)",
                file, module, layer, m.path, m.config.n_layer);
  const Target& tg = kTargets[target];
  const Weight& w = m.weights.layers[size_t(layer)].*tg.weight;
  if (w.empty())
    throw_model("{}: '{}' targets layer {}'s dense MLP, which in {} is a mixture of experts ({})",
                file, module, layer, m.path, kTargetsHelp);
  const int64_t rank = f.a->shape.empty() ? 0 : f.a->shape[0];
  if (f.a->shape.size() != 2 || rank <= 0 || f.a->shape[1] != w.n_in)
    throw_model("{}: tensor '{}' has shape {}, expected [rank, {}] (an adapter for another model?)",
                file, f.a->name, shape_str(f.a->shape), w.n_in);
  if (f.b->shape != std::vector<int64_t>{w.n_out, rank})
    throw_model("{}: tensor '{}' has shape {}, expected [{}, {}] (an adapter for another model?)",
                file, f.b->name, shape_str(f.b->shape), w.n_out, rank);
  Term t{to_f32(*f.a), to_f32(*f.b), rank, scale_of(rank)};
  if (interleaved && tg.rope_rows) {  // back to HF's row order, as the base's rows
    std::vector<float> hf(t.b.size());
    for (int64_t r = 0; r < w.n_out; ++r)
      std::memcpy(&hf[size_t(r * rank)], &t.b[size_t(gguf_stored_row(r, m.config.head_dim) * rank)],
                  size_t(rank) * 4);
    t.b = std::move(hf);
  }
  terms[{layer, target}].push_back(std::move(t));
}

void read_gguf(const Model& m, const std::string& path, float scale, Terms& terms) {
  GgufFile f(path);
  const std::string type = f.get_str("general.type").value_or("");
  if (type != "adapter")
    throw_model("{}: not a LoRA adapter (general.type is '{}', expected 'adapter')", path,
                type.empty() ? "unset" : type);
  const std::string kind = f.get_str("adapter.type").value_or("");
  if (kind != "lora")
    throw_model("{}: adapter.type is '{}'; wick reads 'lora' adapters", path, kind);
  if (f.get("adapter.alora.invocation_tokens"))
    throw_model("{}: an activated LoRA (aLoRA); wick applies adapters to every token", path);
  const std::string arch = f.get_str("general.architecture").value_or("");
  if (arch != gguf_arch(m.config.arch))
    throw_model("{}: an adapter for '{}' models, but {} is '{}'", path, arch, m.path,
                gguf_arch(m.config.arch));
  const float alpha = float(f.get_float("adapter.lora.alpha").value_or(0.0));
  std::map<std::string, Found> pairs;
  for (const auto& [name, t] : f.tensors().all()) {
    const bool is_a = name.ends_with(".lora_a"), is_b = name.ends_with(".lora_b");
    if (!is_a && !is_b) throw_model("{}: tensor '{}' is neither a lora_a nor a lora_b", path, name);
    (is_a ? pairs[name.substr(0, name.size() - 7)].a : pairs[name.substr(0, name.size() - 7)].b) =
        &t;
  }
  const bool interleaved = gguf_rows_interleaved(m.config.arch);
  for (const auto& [module, found] : pairs) {
    if (!found.a || !found.b)
      throw_model("{}: '{}' has {} without {}", path, module, found.a ? "lora_a" : "lora_b",
                  found.a ? "lora_b" : "lora_a");
    auto where = parse_module(module, "blk.", true, ".weight");
    if (!where) throw_model("{}: '{}': {}", path, module, kTargetsHelp);
    add_term(
        m, module, found, where->first, where->second, interleaved,
        [&](int64_t rank) { return alpha != 0.f ? scale * alpha / float(rank) : scale; }, terms);
  }
}

void read_peft(const Model& m, const std::string& dir, float scale, Terms& terms) {
  const fs::path cfg_path = fs::path(dir) / "adapter_config.json";
  if (!fs::exists(cfg_path))
    throw_io("{}: no adapter_config.json in this folder (a PEFT adapter's)", dir);
  nlohmann::json cfg;
  int64_t r = 0;
  double alpha = 8;  // PEFT's default
  bool rslora = false;
  try {
    std::ifstream in(cfg_path);
    cfg = nlohmann::json::parse(in);
    if (cfg.value("peft_type", std::string("LORA")) != "LORA")
      throw_model("{}: peft_type '{}'; wick reads LORA adapters", cfg_path.string(),
                  cfg["peft_type"].get<std::string>());
    auto refuse = [&](const char* key, const std::string& why) {
      throw_model("{}: {} ({}) is not supported", cfg_path.string(), key, why);
    };
    if (cfg.value("use_dora", false)) refuse("use_dora", "DoRA's magnitude vectors");
    if (cfg.value("fan_in_fan_out", false)) refuse("fan_in_fan_out", "transposed weights");
    if (cfg.contains("bias") && cfg["bias"] != "none") refuse("bias", "trained biases");
    for (const char* k : {"rank_pattern", "alpha_pattern"})
      if (cfg.contains(k) && cfg[k].is_object() && !cfg[k].empty())
        refuse(k, "ranks or alphas per module");
    r = cfg.at("r").get<int64_t>();
    if (cfg.contains("lora_alpha") && !cfg["lora_alpha"].is_null())
      alpha = cfg["lora_alpha"].get<double>();
    rslora = cfg.value("use_rslora", false);
  } catch (const nlohmann::json::exception& e) {
    throw_io("{}: not a readable adapter config: {}", cfg_path.string(), e.what());
  }
  if (r <= 0) throw_model("{}: r must be positive (got {})", cfg_path.string(), r);
  const fs::path st = fs::path(dir) / "adapter_model.safetensors";
  if (!fs::exists(st)) {
    if (fs::exists(fs::path(dir) / "adapter_model.bin"))
      throw_model(
          "{}: adapter_model.bin is a PyTorch pickle, which wick does not read; save the "
          "adapter as safetensors (PEFT's default)",
          dir);
    throw_io("{}: no adapter_model.safetensors in this folder", dir);
  }
  TensorSet ts;
  read_safetensors(st.string(), ts);
  std::map<std::string, Found> pairs;
  for (const auto& [name, t] : ts.all()) {
    const bool is_a = name.ends_with(".lora_A.weight"), is_b = name.ends_with(".lora_B.weight");
    if (!is_a && !is_b) throw_model("{}: tensor '{}': {}", st.string(), name, kTargetsHelp);
    (is_a ? pairs[name.substr(0, name.size() - 14)].a : pairs[name.substr(0, name.size() - 14)].b) =
        &t;
  }
  const float s = scale * float(alpha / (rslora ? std::sqrt(double(r)) : double(r)));
  for (const auto& [module, found] : pairs) {
    if (!found.a || !found.b)
      throw_model("{}: '{}' has {} without {}", st.string(), module, found.a ? "lora_A" : "lora_B",
                  found.a ? "lora_B" : "lora_A");
    // PEFT's wrapper prefixes the base model's own module path
    std::string path = module;
    if (path.rfind("base_model.model.", 0) == 0) path = path.substr(17);
    auto where = parse_module(path, "model.layers.", false, "");
    if (!where) throw_model("{}: '{}': {}", st.string(), module, kTargetsHelp);
    if (found.a->shape.size() == 2 && found.a->shape[0] != r)
      throw_model("{}: '{}' has rank {}, but the config's r is {}", st.string(), module,
                  found.a->shape[0], r);
    add_term(
        m, module, found, where->first, where->second, false, [&](int64_t) { return s; }, terms);
  }
}

}  // namespace

void add_lora_row(const LoraDelta& d, int64_t r, float* row) {
  std::vector<float> b(size_t(d.b.n_in)), a(size_t(d.a.n_in));
  dequantize_row_ref(d.b.dtype, d.b.row(r), b.data(), d.b.n_in);
  for (int64_t j = 0; j < d.a.n_out; ++j) {
    dequantize_row_ref(d.a.dtype, d.a.row(j), a.data(), d.a.n_in);
    const float bj = b[size_t(j)] * d.scale.f32()[j];
    for (int64_t i = 0; i < d.a.n_in; ++i) row[i] += bj * a[size_t(i)];
  }
}

const LoraDelta* lora_of_gguf_tensor(const Model& m, const std::string& name) {
  auto where = parse_module(name, "blk.", true, ".weight");
  if (!where || where->first >= int64_t(m.weights.layers.size())) return nullptr;
  return (m.weights.layers[size_t(where->first)].*kTargets[where->second].weight).lora;
}

namespace {

// Reads the adapters (path, scale) into `terms`; throws naming a file that
// does not fit or holds no LoRA tensor.
void read_adapters(const Model& m, std::span<const std::pair<std::string, float>> adapters,
                   Terms& terms) {
  for (const auto& [path, scale] : adapters) {
    if (!std::isfinite(scale)) throw_model("{}: the adapter's scale must be finite", path);
    auto n_terms = [&] {
      size_t n = 0;
      for (const auto& [k, v] : terms) n += v.size();
      return n;
    };
    const size_t before = n_terms();
    if (fs::is_directory(path))
      read_peft(m, path, scale, terms);
    else if (path.ends_with(".safetensors") && fs::exists(path))  // a PEFT folder's file
      read_peft(m, fs::path(path).parent_path().string(), scale, terms);
    else if (fs::exists(path))
      read_gguf(m, path, scale, terms);
    else
      throw_io("{}: no such adapter file or folder", path);
    if (n_terms() == before) throw_model("{}: the adapter has no LoRA tensors", path);
  }
}

// A matrix in `store` (the model's memory): f16 when every value is one (an
// adapter stored in f16, or bf16 within f16's range: exact), else f32.
Weight term_matrix(std::vector<std::vector<uint8_t>>& store, const std::vector<float>& v,
                   int64_t n_out, int64_t n_in) {
  const bool f16 =
      std::all_of(v.begin(), v.end(), [](float x) { return f16_to_f32(f32_to_f16(x)) == x; });
  auto& bytes = store.emplace_back(v.size() * (f16 ? 2 : 4));
  if (f16) {
    auto* h = reinterpret_cast<uint16_t*>(bytes.data());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f16(v[i]);
  } else {
    std::memcpy(bytes.data(), v.data(), v.size() * 4);
  }
  return Weight{f16 ? DType::F16 : DType::F32, n_out, n_in, bytes.data()};
}

// One term per projection for `adapter`: the files' pairs side by side along
// the rank, each one's scale on its rank rows; appended to the weight's list
// of terms. A named adapter's memory is its own (freed with it). Returns the
// parameters added.
int64_t add_deltas(Model& m, const Terms& terms, int32_t adapter) {
  auto& store = adapter == 0 ? m.owned : m.adapter_bytes[adapter];
  int64_t n_params = 0;
  for (const auto& [key, list] : terms) {
    Weight& w = m.weights.layers[size_t(key.first)].*kTargets[key.second].weight;
    int64_t rank = 0;
    for (const Term& t : list) rank += t.rank;
    std::vector<float> a, b(size_t(w.n_out * rank)), scale;
    int64_t at = 0;
    for (const Term& t : list) {
      a.insert(a.end(), t.a.begin(), t.a.end());
      scale.insert(scale.end(), size_t(t.rank), t.scale);
      for (int64_t o = 0; o < w.n_out; ++o)
        for (int64_t j = 0; j < t.rank; ++j)
          b[size_t(o * rank + at + j)] = t.b[size_t(o * t.rank + j)];
      at += t.rank;
    }
    auto* s = reinterpret_cast<float*>(store.emplace_back(scale.size() * 4).data());
    std::memcpy(s, scale.data(), scale.size() * 4);
    const LoraDelta* d = &m.lora.emplace_back(LoraDelta{term_matrix(store, a, rank, w.n_in),
                                                        term_matrix(store, b, w.n_out, rank),
                                                        Weight{DType::F32, 1, rank, s}, adapter});
    const LoraDelta** tail = &w.lora;
    while (*tail) tail = const_cast<const LoraDelta**>(&(*tail)->next);
    *tail = d;
    n_params += rank * (w.n_in + w.n_out);
  }
  return n_params;
}

}  // namespace

void apply_lora(Model& m, std::span<const std::pair<std::string, float>> adapters) {
  if (adapters.empty()) return;
  if (!m.lora.empty()) throw_model("{}: LoRA adapters are applied once, at load", m.path);
  Terms terms;
  read_adapters(m, adapters, terms);
  for (const auto& [path, scale] : adapters) m.adapters.push_back(path);
  const int64_t n_params = add_deltas(m, terms, 0);
  spdlog::info("{}: {} LoRA adapter(s) on {} projections, {} parameters", m.path, adapters.size(),
               terms.size(), n_params);
}

int32_t add_named_lora(Model& m, const std::string& name,
                       std::span<const std::pair<std::string, float>> adapters, int32_t number) {
  if (name.empty()) throw_model("{}: a named adapter needs a name", m.path);
  if (std::find(m.adapter_names.begin(), m.adapter_names.end(), name) != m.adapter_names.end())
    throw_model("{}: two adapters are named '{}'", m.path, name);
  const int32_t slot = number ? number : int32_t(m.adapter_names.size()) + 1;
  if (slot <= int32_t(m.adapter_names.size()) && !m.adapter_names[size_t(slot - 1)].empty())
    throw std::logic_error(fmt::format("{}: adapter number {} is taken", m.path, slot));
  Terms terms;
  read_adapters(m, adapters, terms);
  if (slot > int32_t(m.adapter_names.size()))
    m.adapter_names.resize(size_t(slot));  // numbers skipped: "" (none)
  m.adapter_names[size_t(slot - 1)] = name;
  const int64_t n_params = add_deltas(m, terms, slot);
  spdlog::info("{}: LoRA adapter '{}' ({}) on {} projections, {} parameters", m.path, name,
               adapters.front().first, terms.size(), n_params);
  return slot;
}

void remove_named_lora(Model& m, int32_t adapter) {
  if (adapter <= 0) throw std::logic_error("remove_named_lora: adapter 0 is every row's");
  for (auto& l : m.weights.layers)
    for (const Target& t : kTargets) unlink_lora(l.*t.weight, adapter);
  m.lora.remove_if([&](const LoraDelta& d) { return d.adapter == adapter; });
  m.adapter_bytes.erase(adapter);
  if (adapter <= int32_t(m.adapter_names.size())) m.adapter_names[size_t(adapter - 1)].clear();
}

}  // namespace wick
