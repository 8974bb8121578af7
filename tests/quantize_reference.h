// The scalar K-quant and IQ4 writers as they were before the lane-parallel
// ones (src/io/quantize_k.inc, quantize_iq4.inc), kept as the reference that
// test_quantize.cpp holds every kernel set to, byte for byte.
#pragma once

#include <cstdint>

namespace wick::quant_ref {

void quantize_row_q2_k(const float* src, void* dst, int64_t n);
void quantize_row_q3_k(const float* src, void* dst, int64_t n);
void quantize_row_q4_k(const float* src, void* dst, int64_t n);
void quantize_row_q5_k(const float* src, void* dst, int64_t n);
void quantize_row_q6_k(const float* src, void* dst, int64_t n);
void quantize_row_iq4_nl(const float* src, void* dst, int64_t n);
void quantize_row_iq4_xs(const float* src, void* dst, int64_t n);

}  // namespace wick::quant_ref
