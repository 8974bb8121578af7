// CPU kernels on random inputs: every weight type's matmul against a
// float64 reference, and the decode path (fused, no buffer) bit-identical to
// the prefill path (dequantize then dot), so outputs never depend on how
// many rows a batch has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"

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
  // sane f16 scale fields, as in the GGUF fixture
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

class MatmulTypes : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTypes, DecodeEqualsPrefillAndMatchesReference) {
  const DType t = GetParam();
  std::mt19937 rng(7 + unsigned(t));
  const int64_t bs = traits(t).block_size;
  for (int64_t n_in : {bs == 1 ? 72 : 256, bs == 1 ? 13 : 512, 768}) {  // odd sizes for float types
    const int64_t n_out = 37, n_rows = 6;
    auto wb = random_weight(t, n_out, n_in, rng);
    Weight w{t, n_out, n_in, wb.data()};
    std::normal_distribution<float> nd;
    std::vector<float> x(size_t(n_rows * n_in));
    for (auto& v : x) v = nd(rng);
    std::vector<float> y_batch(static_cast<size_t>(n_rows * n_out)),
        y_one(static_cast<size_t>(n_out));
    cpu::matmul(w, x.data(), n_rows, y_batch.data());  // dequantize-then-dot path
    std::vector<float> row(static_cast<size_t>(n_in));
    for (int64_t r = 0; r < n_rows; ++r) {
      cpu::matmul(w, x.data() + r * n_in, 1, y_one.data());  // fused path
      for (int64_t o = 0; o < n_out; ++o) {
        ASSERT_EQ(y_one[size_t(o)], y_batch[size_t(r * n_out + o)])
            << dtype_name(t) << " n_in " << n_in;
        dequantize_row_ref(t, w.row(o), row.data(), n_in);
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n_in; ++i) {
          ref += double(row[size_t(i)]) * x[size_t(r * n_in + i)];
          mag += std::fabs(double(row[size_t(i)]) * x[size_t(r * n_in + i)]);
        }
        ASSERT_LE(std::fabs(y_one[size_t(o)] - ref), 1e-5 * mag + 1e-30) << dtype_name(t);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTypes,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0,
                                           DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                           DType::Q4_K, DType::Q5_K, DType::Q6_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace wick::test
