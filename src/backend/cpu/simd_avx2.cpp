#include "backend/cpu/simd.h"
#define WICK_SIMD_NS avx2
#define WICK_SIMD_NAME "avx2"
#include "backend/cpu/simd_impl.inc"
