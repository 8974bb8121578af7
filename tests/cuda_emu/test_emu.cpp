// The CUDA emulator against what the CUDA guide and the PTX ISA say its
// instructions do, and its reports of what would hang or corrupt a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "cuda_emu.h"

#ifdef WICK_EMU_TSAN
// The race check's own test counts the reports it expects instead of printing
// them: TSan asks this hook of each report (true: drop it).
namespace {
// -1: none expected, reports as usual (atomic: CTAs of a wave report apart)
std::atomic<int> g_n_races{-1};
}  // namespace
namespace __tsan {
struct ReportDesc;
bool OnReport(const ReportDesc*, bool suppressed) {
  if (g_n_races < 0) return suppressed;
  ++g_n_races;
  return true;
}
}  // namespace __tsan
#endif

namespace {

uint16_t bf16_bits(float f) {
  return uint16_t(wick_emu::to_bits(__float2bfloat16(f)));
}
float bf16_value(uint16_t u) {
  return __bfloat162float(wick_emu::bits_to<__nv_bfloat16>(u));
}
uint16_t f16_bits(float f) {
  return uint16_t(wick_emu::to_bits(__float2half(f)));
}
float f16_value(uint16_t u) {
  return __half2float(wick_emu::bits_to<__half>(u));
}

// m16n8k16: lane l (g = l / 4, t = l % 4) holds A[g][2t..2t+1], A[g+8][..],
// A[g][2t+8..], A[g+8][2t+8..]; B[2t..2t+1][g], B[2t+8..][g]; C/D[g][2t..],
// [g+8][2t..] (PTX ISA, "Matrix Fragments for mma.m16n8k16").
void mma_kernel(const uint16_t* A, const uint16_t* B, float* D, bool bf16) {
  const int l = int(threadIdx.x), g = l / 4, t = l % 4;
  auto pair = [](const uint16_t* p, int i, int j) { return uint32_t(p[i]) | uint32_t(p[j]) << 16; };
  const uint32_t a[4] = {pair(A, g * 16 + 2 * t, g * 16 + 2 * t + 1),
                         pair(A, (g + 8) * 16 + 2 * t, (g + 8) * 16 + 2 * t + 1),
                         pair(A, g * 16 + 2 * t + 8, g * 16 + 2 * t + 9),
                         pair(A, (g + 8) * 16 + 2 * t + 8, (g + 8) * 16 + 2 * t + 9)};
  const uint32_t b[2] = {pair(B, (2 * t) * 8 + g, (2 * t + 1) * 8 + g),
                         pair(B, (2 * t + 8) * 8 + g, (2 * t + 9) * 8 + g)};
  float d[4] = {1.f, 1.f, 1.f, 1.f};
  wick_emu::mma_f32(d, a, b, bf16);
  D[g * 8 + 2 * t] = d[0];
  D[g * 8 + 2 * t + 1] = d[1];
  D[(g + 8) * 8 + 2 * t] = d[2];
  D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// The emulator's rounding (cuda_emu.md): the 16 exact products summed in
// double in k's order, added to C, rounded to float once; bf16 and f16.
TEST(CudaEmu, MmaIsTheMatrixProductInThePtxLayout) {
  for (bool bf16 : {true, false}) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    auto bits = [&](float f) { return bf16 ? bf16_bits(f) : f16_bits(f); };
    auto value = [&](uint16_t u) { return double(bf16 ? bf16_value(u) : f16_value(u)); };
    std::vector<uint16_t> A(16 * 16), B(16 * 8);
    for (auto& v : A) v = bits(nd(rng));
    for (auto& v : B) v = bits(nd(rng));
    A[5] = bits(6e-8f);  // f16: a subnormal
    std::vector<float> D(16 * 8);
    wick_emu::launch(dim3(1), dim3(32), 0, mma_kernel, A.data(), B.data(), D.data(), bf16);
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 8; ++n) {
        double sum = 0;
        for (int k = 0; k < 16; ++k) sum += value(A[r * 16 + k]) * value(B[k * 8 + n]);
        EXPECT_EQ(D[r * 8 + n], float(1.0 + sum)) << r << ", " << n << (bf16 ? " bf16" : " f16");
      }
  }
}

// m16n8k32 s8 x u8: lane l holds A[g][4t..4t+3], A[g+8][..], A[g][4t+16..],
// A[g+8][4t+16..]; B[4t..4t+3][g], B[4t+16..][g].
void imma_kernel(const int8_t* A, const uint8_t* B, int* D) {
  const int l = int(threadIdx.x), g = l / 4, t = l % 4;
  auto word = [](const void* p, int i) {
    uint32_t w;
    std::memcpy(&w, static_cast<const uint8_t*>(p) + i, 4);
    return w;
  };
  auto col = [&](int k0) {
    uint32_t w = 0;
    for (int j = 0; j < 4; ++j) w |= uint32_t(B[(k0 + j) * 8 + g]) << (8 * j);
    return w;
  };
  const uint32_t a[4] = {word(A, g * 32 + 4 * t), word(A, (g + 8) * 32 + 4 * t),
                         word(A, g * 32 + 4 * t + 16), word(A, (g + 8) * 32 + 4 * t + 16)};
  const uint32_t b[2] = {col(4 * t), col(4 * t + 16)};
  int d[4];
  wick_emu::imma(d, a, 4, b, 2, 32, true);
  D[g * 8 + 2 * t] = d[0];
  D[g * 8 + 2 * t + 1] = d[1];
  D[(g + 8) * 8 + 2 * t] = d[2];
  D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

TEST(CudaEmu, ImmaS8U8IsTheMatrixProductInThePtxLayout) {
  std::mt19937 rng(2);
  std::vector<int8_t> A(16 * 32);
  std::vector<uint8_t> B(32 * 8);
  for (auto& v : A) v = int8_t(rng());
  for (auto& v : B) v = uint8_t(rng());
  std::vector<int> D(16 * 8);
  wick_emu::launch(dim3(1), dim3(32), 0, imma_kernel, A.data(), B.data(), D.data());
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      int want = 0;
      for (int k = 0; k < 32; ++k) want += int(A[r * 32 + k]) * int(B[k * 8 + n]);
      EXPECT_EQ(D[r * 8 + n], want) << r << ", " << n;
    }
}

// ldmatrix .x2: lanes 0-15 address the rows of two 8 x 8 matrices of 16-bit
// elements; lane l gets row l / 4, columns 2 (l % 4) and +1, of each (.trans:
// the transposed matrices').
void ldsm_kernel(const uint16_t* src, uint32_t* out, bool trans) {
  auto& tile = wick_emu::cta_shared<uint16_t[16][8], 16>([] {});  // (a .cu file's __shared__)
  const int l = int(threadIdx.x);
  for (int i = 0; i < 4; ++i) tile[(4 * l + i) / 8][(4 * l + i) % 8] = src[4 * l + i];
  __syncthreads();
  uint32_t r0, r1;
  wick_emu::ldmatrix_x2(r0, r1, tile[l % 16], trans);
  out[2 * l] = r0;
  out[2 * l + 1] = r1;
}

TEST(CudaEmu, LdmatrixGivesEachLaneItsPairs) {
  std::vector<uint16_t> src(128);
  for (int i = 0; i < 128; ++i) src[size_t(i)] = uint16_t(i);
  for (bool trans : {false, true}) {
    std::vector<uint32_t> out(64);
    wick_emu::launch(dim3(1), dim3(32), 0, ldsm_kernel, src.data(), out.data(), trans);
    for (int l = 0; l < 32; ++l)
      for (int m = 0; m < 2; ++m)
        for (int j = 0; j < 2; ++j) {
          const int row = trans ? 2 * (l % 4) + j : l / 4, c = trans ? l / 4 : 2 * (l % 4) + j;
          EXPECT_EQ((out[size_t(2 * l + m)] >> (16 * j)) & 0xffff, uint32_t(m * 64 + row * 8 + c))
              << "lane " << l << " matrix " << m << (trans ? " trans" : "");
        }
  }
}

void shfl_kernel(int* out) {
  const int l = int(threadIdx.x) % 32;
  int v = l;
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(~0u, v, off);
  out[threadIdx.x] =
      v + 1000 * __shfl_up_sync(~0u, l, 3) + 100000 * int(__ballot_sync(~0u, l & 1) == 0xaaaaaaaau);
}

TEST(CudaEmu, ShufflesAndVotesFollowTheGuide) {
  std::vector<int> out(64);
  wick_emu::launch(dim3(1), dim3(64), 0, shfl_kernel, out.data());
  for (int t = 0; t < 64; ++t) {
    const int l = t % 32;
    EXPECT_EQ(out[size_t(t)], 496 + 1000 * (l >= 3 ? l - 3 : l) + 100000) << t;
  }
}

// Half of warp 1 waits at __syncthreads, the other half at a __syncwarp that
// needs the first half: a GPU hangs; the emulator says where they wait.
void deadlock_kernel() {
  if (threadIdx.x >= 32 && threadIdx.x < 48)
    __syncwarp();
  else
    __syncthreads();
}

// Each half of a warp shuffles within its own mask: the two collectives
// complete apart (the CUDA guide: the lanes of the mask take part).
void half_warp_kernel(int* out) {
  const int l = int(threadIdx.x);
  const unsigned mask = l < 16 ? 0xffffu : 0xffff0000u;
  int v = l;
  for (int off = 8; off > 0; off >>= 1) v += __shfl_xor_sync(mask, v, off);
  out[l] = v;
}

TEST(CudaEmu, HalfWarpCollectivesCompleteApart) {
  std::vector<int> out(32);
  wick_emu::launch(dim3(1), dim3(32), 0, half_warp_kernel, out.data());
  for (int l = 0; l < 32; ++l) EXPECT_EQ(out[size_t(l)], l < 16 ? 120 : 376) << l;
}

// Lane 31 exits; the others shuffle with a full mask: a GPU's behaviour is
// undefined; the emulator says which lane is missing.
void exited_lane_kernel() {
  if (threadIdx.x == 31) return;
  __shfl_sync(~0u, 1, 0);
}

TEST(CudaEmu, ACollectiveWithAnExitedLaneIsReported) {
  try {
    wick_emu::launch(dim3(1), dim3(32), 0, exited_lane_kernel);
    FAIL() << "no report";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("exited"), std::string::npos) << e.what();
  }
}

TEST(CudaEmu, ABarrierSomeThreadsNeverReachIsReported) {
  try {
    wick_emu::launch(dim3(1), dim3(64), 0, deadlock_kernel);
    FAIL() << "no report";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
  }
}

void overrun_kernel(int n) {
  ::wick_emu::dynamic_smem()[n + int(threadIdx.x)] = 1;
}

TEST(CudaEmu, WritesPastDynamicSharedMemoryAreReported) {
  wick_emu::launch(dim3(1), dim3(32), 4096, overrun_kernel, 4096 - 32);  // the last 32 bytes
  EXPECT_THROW(wick_emu::launch(dim3(1), dim3(32), 4096, overrun_kernel, 4096 - 16),
               std::runtime_error);
}

// cp.async: the copy lands when its group is waited for (here, not before),
// the bytes past src-size as zeros.
void cp_async_kernel(const uint32_t* src, uint32_t* out) {
  auto* s = reinterpret_cast<uint32_t*>(::wick_emu::dynamic_smem());
  if (threadIdx.x == 0) {
    s[0] = s[1] = s[2] = s[3] = 7;
    wick_emu::cp_async(s, src, 16, 8);
    wick_emu::cp_async_commit();
    out[0] = s[0];
    wick_emu::cp_async_wait(0);
    for (int i = 0; i < 4; ++i) out[1 + i] = s[i];
  }
}

TEST(CudaEmu, CpAsyncLandsAtTheWaitWithItsZeros) {
  const uint32_t src[4] = {1, 2, 3, 4};
  uint32_t out[5] = {};
  wick_emu::launch(dim3(1), dim3(32), 64, cp_async_kernel, src, out);
  EXPECT_EQ(out[0], 7u);
  EXPECT_EQ(out[1], 1u);
  EXPECT_EQ(out[2], 2u);
  EXPECT_EQ(out[3], 0u);
  EXPECT_EQ(out[4], 0u);
}

[[maybe_unused]] void read_kernel(const float* x, int n, float* out) {
  out[0] = x[n + int(threadIdx.x)];
}

// make test-emu's binary: a kernel's read past a cudaMalloc'd buffer
TEST(CudaEmu, ReadsPastADeviceBufferAreReportedUnderAsan) {
#ifndef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "AddressSanitizer is on in wick_gpu_emu_asan_tests (make test-emu) only";
#else
  float *x = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&x), 100 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), sizeof(float)), cudaSuccess);
  std::memset(x, 0, 100 * sizeof(float));
  wick_emu::launch(dim3(1), dim3(4), 0, read_kernel, x, 96, out);  // x[96..99]
  EXPECT_DEATH(wick_emu::launch(dim3(1), dim3(4), 0, read_kernel, x, 97, out),
               "heap-buffer-overflow");
  cudaFree(x);
  cudaFree(out);
#endif
}

// Thread 0 writes shared memory, thread kReader reads it, with kSync between:
// 0 nothing, 1 __syncthreads, 2 __syncwarp, 3 a shuffle. (A kernel and a
// word a case: TSan reports a race once for each pair of stacks or address.)
template <int kReader, int kSync>
[[maybe_unused]] void handoff_kernel(int* out) {
  int* s = reinterpret_cast<int*>(::wick_emu::dynamic_smem()) + 2 * kSync + (kReader > 31);
  const int t = int(threadIdx.x);
  if (t == 0) s[0] = 7;
  if (kSync == 1) __syncthreads();
  if (kSync == 2) __syncwarp();
  if (kSync == 3) out[1 + t] = __shfl_sync(~0u, t, 0);
  if (t == kReader) out[0] = s[0];
}

// make test-emu-race's binary: what orders CUDA threads on a GPU orders them
// under the race check, and nothing else does (the CUDA guide: a shuffle
// waits for its lanes but orders no memory).
TEST(CudaEmu, RacesWithoutABarrierAreReportedUnderTsan) {
#ifndef WICK_EMU_TSAN
  GTEST_SKIP() << "ThreadSanitizer is on in wick_gpu_emu_tsan_tests (make test-emu-race) only";
#else
  std::vector<int> out(65);
  auto n_races = [&](void (*kernel)(int*)) {
    g_n_races = 0;
    wick_emu::launch(dim3(1), dim3(64), 64, kernel, out.data());
    const int n = g_n_races;
    g_n_races = -1;
    EXPECT_EQ(out[0], 7);  // (one order: the emulator's)
    return n;
  };
  EXPECT_GE(n_races(handoff_kernel<32, 0>), 1) << "another warp, no barrier";
  EXPECT_EQ(n_races(handoff_kernel<32, 1>), 0) << "another warp, __syncthreads";
  EXPECT_GE(n_races(handoff_kernel<32, 2>), 1) << "another warp, __syncwarp";
  EXPECT_GE(n_races(handoff_kernel<1, 0>), 1) << "the same warp, nothing";
  EXPECT_EQ(n_races(handoff_kernel<1, 2>), 0) << "the same warp, __syncwarp";
  EXPECT_GE(n_races(handoff_kernel<1, 3>), 1) << "the same warp, a shuffle";
#endif
}

// Each CTA's __shared__ variables are its own and fresh: thread 0 reads
// (poison: NaN's bits) and writes, a barrier, the others read its write.
void static_smem_kernel(uint32_t* first, uint32_t* seen) {
  auto& v = wick_emu::cta_shared<uint32_t[2], 0>([] {});
  const unsigned b = blockIdx.x, t = threadIdx.x;
  if (t == 0) first[b] = v[1], v[1] = 100 + b;
  __syncthreads();
  seen[b * blockDim.x + t] = v[1];
}

TEST(CudaEmu, SharedVariablesAreEachCtasOwnAndFresh) {
  std::vector<uint32_t> first(3), seen(3 * 64);
  wick_emu::launch(dim3(3), dim3(64), 0, static_smem_kernel, first.data(), seen.data());
  for (unsigned b = 0; b < 3; ++b) {
    EXPECT_EQ(first[b], 0xffffffffu) << "CTA " << b << " saw another's value";
    for (unsigned t = 0; t < 64; ++t) EXPECT_EQ(seen[b * 64 + t], 100 + b);
  }
}

void big_static_kernel(int* out) {
  auto& big = wick_emu::cta_shared<char[40 * 1024], 0>([] {});
  if (threadIdx.x == 0) out[0] = big[0];
}

// as a GPU refuses it: __shared__ variables and dynamic shared memory
// together past the CTA's limit (227 KB on an H100)
TEST(CudaEmu, SharedVariablesPastTheLimitAreReported) {
  int out = 0, limit = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
            cudaSuccess);
  const size_t fits = size_t(limit) - 40 * 1024, past = fits + 1;
  cudaFuncSetAttribute(big_static_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(past));
  wick_emu::launch(dim3(1), dim3(32), fits, big_static_kernel, &out);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  try {
    wick_emu::launch(dim3(1), dim3(32), past, big_static_kernel, &out);
    FAIL() << "no report";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("exceed the device"), std::string::npos) << e.what();
  }
}

// The last of a grid's CTAs sums every CTA's part (matmul.cu's counters):
// each writes its part, then kCase: 0 a __threadfence, a barrier and thread
// 0's atomic count, the last one (which resets the count with an atomic) a
// barrier and a __threadfence before it reads; 1 no fence before the count;
// 2 none after it; 3 the count reset by a plain store; 4 no count, the next
// CTA's part read at once.
template <int kCase>
[[maybe_unused]] void last_cta_kernel(int* part, int* count, int* out) {
  auto& last = wick_emu::cta_shared<int, 0>([] {});
  const int b = int(blockIdx.x), t = int(threadIdx.x), n = int(gridDim.x);
  part[b * 32 + t] = b + t;
  if (kCase == 4) {
    out[b * 32 + t] = part[(b + 1) % n * 32 + t];
    return;
  }
  if (kCase != 1) __threadfence();
  __syncthreads();
  if (t == 0) {
    last = atomicAdd(count, 1) == n - 1;
    if (last && kCase == 3) *count = 0;
    if (last && kCase != 3) atomicExch(count, 0);
  }
  __syncthreads();
  if (!last) return;
  if (kCase != 2) __threadfence();
  int sum = 0;
  for (int c = 0; c < n; ++c) sum += part[c * 32 + t];
  out[t] = sum;
}

// make test-emu-race's binary with CTAs in waves (WICK_EMU_RACE_CTAS): what
// orders CTAs on a GPU orders them here, fences around an atomic, and nothing
// else does (the CTAs of a wave run one after another).
TEST(CudaEmu, RacesBetweenCtasAreReportedUnderTsan) {
#ifndef WICK_EMU_TSAN
  GTEST_SKIP() << "ThreadSanitizer is on in wick_gpu_emu_tsan_tests (make test-emu-race) only";
#else
  constexpr int kCtas = 4;
  std::vector<int> mem(6 *
                       (kCtas * 64 + 8));  // (a word for each case: TSan reports an address once)
  auto n_races = [&](int waves_of, int c, void (*kernel)(int*, int*, int*)) {
    int* part = mem.data() + c * (kCtas * 64 + 8);
    int *count = part + kCtas * 32, *out = count + 4;
    const int was = wick_emu::set_race_ctas(waves_of);
    g_n_races = 0;
    wick_emu::launch(dim3(kCtas), dim3(32), 0, kernel, part, count, out);
    const int n = g_n_races;
    g_n_races = -1;
    wick_emu::set_race_ctas(was);
    if (c < 4) {
      EXPECT_EQ(out[5], kCtas * 5 + kCtas * (kCtas - 1) / 2) << "case " << c;
    }
    return n;
  };
  EXPECT_EQ(n_races(kCtas, 0, last_cta_kernel<0>), 0) << "fences around the count";
  EXPECT_GE(n_races(kCtas, 1, last_cta_kernel<1>), 1) << "no fence before the count";
  EXPECT_GE(n_races(kCtas, 2, last_cta_kernel<2>), 1) << "no fence after the count";
  EXPECT_GE(n_races(kCtas, 3, last_cta_kernel<3>), 1) << "a plain store resets the count";
  EXPECT_GE(n_races(kCtas, 4, last_cta_kernel<4>), 1) << "another CTA's part, nothing between";
  EXPECT_EQ(n_races(1, 5, last_cta_kernel<4>), 0) << "a CTA a wave: CTAs one after another";
#endif
}

// Loads through the read-only path (__ldg) of a word the same launch writes:
// thread 0 of CTA 0 writes word kCase before a barrier and the loads (0) or
// after them (1); 2's word an earlier launch wrote; in 3 (4: a plain load)
// CTA 1 loads what CTA 0 wrote, CTAs one after another.
template <int kCase>
[[maybe_unused]] void nc_kernel(int* words, int* out) {
  const int t = int(threadIdx.x), b = int(blockIdx.x);
  int* w = words + kCase;
  const bool writer = b == 0 && t == 0;
  if ((kCase == 0 || kCase >= 3) && writer) *w = 5;
  __syncthreads();
  if (kCase < 3 || b == 1) out[b * 32 + t] = kCase == 4 ? *w : __ldg(w);
  __syncthreads();
  if (kCase == 1 && writer) *w = 6;
}
[[maybe_unused]] void set_kernel(int* w) {
  *w = 7;
}

// make test-emu-race's binary: the read-only path's cache is not coherent
// with the launch's writes, so memory loaded through it must be read-only for
// the launch (the CUDA guide, __ldg); a barrier does not order them, nor
// does one CTA's end the next one's start.
TEST(CudaEmu, ReadOnlyLoadsOfMemoryTheLaunchWritesAreReportedUnderTsan) {
#ifndef WICK_EMU_TSAN
  GTEST_SKIP() << "ThreadSanitizer is on in wick_gpu_emu_tsan_tests (make test-emu-race) only";
#else
  std::vector<int> words(5, 0), out(64, -1);
  const int was = wick_emu::set_race_ctas(1);
  auto n_races = [&](void (*kernel)(int*, int*)) {
    g_n_races = 0;
    wick_emu::launch(dim3(2), dim3(32), 0, kernel, words.data(), out.data());
    const int n = g_n_races;
    g_n_races = -1;
    return n;
  };
  EXPECT_GE(n_races(nc_kernel<0>), 1) << "written before a barrier";
  EXPECT_EQ(out[33], 5);
  EXPECT_GE(n_races(nc_kernel<1>), 1) << "written after a barrier";
  EXPECT_EQ(out[1], 0);  // (CTA 1 runs after CTA 0's write here)
  wick_emu::launch(dim3(1), dim3(1), 0, set_kernel, words.data() + 2);
  EXPECT_EQ(n_races(nc_kernel<2>), 0) << "written by an earlier launch";
  EXPECT_EQ(out[33], 7);
  EXPECT_GE(n_races(nc_kernel<3>), 1) << "written by an earlier CTA";
  EXPECT_EQ(out[33], 5);
  EXPECT_EQ(n_races(nc_kernel<4>), 0) << "written by an earlier CTA, a plain load";
  EXPECT_EQ(out[33], 5);
  wick_emu::set_race_ctas(was);
#endif
}

// A GPU faults on an access not aligned to its type, which x86 allows: the
// emulated kernels check each one (UBSan), and cp.async and ldmatrix their
// addresses.
void misaligned_kernel(const unsigned char* p, uint4* out) {
  out[0] = *reinterpret_cast<const uint4*>(p + 8);
}
void misaligned_copy_kernel(const unsigned char* p) {
  wick_emu::cp_async(wick_emu::dynamic_smem(), p + 8, 16, 16);
}

TEST(CudaEmu, MisalignedAccessesAreReported) {
  alignas(16) unsigned char buf[64] = {};
  uint4 out[1];
  EXPECT_DEATH(wick_emu::launch(dim3(1), dim3(1), 0, misaligned_kernel, buf, out),
               "misaligned address");
  try {
    wick_emu::launch(dim3(1), dim3(1), 64, misaligned_copy_kernel, buf);
    FAIL() << "no report";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not aligned"), std::string::npos) << e.what();
  }
}

// Each thread, then each CTA's thread 0, takes the next slot of a count.
void arrival_kernel(int* count, int* by_slot, int* ctas_by_slot) {
  const int t = int(blockIdx.x * blockDim.x + threadIdx.x);
  by_slot[atomicAdd(count, 1)] = t;
  __syncthreads();
  if (threadIdx.x == 0) ctas_by_slot[atomicAdd(count + 1, 1)] = int(blockIdx.x);
}

// A GPU runs CTAs, and warps between barriers, in no fixed order: shuffled
// schedules (WICK_EMU_SHUFFLE) run them in a seeded random one, which the
// same seed repeats; unshuffled, index order.
TEST(CudaEmu, ShuffledSchedulesRunCtasAndThreadsInAnotherOrder) {
  constexpr int kCtas = 8, kThreads = 64;
  auto run = [](uint64_t seed) {
    const uint64_t was = wick_emu::set_shuffle(seed);
    std::vector<int> count(2, 0), by_slot(kCtas * kThreads), ctas(kCtas);
    wick_emu::launch(dim3(kCtas), dim3(kThreads), 0, arrival_kernel, count.data(), by_slot.data(),
                     ctas.data());
    wick_emu::set_shuffle(was);
    by_slot.insert(by_slot.end(), ctas.begin(), ctas.end());
    return by_slot;
  };
  std::vector<int> in_order(kCtas * kThreads + kCtas);
  for (int i = 0; i < kCtas * kThreads; ++i) in_order[size_t(i)] = i;
  for (int b = 0; b < kCtas; ++b) in_order[size_t(kCtas * kThreads + b)] = b;
  EXPECT_EQ(run(0), in_order);
  const std::vector<int> a = run(1), b = run(2);
  EXPECT_NE(a, in_order);
  EXPECT_NE(a, b);
  EXPECT_EQ(run(1), a);
  for (const auto& order : {a, b}) {  // every thread and CTA once
    std::vector<int> threads(order.begin(), order.begin() + kCtas * kThreads);
    std::vector<int> ctas(order.begin() + kCtas * kThreads, order.end());
    std::sort(threads.begin(), threads.end());
    std::sort(ctas.begin(), ctas.end());
    EXPECT_EQ(threads, std::vector<int>(in_order.begin(), in_order.begin() + kCtas * kThreads));
    EXPECT_EQ(ctas, std::vector<int>(in_order.begin() + kCtas * kThreads, in_order.end()));
  }
  // the CTAs' own order: not index order
  EXPECT_NE(std::vector<int>(a.begin() + kCtas * kThreads, a.end()),
            std::vector<int>(in_order.begin() + kCtas * kThreads, in_order.end()));
}

// What C++ leaves undefined and a GPU does otherwise than x86 stops the
// emulated kernel (UBSan, fatal): a shift by the width (PTX clamps to 0,
// x86 masks the count), a float past int's range (a GPU saturates, x86 gives
// INT_MIN), an index past a local array (a GPU reads another register).
void shift_kernel(const unsigned* in, unsigned* out) {
  out[0] = in[0] >> in[1];
}
void cast_kernel(const float* in, int* out) {
  out[0] = int(in[0]);
}
void index_kernel(const int* in, int* out) {
  int regs[4] = {1, 2, 3, 4};
  out[0] = regs[in[0]];
}

TEST(CudaEmu, UndefinedBehaviourAGpuDoesOtherwiseIsReported) {
  const unsigned shifts[2] = {0x80000000u, 32};
  unsigned shifted = 0;
  EXPECT_DEATH(wick_emu::launch(dim3(1), dim3(1), 0, shift_kernel, shifts, &shifted),
               "shift exponent 32");
  const float big = 3e9f;
  int cast = 0;
  EXPECT_DEATH(wick_emu::launch(dim3(1), dim3(1), 0, cast_kernel, &big, &cast),
               "outside the range");
  const int at = 4;
  int read = 0;
  EXPECT_DEATH(wick_emu::launch(dim3(1), dim3(1), 0, index_kernel, &at, &read), "out of bounds");
  const int in_range = 3;  // (and no report where all is defined)
  wick_emu::launch(dim3(1), dim3(1), 0, index_kernel, &in_range, &read);
  EXPECT_EQ(read, 4);
}

// Fresh device memory is poisoned as a GPU's holds old bytes (NaN floats):
// a kernel that reads a buffer nothing wrote shows.
TEST(CudaEmu, FreshDeviceMemoryIsPoisoned) {
  uint32_t* p = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), 3 * sizeof(uint32_t)), cudaSuccess);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p[i], 0xffffffffu);
  cudaFree(p);
}

void add_kernel(int* p, int v) {
  atomicAdd(p, v);
}

void wide_kernel(int* out) {
  out[threadIdx.x] = int(threadIdx.x);
}
void bounded_kernel(int* out) {
  out[threadIdx.x] = 1;
}

// A GPU refuses a launch whose CTA needs more registers than an SM has or
// more threads than the kernel's __launch_bounds__; its occupancy counts
// registers a warp, 256 at a time, and each CTA's static shared memory.
TEST(CudaEmu, LaunchesPastAKernelsRegistersOrBoundsFail) {
  const void* wide = reinterpret_cast<const void*>(&wide_kernel);
  const void* bounded = reinterpret_cast<const void*>(&bounded_kernel);
  wick_emu::set_kernel_resources(wide, {255, 1024, 0, 0});
  wick_emu::set_kernel_resources(bounded, {40, 0, 16, 128});
  cudaFuncAttributes a{};
  ASSERT_EQ(cudaFuncGetAttributes(&a, wide), cudaSuccess);
  EXPECT_EQ(a.numRegs, 255);
  EXPECT_EQ(a.maxThreadsPerBlock, 256);  // 8 warps of 8,192 registers
  EXPECT_EQ(a.sharedSizeBytes, 1024u);
  ASSERT_EQ(cudaFuncGetAttributes(&a, bounded), cudaSuccess);
  EXPECT_EQ(a.maxThreadsPerBlock, 128);
  EXPECT_EQ(a.localSizeBytes, 16u);
  int n = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, wide, 256, 0);
  EXPECT_EQ(n, 1);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, bounded, 128, 0);
  EXPECT_EQ(n, 12);  // 51 warps of 1,280 registers, 4 a CTA
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, bounded, 256, 0);
  EXPECT_EQ(n, 0);

  std::vector<int> out(512, -1);
  cudaGetLastError();
  wick_emu::launch(dim3(1), dim3(512), 0, wide_kernel, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchOutOfResources);
  EXPECT_EQ(out[0], -1);
  wick_emu::launch(dim3(1), dim3(256), 0, wide_kernel, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(out[255], 255);
  wick_emu::launch(dim3(1), dim3(256), 0, bounded_kernel, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchOutOfResources);
  EXPECT_EQ(out[0], 0);
  wick_emu::launch(dim3(1), dim3(128), 0, bounded_kernel, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(out[0], 1);
  // static shared memory counts with the dynamic: 48 KB without an opt-in,
  // the device's opt-in with one
  wick_emu::launch(dim3(1), dim3(32), 48 * 1024, wide_kernel, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  wick_emu::launch(dim3(1), dim3(32), 47 * 1024, wide_kernel, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  int optin = 0;
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
  EXPECT_EQ(cudaFuncSetAttribute(wide, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - 512),
            cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cudaFuncSetAttribute(wide, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - 1024),
            cudaSuccess);
  wick_emu::launch(dim3(1), dim3(32), size_t(optin - 1024), wide_kernel, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Every line of the table of the backend's kernels (kernel_resources.py)
// names a kernel of this program: nvcc's names and g++'s agree.
TEST(CudaEmu, BackendKernelsTakeTheirH100Resources) {
  const auto [n_lines, n_matched] = wick_emu::resource_table_lines();
  if (n_lines == 0) GTEST_SKIP() << "no kernel resources table (WICK_EMU_RESOURCES=none)";
  EXPECT_GT(n_lines, 100u);
  EXPECT_EQ(n_matched, n_lines);
}

TEST(CudaEmu, LaunchChecksAndGraphsAsTheRuntime) {
  int x = 0;
  cudaGetLastError();
  wick_emu::launch(dim3(1), dim3(32), 64 * 1024, add_kernel, &x, 1);  // no opt-in past 48 KB
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(x, 0);
  cudaFuncSetAttribute(add_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
  wick_emu::launch(dim3(2), dim3(32), 64 * 1024, add_kernel, &x, 1);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(x, 64);
  // a captured launch keeps its arguments; replays run it again
  cudaStream_t st;
  cudaStreamCreate(&st);
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  int v = 2;
  wick_emu::launch(dim3(1), dim3(1), 0, st, add_kernel, &x, v);
  v = 100;
  cudaGraph_t g;
  ASSERT_EQ(cudaStreamEndCapture(st, &g), cudaSuccess);
  EXPECT_EQ(x, 64);  // recorded, not run
  cudaGraphExec_t e;
  ASSERT_EQ(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
  cudaGraphLaunch(e, st);
  cudaGraphLaunch(e, st);
  EXPECT_EQ(x, 64);  // a created stream's work waits for the host to wait for it
  cudaStreamSynchronize(st);
  EXPECT_EQ(x, 68);
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
  cudaStreamDestroy(st);
}

// As the runtime's "potentially unsafe API calls": in a thread capturing a
// stream (not in relaxed mode), cudaMalloc or waiting for a stream fails and
// spoils the capture.
TEST(CudaEmu, UnsafeCallsDuringACaptureSpoilIt) {
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  void* p = nullptr;
  for (auto mode : {cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed}) {
    const bool relaxed = mode == cudaStreamCaptureModeRelaxed;
    ASSERT_EQ(cudaStreamBeginCapture(st, mode), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&p, 64), relaxed ? cudaSuccess : cudaErrorStreamCaptureUnsupported);
    cudaGetLastError();
    cudaFree(p);
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(st, &g),
              relaxed ? cudaSuccess : cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(g != nullptr, relaxed);
    if (g) cudaGraphDestroy(g);
  }
  EXPECT_EQ(cudaMalloc(&p, 64), cudaSuccess) << "after the capture";
  cudaFree(p);
  cudaStreamDestroy(st);
}

// A created stream's work runs when the host waits for it (as if the GPU were
// far behind): a copy reads pinned memory then, a pinned destination holds
// poison until then, a copy to pageable memory waits, and an event waits for
// the work before its record only. (Device memory is read directly here:
// the emulator's is the host's.)
TEST(CudaEmu, CreatedStreamsRunWhenTheHostWaits) {
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  int *dev_x = nullptr, *pinned = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev_x), sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 2 * sizeof(int)), cudaSuccess);
  cudaEvent_t copied;
  ASSERT_EQ(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), cudaSuccess);
  pinned[0] = 1;
  cudaMemcpyAsync(dev_x, pinned, sizeof(int), cudaMemcpyHostToDevice, st);
  cudaEventRecord(copied, st);
  wick_emu::launch(dim3(1), dim3(1), 0, st, add_kernel, dev_x, 10);
  pinned[0] = 2;  // too soon: the copy has not read it
  cudaEventSynchronize(copied);
  EXPECT_EQ(dev_x[0], 2) << "the copy, and not the kernel after the event";
  cudaMemcpyAsync(pinned + 1, dev_x, sizeof(int), cudaMemcpyDeviceToHost, st);
  EXPECT_EQ(pinned[1], -1) << "poison until the host waits";
  cudaStreamSynchronize(st);
  EXPECT_EQ(pinned[1], 12);
  int pageable = 0;
  wick_emu::launch(dim3(1), dim3(1), 0, st, add_kernel, dev_x, 10);
  cudaMemcpyAsync(&pageable, dev_x, sizeof(int), cudaMemcpyDeviceToHost, st);
  EXPECT_EQ(pageable, 22) << "a copy to pageable memory returns when done";
  cudaEventDestroy(copied);
  cudaFreeHost(pinned);
  cudaFree(dev_x);
  cudaStreamDestroy(st);
}

}  // namespace
