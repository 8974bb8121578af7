// Device helpers shared by the matmul kernels (matmul.cu, matmul_tiled.cu):
// how a lane's 16 bytes of a weight row become bf16 fragments. Both kernels
// use these so that they compute the same products in the same order.
#pragma once

#include "backend/cuda/device.cuh"
#include "backend/cuda/gpu_weight.h"

namespace wick::cuda {

template <Fmt F>
constexpr int kE = elems_per_load(F);

// The index of the scale (and min) of element k of row `row`: groups are a
// power of two (16 or 32, repack.cpp), so shifts, not two signed divisions
// by a run-time value (~50 instructions a weight load in the decode loop).
__device__ __forceinline__ size_t group_index(const GpuWeight& w, int row, int k) {
  const int shift = __ffs(w.group) - 1;
  return size_t(row) * size_t(w.k_pad >> shift) + size_t(k >> shift);
}

// The min of group gi of w, whose scale is s: stored, 8 s (min8: Q4_0's,
// the stored value's bits), or none.
__device__ __forceinline__ float group_min(const GpuWeight& w, size_t gi, float s) {
  return w.min ? __ldg(w.min + gi) : w.min8 ? 8.f * s : 0.f;
}

// Signed byte i of a word, given with every byte's sign bit flipped (q +
// 128), as a float without the SM's conversion unit (16 a clock, with the
// bf16 packing the 8-bit products' limit): it becomes the low byte of the
// float 2^23 + q + 128, and one exact subtraction leaves q.
__device__ __forceinline__ float i8_to_float(uint32_t flipped, int i) {
  return __uint_as_float(__byte_perm(flipped, 0x4b000000u, 0x7650 + i)) - 8388736.f;
}

// Byte i of a word (0-255) as a float, as i8_to_float does it.
__device__ __forceinline__ float u8_to_float(uint32_t word, int i) {
  return __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7650 + i)) - 8388608.f;
}

// One word of 4-bit weights (bytes i: elements 2i, 2i + 1 in the low and
// high nibble) as 4 bf16 pairs: two mma steps' B registers. decode<U4> is
// four of these; the tiled kernel decodes a word right before its steps.
// (The nibbles become floats by u8_to_float: float(n)'s values, without the
// conversion unit.)
// FUSED: q s - m as one FMA, for weights whose m is 8 s (min8, Q4_0's): a
// 4-bit type's scale has at most 17 significant bits (an f16 d, or d times
// a 6-bit sub-scale), so q s and (q - 8) s are exact in a float, and the
// FMA's one rounding gives dq's bits (CudaRepack.Min8WeightsDequantizeExactlyInOneFma).
template <bool FUSED = false>
__device__ __forceinline__ void decode_u4_word(uint32_t word, float s, float m, uint32_t (&b)[4]) {
  const uint32_t lo = word & 0x0f0f0f0fu, hi = (word >> 4) & 0x0f0f0f0fu;
  const auto v = [&](float q) { return FUSED ? __fmaf_rn(q, s, -m) : dq(q, s, m); };
#pragma unroll
  for (int i = 0; i < 4; ++i) b[i] = pack_bf16(v(u8_to_float(lo, i)), v(u8_to_float(hi, i)));
}

// The E weights of one lane's load as E/2 bf16 pairs. MIN false (8-bit
// weights stored without a min: Q8_0, Q6_K, Q5_0, Q3_K, IQ4_*; repack.cpp):
// the min's subtraction left out, the same bits (q s - (+0) is q s). MIN8
// (4-bit weights whose min is 8 s): decode_u4_word's one FMA, the same bits.
template <Fmt F, bool MIN = true, bool MIN8 = false>
__device__ __forceinline__ void decode(const uint4 raw, float s, float m,
                                       uint32_t (&b)[kE<F> / 2]) {
  const uint32_t r[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (F == Fmt::BF16) {
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = r[j];
  } else if constexpr (F == Fmt::F16) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&r[j]));
      b[j] = pack_bf16(f.x, f.y);
    }
  } else if constexpr (F == Fmt::I8) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t flipped = r[j / 2] ^ 0x80808080u;
      const float lo = i8_to_float(flipped, 2 * (j % 2)),
                  hi = i8_to_float(flipped, 2 * (j % 2) + 1);
      if constexpr (MIN)
        b[j] = pack_bf16(dq(lo, s, m), dq(hi, s, m));
      else
        b[j] = pack_bf16(__fmul_rn(lo, s), __fmul_rn(hi, s));
    }
  } else {  // U4: byte i holds elements 2i (low nibble) and 2i + 1
#pragma unroll
    for (int v = 0; v < 4; ++v)
      decode_u4_word<MIN8>(r[v], s, m, *reinterpret_cast<uint32_t(*)[4]>(&b[4 * v]));
  }
}

// The launch-uniform forms of the mins of a product's weights (w, and for
// gate/up u as well), for the decoders that keep dq's bits with less work:
// none at all (decode<F, false>, 8-bit weights) or 8 s in every group
// (decode_u4_word<true>, 4-bit weights).
struct MinForm {
  bool none, eight;
};
template <bool GATED>
__device__ __forceinline__ MinForm min_form(const GpuWeight& w, const GpuWeight& u) {
  return {!w.min && !w.min8 && (!GATED || (!u.min && !u.min8)), w.min8 && (!GATED || u.min8)};
}

template <Fmt F>
__device__ __forceinline__ const uint8_t* row_ptr(const GpuWeight& w, int row) {
  constexpr int kNum = F == Fmt::U4 ? 1 : (F == Fmt::I8 ? 2 : 4);  // bytes per 2 elements
  return static_cast<const uint8_t*>(w.q) + size_t(row) * size_t(w.k_pad) * kNum / 2;
}

}  // namespace wick::cuda
