// Micro-benchmarks of the searching quantizers (K-quants, IQ4), per kernel set
// on this CPU: rows of 4096 normal values (sd 0.02, as weights), one thread.
// Items are elements quantized. And FP8 checkpoints' dequantization at load.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "io/quantize_kernels.h"
#include "model/fp8.h"

namespace {

using namespace wick;
using RowWriter = QuantKernels::RowWriter;

constexpr int64_t kRow = 4096, kRows = 16;

void BM_Quantize(benchmark::State& state, DType t, RowWriter QuantKernels::*writer,
                 const QuantKernels* k) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<float> x(size_t(kRow * kRows));
  for (float& v : x) v = nd(rng);
  const size_t rb = row_bytes(t, kRow);
  std::vector<uint8_t> out(rb * kRows);
  for (auto _ : state) {
    for (int64_t r = 0; r < kRows; ++r)
      (k->*writer)(x.data() + r * kRow, out.data() + size_t(r) * rb, kRow);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * kRow * kRows);
}

const bool kRegistered = [] {
  const struct {
    DType type;
    RowWriter QuantKernels::*writer;
  } types[] = {{DType::Q2_K, &QuantKernels::q2_k},    {DType::Q3_K, &QuantKernels::q3_k},
               {DType::Q4_K, &QuantKernels::q4_k},    {DType::Q5_K, &QuantKernels::q5_k},
               {DType::Q6_K, &QuantKernels::q6_k},    {DType::IQ4_NL, &QuantKernels::iq4_nl},
               {DType::IQ4_XS, &QuantKernels::iq4_xs}};
  for (const char* isa : {"generic", "avx2", "avx512"})
    if (const QuantKernels* k = quant_kernels_for(isa))
      for (const auto& t : types)
        benchmark::RegisterBenchmark(
            (std::string("BM_Quantize/") + dtype_name(t.type) + "/" + isa).c_str(), BM_Quantize,
            t.type, t.writer, k);
  return true;
}();

}  // namespace

// FP8 checkpoints' load-time dequantization (model/fp8.h): a 4096 x 4096
// e4m3 matrix with a scale per 128 x 128 block into bf16, on the threads
// WICK_THREADS gives. Items are weights.

namespace {

void BM_Fp8Dequant(benchmark::State& state) {
  constexpr int64_t n = 4096, block = 128;
  std::mt19937 rng(7);
  std::vector<uint8_t> codes(size_t(n * n));
  for (auto& c : codes) c = uint8_t(rng() % 0x7f) | uint8_t(rng() & 0x80);  // no 0x7f: NaN
  std::vector<float> scales(size_t((n / block) * (n / block)), 1e-3f);
  wick::TensorView w{"w", wick::DType::F8_E4M3, {n, n}, codes.data(), codes.size(), "bench"};
  wick::TensorView s{"w_scale_inv", wick::DType::F32,  {n / block, n / block},
                     scales.data(), scales.size() * 4, "bench"};
  wick::Fp8Scheme scheme{block, block};
  std::vector<uint16_t> out(size_t(n * n));
  for (auto _ : state) {
    wick::dequantize_fp8(w, s, scheme, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n * n);
}
BENCHMARK(BM_Fp8Dequant)->Unit(benchmark::kMillisecond);

}  // namespace
