// Integer products of decode steps on the CUDA cores (WICK_CUDA_INT_DP4A,
// with WICK_CUDA_INT_MMA): the same sums as matmul_int.cuh's mma, by dp4a,
// one thread for each weight row and slice, with no fragment exchange, no
// shuffle and no tensor core (a one-row step uses 1/16 of an mma's rows).
//
// The bits are the mma kernels': a weight group's sum 256 c1 + c2 (- 8 xs)
// is an exact integer however it is added up, and a thread folds it into
// its accumulator with int_chunk's FMAs in int_chunk's order (slice w: chunks
// w, w + kw, ... in increasing order, each chunk's groups in k order, a min
// term right after its group's). The slices' sums and all that follows are
// mm_body's epilogue (matmul.cu), from the same tile of sums.
//
// Thread t of a CTA takes row t % TC of the CTA's TC rows (8, or 32 for tall
// products) and slice t / TC (a thread for each row and slice); it loads a
// whole chunk of its row (64 bytes: 4 16-byte loads, a chunk ahead) and
// reads x from a shared-memory stage of x's integer form (rows 0..M-1, M <=
// kDpRows), where the threads of a slice read the same bytes and the slices
// of a warp, one chunk apart, fall on different banks (a 16-byte skew per
// chunk).
// scripts/emulate_int_dp4a.py replays it on the CPU against int_chunk's sums.
#pragma once

#include "backend/cuda/matmul_int.cuh"

namespace wick::cuda {

constexpr int kDpRows = 4;  // the most rows of x a dp4a launch takes

// The stage: each row's levels as chunks of 2 KC bytes, each followed by 16
// bytes of skew; then d [M][k_pad / 32] and the 16-sums [M][k_pad / 16].
__host__ __device__ constexpr size_t dp_align16(size_t n) {
  return (n + 15) / 16 * 16;
}
__host__ __device__ constexpr int dp_chunk_bytes(int kc) {
  return 2 * kc + 16;
}
__host__ __device__ constexpr size_t dp_row_bytes(int kc, int k_pad) {
  return size_t(k_pad / kc) * size_t(dp_chunk_bytes(kc));
}
__host__ __device__ constexpr size_t dp_stage_bytes(int kc, int M, int k_pad) {
  return size_t(M) * dp_row_bytes(kc, k_pad) + dp_align16(size_t(M) * size_t(k_pad / 32) * 4) +
         size_t(M) * size_t(k_pad / 16) * 4;
}

struct DpStage {
  const uint8_t* q;
  const float* d;
  const int* s;
  int k_pad;
};

// Rows 0..M-1 of x's integer form (rows k_pad apart in xa) into the stage,
// by every thread of the CTA, then a barrier. The levels go 16 bytes at a
// time, two loads before their stores (as stage_x: each round trip to L2
// delays the chunk loop).
template <int KC>
__device__ DpStage stage_int_x(const IntAct& xa, int M, int k_pad, uint8_t* smem) {
  constexpr int kIn = 2 * KC / 16;  // 16-byte pieces of a chunk's levels
  const int t = int(threadIdx.x), n_t = int(blockDim.x);
  const int n_q = M * (2 * k_pad / 16);
  const uint4* src = reinterpret_cast<const uint4*>(xa.q);
  // piece i of the rows' levels: its place in the stage (row, chunk, piece)
  auto dst = [&](int i) {
    const int ch = i / kIn;  // chunks of all rows, in order (a row is whole chunks)
    return reinterpret_cast<uint4*>(smem + size_t(ch) * dp_chunk_bytes(KC)) + (i - ch * kIn);
  };
  for (int i0 = t; i0 < n_q; i0 += 2 * n_t) {
    const int i1 = i0 + n_t;
    const uint4 a = __ldg(src + i0), b = i1 < n_q ? __ldg(src + i1) : uint4{};
    *dst(i0) = a;
    if (i1 < n_q) *dst(i1) = b;
  }
  float* d = reinterpret_cast<float*>(smem + size_t(M) * dp_row_bytes(KC, k_pad));
  int* s = reinterpret_cast<int*>(reinterpret_cast<uint8_t*>(d) +
                                  dp_align16(size_t(M) * size_t(k_pad / 32) * 4));
  const int n_d = M * (k_pad / 32), n_s = M * (k_pad / 16);
  for (int i = t; i < n_d + n_s; i += n_t) {
    if (i < n_d)
      d[i] = __ldg(xa.d + i);
    else
      s[i - n_d] = __ldg(xa.s + (i - n_d));
  }
  __syncthreads();
  return DpStage{smem, d, s, k_pad};
}

// A chunk of one weight row as a thread holds it: its 16 words of levels
// and its groups' scales and mins (mins: the stored ones, where it has them).
template <Fmt F, int IG>
struct DpChunk {
  static constexpr int KC = k_chunk(F), NG = KC / IG;
  uint4 q[4];
  float s[NG], m[NG];
};

// Chunk ch of weight row `row` of w (zeros past n_out: its sums are dropped).
template <Fmt F, int IG>
__device__ __forceinline__ void dp_fetch(const GpuWeight& w, int row, int ch, DpChunk<F, IG>& out) {
  using C = DpChunk<F, IG>;
  constexpr int kBytes = F == Fmt::U4 ? C::KC / 2 : C::KC;  // 64 either way
  static_assert(kBytes == 64, "a chunk of a row is 64 bytes");
  if (row >= w.n_out) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out.q[i] = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int g = 0; g < C::NG; ++g) out.s[g] = out.m[g] = 0.f;
    return;
  }
  const uint4* src =
      reinterpret_cast<const uint4*>(row_ptr<F>(w, row) + size_t(ch) * size_t(kBytes));
#pragma unroll
  for (int i = 0; i < 4; ++i) out.q[i] = __ldg(src + i);
  const size_t gi = size_t(row) * size_t(w.k_pad / IG) + size_t(ch) * C::NG;
  load_n<C::NG>(w.scale + gi, out.s);           // (16-byte aligned arrays, check_int_weight)
  if (w.min) load_n<C::NG>(w.min + gi, out.m);  // (else never read: has_min is false)
}

// Chunk ch of a thread's row into acc[m] for rows m < M of the stage: each
// group's exact integer sum, folded as int_chunk folds it.
template <Fmt F, int IG>
__device__ __forceinline__ void dp_chunk(const DpStage& xs, int M, int ch, const DpChunk<F, IG>& c,
                                         bool has_min, bool min8, float (&acc)[kDpRows]) {
  using C = DpChunk<F, IG>;
  constexpr int NG = C::NG, KC = C::KC;
  uint32_t wq[16];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    wq[4 * i] = c.q[i].x, wq[4 * i + 1] = c.q[i].y, wq[4 * i + 2] = c.q[i].z,
           wq[4 * i + 3] = c.q[i].w;
#pragma unroll
  for (int m = 0; m < kDpRows; ++m) {
    if (m >= M) break;
    // the chunk's levels of row m: per 4 stored elements their q1 bytes,
    // then their q2 bytes; 4-bit weights' x in each 8 the even elements,
    // then the odd ones, as the weights' low and high nibbles
    const uint4* xq = reinterpret_cast<const uint4*>(xs.q + m * dp_row_bytes(KC, xs.k_pad) +
                                                     ch * dp_chunk_bytes(KC));
    const float* dx = xs.d + m * (xs.k_pad / 32) + ch * (KC / 32);
    const int* s16 = xs.s + m * (xs.k_pad / 16) + ch * (KC / 16);
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      int c1 = 0, c2 = 0;
#pragma unroll
      for (int v = 0; v < IG / 8; ++v) {  // 8 elements a load of x
        const int e = g * IG + 8 * v;     // the first of them in the chunk
        const uint4 X = xq[e / 8];
        uint32_t w0, w1;  // the weights X's halves pair with
        if constexpr (F == Fmt::I8) {
          w0 = wq[e / 4], w1 = wq[e / 4 + 1];
        } else {
          w0 = wq[e / 8] & 0x0f0f0f0fu, w1 = (wq[e / 8] >> 4) & 0x0f0f0f0fu;
        }
        c1 = __dp4a(int(w0), int(X.x), c1);
        c2 = __dp4a(int(w0), int(X.y), c2);
        c1 = __dp4a(int(w1), int(X.z), c1);
        c2 = __dp4a(int(w1), int(X.w), c2);
      }
      // the group's sum of x (256 q1 + q2), where a min needs it
      const int x16 = !(min8 || has_min) ? 0 : IG == 16 ? s16[g] : s16[2 * g] + s16[2 * g + 1];
      // |256 c1 + c2 (- 8 xs)| < 2^28: one rounding (6e-8) at most
      const int sum = c1 * 256 + c2 - (min8 ? 8 * x16 : 0);
      const float d = dx[IG == 16 ? g / 2 : g];
      acc[m] = __fmaf_rn(__int2float_rn(sum), __fmul_rn(d, c.s[g]), acc[m]);
      if (has_min) acc[m] = __fmaf_rn(-c.m[g], __fmul_rn(__int2float_rn(x16), d), acc[m]);
    }
  }
}

}  // namespace wick::cuda
