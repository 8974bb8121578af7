// The searching quantizers (K-quants, IQ4) of every kernel set this CPU runs
// write the same bytes as the scalar writers they replaced
// (quantize_reference.cpp), on rows of many shapes of data, edge cases and
// the default model's weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "helpers.h"
#include "io/dtype.h"
#include "io/gguf.h"
#include "io/quantize.h"
#include "io/quantize_kernels.h"
#include "quantize_reference.h"

namespace wick {
namespace {

using RowWriter = QuantKernels::RowWriter;

struct WriterCase {
  DType type;
  RowWriter QuantKernels::*kernel;
  RowWriter reference;
};

const std::vector<WriterCase>& writer_cases() {
  static const std::vector<WriterCase> cases = {
      {DType::Q2_K, &QuantKernels::q2_k, quant_ref::quantize_row_q2_k},
      {DType::Q3_K, &QuantKernels::q3_k, quant_ref::quantize_row_q3_k},
      {DType::Q4_K, &QuantKernels::q4_k, quant_ref::quantize_row_q4_k},
      {DType::Q5_K, &QuantKernels::q5_k, quant_ref::quantize_row_q5_k},
      {DType::Q6_K, &QuantKernels::q6_k, quant_ref::quantize_row_q6_k},
      {DType::IQ4_NL, &QuantKernels::iq4_nl, quant_ref::quantize_row_iq4_nl},
      {DType::IQ4_XS, &QuantKernels::iq4_xs, quant_ref::quantize_row_iq4_xs},
  };
  return cases;
}

// The kernel sets compiled in and supported here (generic always).
std::vector<const QuantKernels*> kernel_sets() {
  std::vector<const QuantKernels*> sets;
  for (const char* isa : {"generic", "avx2", "avx512"})
    if (const QuantKernels* k = quant_kernels_for(isa)) sets.push_back(k);
  return sets;
}

// Rows of n elements, a kind of data each (n a multiple of 256).
std::vector<std::vector<float>> synthetic_rows(int64_t n) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::student_t_distribution<float> heavy(1.5f);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<std::vector<float>> rows;
  auto add = [&](auto fill) {
    std::vector<float> r(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) r[size_t(i)] = fill(i);
    rows.push_back(std::move(r));
  };
  for (float scale : {1.f, 0.02f, 1e-3f, 1e-20f, 1e-38f, 1e-42f, 1e5f, 1e30f})
    add([&](int64_t) { return normal(rng) * scale; });
  for (int k = 0; k < 4; ++k) add([&](int64_t) { return heavy(rng) * 0.05f; });
  add([&](int64_t) { return uniform(rng); });
  add([&](int64_t) { return std::fabs(normal(rng)); });   // all positive
  add([&](int64_t) { return -std::fabs(normal(rng)); });  // all negative
  add([&](int64_t) { return 0.f; });
  add([&](int64_t) { return -0.f; });
  add([&](int64_t) { return 0.37f; });
  add([&](int64_t) { return -2.5f; });
  add([&](int64_t i) { return i % 16 == 3 ? 1.f : 0.f; });  // one spike per 16
  add([&](int64_t i) { return i % 97 == 0 ? 50.f * normal(rng) : 0.01f * normal(rng); });
  // sub-blocks of every kind side by side: zero, constant, tiny, normal, spiky
  add([&](int64_t i) {
    switch ((i / 16) % 5) {
      case 0:
        return 0.f;
      case 1:
        return 0.25f;
      case 2:
        return normal(rng) * 1e-40f;
      case 3:
        return normal(rng);
      default:
        return i % 7 == 0 ? 30.f : -0.001f;
    }
  });
  // on a grid already (weights dequantized from a 4-bit type)
  add([&](int64_t i) { return float(int(rng() % 16)) * 0.0625f - float((i / 32) % 3) * 0.1f; });
  add([&](int64_t) { return float(int(rng() % 8) - 4) * 0.5f; });
  add([&](int64_t) { return normal(rng) * 3e38f; });  // overflowing ranges
  // infinities and NaNs here and there
  add([&](int64_t i) {
    return i % 61 == 5 ? std::numeric_limits<float>::infinity() : normal(rng);
  });
  add([&](int64_t i) {
    return i % 53 == 9 ? -std::numeric_limits<float>::infinity() : normal(rng);
  });
  add([&](int64_t i) {
    return i % 71 == 1 ? std::numeric_limits<float>::quiet_NaN() : normal(rng);
  });
  for (int k = 0; k < 16; ++k) add([&](int64_t) { return normal(rng) * 0.03f; });
  return rows;
}

// The bytes of row x written by w as type t.
std::vector<uint8_t> written(DType t, RowWriter w, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size());
  std::vector<uint8_t> out(row_bytes(t, n), 0xcd);
  w(x.data(), out.data(), n);
  return out;
}

// Every kernel set and quantize_row against the reference on each row.
void expect_same_bytes(const std::vector<std::vector<float>>& rows, const std::string& what) {
  const auto sets = kernel_sets();
  for (const WriterCase& c : writer_cases())
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto want = written(c.type, c.reference, rows[r]);
      for (const QuantKernels* k : sets)
        ASSERT_EQ(written(c.type, k->*c.kernel, rows[r]), want)
            << dtype_name(c.type) << ", " << k->isa << ", " << what << " row " << r;
      const int64_t n = int64_t(rows[r].size());
      std::vector<uint8_t> got(row_bytes(c.type, n));
      quantize_row(c.type, rows[r].data(), got.data(), n);
      ASSERT_EQ(got, want) << dtype_name(c.type) << ", quantize_row, " << what << " row " << r;
    }
}

TEST(Quantize, KernelSetsWriteTheScalarWritersBytes) {
  ASSERT_GE(kernel_sets().size(), 1u);
  expect_same_bytes(synthetic_rows(4096), "synthetic");
}

// Rows of 1, 3 and 5 super-blocks: the writers that take two at a time
// (q4_k, q5_k, iq4_xs on AVX-512) with one left over.
TEST(Quantize, RowsOfAnOddNumberOfSuperblocks) {
  for (int64_t n_sb : {1, 3, 5}) {
    auto rows = synthetic_rows(256 * n_sb);
    rows.resize(12);
    expect_same_bytes(rows, std::to_string(n_sb) + " super-blocks");
  }
}

// IQ4_NL rows of 1 to 11 blocks of 32: the lanes past a row's last block.
TEST(Quantize, Iq4NlRowsOfAnyBlockCount) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t n_blocks = 1; n_blocks <= 11; ++n_blocks) {
    std::vector<float> x(static_cast<size_t>(32 * n_blocks));
    for (float& v : x) v = normal(rng);
    const auto want = written(DType::IQ4_NL, quant_ref::quantize_row_iq4_nl, x);
    for (const QuantKernels* k : kernel_sets())
      ASSERT_EQ(written(DType::IQ4_NL, k->iq4_nl, x), want) << k->isa << ", " << n_blocks;
  }
}

// Rows of the default model's 256-divisible matrices, dequantized.
TEST(Quantize, KernelSetsWriteTheScalarWritersBytesOnModelRows) {
  const char* p = std::getenv("WICK_TEST_MODEL");
  if (!p || !std::filesystem::exists(p))
    WICK_SKIP_OR_FAIL("default model missing (WICK_TEST_MODEL)");
  GgufFile f(p);
  std::vector<std::vector<float>> rows;
  for (const std::string& name : f.tensor_order()) {
    const TensorView& t = *f.tensors().find(name);
    const int64_t n_in = t.shape.back(), n_rows = t.numel() / n_in;
    if (t.shape.size() != 2 || n_in % 256 != 0) continue;
    for (int64_t r = 0; r < n_rows && r < 3; ++r) {  // the first rows of each, strided
      const int64_t row = r * (n_rows / 3);
      std::vector<float> x(static_cast<size_t>(n_in));
      dequantize_row_ref(
          t.dtype, static_cast<const uint8_t*>(t.data) + size_t(row) * row_bytes(t.dtype, n_in),
          x.data(), n_in);
      rows.push_back(std::move(x));
    }
    if (rows.size() >= 24) break;
  }
  ASSERT_FALSE(rows.empty());
  expect_same_bytes(rows, "model");
}

}  // namespace
}  // namespace wick
