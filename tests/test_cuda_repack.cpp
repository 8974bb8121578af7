// The CUDA backend's weight repacking (host code, so CPU-only builds test
// it): every type's levels, scales and mins give exactly the values the CPU
// dequantizes, and the padding is zero.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cuda/repack.h"

namespace wick::test {
namespace {

std::vector<uint8_t> random_weight(DType t, int64_t n_out, int64_t n_in, std::mt19937& rng) {
  const size_t rb = row_bytes(t, n_in);
  std::vector<uint8_t> w(size_t(n_out) * rb);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd(0.f, 1.f);
  if (t == DType::F32) {
    for (size_t i = 0; i < w.size() / 4; ++i) reinterpret_cast<float*>(w.data())[i] = nd(rng);
    return w;
  }
  for (auto& b : w) b = uint8_t(byte(rng));
  if (t == DType::F16 || t == DType::BF16) {
    auto* h = reinterpret_cast<uint16_t*>(w.data());
    for (size_t i = 0; i < w.size() / 2; ++i)
      h[i] = t == DType::F16 ? f32_to_f16(nd(rng)) : f32_to_bf16(nd(rng));
    return w;
  }
  const size_t bb = traits(t).block_bytes;
  std::vector<size_t> offs =
      t == DType::Q6_K ? std::vector<size_t>{208}
      : (t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q5_K)
          ? std::vector<size_t>{0, 2}
          : std::vector<size_t>{0};
  for (size_t b = 0; b < w.size() / bb; ++b)
    for (size_t o : offs) {
      uint16_t d = f32_to_f16(nd(rng) * 0.1f);
      std::memcpy(w.data() + b * bb + o, &d, 2);
    }
  return w;
}

// Repacking (host side, no GPU needed) reproduces the CPU's dequantized
// values exactly for every type: the kernels' q * scale - min is exact.
TEST(CudaRepack, ValuesEqualCpuDequantization) {
  std::mt19937 rng(2);
  for (DType t : {DType::BF16, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                  DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
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

}  // namespace
}  // namespace wick::test
