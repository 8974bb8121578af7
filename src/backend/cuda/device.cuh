// Small device helpers shared by the CUDA kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/check.h"

namespace wick::cuda {

// Packs two floats into a bf16x2 register (lo in the low half).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, 4);
  return r;
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, 4);
  return r;
}

// A 16-byte load that bypasses L1 (weights are streamed once per step).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
#ifdef WICK_CUDA_EMU
  return __ldg(static_cast<const uint4*>(p));  // (the read-only path, as below)
#else
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
#endif
}

// Brings the 128-byte line of p into L1 (no register: a later load hits).
__device__ __forceinline__ void prefetch_l1(const void* p) {
#ifndef WICK_CUDA_EMU
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
#endif
}

// D += A . B on the tensor cores: m16n8k16, bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#ifdef WICK_CUDA_EMU
  ::wick_emu::mma_f32(d, {a0, a1, a2, a3}, {b0, b1}, true);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}
// The same with f16 inputs.
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
#ifdef WICK_CUDA_EMU
  ::wick_emu::mma_f32(d, {a0, a1, a2, a3}, {b0, b1}, false);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// q * scale - min with two roundings, as the CPU computes it (no FMA).
__device__ __forceinline__ float dq(float q, float scale, float min) {
  return __fsub_rn(__fmul_rn(q, scale), min);
}

// RoPE of the pair (a, b) = (x_i, x_{i + head_dim/2}) by the angle (cs, sn),
// each product and sum rounded on its own (no FMA): every kernel that rotates
// (the RoPE kernels, the q/k/v epilogue, attention's pre-RoPE keys) gives the
// same bits.
__device__ __forceinline__ float rope_lo(float a, float b, float cs, float sn) {
  return __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
}
__device__ __forceinline__ float rope_hi(float a, float b, float cs, float sn) {
  return __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn));
}
// The angle of frequency `freq` at position `pos`, as every RoPE kernel takes it.
__device__ __forceinline__ void rope_angle(int pos, float freq, float& cs, float& sn) {
  sincosf(__fmul_rn(float(pos), freq), &sn, &cs);
}

// Programmatic dependent launch (sm_90): a kernel launched by launch_early
// may start while the kernel before it drains, and must call this before it
// reads that kernel's outputs or writes anything. Elsewhere a no-op.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next kernel, when launched by launch_early, start now (it waits
// for this one's results itself).
__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Multiprocessors of the current device (read once).
inline int n_sms() {
  static const int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 1;
  }();
  return n;
}

// The most dynamic shared memory a CTA may opt in to on this GPU (H100/H200
// 227 KB, A100 163 KB, other Ampere and Ada GPUs 99 KB).
inline int device_smem_optin() {
  static const int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return v > 0 ? v : 48 * 1024;
  }();
  return n;
}
// A kernel's static shared memory counts against the opt-in limit too: the
// dynamic memory a kernel is sized for leaves this much (the gated product
// kernels' 16 bytes, and the 1 KB a driver may count as reserved).
constexpr int kStaticSmemReserve = 2048;
int smem_limit();  // WICK_CUDA_SMEM_LIMIT, set_smem_limit (matmul.cu): 0 none
// What the kernels size their shared memory by: the GPU's, or less where a
// test plays a smaller GPU (WICK_CUDA_SMEM_LIMIT). Kernels that would need
// more take a smaller shape or another kernel, with the same bits.
inline int max_smem_optin() {
  const int limit = smem_limit(), dev = device_smem_optin();
  return limit > 0 && limit < dev ? limit : dev;
}

// Launches `kernel` so that it may overlap the previous kernel's tail (its
// weight loads need nothing from it); the kernel calls wait_for_previous_kernel.
template <typename Kernel, typename... Args>
void launch_early(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                  Args... args) {
#ifdef WICK_CUDA_EMU
  ::wick_emu::launch(grid, block, smem, st, kernel, args...);
  WICK_CUDA_CHECK(cudaGetLastError());
#else
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  WICK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
#endif
}

}  // namespace wick::cuda
