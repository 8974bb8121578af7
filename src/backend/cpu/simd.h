// Innermost CPU kernels, compiled once per ISA (generic, AVX2, AVX-512) and
// chosen once at run time from what the processor supports.
#pragma once

#include <cstdint>

#include "io/dtype.h"

namespace wick::cpu {

struct SimdKernels {
  const char* isa;
  float (*dot)(const float* a, const float* b, int64_t n);
  // y[i] += a * x[i]
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  // Dequantizes n elements of a row into dst (any supported dtype).
  void (*dequant_row)(DType t, const void* src, float* dst, int64_t n);
  // dot(x, dequantized row w): bit-identical to dequant_row + dot, fused where
  // the ISA has a kernel for the type. buf holds n floats for the fallback.
  float (*dot_row)(DType t, const void* w, const float* x, int64_t n, float* buf);
};

const SimdKernels& simd();  // the best for this CPU; WICK_ISA=generic|avx2|avx512 overrides
const SimdKernels* simd_for(const char* isa);  // nullptr when not compiled in or unsupported here

}  // namespace wick::cpu
