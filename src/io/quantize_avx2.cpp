#define WICK_QUANT_NS quant_avx2
#define WICK_QUANT_NAME "avx2"
#include "io/quantize_isa.inc"
