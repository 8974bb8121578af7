// CPU kernels on random inputs.
// - Every kernel set this CPU has (generic, avx2, avx512) x every weight type x sizes with odd
//   block counts and odd lengths, through the SimdKernels tables: dequant_row bit-identical to
//   dequantize_row_ref, dot_row (the fused decode path) bit-identical to dequant_row + dot (the
//   prefill path), so outputs never depend on how many rows a batch has, and the product close
//   to a float64 reference.
// - The matmul against a float64 reference, decode equal to prefill, with the kernel set picked
//   at run time.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>

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

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

const DType kAllTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,
                           DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                           DType::Q4_K, DType::Q5_K, DType::Q6_K};
const char* const kIsas[] = {"generic", "avx2", "avx512"};

// The kernel set, or nullptr after GTEST_SKIP when this CPU lacks the ISA.
#define KERNELS_OR_SKIP(k, isa)                                    \
  const cpu::SimdKernels* k = cpu::simd_for(isa);                  \
  if (!k) GTEST_SKIP() << "this CPU has no " << isa << " (cpuid)"; \
  ASSERT_STREQ(k->isa, isa)

class KernelSet : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

TEST_P(KernelSet, DequantAndFusedDotAreExact) {
  const auto [isa, t] = GetParam();
  KERNELS_OR_SKIP(k, isa);
  const int64_t bs = traits(t).block_size;
  // element counts: for float types odd ones around the vector widths (8, 16) and the unrolled
  // steps (32, 64); for block types 1, 2, 3, 5, 7, 28 (Qwen2.5-0.5B's 896) and 152 blocks
  std::vector<int64_t> sizes;
  if (bs == 1)
    sizes = {1, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 129, 896, 1000, 4864};
  else
    for (int64_t nb : {1, 2, 3, 5, 7, 28, 152}) sizes.push_back(nb * bs);
  std::mt19937 rng(1234 + unsigned(t));
  std::normal_distribution<float> nd;
  for (const int64_t n : sizes) {
    const int64_t n_rows = 5;  // rows after the first start at unaligned byte offsets
    auto wb = random_weight(t, n_rows, n, rng);
    const size_t rb = row_bytes(t, n);
    std::vector<float> x(static_cast<size_t>(n) + 1);
    for (auto& v : x) v = nd(rng);
    const float* xr = x.data() + 1;  // not 64-byte aligned
    const size_t un = static_cast<size_t>(n);
    std::vector<float> ref(un), deq(un), buf(un);
    for (int64_t r = 0; r < n_rows; ++r) {
      const uint8_t* w = wb.data() + size_t(r) * rb;
      const std::string where = std::string(isa) + " " + dtype_name(t) + " n=" + std::to_string(n) +
                                " row " + std::to_string(r);
      dequantize_row_ref(t, w, ref.data(), n);
      std::fill(deq.begin(), deq.end(), NAN);
      k->dequant_row(t, w, deq.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(bits(deq[size_t(i)]), bits(ref[size_t(i)])) << where << " element " << i;

      const float unfused = k->dot(xr, deq.data(), n);
      std::fill(buf.begin(), buf.end(), NAN);  // a fused kernel must not read it
      const float fused = k->dot_row(t, w, xr, n, buf.data());
      ASSERT_EQ(bits(fused), bits(unfused)) << where << ": " << fused << " vs " << unfused;

      double exact = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        exact += double(ref[size_t(i)]) * xr[i];
        mag += std::fabs(double(ref[size_t(i)]) * xr[i]);
      }
      ASSERT_LE(std::fabs(double(fused) - exact), 1e-5 * mag + 1e-30) << where;
    }
  }
}

// Every finite f16 and bf16 value, subnormals included, and the infinities, through each
// kernel set's dequant_row (vector body and scalar tail) and fused dot.
class HalfKernels : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

TEST_P(HalfKernels, EveryBitPattern) {
  const auto [isa, t] = GetParam();
  KERNELS_OR_SKIP(k, isa);
  std::vector<uint16_t> all;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t exp_mask = t == DType::F16 ? 0x7c00 : 0x7f80;
    const uint32_t man_mask = t == DType::F16 ? 0x03ff : 0x007f;
    if ((h & exp_mask) == exp_mask && (h & man_mask)) continue;  // NaN
    all.push_back(uint16_t(h));
  }
  const int64_t n = int64_t(all.size()) - 5;  // an odd tail
  std::vector<float> ref(all.size()), got(all.size());
  dequantize_row_ref(t, all.data(), ref.data(), n);
  k->dequant_row(t, all.data(), got.data(), n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(bits(got[size_t(i)]), bits(ref[size_t(i)]))
        << isa << " 0x" << std::hex << all[size_t(i)];
  // each value alone in a row of 88 at positions in the unrolled loop, the 16- (avx512) or 8-wide
  // (avx2) remainder loop and the scalar tail: dot_row must agree with dot over the reference
  // weights
  constexpr int64_t kRow = 88;
  std::vector<uint16_t> w(kRow);
  std::vector<float> x(kRow), wf(kRow), buf(kRow);
  for (const uint16_t h : all)
    for (const int64_t pos : {5, 50, 70, 85}) {
      w.assign(kRow, 0);
      w[size_t(pos)] = h;
      x.assign(kRow, 0.f);
      x[size_t(pos)] = 1.5f;
      dequantize_row_ref(t, w.data(), wf.data(), kRow);
      ASSERT_EQ(bits(k->dot_row(t, w.data(), x.data(), kRow, buf.data())),
                bits(k->dot(x.data(), wf.data(), kRow)))
          << isa << " 0x" << std::hex << h << " at " << std::dec << pos;
    }
}

INSTANTIATE_TEST_SUITE_P(IsaByType, KernelSet,
                         ::testing::Combine(::testing::ValuesIn(kIsas),
                                            ::testing::ValuesIn(kAllTypes)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

INSTANTIATE_TEST_SUITE_P(IsaByType, HalfKernels,
                         ::testing::Combine(::testing::ValuesIn(kIsas),
                                            ::testing::Values(DType::F16, DType::BF16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

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
