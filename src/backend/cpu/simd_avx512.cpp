#include "backend/cpu/simd.h"
#define WICK_SIMD_NS avx512
#define WICK_SIMD_NAME "avx512"
#include "backend/cpu/simd_impl.inc"
