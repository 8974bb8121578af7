#include "cli/device_options.h"

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "engine/model_pool.h"

namespace wick::cli {

namespace {
struct Parsed {
  std::string device;
  bool gpu_f32 = false;
  double gpu_memory_fraction = 0.90;
  std::string quantize;
  std::string kv_cache_dtype;
  std::string rope_scaling;
  float rope_scale = 0.f;
  int64_t yarn_orig_ctx = 0;
  LoraFlags lora;
};
Parsed& parsed() {
  static Parsed p;
  return p;
}
}  // namespace

void add_device_options(CLI::App* cmd) {
  auto& p = parsed();
  cmd->add_option("--device", p.device,
                  "where the model runs: cpu, cuda or auto (env WICK_DEVICE, default auto: cuda "
                  "when a GPU is visible)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->add_flag(
      "--gpu-f32", p.gpu_f32,
      "on a GPU keep f32 weights and the KV cache in f32 (default: bf16 weights, f16 KV)");
  cmd->add_option("--gpu-memory-fraction", p.gpu_memory_fraction,
                  "share of the GPU's memory wick may use for weights and KV cache (default 0.9)")
      ->check(CLI::Range(0.05, 1.0));
  // the types and mixes of wick quantize (quant_plan_names)
  static const std::vector<std::string> kQuantizeTypes{
      "f32",  "f16",  "bf16", "q8_0",   "q4_0",   "q4_1",   "q5_0",   "q5_1",   "q2_k",   "q3_k",
      "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_m", "q5_k_m"};
  cmd->add_option("--quantize", p.quantize,
                  "quantize the f32/f16/bf16 matrices of the model at load (in memory, in "
                  "parallel): q8_0, q6_k, q5_k_m, q4_k_m, iq4_xs, q3_k_m, q2_k, q4_0, ... (the "
                  "types of wick quantize)")
      ->check(CLI::IsMember(kQuantizeTypes));
  cmd->add_option("--kv-cache-dtype", p.kv_cache_dtype,
                  "the KV cache's type: f32, f16 (half the memory), bf16 (CPU only: half the "
                  "memory; with AMX, attention on tiles in bf16) or q8_0 (head dims a multiple "
                  "of 32: 0.27 of f32's memory, 0.53 of f16's); default f32 on the CPU, f16 on a "
                  "GPU, f32 there with --gpu-f32 (the only type it takes)")
      ->envname("WICK_KV_CACHE_DTYPE")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  cmd->add_option("--rope-scaling", p.rope_scaling,
                  "RoPE scaling over the model's own: none, linear or yarn (with --rope-scale; "
                  "as llama.cpp's flags)")
      ->check(CLI::IsMember({"none", "linear", "yarn"}));
  cmd->add_option("--rope-scale", p.rope_scale,
                  "how far --rope-scaling stretches the trained context (e.g. 4: 32768 -> 131072)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--yarn-orig-ctx", p.yarn_orig_ctx,
                  "the context the model was trained at, for --rope-scaling yarn (default: the "
                  "model's)")
      ->check(CLI::PositiveNumber);
  add_lora_options(cmd, p.lora, "apply a LoRA adapter at load");
  // Models loaded through the pool use these options.
  cmd->parse_complete_callback([] { ModelPool::global().set_backend(backend_options()); });
}

BackendOptions backend_options() {
  const auto& p = parsed();
  BackendOptions o;
  std::string d = p.device;
  if (d.empty())
    if (const char* e = std::getenv("WICK_DEVICE"); e && *e) d = e;
  try {
    o.device = parse_device(d);
  } catch (const std::exception&) {
    throw std::runtime_error("WICK_DEVICE=" + d + ": expected cpu, cuda or auto");
  }
  o.gpu_f32 = p.gpu_f32;
  o.gpu_memory_fraction = p.gpu_memory_fraction;
  o.quantize = p.quantize;
  o.kv_cache_dtype = p.kv_cache_dtype;
  o.rope_scaling = p.rope_scaling;
  o.rope_scale = p.rope_scale;
  o.yarn_orig_ctx = p.yarn_orig_ctx;
  o.lora = p.lora.adapters();
  return o;
}

std::vector<std::pair<std::string, float>> LoraFlags::adapters() const {
  std::vector<std::pair<std::string, float>> out;
  for (const auto& path : paths) out.emplace_back(path, 1.f);
  out.insert(out.end(), scaled.begin(), scaled.end());
  return out;
}

void add_lora_options(CLI::App* cmd, LoraFlags& f, const std::string& verb) {
  cmd->add_option("--lora", f.paths,
                  verb +
                      " (repeatable): a GGUF adapter (llama.cpp's convert_lora_to_gguf.py) or a "
                      "PEFT folder (adapter_config.json, adapter_model.safetensors)")
      ->check(CLI::ExistingPath);
  cmd->add_option("--lora-scaled", f.scaled,
                  "PATH SCALE: as --lora, the adapter's scale multiplied by SCALE (repeatable)");
}

}  // namespace wick::cli
