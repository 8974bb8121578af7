// The q8_0 KV cache's values on the device (kernels.h's KvLayer, Q8): how
// the writers quantize a block of 32 and how attention widens it again.
#pragma once

#include "backend/cuda/device.cuh"

namespace wick::cuda {

// The scale d = amax / 127 of the block of 32 values a warp holds (lane i
// value i), and 1 / d (0 for a block of zeros), as the CPU's
// quantize_row_q8_0 computes them: IEEE divisions, no contraction.
__device__ __forceinline__ float2 q8_scale(float x) {
  float amax = fabsf(x);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, off));
  const float d = __fdiv_rn(amax, 127.f);
  return {d, d != 0.f ? __fdiv_rn(1.f, d) : 0.f};
}

// Quantizes one block of 32 values, lane i holding value i (a whole warp),
// into q[0..31] and *d with the bits of the CPU's quantize_row_q8_0: q = x
// (1 / d) rounded half away from zero, d stored as f16 (the q from the f32 d).
__device__ __forceinline__ void q8_store(float x, int lane, int8_t* q, __half* d) {
  const float2 s = q8_scale(x);
  q[lane] = int8_t(roundf(__fmul_rn(x, s.y)));
  if (lane == 0) *d = __float2half_rn(s.x);
}

// The value a block of the cache holds for x (x quantized, then widened as
// attention widens it): for measuring how far new K/V lie from the cache.
__device__ __forceinline__ float q8_round_trip(float x) {
  const float2 s = q8_scale(x);
  return __fmul_rn(roundf(__fmul_rn(x, s.y)), __half2float(__float2half_rn(s.x)));
}

// Element i of slot row `slot` of a Q8 layer (q, d: its two planes), widened
// to f32: q d, exact (8 by 11 significant bits).
__device__ __forceinline__ float q8_load(const int8_t* q, const __half* d, size_t slot, int kv_dim,
                                         int i) {
  return __fmul_rn(float(q[slot * kv_dim + i]), __half2float(d[(slot * kv_dim + i) / 32]));
}

// 8 consecutive elements from i (a multiple of 8) of slot row `slot`, as f16
// (each q d rounded once): one 8-byte load of q and one scale. (A layer's q
// plane starts 8-byte aligned unless its slots times kv_dim / 32 is not a
// multiple of 4: then four 2-byte loads, the layer's branch alike in every
// thread.)
__device__ __forceinline__ uint4 q8_load8_f16(const int8_t* q, const __half* d, size_t slot,
                                              int kv_dim, int i) {
  const size_t at = slot * size_t(kv_dim) + size_t(i);
  uint2 raw;
  if ((reinterpret_cast<uintptr_t>(q) & 7) == 0) {
    raw = *reinterpret_cast<const uint2*>(q + at);
  } else {
    const auto* h = reinterpret_cast<const uint16_t*>(q + at);
    raw = make_uint2(h[0] | uint32_t(h[1]) << 16, h[2] | uint32_t(h[3]) << 16);
  }
  const float s = __half2float(d[at / 32]);
  uint32_t h[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t w = j < 2 ? raw.x : raw.y;
    const int b = 2 * (j % 2);
    const float lo = float(int8_t(w >> (8 * b))), hi = float(int8_t(w >> (8 * b + 8)));
    h[j] = pack_f16(__fmul_rn(lo, s), __fmul_rn(hi, s));
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

}  // namespace wick::cuda
