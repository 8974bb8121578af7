// The activations of an integer product (matmul_int.cuh): x quantized per row
// and block of 32 into two int8 levels, once per product.
#include <algorithm>

#include "backend/cuda/matmul_int.cuh"

namespace wick::cuda {

namespace {

size_t align16(size_t n) {
  return (n + 15) / 16 * 16;
}

// One warp a block of 32 elements, one lane an element.
__global__ void quantize_act_kernel(const float* x, int M, int n_in, int k_pad, bool nibbles,
                                    uint8_t* q, float* d, int* s) {
  allow_next_kernel();
  const int lane = threadIdx.x & 31, n_blocks = k_pad / 32;
  const int64_t blk = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  wait_for_previous_kernel();                // x comes from the kernel before
  if (blk >= int64_t(M) * n_blocks) return;  // whole warps
  const int row = int(blk / n_blocks), b = int(blk % n_blocks), e = 32 * b + lane;
  const float v = e < n_in ? x[size_t(row) * size_t(n_in) + e] : 0.f;
  float amax = fabsf(v);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, off));
  const float dd = __fdiv_rn(amax, 127.f);
  int q1 = 0, q2 = 0;
  if (amax > 0.f) {
    q1 = max(-127, min(127, __float2int_rn(__fdiv_rn(v, dd))));
    const float rest = __fsub_rn(v, __fmul_rn(dd, float(q1)));
    q2 = max(-127, min(127, __float2int_rn(__fdiv_rn(__fmul_rn(rest, 256.f), dd))));
  }
  // U4's order: in each 8, the even elements, then the odd ones
  const int w = e & 7, p = nibbles ? (e & ~7) + (w & 1) * 4 + (w >> 1) : e;
  uint8_t* dst = q + size_t(row) * size_t(2 * k_pad) + (p / 4) * 8 + p % 4;
  dst[0] = uint8_t(int8_t(q1));
  dst[4] = uint8_t(int8_t(q2));
  int sum = 256 * q1 + q2;
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(~0u, sum, off);  // per 16
  if (lane % 16 == 0) s[size_t(row) * (k_pad / 16) + 2 * b + lane / 16] = sum;
  if (lane == 0) d[size_t(row) * n_blocks + b] = __fdiv_rn(dd, 256.f);
}

}  // namespace

size_t int_act_bytes(int M, int k_pad) {
  const size_t m = size_t(std::max(M, 0));
  return align16(m * 2 * size_t(k_pad)) + align16(m * size_t(k_pad / 32) * 4) +
         m * size_t(k_pad / 16) * 4;
}

IntAct quantize_act(const float* x, int M, int n_in, int k_pad, bool nibbles, void* scratch,
                    cudaStream_t st) {
  uint8_t* base = static_cast<uint8_t*>(scratch);
  const size_t m = size_t(M);
  uint8_t* q = base;
  float* d = reinterpret_cast<float*>(base + align16(m * 2 * size_t(k_pad)));
  int* s =
      reinterpret_cast<int*>(reinterpret_cast<uint8_t*>(d) + align16(m * size_t(k_pad / 32) * 4));
  const int64_t threads = int64_t(M) * k_pad;  // one an element
  launch_early(quantize_act_kernel, dim3(unsigned((threads + 255) / 256)), dim3(256), 0, st, x, M,
               n_in, k_pad, nibbles, q, d, s);
  return IntAct{q, d, s};
}

}  // namespace wick::cuda
