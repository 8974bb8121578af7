// The CUDA products' slice count (slices.cpp; host code, so CPU-only builds
// test it): on the shapes whose decode products were measured at every
// count (wick_gpu_bench's kw cells, docs/gpu), the rule picks the count that
// streamed fastest, given the CTAs an SM holds by the kernels' registers.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "backend/cuda/slices.h"

namespace wick::test {
namespace {

// CTAs an SM of compute capability 9.0 holds of a kernel of `regs`
// registers a thread at kw slices (a warp a slice up to 32): 64 Ki
// registers, allocated 8 a thread at a time; 64 warps; 32 CTAs. (The GPU
// code asks cudaOccupancyMaxActiveBlocksPerMultiprocessor instead.)
int ctas_per_sm(int regs, int kw) {
  const int n_warps = std::min(kw, 32), per_thread = (regs + 7) / 8 * 8;
  return std::min({65536 / (per_thread * 32 * n_warps), 64 / n_warps, 32});
}

struct Case {
  const char* what;  // the product, and what the kernels table measured
  int regs;          // the staged one-row kernel's (ptxas -v, sm_90)
  int k_chunk;       // elements of a chunk: bf16 32, 8-bit 64, 4-bit 128
  int n_out, n_rows, k;
  int want;
};

constexpr int kBf16 = 62, kI8 = 80, kU4 = 96;  // registers, not gated
constexpr int kI8Gated = 125;

// Measured on an H100 (session 52, bf16; docs/gpu/report-2026-11-28-h100.md)
// and an H200 (session 57, Q8_0 and Q4_0; report-2026-11-28-h200-session57.md),
// both 132 SMs: share of 3.0 TB/s at the wanted count, then the others'.
const Case kCases[] = {
    {"Llama-3.2-1B q/k/v Q8_0: 8 39 %, 16 23 %, 4 27 %", kI8, 64, 2048, 3072, 2048, 8},
    {"Llama-3.2-1B o Q8_0: 8 30 %, 16 23 %, 4 18 %", kI8, 64, 2048, 2048, 2048, 8},
    {"Llama-3.2-1B down Q8_0: 8 33 %, 16 31 %, 32 29 %", kI8, 64, 2048, 2048, 8192, 8},
    {"Llama-3.2-1B q/k/v Q4_0: 4 16 %, 8 14 %", kU4, 128, 2048, 3072, 2048, 4},
    {"Llama-3.2-1B o Q4_0: 8 17 %, 4 11 %, 16 13 %", kU4, 128, 2048, 2048, 2048, 8},
    {"Llama-3.2-1B down Q4_0: 8 19 %, 16 18 %, 4 10 %", kU4, 128, 2048, 2048, 8192, 8},
    {"Llama-3.1-8B q/k/v Q8_0: 4 51 %, 8 45 %", kI8, 64, 4096, 6144, 4096, 4},
    {"Llama-3.1-8B o Q8_0: 4 36 %, 8 33 %", kI8, 64, 4096, 4096, 4096, 4},
    {"Llama-3.2-3B o Q8_0 (H100): 8 39 %, 4 23 %", kI8, 64, 3072, 3072, 3072, 8},
    {"Llama-3.2-1B q/k/v bf16: 8 58 %, 16 52 %", kBf16, 32, 2048, 3072, 2048, 8},
    {"Llama-3.2-1B o bf16: 16 60 %, 8 43 %, 32 46 %", kBf16, 32, 2048, 2048, 2048, 16},
    {"Llama-3.2-1B down bf16: 16 74 %, 8 47 %, 32 63 %", kBf16, 32, 2048, 2048, 8192, 16},
    {"Llama-3.1-8B o bf16: 8 74 %, 4 47 %, 16 67 %", kBf16, 32, 4096, 4096, 4096, 8},
    {"Qwen2.5-0.5B q/k/v bf16: 14 29 % (16: 30 %), 8 25 %", kBf16, 32, 896, 1152, 896, 14},
    {"Qwen2.5-0.5B down bf16: 32 50 %, 16 38 %", kBf16, 32, 896, 896, 4864, 32},
    {"Qwen2.5-0.5B down Q8_0 (H100): 16 24 %, 8 13 %, 32 22 %", kI8, 64, 896, 896, 4864, 16},
    {"Llama-3.2-1B output head Q8_0: 4 53 %, 8 49 %", kI8, 64, 128256, 128256, 2048, 4},
    {"Llama-3.1-8B output head Q8_0: 4 54 %, 8 50 %", kI8, 64, 128256, 128256, 4096, 4},
    {"Llama-3.1-8B gate/up Q8_0: 4 46 %, 8 44 %", kI8Gated, 64, 14336, 14336, 4096, 4},
};

TEST(CudaSlices, PickTheMeasuredFastestCount) {
  for (const Case& c : kCases) {
    cuda::SliceProblem p;
    p.n_out = c.n_out;
    p.n_rows = c.n_rows;
    p.n_chunks = c.k / c.k_chunk;
    p.kw_max = 32;
    p.n_sms = 132;
    EXPECT_EQ(cuda::slice_count(p, [&](int kw) { return ctas_per_sm(c.regs, kw); }), c.want)
        << c.what;
  }
}

// Where no count fits one wave (more CTAs than the GPU holds at 4 slices:
// gate/up and the output head), 4 at any k; and never past 2 chunks a warp
// or WICK_CUDA_KW_MAX.
TEST(CudaSlices, BoundsAndTheCountWithoutAWave) {
  cuda::SliceProblem p;
  p.n_out = 28672;  // a 70B model's gate/up, Q8_0
  p.n_rows = 28672;
  p.n_sms = 132;
  const auto gated_i8 = [](int kw) { return ctas_per_sm(kI8Gated, kw); };
  for (int k : {2048, 8192, 16384}) {
    p.n_chunks = k / 64;
    EXPECT_EQ(cuda::slice_count(p, gated_i8), 4) << "k " << k;
  }
  // few rows, few chunks: at most n_chunks / 2 slices, 4 at least
  p.n_out = p.n_rows = 64;
  for (int n_chunks : {1, 8, 14, 40}) {
    p.n_chunks = n_chunks;
    EXPECT_EQ(cuda::slice_count(p, gated_i8), std::max(4, std::min(16, n_chunks / 2)))
        << n_chunks << " chunks";
  }
  // 32 only with 128 chunks or more on at most 1,024 rows, and within kw_max
  p.n_chunks = 256;
  EXPECT_EQ(cuda::slice_count(p, [](int) { return 1; }), 32);
  p.kw_max = 24;
  EXPECT_EQ(cuda::slice_count(p, [](int) { return 1; }), 24);
  p.kw_max = 8;
  EXPECT_EQ(cuda::slice_count(p, [](int) { return 1; }), 8);
  // WICK_CUDA_KW_WAVES=0: the rule before (the cap; 8 or 4 past 2,048 rows)
  p.kw_max = 32;
  p.waves = false;
  p.n_out = p.n_rows = 2048;
  EXPECT_EQ(cuda::slice_count(p, [](int) { return 1; }), 16);
  p.n_out = p.n_rows = 4096;
  EXPECT_EQ(cuda::slice_count(p, [](int) { return 1; }), 8);
  p.n_chunks = 32;
  EXPECT_EQ(cuda::slice_count(p, [](int) { return 1; }), 4);
  p.waves = true;
  p.n_chunks = 256;
  // a GPU too small for one wave of even 4 slices: the cap, as before
  p.kw_max = 32;
  p.n_out = p.n_rows = 2048;
  p.n_sms = 2;
  EXPECT_EQ(cuda::slice_count(p, [](int) { return 1; }), 16);
}

}  // namespace
}  // namespace wick::test
