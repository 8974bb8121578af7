// HF FP8 checkpoints: linear weights stored as float8 (e4m3 or e5m2) with
// their scales, as vLLM and transformers read them (Qwen3-*-FP8 and
// DeepSeek's "fp8" with 128 x 128 blocks, compressed-tensors' and fbgemm's
// per-tensor or per-channel scales). wick dequantizes them to bf16 once at
// load, so every kernel, backend and `--quantize` takes them as a bf16 model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "io/tensor.h"

namespace wick {

// What config.json says of the checkpoint's scales: their blocks' size.
struct Fp8Scheme {
  int64_t block_rows = 0;  // weight_block_size, 0 when it gives none
  int64_t block_cols = 0;
};

// config.json's quantization_config. Throws ModelError for a method wick
// cannot load (GPTQ, AWQ, bitsandbytes, ...), naming it and what to do.
Fp8Scheme fp8_scheme_from_hf(const nlohmann::json& config, const std::string& where);

// One float8 code as a float (NaN for e4m3's 0x7f/0xff and e5m2's infinities
// and NaNs, which no weight may hold).
float fp8_to_f32(DType t, uint8_t code);

// The names an FP8 weight's scale goes by, in the order they are looked up:
// "<weight>_scale_inv" (the "fp8" method: w = q * scale_inv) and
// "<weight>_scale" (compressed-tensors, fbgemm: w = q * scale).
inline std::string fp8_scale_inv_name(const std::string& weight) {
  return weight + "_scale_inv";
}
inline std::string fp8_scale_name(const std::string& weight) {
  return weight + "_scale";
}

// Dequantizes the [n_out, n_in] FP8 weight `w` into n_out x n_in bf16
// values: each code as a float times its scale (one for the tensor, one a
// row, or one a block of the scheme's size, by the scale's shape), rounded
// to bf16. Throws ModelError for a scale of another shape or a non-finite
// scale, and for a NaN or infinite code.
void dequantize_fp8(const TensorView& w, const TensorView& scale, const Fp8Scheme& scheme,
                    uint16_t* out);

}  // namespace wick
