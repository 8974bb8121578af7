#include "backend/cpu/simd.h"
#define WICK_SIMD_NS avx512bf16
#define WICK_SIMD_NAME "avx512bf16"
#include "backend/cpu/simd_impl.inc"
