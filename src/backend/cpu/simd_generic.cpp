#include "backend/cpu/simd.h"
#define WICK_SIMD_NS generic
#define WICK_SIMD_NAME "generic"
#include "backend/cpu/simd_impl.inc"
