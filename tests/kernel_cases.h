// What the CPU kernel tests sweep: every stored weight type and every ISA's
// kernel set; bit patterns for exact comparisons.
#pragma once

#include <cstdint>
#include <cstring>

#include "io/dtype.h"

namespace wick::test {

inline constexpr DType kAllTypes[] = {DType::F32,  DType::F16,    DType::BF16,  DType::Q8_0,
                                      DType::Q4_0, DType::Q4_1,   DType::Q5_0,  DType::Q5_1,
                                      DType::Q4_K, DType::Q5_K,   DType::Q6_K,  DType::Q2_K,
                                      DType::Q3_K, DType::IQ4_NL, DType::IQ4_XS};
inline constexpr const char* kIsas[] = {"generic", "avx2", "avx512", "avx512bf16"};
// The matrix multiply's sets: the same and "amx" (avx512bf16's kernels with the BF16 path's
// products on AMX tiles; the other kernels are avx512bf16's own, tested as that set).
inline constexpr const char* kGemmIsas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace wick::test
