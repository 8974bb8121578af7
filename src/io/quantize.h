// Quantization of f32 rows into the GGML block types wick writes (the
// inverse of dequantize_row_ref). Legacy types (q4_0 ... q8_0) round with
// their block's absolute maximum or min/max, as the format defines them;
// K-quants search each sub-block's scale and minimum for the least squared
// error before packing the 4-, 6- or 8-bit sub-block scales; IQ4_NL / IQ4_XS
// search each block's scale over their 16 non-linear levels.
#pragma once

#include <cmath>
#include <cstdint>

#include "io/dtype.h"

namespace wick {

// Whether quantize_row can write type t (f32, f16, bf16, q4_0, q4_1, q5_0,
// q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs).
bool can_quantize(DType t);

// Writes n floats (a whole number of blocks of t) as type t into dst.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// The per-type writers (quantize_legacy.cpp; the K-quants and IQ4 in
// quantize_k.inc / quantize_iq4.inc, per ISA: quantize_kernels.h).
void quantize_row_q4_0(const float* src, void* dst, int64_t n);
void quantize_row_q4_1(const float* src, void* dst, int64_t n);
void quantize_row_q5_0(const float* src, void* dst, int64_t n);
void quantize_row_q5_1(const float* src, void* dst, int64_t n);
void quantize_row_q2_k(const float* src, void* dst, int64_t n);
void quantize_row_q3_k(const float* src, void* dst, int64_t n);
void quantize_row_q4_k(const float* src, void* dst, int64_t n);
void quantize_row_q5_k(const float* src, void* dst, int64_t n);
void quantize_row_q6_k(const float* src, void* dst, int64_t n);
void quantize_row_iq4_nl(const float* src, void* dst, int64_t n);
void quantize_row_iq4_xs(const float* src, void* dst, int64_t n);

// The element of x[0..n) of largest magnitude, with its sign (the first of
// ties): symmetric types map it onto their most negative level.
inline float signed_amax(const float* x, int n) {
  float m = 0.f, a = 0.f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > a) {
      a = std::fabs(x[i]);
      m = x[i];
    }
  return m;
}

}  // namespace wick
