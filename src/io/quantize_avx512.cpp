#define WICK_QUANT_NS quant_avx512
#define WICK_QUANT_NAME "avx512"
#include "io/quantize_isa.inc"
