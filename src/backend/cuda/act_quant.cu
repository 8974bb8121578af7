// The activations of an integer product (matmul_int.cuh): x quantized per row
// and block of 32 into two int8 levels, once per product, unless the norm
// that made x already did (NormInt, elementwise.cu).
#include <algorithm>
#include <atomic>

#include "backend/cuda/matmul_int.cuh"

namespace wick::cuda {

namespace {

std::atomic<uint64_t> g_launches{0};

size_t align16(size_t n) {
  return (n + 15) / 16 * 16;
}

// M rows' integer form: levels [M][2 k_pad], d [M][k_pad / 32], s [M][k_pad / 16].
size_t bytes_of(int M, int k_pad) {
  const size_t m = size_t(std::max(M, 0));
  return align16(m * 2 * size_t(k_pad)) + align16(m * size_t(k_pad / 32) * 4) +
         m * size_t(k_pad / 16) * 4;
}

IntAct act_at(void* base_ptr, int M, int k_pad) {
  uint8_t* base = static_cast<uint8_t*>(base_ptr);
  const size_t m = size_t(std::max(M, 0));
  float* d = reinterpret_cast<float*>(base + align16(m * 2 * size_t(k_pad)));
  int* s =
      reinterpret_cast<int*>(reinterpret_cast<uint8_t*>(d) + align16(m * size_t(k_pad / 32) * 4));
  return IntAct{base, d, s};
}

// A NormInt's buffer: the form for I8 weights (k's order), then for U4
// weights (theirs), each with rows round_up(n, k_chunk) apart, as the
// weights' k_pad (repack.cpp).
struct NormIntLayout {
  int k_pad[2];
  size_t offset[2];
  NormIntLayout(int M, int n) {
    k_pad[0] = k_pad_of(Fmt::I8, n);
    k_pad[1] = k_pad_of(Fmt::U4, n);
    offset[0] = 0;
    offset[1] = align16(bytes_of(M, k_pad[0]));
  }
};

// One warp a block of 32 elements, one lane an element.
__global__ void quantize_act_kernel(const float* x, int M, int n_in, int k_pad, bool nibbles,
                                    IntAct a) {
  allow_next_kernel();
  const int lane = threadIdx.x & 31, n_blocks = k_pad / 32;
  const int64_t blk = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  wait_for_previous_kernel();                // x comes from the kernel before
  if (blk >= int64_t(M) * n_blocks) return;  // whole warps
  const int row = int(blk / n_blocks), b = int(blk % n_blocks), e = 32 * b + lane;
  const float v = e < n_in ? x[size_t(row) * size_t(n_in) + e] : 0.f;
  quantize_block(v, lane, b, {int_row_out(a, row, k_pad, nibbles)});
}

}  // namespace

size_t int_act_bytes(int M, int k_pad) {
  return bytes_of(M, k_pad);
}

IntAct quantize_act(const float* x, int M, int n_in, int k_pad, bool nibbles, void* scratch,
                    cudaStream_t st) {
  const IntAct a = act_at(scratch, M, k_pad);
  ++g_launches;
  const int64_t threads = int64_t(M) * k_pad;  // one an element
  launch_early(quantize_act_kernel, dim3(unsigned((threads + 255) / 256)), dim3(256), 0, st, x, M,
               n_in, k_pad, nibbles, a);
  return a;
}

uint64_t quantize_act_launches() {
  return g_launches.load();
}

size_t norm_int_bytes(int M, int n) {
  const NormIntLayout l(M, n);
  return l.offset[1] + bytes_of(M, l.k_pad[1]);
}

IntAct norm_int_act(const NormInt& ni, Fmt f) {
  const NormIntLayout l(ni.M, ni.n);
  const int i = f == Fmt::U4 ? 1 : 0;
  return act_at(static_cast<uint8_t*>(ni.buf) + l.offset[i], ni.M, l.k_pad[i]);
}

IntOut int_out(const NormInt& ni) {
  IntOut o;
  if (ni.for_i8) o.i8 = norm_int_act(ni, Fmt::I8);
  if (ni.for_u4) o.u4 = norm_int_act(ni, Fmt::U4);
  o.k_i8 = k_pad_of(Fmt::I8, ni.n);
  o.k_u4 = k_pad_of(Fmt::U4, ni.n);
  return o;
}

}  // namespace wick::cuda
