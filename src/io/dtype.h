// Element types of stored tensors. Values are GGML's type ids so that GGUF
// tensor infos map directly; safetensors dtypes map onto the float ones. The
// FP8 types are wick's own ids, outside GGML's range: safetensors only, and
// not computed with (model/fp8.h dequantizes them with their scales at load).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace wick {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ4_NL = 20,
  IQ4_XS = 23,
  BF16 = 30,
  F8_E4M3 = 0x1000,
  F8_E5M2 = 0x1001,
};

struct DTypeTraits {
  const char* name;
  int64_t block_size;  // elements per block (1 for plain floats)
  size_t block_bytes;  // bytes per block
  bool supported;      // wick computes with it (kernels, dequantize_row_ref)
};

// Traits of a GGML type id; nullopt for ids wick does not know at all.
std::optional<DTypeTraits> dtype_traits(uint32_t ggml_type);
const DTypeTraits& traits(DType t);  // t must be a known type
inline bool is_fp8(DType t) {
  return t == DType::F8_E4M3 || t == DType::F8_E5M2;
}
std::string dtype_name(uint32_t ggml_type);
inline const char* dtype_name(DType t) {
  return traits(t).name;
}
std::optional<DType> dtype_from_name(std::string_view name);  // "q8_0", "bf16", ...

// Bytes taken by n elements (n must be a multiple of the block size).
size_t row_bytes(DType t, int64_t n);

// Scalar float16 / bfloat16 conversions (round to nearest even).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_bf16(float f);

// Dequantizes n elements (a whole number of blocks) of type t into dst.
// Reference scalar path, also used by tests; the SIMD kernels have their own.
void dequantize_row_ref(DType t, const void* src, float* dst, int64_t n);

// Quantizes n floats into Q8_0 blocks (used by the GGUF writer).
void quantize_row_q8_0(const float* src, void* dst, int64_t n);

}  // namespace wick
