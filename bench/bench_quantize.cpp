// Micro-benchmarks of the searching quantizers (K-quants, IQ4), per kernel set
// on this CPU: rows of 4096 normal values (sd 0.02, as weights), one thread.
// Items are elements quantized.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "io/quantize_kernels.h"

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
