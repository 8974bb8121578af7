// The CUDA backend's weight repacking (host code, so CPU-only builds test
// it): every type's levels, scales and mins give exactly the values the CPU
// dequantizes, and the padding is zero.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace wick::test
