// Which type each tensor of a model gets when wick writes it as a GGUF
// (`wick quantize`, `wick convert`, quantize-on-load). With llama.cpp's
// rules on (the default for `wick quantize`), the choices follow
// llama-quantize, so that files of the same name compare like for like:
//   - vectors (norms, biases) stay f32; MoE routers (ffn_gate_inp) stay f32;
//   - the output matrix, or the token embedding when it is tied to the
//     output, is q6_k for every quantized type but q8_0 (q8_0 when its rows
//     do not fit q6_k's 256-element blocks);
//   - q4_k_m / q5_k_m: attn_v and ffn_down are q6_k in the layers where
//     llama.cpp spends more bits (the first and last eighth of the layers
//     and every third layer between), the rest q4_k / q5_k;
//   - q2_k, q3_k_s, q3_k_m, q3_k_l, iq4_nl, iq4_xs: llama-quantize's mixes
//     of those names (Q2_K: attn_v q3_k, or q4_k with 4+ query heads per KV
//     head, ffn_down and attn_output q3_k; Q3_K_M: attn_v q5_k in layers 0-1
//     then q4_k, ffn_down q5_k in the first sixteenth of the layers then q4_k,
//     attn_output q4_k; Q3_K_L: attn_v, ffn_down, attn_output q5_k; IQ4_NL /
//     IQ4_XS: ffn_down q5_k in the first eighth, attn_v q5_k with 4+ query
//     heads per KV head; 8-expert models: attn_output q5_k but in Q3_K_L);
//   - 8-expert MoE models keep attn_k and attn_v at q8_0;
//   - a matrix whose rows do not fit the type's block falls back as in
//     llama.cpp: q2_k, q3_k -> q4_0, iq4_xs -> iq4_nl, q4_k -> q5_0,
//     q5_k -> q5_1, q6_k -> q8_0, then f16.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/dtype.h"

namespace wick {

// The llama-quantize mixture a plan follows beyond the rules every quantized
// type shares (output, MoE attention, routers, fallbacks).
enum class QuantMix {
  kNone,      // the base type throughout (q4_k, q5_k, q3_k, q8_0, ...)
  kMoreBits,  // q4_k_m, q5_k_m
  kQ2K,       // q2_k
  kQ3KS,      // q3_k_s
  kQ3KM,      // q3_k_m
  kQ3KL,      // q3_k_l
  kIQ4,       // iq4_nl, iq4_xs
};

struct QuantPlan {
  std::string name;         // as asked: "q4_k_m", "q8_0", ...
  DType base = DType::F16;  // the type of most matrices
  QuantMix mix = QuantMix::kNone;
  bool llama_rules = true;  // false: every matrix as `base` (f32 where it does not fit)

  // The type of one tensor of `shape` (outermost first) named as in GGUF.
  // `tied`: the model has no output matrix (the token embedding serves).
  // `n_gqa`: query heads per KV head, for the rules that look at it (q2_k,
  // iq4_nl, iq4_xs); 0 takes it from attn_v's shape as n_embd / its rows,
  // which is n_head / n_head_kv where n_head * head_dim = n_embd.
  DType type_of(const std::string& name, const std::vector<int64_t>& shape, int64_t n_layer,
                int64_t n_expert, bool tied, int64_t n_gqa = 0) const;
  // The GGUF general.file_type (llama_ftype) value of the plan.
  uint32_t file_type() const;
};

// f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k,
// iq4_nl, iq4_xs, q3_k_s, q3_k_m, q3_k_l, q4_k_m, q5_k_m.
std::optional<QuantPlan> quant_plan_from_name(std::string_view name);
// The names quant_plan_from_name accepts, comma-separated (for help and errors).
const char* quant_plan_names();

}  // namespace wick
