#include "model/quant_plan.h"

#include <cstdio>

#include "io/quantize.h"

namespace wick {

namespace {

bool ends_with(const std::string& s, std::string_view t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// llama.cpp's "use more bits" layers: first and last eighth, every third between.
bool more_bits_layer(int64_t i, int64_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

bool fits(DType t, int64_t n_in) {
  return n_in % traits(t).block_size == 0;
}

// llama-quantize's fallback for rows that do not fit t's blocks.
DType fallback(DType t) {
  switch (t) {
    case DType::Q2_K:
    case DType::Q3_K:
      return DType::Q4_0;
    case DType::IQ4_XS:
      return DType::IQ4_NL;
    case DType::Q4_K:
      return DType::Q5_0;
    case DType::Q5_K:
      return DType::Q5_1;
    case DType::Q6_K:
      return DType::Q8_0;
    default:
      return DType::F16;
  }
}

bool is_quantized(DType t) {
  return t != DType::F32 && t != DType::F16 && t != DType::BF16;
}

// Query heads per KV head: as given, or attn_v's n_embd / rows.
int64_t gqa_of(int64_t n_gqa, const std::vector<int64_t>& shape) {
  if (n_gqa > 0) return n_gqa;
  const int64_t rows = shape[shape.size() - 2];
  return rows > 0 ? shape.back() / rows : 1;
}

}  // namespace

DType QuantPlan::type_of(const std::string& name, const std::vector<int64_t>& shape,
                         int64_t n_layer, int64_t n_expert, bool tied, int64_t n_gqa) const {
  if (shape.size() < 2 || name.find("ffn_gate_inp") != std::string::npos) return DType::F32;
  const int64_t n_in = shape.back();
  if (!llama_rules) return fits(base, n_in) ? base : DType::F32;
  DType t = base;
  if (is_quantized(base)) {
    const bool output = name == "output.weight" || (tied && name == "token_embd.weight");
    int layer = -1;
    std::sscanf(name.c_str(), "blk.%d.", &layer);
    const bool more_bits = layer >= 0 && more_bits_layer(layer, n_layer);
    if (output) {
      if (!fits(base, n_in))
        t = DType::Q8_0;
      else if (base != DType::Q8_0)
        t = DType::Q6_K;
    } else if (ends_with(name, "attn_v.weight")) {
      switch (mix) {
        case QuantMix::kQ2K:
          t = gqa_of(n_gqa, shape) >= 4 ? DType::Q4_K : DType::Q3_K;
          break;
        case QuantMix::kQ3KM:
          t = layer >= 0 && layer < 2 ? DType::Q5_K : DType::Q4_K;
          break;
        case QuantMix::kQ3KL:
          t = DType::Q5_K;
          break;
        case QuantMix::kIQ4:
          if (gqa_of(n_gqa, shape) >= 4) t = DType::Q5_K;
          break;
        case QuantMix::kMoreBits:
          if (more_bits) t = DType::Q6_K;
          break;
        default:
          break;
      }
      if (n_expert == 8) t = DType::Q8_0;
    } else if (ends_with(name, "attn_k.weight")) {
      if (n_expert == 8) t = DType::Q8_0;
    } else if (name.find("ffn_down") != std::string::npos && layer >= 0) {
      switch (mix) {
        case QuantMix::kQ2K:
          t = DType::Q3_K;
          break;
        case QuantMix::kQ3KM:
          t = layer < n_layer / 16 ? DType::Q5_K : DType::Q4_K;
          break;
        case QuantMix::kQ3KL:
          t = DType::Q5_K;
          break;
        case QuantMix::kIQ4:  // llama.cpp's rule without an importance matrix
          if (layer < n_layer / 8) t = DType::Q5_K;
          break;
        case QuantMix::kMoreBits:
          if (more_bits) t = DType::Q6_K;
          break;
        default:
          break;
      }
    } else if (ends_with(name, "attn_output.weight")) {
      if (n_expert == 8) {
        if (mix == QuantMix::kQ2K || mix == QuantMix::kQ3KS || mix == QuantMix::kQ3KM ||
            mix == QuantMix::kIQ4)
          t = DType::Q5_K;
      } else if (mix == QuantMix::kQ2K) {
        t = DType::Q3_K;
      } else if (mix == QuantMix::kQ3KM) {
        t = DType::Q4_K;
      } else if (mix == QuantMix::kQ3KL) {
        t = DType::Q5_K;
      }
    }
  }
  while (!fits(t, n_in)) t = fallback(t);
  return t;
}

uint32_t QuantPlan::file_type() const {
  switch (mix) {
    case QuantMix::kMoreBits:
      return base == DType::Q4_K ? 15 : 17;
    case QuantMix::kQ3KS:
      return 11;
    case QuantMix::kQ3KM:
      return 12;
    case QuantMix::kQ3KL:
      return 13;
    default:
      break;
  }
  switch (base) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::Q4_0:
      return 2;
    case DType::Q4_1:
      return 3;
    case DType::Q8_0:
      return 7;
    case DType::Q5_0:
      return 8;
    case DType::Q5_1:
      return 9;
    case DType::Q2_K:
      return 10;
    case DType::Q3_K:
      return 11;  // Q3_K_S: all q3_k but the output
    case DType::Q4_K:
      return 14;  // Q4_K_S: all q4_k but the output
    case DType::Q5_K:
      return 16;  // Q5_K_S
    case DType::Q6_K:
      return 18;
    case DType::IQ4_NL:
      return 25;
    case DType::IQ4_XS:
      return 30;
    case DType::BF16:
      return 32;
    default:
      return 1;
  }
}

std::optional<QuantPlan> quant_plan_from_name(std::string_view name) {
  QuantPlan p;
  p.name = std::string(name);
  if (name == "q4_k_m" || name == "q5_k_m") {
    p.base = name == "q4_k_m" ? DType::Q4_K : DType::Q5_K;
    p.mix = QuantMix::kMoreBits;
    return p;
  }
  if (name == "q3_k_s" || name == "q3_k_m" || name == "q3_k_l") {
    p.base = DType::Q3_K;
    p.mix = name == "q3_k_s"   ? QuantMix::kQ3KS
            : name == "q3_k_m" ? QuantMix::kQ3KM
                               : QuantMix::kQ3KL;
    return p;
  }
  auto t = dtype_from_name(name);
  if (!t || !can_quantize(*t)) return std::nullopt;
  p.base = *t;
  // llama-quantize's Q2_K, IQ4_NL and IQ4_XS are mixes of those names
  if (*t == DType::Q2_K) p.mix = QuantMix::kQ2K;
  if (*t == DType::IQ4_NL || *t == DType::IQ4_XS) p.mix = QuantMix::kIQ4;
  return p;
}

const char* quant_plan_names() {
  return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, "
         "iq4_xs, q3_k_s, q3_k_m, q3_k_l, q4_k_m, q5_k_m";
}

}  // namespace wick
