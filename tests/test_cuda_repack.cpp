// The CUDA backend's weight repacking (host code, so CPU-only builds test
// it): every type's levels, scales and mins give exactly the values the CPU
// dequantizes, and the padding is zero.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cuda/repack.h"
#include "random_weight.h"

namespace wick::test {
namespace {

// Repacking (host side, no GPU needed) reproduces the CPU's dequantized
// values exactly for every type: the kernels' q * scale - min is exact.
TEST(CudaRepack, ValuesEqualCpuDequantization) {
  std::mt19937 rng(2);
  for (DType t : {DType::BF16, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                  DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q2_K, DType::Q3_K,
                  DType::IQ4_NL, DType::IQ4_XS}) {
    const int64_t n_out = 9, n_in = 512;
    auto wb = random_weight(t, n_out, n_in, rng);
    const Weight w{t, n_out, n_in, wb.data()};
    const cuda::Repacked r = cuda::repack(w, false);
    std::vector<float> want(static_cast<size_t>(n_in));
    for (int64_t o = 0; o < n_out; ++o) {
      dequantize_row_ref(t, w.row(o), want.data(), n_in);
      for (int64_t i = 0; i < n_in; ++i)
        ASSERT_EQ(cuda::repacked_value(r, o, i), want[size_t(i)])
            << dtype_name(t) << " " << o << "," << i;
      for (int64_t i = n_in; i < r.k_pad; ++i) ASSERT_EQ(cuda::repacked_value(r, o, i), 0.f);
    }
  }
}

// Q4_0's min is 8 d in every group: not stored, the kernels compute it
// (min8); a type whose mins are its own (Q4_1, Q4_K) keeps them, and one
// without (Q8_0) has neither.
TEST(CudaRepack, Q4_0MinIsComputedNotStored) {
  std::mt19937 rng(3);
  struct Want {
    DType t;
    bool stored, min8;
  };
  for (Want c : {Want{DType::Q4_0, false, true}, Want{DType::Q4_1, true, false},
                 Want{DType::Q4_K, true, false}, Want{DType::Q8_0, false, false}}) {
    auto wb = random_weight(c.t, 5, 256, rng);
    const cuda::Repacked r = cuda::repack(Weight{c.t, 5, 256, wb.data()}, false);
    EXPECT_EQ(!r.min.empty(), c.stored) << dtype_name(c.t);
    EXPECT_EQ(r.min8, c.min8) << dtype_name(c.t);
  }
}

// The decode kernel takes 4-bit weights whose min is 8 s (min8) with one FMA,
// fma(q, s, -8 s), where the tiled kernel and the CPU round q s, then q s - 8 s:
// the same bits only if both are exact. They are for every scale a 4-bit type
// repacks to (an f16 d, or d times a 6-bit sub-scale: at most 17 significant
// bits; q at most 15): every level of every group of random Q4_0 weights and
// of the f16 extremes, and of Q4_K's d sc products.
TEST(CudaRepack, Min8WeightsDequantizeExactlyInOneFma) {
  std::mt19937 rng(4);
  std::vector<float> scales;
  for (DType t : {DType::Q4_0, DType::Q4_K}) {
    auto wb = random_weight(t, 16, 512, rng);
    const cuda::Repacked r = cuda::repack(Weight{t, 16, 512, wb.data()}, false);
    scales.insert(scales.end(), r.scale.begin(), r.scale.end());
  }
  for (uint16_t h : {uint16_t(0x0001), uint16_t(0x03ff), uint16_t(0x0400), uint16_t(0x3c01),
                     uint16_t(0x7bff)})  // f16 subnormals, the smallest normal, the largest
    for (int sc : {1, 37, 63}) scales.push_back(f16_to_f32(h) * float(sc));
  for (float s : scales)
    for (int q = 0; q < 16; ++q) {
      volatile float prod = float(q) * s;  // (two roundings, as the CPU and dq)
      const float two = prod - 8.f * s;
      ASSERT_EQ(std::fma(float(q), s, -8.f * s), two) << "scale " << s << ", q " << q;
      ASSERT_EQ(two, float(q - 8) * s) << "scale " << s << ", q " << q;
    }
}

}  // namespace
}  // namespace wick::test
