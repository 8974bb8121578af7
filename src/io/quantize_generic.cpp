#define WICK_QUANT_NS quant_generic
#define WICK_QUANT_NAME "generic"
#include "io/quantize_isa.inc"
