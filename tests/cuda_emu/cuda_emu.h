// wick's CUDA emulator: the CUDA backend's kernels compiled as host C++ and
// run on the CPU, one CTA at a time, each thread a fiber (docs/cuda_emu.md).
//
// Force-included (-include) into every .cu file of the emulated build, after
// tests/cuda_emu/rewrite_cu.py has turned its launches (`k<<<g, b, s, st>>>(a)`)
// into wick_emu::launch calls and its `extern __shared__` arrays into pointers
// to the CTA's dynamic shared memory. What the kernels use of the device
// (intrinsics, warp collectives, barriers, the tensor cores' mma, ldmatrix,
// cp.async) is written here from the CUDA C++ Programming Guide and the PTX
// ISA; the asm wrappers in the kernels call it under WICK_CUDA_EMU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

namespace wick_emu {

// ---- the running thread (a fiber) and its CTA --------------------------------

const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
unsigned char* dynamic_smem();
// A `__shared__` variable's storage in the running CTA (rewrite_cu.py): its
// own for each CTA, fresh (poisoned as dynamic shared memory) at its start;
// `key` tells the declarations apart.
void* static_smem(const void* key, size_t size, size_t align);
template <typename A, size_t kAlign, typename Site>
A& cta_shared(Site) {
  static char key;  // (its address)
  constexpr size_t align = kAlign > alignof(A) ? kAlign : alignof(A);
  return *static_cast<A*>(static_smem(&key, sizeof(A), align));
}

// The race check (WICK_EMU_TSAN): a __threadfence; an atomic on p follows;
// the CTAs a wave (WICK_EMU_RACE_CTAS; returns the value it replaces).
void fence();
void before_atomic(const void* p);
int set_race_ctas(int n);
// Shuffled schedules' seed (WICK_EMU_SHUFFLE; 0: CTAs and threads in index
// order); returns the one it replaces.
uint64_t set_shuffle(uint64_t seed);
// The race check: n bytes at p loaded through the read-only path (__ldg,
// ld.global.nc), whose cache is not coherent with the launch's own writes.
void nc_read(const void* p, size_t n);

// What a kernel takes on an H100: registers a thread, static shared memory
// and stack frame bytes, its __launch_bounds__ (0: none). The backend's come
// from kernel_resources.py's table (nvcc and ptxas -v, built with the
// emulator; WICK_EMU_RESOURCES names another, "none" for none), by the
// emulated kernel's symbol; occupancy, cudaFuncGetAttributes and the launch's
// check use them (others: WICK_EMU_REGS registers).
struct KernelResources {
  int regs = 0, static_smem = 0, stack = 0, max_threads = 0;
};
// A test's own kernel's (those the table cannot have).
void set_kernel_resources(const void* kernel, const KernelResources& r);
// The table's lines, and how many name a function of this program.
std::pair<size_t, size_t> resource_table_lines();

void syncthreads();
void syncwarp(unsigned mask);
uint64_t shfl(unsigned mask, uint64_t v, int kind, int arg,
              int width);                        // kind: 0 idx 1 up 2 down 3 xor
unsigned vote(unsigned mask, bool v, int kind);  // kind: 0 any 1 all 2 ballot

// Tensor-core and shared-memory matrix instructions, per lane (PTX ISA, "Matrix
// Fragments for mma.m16n8k16" / "m16n8k32", and ldmatrix).
void mma_f32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16);
void imma(int (&d)[4], const uint32_t* a, int n_a, const uint32_t* b, int n_b, int k, bool b_u8);
void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* row_addr, bool trans);

// cp.async: a copy of `bytes` (the rest of `size` zero-filled), done when the
// thread waits for its group (the latest a GPU may complete it).
void cp_async(void* smem, const void* gmem, int size, int bytes);
void cp_async_commit();
void cp_async_wait(int n_newest_pending);

// ---- launches -----------------------------------------------------------------

using Body = std::function<void()>;
// Checks the configuration against the device (as the GPU does at launch) and
// runs the grid now, or records it while `st` is being captured into a graph.
void submit(cudaStream_t st, dim3 grid, dim3 block, size_t smem, const void* kernel, Body body);

template <typename... P, typename... A>
void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t st, void (*kernel)(P...), A&&... a) {
  // A kernel's arguments are copied at the launch (a graph keeps these copies).
  auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(a)...);
  submit(st, grid, block, smem, reinterpret_cast<const void*>(kernel),
         [kernel, params] { std::apply(kernel, *params); });
}
template <typename... P, typename... A>
void launch(dim3 grid, dim3 block, size_t smem, void (*kernel)(P...), A&&... a) {
  launch(grid, block, smem, cudaStream_t(nullptr), kernel, std::forward<A>(a)...);
}

template <typename T>
T bits_to(uint64_t v) {
  T r;
  std::memcpy(static_cast<void*>(&r), &v, sizeof(T));
  return r;
}
template <typename T>
uint64_t to_bits(const T& x) {
  static_assert(sizeof(T) <= 8, "shuffles of at most 8 bytes");
  uint64_t v = 0;
  std::memcpy(&v, static_cast<const void*>(&x), sizeof(T));
  return v;
}

}  // namespace wick_emu

// ---- CUDA C++'s names for them ----------------------------------------------------

#undef __shared__
// rewrite_cu.py turns each `__shared__` declaration of a .cu file into a
// cta_shared call: one left here (in a header, say) fails to compile.
#define __shared__ __shared___outside_a_cu_file_is_not_rewritten
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#define threadIdx (::wick_emu::thread_idx())
#define blockIdx (::wick_emu::block_idx())
#define blockDim (::wick_emu::block_dim())
#define gridDim (::wick_emu::grid_dim())
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif
#ifndef warpSize
#define warpSize 32
#endif

// The runtime's kernel-typed overloads (cuda_runtime.h has them for nvcc only).
template <typename... P>
cudaError_t cudaFuncSetAttribute(void (*f)(P...), cudaFuncAttribute a, int v) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(f), a, v);
}
template <typename... P>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* out, void (*f)(P...)) {
  return cudaFuncGetAttributes(out, reinterpret_cast<const void*>(f));
}
template <typename... P>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, void (*f)(P...), int block,
                                                          size_t smem) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, reinterpret_cast<const void*>(f), block,
                                                       smem);
}

inline void __syncthreads() {
  ::wick_emu::syncthreads();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::wick_emu::syncwarp(mask);
}
inline void __threadfence() {  // (one thread at a time: nothing to order but for the race check)
#ifdef WICK_EMU_TSAN
  ::wick_emu::fence();
#endif
}
inline void __threadfence_block() {}

template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return ::wick_emu::bits_to<T>(::wick_emu::shfl(mask, ::wick_emu::to_bits(v), 0, src, width));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
  return ::wick_emu::bits_to<T>(::wick_emu::shfl(mask, ::wick_emu::to_bits(v), 1, int(d), width));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
  return ::wick_emu::bits_to<T>(::wick_emu::shfl(mask, ::wick_emu::to_bits(v), 2, int(d), width));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
  return ::wick_emu::bits_to<T>(::wick_emu::shfl(mask, ::wick_emu::to_bits(v), 3, m, width));
}
inline int __any_sync(unsigned mask, int p) {
  return int(::wick_emu::vote(mask, p != 0, 0));
}
inline int __all_sync(unsigned mask, int p) {
  return int(::wick_emu::vote(mask, p != 0, 1));
}
inline unsigned __ballot_sync(unsigned mask, int p) {
  return ::wick_emu::vote(mask, p != 0, 2);
}

// Loads through the read-only / L2 paths are plain loads here. The read-only
// path's cache is not kept coherent with writes (the CUDA guide: the memory
// must be read-only for the kernel's lifetime), so the race check makes an
// __ldg a read ordered with the host only: a write of the same launch to the
// same bytes, before or after it, in any thread, is a report.
template <typename T>
T __ldg(const T* p) {
#ifdef WICK_EMU_TSAN
  ::wick_emu::nc_read(p, sizeof(T));
#endif
  return *p;
}
template <typename T>
T __ldcg(const T* p) {
  return *p;
}
inline size_t __cvta_generic_to_shared(const void* p) {
  return reinterpret_cast<size_t>(p);
}

// Arithmetic with the rounding named (the emulated build has no FMA
// contraction: -ffp-contract=off).
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}
inline float __frcp_rn(float a) {
  return 1.f / a;
}
inline float __expf(float a) {
  return std::exp(a);
}
inline float __logf(float a) {
  return std::log(a);
}
inline float __saturatef(float a) {
  return a < 0.f ? 0.f : a > 1.f ? 1.f : a;
}
inline float rsqrtf(float a) {
  return 1.f / std::sqrt(a);
}
inline float __int2float_rn(int i) {
  return float(i);
}
inline int __float2int_rn(float f) {
  return int(std::nearbyint(f));
}
inline float __double2float_rn(double d) {
  return float(d);
}
// Toward zero / toward minus infinity: the nearest float, stepped back where
// it went past d.
inline float __double2float_rz(double d) {
  float f = float(d);
  if (std::fabs(double(f)) > std::fabs(d)) f = std::nextafter(f, 0.f);
  return f;
}
inline float __double2float_rd(double d) {
  float f = float(d);
  if (double(f) > d) f = std::nextafter(f, -INFINITY);
  return f;
}
inline unsigned long long __float2ull_rz(float f) {
  return (unsigned long long)(f);
}
inline unsigned long long __double2ull_rz(double d) {
  return (unsigned long long)(d);
}
inline float __uint_as_float(unsigned u) {
  return ::wick_emu::bits_to<float>(u);
}
inline float __int_as_float(int i) {
  return ::wick_emu::bits_to<float>(uint32_t(i));
}
inline unsigned __float_as_uint(float f) {
  return uint32_t(::wick_emu::to_bits(f));
}
inline int __float_as_int(float f) {
  return int(uint32_t(::wick_emu::to_bits(f)));
}
inline int __ffs(int x) {
  return __builtin_ffs(x);
}
inline int __clz(int x) {
  return x == 0 ? 32 : __builtin_clz(unsigned(x));
}
inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}
// Byte s[4i+3..4i] of the selector picks byte i of the result from {y, x}'s 8.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = uint64_t(y) << 32 | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += int(int8_t(a >> (8 * i))) * int(int8_t(b >> (8 * i)));
  return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
  for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xff) * ((b >> (8 * i)) & 0xff);
  return c;
}
inline int __dp4a(int a, unsigned b, int c) {
  for (int i = 0; i < 4; ++i) c += int(int8_t(a >> (8 * i))) * int((b >> (8 * i)) & 0xff);
  return c;
}

// One host thread runs a CTA's fibers in turn, and CTAs one after another:
// the atomics need no lock. Under the race check (WICK_EMU_TSAN) they are the
// compiler's relaxed atomics, as a GPU's: what orders memory between CTAs is
// a __threadfence before an atomic in one and one after it in another (the
// PTX memory model's fences, as the emulator tells TSan).
namespace wick_emu {
template <typename T, typename F>
T atomic_update(T* p, F next_of) {
#ifdef WICK_EMU_TSAN
  before_atomic(p);
  T old, next;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do next = next_of(old);
  while (!__atomic_compare_exchange(p, &old, &next, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return old;
#else
  const T old = *p;
  *p = next_of(old);
  return old;
#endif
}
}  // namespace wick_emu
template <typename T>
T atomicAdd(T* p, T v) {
  return ::wick_emu::atomic_update(p, [v](T old) { return T(old + v); });
}
template <typename T>
T atomicMin(T* p, T v) {
  return ::wick_emu::atomic_update(p, [v](T old) { return v < old ? v : old; });
}
template <typename T>
T atomicMax(T* p, T v) {
  return ::wick_emu::atomic_update(p, [v](T old) { return v > old ? v : old; });
}
template <typename T>
T atomicExch(T* p, T v) {
  return ::wick_emu::atomic_update(p, [v](T) { return v; });
}
template <typename T>
T atomicCAS(T* p, T cmp, T v) {
  return ::wick_emu::atomic_update(p, [cmp, v](T old) { return old == cmp ? v : old; });
}

// Device code's unqualified math.
using std::isfinite;
using std::isinf;
using std::isnan;
using std::max;
using std::min;
