// How the CUDA backend stores a weight matrix on the device. Every supported
// GGUF type maps exactly onto one of a few layouts, each row padded with
// zeros to a whole number of k-chunks (see matmul.cu):
//   BF16, F16, F32   dense rows;
//   I8               int8 q per element, w = q * scale - min per group
//                    (Q8_0, Q5_0, Q5_1, Q5_K, IQ4_NL, IQ4_XS: groups of 32; Q6_K, Q2_K,
//                    Q3_K: groups of 16; IQ4's q is the level itself);
//   U4               4-bit q per element (byte b holds elements 2b, 2b+1 in
//                    its low and high nibble), w = q * scale - min per group
//                    of 32 (Q4_0, Q4_1, Q4_K).
// The scale and min of a group are f32, computed on the host so that
// q * scale - min gives exactly the value the CPU dequantizes; where every
// min is 8 * scale (Q4_0), the kernels compute it (group_min) instead.
#pragma once

#include <cstdint>

namespace wick::cuda {

enum class Fmt : int32_t { F32, BF16, F16, I8, U4 };

struct GpuWeight {
  Fmt fmt = Fmt::BF16;
  int32_t n_out = 0, n_in = 0;
  int32_t k_pad = 0;             // elements per stored row (n_in rounded up to a k-chunk)
  int32_t group = 0;             // I8/U4: elements per scale, a power of two
  const void* q = nullptr;       // [n_out][k_pad] elements of the layout's type
  const float* scale = nullptr;  // I8/U4: [n_out][k_pad / group]
  const float* min = nullptr;    // I8/U4: [n_out][k_pad / group], or null when all zero or min8
  bool min8 = false;             // I8/U4: every min is 8 * its scale (Q4_0's), not stored
};

// Elements one lane loads with one 16-byte load; a warp step covers 4 lanes'
// worth (the k-chunk).
constexpr int elems_per_load(Fmt f) {
  return f == Fmt::U4 ? 32 : f == Fmt::I8 ? 16 : f == Fmt::F32 ? 4 : 8;
}
constexpr int k_chunk(Fmt f) {
  return 4 * elems_per_load(f);
}
// A row of n elements padded to whole chunks (repack.cpp's k_pad).
constexpr int k_pad_of(Fmt f, int n) {
  return (n + k_chunk(f) - 1) / k_chunk(f) * k_chunk(f);
}

}  // namespace wick::cuda
