// The CUDA emulator's own speed (tests/cuda_emu, docs/cuda_emu.md "Speed"):
// what a warp collective and an emulated mma cost, the two that dominate the
// GPU tests' time on a machine with no GPU. Not a GPU benchmark.
#include <benchmark/benchmark.h>

#include <vector>

#include "cuda_emu.h"

namespace {

constexpr int kIters = 2000;

// Four warps, each kIters mma.sync m16n8k16 bf16; rows_full = 0: A's rows
// past the first are zeros, as in a decode step.
void mma_kernel(const uint32_t* in, float* out, int rows_full) {
  const int l = int(threadIdx.x) % 32;
  uint32_t a[4] = {in[l], rows_full ? in[l + 32] : 0u, in[l + 64], rows_full ? in[l + 96] : 0u};
  if (!rows_full && l >= 4) a[0] = a[2] = 0;
  const uint32_t b[2] = {in[l + 128], in[l + 160]};
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < kIters; ++i) wick_emu::mma_f32(d, a, b, true);
  out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}

void BM_EmuMma(benchmark::State& state) {
  std::vector<uint32_t> in(192);
  for (int i = 0; i < 192; ++i) in[size_t(i)] = 0x3f803f80u + uint32_t(i) * 0x00010001u;
  std::vector<float> out(128);
  for (auto _ : state)
    wick_emu::launch(dim3(1), dim3(128), 0, mma_kernel, in.data(), out.data(), int(state.range(0)));
  state.SetItemsProcessed(state.iterations() * 4 * kIters);  // mma a warp
  state.SetLabel(state.range(0) ? "16 rows" : "1 row (decode)");
}
BENCHMARK(BM_EmuMma)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);

// Eight warps, each kIters butterfly shuffles.
void shfl_kernel(float* out) {
  float v = float(threadIdx.x);
  for (int i = 0; i < kIters; ++i) v += __shfl_xor_sync(~0u, v, 1 + i % 16);
  out[threadIdx.x] = v;
}

void BM_EmuShuffle(benchmark::State& state) {
  std::vector<float> out(256);
  for (auto _ : state) wick_emu::launch(dim3(1), dim3(256), 0, shfl_kernel, out.data());
  state.SetItemsProcessed(state.iterations() * 8 * kIters);  // shuffles a warp
}
BENCHMARK(BM_EmuShuffle)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
