// The searching writers (K-quants, IQ4) compiled once per ISA (generic,
// AVX2, AVX-512; src/io/quantize_isa.inc) and chosen at run time like the
// CPU kernels (backend/cpu/simd.h). They search several sub-blocks side by
// side, one per SIMD lane, each lane doing the scalar search's operations in
// the scalar order: every kernel set writes the same bytes.
#pragma once

#include <cstdint>

namespace wick {

struct QuantKernels {
  const char* isa;
  using RowWriter = void (*)(const float* src, void* dst, int64_t n);
  RowWriter q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs;
};

// The best for this CPU; WICK_ISA (generic, avx2, avx512, avx512bf16, amx) picks
// another where this CPU runs it (avx512bf16, amx: the avx512 writers).
const QuantKernels& quant_kernels();
// nullptr when not compiled in or not supported here.
const QuantKernels* quant_kernels_for(const char* isa);

}  // namespace wick
