// Matrix products on the tensor cores (bf16 in, f32 accumulate), one kernel
// for every batch size, so that a token's result never depends on what else
// is in its batch.
//
// The reduction order of an output element is fixed by the weights alone:
// k is cut into chunks of k_chunk(fmt) elements; warp w of a CTA's KW warps
// (KW from the shapes of the weights launched together and the GPU's size,
// kw_for) takes chunks w, w + KW, ... in increasing
// order, each chunk as E/4 mma steps; the KW partial sums are then added in
// warp order. Lanes load their weights with one 16-byte load per chunk: lane
// (g, c) = (lane / 4, lane % 4) holds elements [E c, E c + E) of its row, and
// mma step s uses its elements 4s..4s+3 as the fragment's k = 2c, 2c+1,
// 2c+8, 2c+9. The activations use the same permutation of k, so the sum is
// the same set of products. A tile shape (rows x columns per warp) changes
// which CTA computes an element, never the order.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "backend/cuda/device.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/matmul_common.cuh"
#include "backend/cuda/matmul_dp4a.cuh"
#include "backend/cuda/matmul_int.cuh"
#include "backend/cuda/matmul_tiled.h"
#include "backend/cuda/slices.h"

namespace wick::cuda {

namespace {

constexpr int kMaxJobs = 3;

struct Job {
  GpuWeight w;
  float* y;
  const float* bias;
  int tile_start;  // first n-tile of this job in grid.x
};

struct Params {
  Job jobs[kMaxJobs];
  int n_jobs;
  const float* x;
  int M, n_in, k_pad, kw;
  float* y_gated;  // GATED: the output
  GpuWeight up;    // GATED: the second weight (jobs[0] is the gate)
  // GROUPED (mixture of experts): blockIdx.y picks a tile (expert, first row,
  // rows); the weights are experts[expert * 3 + which] (gate, up, down).
  const GpuWeight* experts;
  const int4* tiles;
  int which;
  int tile_rows;  // the most rows of a tile (grouped_tile_rows)
  RopeKv rope;    // ROPE: RoPE and the cache write in the epilogue (jobs q, k, v)
  AddNorm norm;   // NORM: residual add and norm of the one row, by the last CTA
  IntAct xa;      // IG: x in integer form (quantize_act)
  // GATED decode with integer products (16 rows, 8 columns a CTA): the
  // output's integer form too, for the product of it after (the down
  // projection), in the orders wanted (levels null: not), rows k_* apart;
  // each 32 columns by the last of their 4 CTAs (out_counters, one a block,
  // zero between launches); null: none
  IntOut out_form;
  int* out_counters;
  int xs_rs;  // XS: the staged activations' row stride, in bf16 pairs (xs_row_pairs)
};

// ROPE: tile t of q or k holds four rotation pairs of one head, so that the
// epilogue finds both elements of a pair in its CTA: lane group g (the
// tile's column g) computes element i0 + (g & 3) of the head's first half
// (g < 4) or the same element of its second half. A tile's rows never change
// an element's reduction order, so the bits equal the plain kernel's.
__device__ __forceinline__ int rope_row(int tile, int g, int head_dim) {
  const int tiles_per_head = head_dim / 8, half = head_dim / 2;
  const int i0 = (tile % tiles_per_head) * 4;
  return (tile / tiles_per_head) * head_dim + i0 + (g & 3) + (g >> 2) * half;
}

// The raw 16 bytes of one lane's weights of one chunk, with its group's
// scale and min: fetched a few chunks ahead, decoded when used.
struct RawB {
  uint4 q;
  float s, m;
};

// row_g: the lane's weight row in the first 8-row tile (the next tiles' rows
// follow by 8). L1: integer products, which read the scales of other rows
// (int_chunk): the lane's scale and min only brought into L1 for them.
template <Fmt F, int NT, bool L1 = false>
__device__ __forceinline__ void fetch_b(const GpuWeight& w, int row_g, int k, RawB (&r)[NT]) {
  constexpr int kBytesPer16 = F == Fmt::U4 ? 8 : (F == Fmt::I8 ? 16 : 32);  // bytes per 16 elems
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int row = row_g + 8 * nt;
    r[nt] = RawB{make_uint4(0, 0, 0, 0), 0.f, 0.f};
    if (row < w.n_out) {
      r[nt].q = ld_stream(row_ptr<F>(w, row) + size_t(k) * kBytesPer16 / 16);
      if constexpr (F == Fmt::I8 || F == Fmt::U4) {
        const size_t gi = group_index(w, row, k);
        if constexpr (L1) {
          prefetch_l1(w.scale + gi);
          if (w.min) prefetch_l1(w.min + gi);
        } else {
          r[nt].s = __ldg(w.scale + gi);
          r[nt].m = group_min(w, gi, r[nt].s);
        }
      }
    }
  }
}

// Four consecutive activations of row r from k (zero past the row or M).
__device__ __forceinline__ float4 load_x4(const float* x, int M, int n_in, int r, int k) {
  if (r >= M) return make_float4(0.f, 0.f, 0.f, 0.f);
  const float* src = x + size_t(r) * size_t(n_in) + k;
  if ((n_in & 3) == 0 && k + 3 < n_in) return *reinterpret_cast<const float4*>(src);
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = k + j < n_in ? src[j] : 0.f;
  return make_float4(v[0], v[1], v[2], v[3]);
}

// XS (decode kernels of up to 16 rows): x staged once a CTA in shared
// memory as bf16 pairs, so that the chunk loop reads each step's A registers
// with one shared load per step or two, instead of every lane loading its
// float4s from L2 (a chunk's x is read by one warp of a CTA: each load
// missed L1, a wait the weights' prefetch does not cover) and converting
// them itself (8 of a chunk's 16 conversions for 8-bit weights, every one
// done by 8 lanes alike). The values are load_x4's, packed as before: the
// same A registers in every row below M, the same bits (rows past M, zeros
// before, now repeat row M - 1: their products reach only their own output
// rows, which the epilogue drops).
//
// Layout, chosen so that the lanes of a load fall on distinct banks: the
// 16-byte loads of two steps (16- and 4-bit weights) of a quarter warp
// (lanes g = 2q, 2q + 1 and c = 0..3, at pair E/2 c + 4 t of their rows),
// the 8-byte loads of one step (8-bit weights) of a half warp (g = 4q ..
// 4q + 3, at pair 8 c + 2 s). 4-bit weights' rows (a lane 16 pairs past the
// last) leave 4 pairs after every 32; row r starts at r xs_rs, xs_rs = 16
// (16-bit), 2 (8-bit) or 8 (4-bit) past a multiple of 32.
template <Fmt F>
__host__ __device__ constexpr int xs_pair(int i) {
  return F == Fmt::U4 ? i + ((i >> 5) << 2) : i;
}
template <Fmt F>
__host__ __device__ constexpr int xs_row_pairs(int k_pad) {
  const int len = xs_pair<F>(k_pad / 2 - 1) + 1;
  const int want = F == Fmt::U4 ? 8 : F == Fmt::I8 ? 2 : 16;  // the row stride mod 32
  return len + ((want - len % 32) + 32) % 32;
}

// Rows 0..M-1 of x into the stage (every thread of the CTA, then a barrier),
// four elements at a time: group i of the rows' M k_pad / 4. A thread's
// loads go out two at a time before their stores: each round trip to L2
// here delays the chunk loop (a row of 8,192 in 128 threads: 8, not 16).
// (Four at a time took 87 registers in the 8-bit kernel, 79 before: two
// CTAs an SM instead of three; two take 80. ptxas, sm_90.)
constexpr int kStageLoads = 2;
template <Fmt F>
__device__ void stage_x(const float* x, int M, int n_in, int k_pad, int rs, uint32_t* xs) {
  const int n_row = k_pad / 4, n = M * n_row;  // groups of a row (whole chunks), of all
  for (int i0 = int(threadIdx.x); i0 < n; i0 += kStageLoads * int(blockDim.x)) {
    float4 v[kStageLoads];
#pragma unroll
    for (int u = 0; u < kStageLoads; ++u) {
      const int i = i0 + u * int(blockDim.x), r = i / n_row, k = 4 * (i - r * n_row);
      v[u] = i < n ? load_x4(x, M, n_in, r, k) : float4{};
    }
#pragma unroll
    for (int u = 0; u < kStageLoads; ++u) {
      const int i = i0 + u * int(blockDim.x), r = i / n_row, k = 4 * (i - r * n_row);
      if (i < n)
        *reinterpret_cast<uint2*>(xs + r * rs + xs_pair<F>(k / 2)) =
            make_uint2(pack_bf16(v[u].x, v[u].y), pack_bf16(v[u].z, v[u].w));
    }
  }
  __syncthreads();
}

// The lane's first pair in row r of the stage (chunk 0, step 0: its pairs
// of chunk ch and step s are xs_chunk ch + 2 s further, within one 32).
// Rows past M read row M - 1: an mma row only reaches its own output row,
// which the epilogue drops.
template <Fmt F>
__device__ __forceinline__ const uint32_t* xs_lane(const uint32_t* xs, int rs, int M, int r,
                                                   int c) {
  return xs + min(r, M - 1) * rs + xs_pair<F>(kE<F> / 2 * c);
}
template <Fmt F>
constexpr int xs_chunk = xs_pair<F>(2 * kE<F>);  // pairs of a chunk in a row of the stage

// The epilogue of a ROPE launch, after the tile's sums are in `res` [16][8]:
// q and k rotated (k unless the cache keeps keys before RoPE) with
// rope_kv_kernel's bits, k and v also written to their cache slots.
__device__ __forceinline__ void rope_kv_epilogue(const Params& p, int j, int tile, int n0,
                                                 int n_out, int M, const float* res, float* y) {
  const RopeKv& r = p.rope;
  const int i = int(threadIdx.x);  // one element a thread (the launch has >= 128 threads)
  const int row = i / 8, tc = i % 8;
  if (row >= M) return;
  const int col = j < 2 ? rope_row(tile, tc, r.head_dim) : n0 + tc;
  if (col >= n_out) return;
  float v = res[i];
  if (j == 0 || (j == 1 && r.rotate_k)) {
    float cs, sn;
    rope_angle(r.pos[row], r.inv_freq[col % r.head_dim % (r.head_dim / 2)], cs, sn);
    const float other = res[i ^ 4];  // the pair's other element (column tc ^ 4)
    v = tc < 4 ? rope_lo(v, other, cs, sn) : rope_hi(other, v, cs, sn);
  }
  y[size_t(row) * n_out + col] = v;
  if (j == 0) return;
  const size_t at = size_t(r.slots[row]) * size_t(n_out) + size_t(col);
  void* cache = j == 1 ? r.k_cache : r.v_cache;
  if (r.cache_f16)
    static_cast<__half*>(cache)[at] = __float2half_rn(v);
  else
    static_cast<float*>(cache)[at] = v;
}

// NORM, in the last CTA to finish: x += r and y = rmsnorm(x) * w for one row
// of n, with the bits of elementwise.cu's rmsnorm_kernel<true>: its block of
// vb threads emulated (thread t sums elements t, t + vb, ... in order, each
// warp of them by the shuffle tree, then the warp sums by warp 0's tree).
__device__ void add_rmsnorm_row(const AddNorm& a, const float* r, int n, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x / 32;
  const int vb = n >= 256 ? 256 : 64;  // rmsnorm()'s block size for rows of n
  for (int vw = warp; vw < vb / 32; vw += n_warps) {
    float ss = 0.f;
    for (int i = vw * 32 + lane; i < n; i += vb) {
      const float v = a.x[i] + __ldcg(r + i);  // r: other CTAs' results, from L2
      ss = __fmaf_rn(v, v, ss);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(~0u, ss, off);
    if (lane == 0) sh[vw] = ss;
  }
  __syncthreads();
  if (warp == 0) {
    float v = lane < vb / 32 ? sh[lane] : 0.f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(~0u, v, off);
    if (lane == 0) sh[32] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(sh[32] / float(n) + a.eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = a.x[i] + __ldcg(r + i);
    a.x[i] = v;
    a.y[i] = a.w[i] * (v * inv);
  }
}

// A gated decode launch's output in integer form (Params' out_*), after
// this CTA wrote its 8 columns (n0..) of y's M rows: the last of the CTAs
// of their block of 32 quantizes the block from L2 (and, for the last
// block, the zero blocks past n_out to the forms' k_pad), with
// quantize_block: quantize_act's bits. One warp a row.
__device__ void gated_int_out(const Params& p, const float* y, int n0, int n_out, int M) {
  __shared__ int last;
  const int b = n0 / 32;
  const int n_ctas = min(4, (min(n_out - 32 * b, 32) + 7) / 8);  // CTAs of 8 columns in block b
  __threadfence();                                               // this CTA's y before its count
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(p.out_counters + b, 1) == n_ctas - 1;
    // all of them counted: ready for the next launch (an atomic: a plain store
    // would race with the others' counts, by the PTX memory model)
    if (last) atomicExch(p.out_counters + b, 0);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x / 32;
  const int b_end = 32 * b + 32 >= n_out ? p.out_form.k_pad() / 32 : b + 1;
  for (int r = warp; r < M; r += n_warps) {
    const IntRowOuts out = int_row_outs(p.out_form, r);
    for (int bb = b; bb < b_end; ++bb) {
      const int i = 32 * bb + lane;
      quantize_block(i < n_out ? __ldcg(y + size_t(r) * n_out + i) : 0.f, lane, bb, out.o);
    }
  }
}

// After the slices' tiles of sums are in red ([kw][NACC][16 MT][8 NT], then
// ROPE's [16][8]): each element's sum over the slices in order, and what the
// launch does with it (silu(gate) up, the bias, RoPE and the cache write,
// the output's integer form, the norm). mm_body's and dp_kernel's.
template <bool GATED, bool GROUPED, bool ROPE, bool NORM, int MT, int NT, int IG>
__device__ __forceinline__ void mm_epilogue(const Params& p, int j, int tile, int n0, int m0, int M,
                                            const GpuWeight& W, float* y, const float* bias,
                                            float* red) {
  constexpr int NACC = GATED ? 2 : 1, TC = 8 * NT, TILE = 16 * MT * TC;
  __syncthreads();
  float* res = red + p.kw * NACC * TILE;  // ROPE
  for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
    const int r = m0 + i / TC;
    int col = n0 + i % TC;
    if constexpr (ROPE)
      if (j < 2) col = rope_row(tile, i % TC, p.rope.head_dim);
    if (r >= M || col >= W.n_out) continue;
    float sum[NACC];
#pragma unroll
    for (int a = 0; a < NACC; ++a) {
      sum[a] = red[a * TILE + i];
      for (int w = 1; w < p.kw; ++w) sum[a] += red[(w * NACC + a) * TILE + i];
    }
    if constexpr (GATED) {
      const float gv = sum[0];
      y[size_t(r) * W.n_out + col] = gv / (1.f + expf(-gv)) * sum[NACC - 1];
    } else {
      if (bias) sum[0] += bias[col];
      if constexpr (ROPE)
        res[i] = sum[0];
      else
        y[size_t(r) * W.n_out + col] = sum[0];
    }
  }
  if constexpr (ROPE) {
    __syncthreads();
    rope_kv_epilogue(p, j, tile, n0, W.n_out, M, res, y);
  }
  if constexpr (GATED && !GROUPED && IG != 0 && MT == 1 && NT == 1)
    if (p.out_counters) gated_int_out(p, y, n0, W.n_out, M);
  if constexpr (NORM) {  // the last CTA to finish takes the row's add and norm
    __shared__ int last;
    __threadfence();  // this CTA's y before its count
    __syncthreads();
    if (threadIdx.x == 0) {
      last = atomicAdd(p.norm.counter, 1) == int(gridDim.x * gridDim.y) - 1;
      if (last) atomicExch(p.norm.counter, 0);  // every CTA has counted (atomic: as above)
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    add_rmsnorm_row(p.norm, y, W.n_out, red);
  }
}

// IG (8- and 4-bit weights, WICK_CUDA_INT_MMA): integer products
// (matmul_int.cuh) for weight groups of IG elements; 0: bf16 products.
// XS: x staged in shared memory (above). The body of mm_kernel and mm_kernel_r128.
template <Fmt F, int MT, int NT, bool GATED, bool GROUPED, bool ROPE, bool NORM, int IG, bool XS>
__device__ __forceinline__ void mm_body(const Params& p) {
  constexpr int E = kE<F>, KC = 4 * E, NACC = GATED ? 2 : 1;
  static_assert(!XS || (MT == 1 && NT == 1 && !GROUPED && IG == 0), "XS: 1-tile bf16 products");
  static_assert(!ROPE || (MT == 1 && NT == 1 && !GATED && !GROUPED), "ROPE: one 16x8 tile");
  static_assert(!NORM || (MT == 1 && NT == 1 && !GATED && !GROUPED && !ROPE), "NORM: one row");
  static_assert(!IG || ((F == Fmt::I8 || F == Fmt::U4) && !NORM), "IG: 8/4-bit");
  extern __shared__ float red[];  // [kw][NACC][16 MT][8 NT], then ROPE's [16][8] sums, then XS's x
  allow_next_kernel();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  int j = 0;
  while (j + 1 < p.n_jobs && int(blockIdx.x) >= p.jobs[j + 1].tile_start) ++j;
  // The problem of this CTA: weights, rows of x and y.
  GpuWeight W = p.jobs[j].w, U = p.up;
  IntAct xa = p.xa;  // (IG: a grouped tile's rows from its first)
  const float* x = p.x;
  float* y = GATED ? p.y_gated : p.jobs[j].y;
  const float* bias = p.jobs[j].bias;
  int M = p.M, m0 = int(blockIdx.y) * 16 * MT;
  if constexpr (GROUPED) {
    wait_for_previous_kernel();  // the tiles come from the routing kernel
    const int4 t = p.tiles[blockIdx.y];
    if (t.x < 0) return;
    W = p.experts[t.x * 3 + p.which];
    if constexpr (GATED) U = p.experts[t.x * 3 + 1];
    x += size_t(t.y) * p.n_in;
    y += size_t(t.y) * W.n_out;
    if constexpr (IG != 0) {  // the tile's rows of x's integer form
      xa.q += size_t(t.y) * 2 * p.k_pad;
      xa.d += size_t(t.y) * (p.k_pad / 32);
      xa.s += size_t(t.y) * (p.k_pad / 16);
    }
    M = t.z;
    m0 = 0;
  }
  const int tile = int(blockIdx.x) - p.jobs[j].tile_start, n0 = tile * 8 * NT;
  const MinForm mins = min_form<GATED>(W, U);
  const int n_chunks = p.k_pad / KC;
  int row_g = n0 + g;
  if constexpr (ROPE)
    if (j < 2) row_g = rope_row(tile, g, p.rope.head_dim);

  // Slice w sums chunks w, w + kw, ... in order; a warp computes slices
  // warp, warp + n_warps, ... and leaves each slice's tile in shared memory;
  // the tile's elements are then summed over slices 0..kw-1 in order.
  constexpr int TR = 16 * MT, TC = 8 * NT, TILE = TR * TC;
  uint32_t* xs = reinterpret_cast<uint32_t*>(red + (p.kw * NACC + (ROPE ? 1 : 0)) * TILE);
  // XS: the lane's rows g and g + 8 of the stage (MT == 1)
  const uint32_t* xs_g[2] = {xs_lane<F>(xs, p.xs_rs, M, m0 + g, c),
                             xs_lane<F>(xs, p.xs_rs, M, m0 + g + 8, c)};
  constexpr int P = MT == 1 ? 4 : 1;  // chunks fetched ahead of their use
  const int n_warps = int(blockDim.x) / 32;
  // IG: each tile's rows of x, whether its rows 8-15 are read, and the
  // scales of the lane's output columns (matmul_int.cuh)
  bool rows8[MT];
  IntRows xr[MT];
  IntCols<NACC, NT> cols;
  if constexpr (IG != 0) {
    int_tiles<F, IG, MT>(xa, p.k_pad, M, m0, g, c, xr, rows8);
    set_int_cols(cols, W, U, p.k_pad, [&](int nt, int jc) {
      if constexpr (ROPE)
        if (j < 2) return rope_row(tile, 2 * c + jc, p.rope.head_dim);
      return n0 + 8 * nt + 2 * c + jc;
    });
  }
  for (int w = warp; w < p.kw; w += n_warps) {
    float acc[NACC][MT][NT][4];
#pragma unroll
    for (int a = 0; a < NACC; ++a)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[a][mt][nt][i] = 0.f;
    RawB raw[P][NACC][NT];
#pragma unroll
    for (int d = 0; d < P; ++d) {
      const int ch = w + d * p.kw;
      if (ch < n_chunks) {
        fetch_b<F, NT, IG != 0>(W, row_g, ch * KC + E * c, raw[d][0]);
        if constexpr (GATED) fetch_b<F, NT, IG != 0>(U, row_g, ch * KC + E * c, raw[d][NACC - 1]);
      }
    }
    // The weights above do not depend on the kernel before; x does.
    wait_for_previous_kernel();
    if constexpr (XS)  // (every warp's first slice: the whole CTA is here)
      if (w == warp) stage_x<F>(x, M, p.n_in, p.k_pad, p.xs_rs, xs);
    for (int base = w; base < n_chunks; base += P * p.kw) {
#pragma unroll
      for (int d = 0; d < P; ++d) {
        const int ch = base + d * p.kw;
        if (ch >= n_chunks) break;
        if constexpr (IG != 0) {
          // (the B registers first: raw[d] is then free for the next fetch)
          uint32_t b[NACC][NT][IntShape<F, IG>::NG][IntShape<F, IG>::NB];
#pragma unroll
          for (int a = 0; a < NACC; ++a)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) int_fragments<F, IG>(raw[d][a][nt].q, c, b[a][nt]);
          const int next = ch + P * p.kw;
          if (next < n_chunks) {
            fetch_b<F, NT, true>(W, row_g, next * KC + E * c, raw[d][0]);
            if constexpr (GATED)
              fetch_b<F, NT, true>(U, row_g, next * KC + E * c, raw[d][NACC - 1]);
          }
          int_chunk<F, IG, MT, NT, NACC>(xr, ch, rows8, cols, ch, b, acc);
          continue;
        }
        const int k = ch * KC + E * c;
        uint32_t b[NACC][NT][E / 2];
#pragma unroll
        for (int a = 0; a < NACC; ++a)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const RawB& rb = raw[d][a][nt];
            if (F == Fmt::I8 && mins.none)  // (16 of a Q8_0 chunk's ~150 instructions)
              decode<F, false>(rb.q, rb.s, rb.m, b[a][nt]);
            else if (F == Fmt::U4 && mins.eight)  // (32 of a Q4_0 chunk's 256)
              decode<F, true, true>(rb.q, rb.s, rb.m, b[a][nt]);
            else
              decode<F>(rb.q, rb.s, rb.m, b[a][nt]);
          }
        const int next = ch + P * p.kw;
        if (next < n_chunks) {
          fetch_b<F, NT>(W, row_g, next * KC + E * c, raw[d][0]);
          if constexpr (GATED) fetch_b<F, NT>(U, row_g, next * KC + E * c, raw[d][NACC - 1]);
        }
        [[maybe_unused]] uint4 xv[MT][2];  // XS: two steps' A pairs, rows g and g + 8
#pragma unroll
        for (int s = 0; s < E / 4; ++s) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const int r = m0 + 16 * mt + g;
            // the tile's rows 8-15 (zeros past M). 8- and 4-bit weights: a
            // decode step of up to 8 rows skips their conversions, which with
            // the weights' run at 16 a clock an SM, those products' limit
            // (16-bit ones are bound by memory, and their gated 4-tile kernel
            // spilled 2.8 times as much with the branch)
            const bool hi8 = !(F == Fmt::I8 || F == Fmt::U4) || m0 + 16 * mt + 8 < M;
            uint32_t a0, a1 = 0, a2, a3 = 0;
            if constexpr (XS && F != Fmt::I8) {
              // (two steps a load; one for 8-bit weights: 80 registers
              // against 91, where 4-bit ones take 113 against 126; ptxas)
              if (s % 2 == 0) {
                const int at = ch * xs_chunk<F> + 2 * s;
                xv[mt][0] = *reinterpret_cast<const uint4*>(xs_g[0] + at);
                xv[mt][1] = hi8 ? *reinterpret_cast<const uint4*>(xs_g[1] + at) : uint4{};
              }
              a0 = s % 2 ? xv[mt][0].z : xv[mt][0].x;
              a2 = s % 2 ? xv[mt][0].w : xv[mt][0].y;
              a1 = s % 2 ? xv[mt][1].z : xv[mt][1].x;
              a3 = s % 2 ? xv[mt][1].w : xv[mt][1].y;
            } else if constexpr (XS) {
              const int at = ch * xs_chunk<F> + 2 * s;
              const uint2 v0 = *reinterpret_cast<const uint2*>(xs_g[0] + at);
              a0 = v0.x, a2 = v0.y;
              if (hi8) {
                const uint2 v1 = *reinterpret_cast<const uint2*>(xs_g[1] + at);
                a1 = v1.x, a3 = v1.y;
              }
            } else {
              const float4 x0 = load_x4(x, M, p.n_in, r, k + 4 * s);
              a0 = pack_bf16(x0.x, x0.y);
              a2 = pack_bf16(x0.z, x0.w);
              if (hi8) {
                const float4 x1 = load_x4(x, M, p.n_in, r + 8, k + 4 * s);
                a1 = pack_bf16(x1.x, x1.y);
                a3 = pack_bf16(x1.z, x1.w);
              }
            }
#pragma unroll
            for (int a = 0; a < NACC; ++a)
#pragma unroll
              for (int nt = 0; nt < NT; ++nt)
                mma_bf16(acc[a][mt][nt], a0, a1, a2, a3, b[a][nt][2 * s], b[a][nt][2 * s + 1]);
          }
        }
      }
    }
#pragma unroll
    for (int a = 0; a < NACC; ++a) {
      float* t = red + (w * NACC + a) * TILE;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int r = 16 * mt + g, col = 8 * nt + 2 * c;
          t[r * TC + col] = acc[a][mt][nt][0];
          t[r * TC + col + 1] = acc[a][mt][nt][1];
          t[(r + 8) * TC + col] = acc[a][mt][nt][2];
          t[(r + 8) * TC + col + 1] = acc[a][mt][nt][3];
        }
    }
  }
  mm_epilogue<GATED, GROUPED, ROPE, NORM, MT, NT, IG>(p, j, tile, n0, m0, M, W, y, bias, red);
}

template <Fmt F, int MT, int NT, bool GATED, bool GROUPED, bool ROPE = false, bool NORM = false,
          int IG = 0, bool XS = false>
__global__ void mm_kernel(const __grid_constant__ Params p) {
  mm_body<F, MT, NT, GATED, GROUPED, ROPE, NORM, IG, XS>(p);
}

// The same, held to 128 registers (CTAs of up to 512 threads): integer
// products' decode kernels of 8-bit weights took 132 (176 gated), so an SM
// ran one CTA of 8 warps, and a CTA of 16 slices got 15 warps (two slices
// for one of them); at 128, two CTAs of 8 warps or one of 16 (no spills but
// gated's, 184 bytes; ptxas -v). On an H200 (session 57) those products ran
// at 12.5 % occupancy, 0.7x the bf16 products' speed (ncu, wick_gpu_bench).
// WICK_CUDA_INT_R128 chooses (int_r128()).
template <Fmt F, int MT, int NT, bool GATED, bool GROUPED, bool ROPE = false, bool NORM = false,
          int IG = 0>
__global__ void __launch_bounds__(512, 1) mm_kernel_r128(const __grid_constant__ Params p) {
  mm_body<F, MT, NT, GATED, GROUPED, ROPE, NORM, IG, false>(p);
}

// Integer products of up to kDpRows rows by dp4a (matmul_dp4a.cuh): thread
// t takes row t % TC of the CTA's NT 8-row tiles (TC rows) and slice t / TC
// (the launch has a thread for each; those past kw only stage x and take
// part in the epilogue, which is mm_body's). The same bits as mm_kernel's
// integer products (a tile shape never changes the order).
template <Fmt F, int IG, bool GATED, bool ROPE, int NT = 1>
__global__ void dp_kernel(const __grid_constant__ Params p) {
  static_assert(NT == 1 || (!GATED && !ROPE), "NT: plain products");
  constexpr int NACC = GATED ? 2 : 1, TC = 8 * NT, TILE = 16 * TC, KC = k_chunk(F);
  extern __shared__ float red[];  // [kw][NACC][16][TC], then ROPE's [16][8] sums, then x's stage
  allow_next_kernel();
  int j = 0;
  while (j + 1 < p.n_jobs && int(blockIdx.x) >= p.jobs[j + 1].tile_start) ++j;
  const GpuWeight W = p.jobs[j].w, U = p.up;
  const int M = p.M, tile = int(blockIdx.x) - p.jobs[j].tile_start, n0 = tile * TC;
  const int t = int(threadIdx.x), rc = t % TC, w = t / TC;  // row in the tile, slice
  int row = n0 + rc;
  if constexpr (ROPE)
    if (j < 2) row = rope_row(tile, rc, p.rope.head_dim);
  const int n_chunks = p.k_pad / KC;
  const bool has_min[2] = {W.min != nullptr, U.min != nullptr}, min8[2] = {W.min8, U.min8};
  // the slice's chunks two at a time: one computed while the next is in flight
  DpChunk<F, IG> buf[2][NACC];
  auto fetch = [&](int ch, DpChunk<F, IG>(&b)[NACC]) {
    dp_fetch<F, IG>(W, row, ch, b[0]);
    if constexpr (GATED) dp_fetch<F, IG>(U, row, ch, b[NACC - 1]);
  };
  if (w < p.kw) {  // (the weights need nothing from the kernel before)
#pragma unroll
    for (int d = 0; d < 2; ++d)
      if (w + d * p.kw < n_chunks) fetch(w + d * p.kw, buf[d]);
  }
  wait_for_previous_kernel();
  const DpStage xs = stage_int_x<KC>(
      p.xa, M, p.k_pad, reinterpret_cast<uint8_t*>(red + (p.kw * NACC + (ROPE ? 1 : 0)) * TILE));
  if (w < p.kw) {
    float acc[NACC][kDpRows];
#pragma unroll
    for (int a = 0; a < NACC; ++a)
#pragma unroll
      for (int m = 0; m < kDpRows; ++m) acc[a][m] = 0.f;
    for (int base = w; base < n_chunks; base += 2 * p.kw) {
#pragma unroll
      for (int d = 0; d < 2; ++d) {
        const int ch = base + d * p.kw;
        if (ch >= n_chunks) break;
#pragma unroll
        for (int a = 0; a < NACC; ++a)
          dp_chunk<F, IG>(xs, M, ch, buf[d][a], has_min[a], min8[a], acc[a]);
        if (ch + 2 * p.kw < n_chunks) fetch(ch + 2 * p.kw, buf[d]);
      }
    }
#pragma unroll
    for (int a = 0; a < NACC; ++a)
#pragma unroll
      for (int m = 0; m < kDpRows; ++m)
        if (m < M) red[(w * NACC + a) * TILE + m * TC + rc] = acc[a][m];
  }
  mm_epilogue<GATED, false, ROPE, false, 1, NT, IG>(
      p, j, tile, n0, 0, M, W, GATED ? p.y_gated : p.jobs[j].y, p.jobs[j].bias, red);
}

// A positive integer from the environment (unset: fallback), or one of
// `allowed` when given (0 too, if listed).
int env_int(const char* name, int fallback, std::initializer_list<int> allowed = {}) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  bool ok = end != v && *end == 0 && x >= 0 && x < (1 << 30);
  if (ok)
    ok =
        allowed.size() ? std::find(allowed.begin(), allowed.end(), int(x)) != allowed.end() : x > 0;
  if (!ok) throw std::invalid_argument(std::string(name) + ": invalid value '" + v + "'");
  return int(x);
}
// A 0/1 switch from the environment (unset: fallback).
bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  if (std::string(v) != "0" && std::string(v) != "1")
    throw std::invalid_argument(std::string(name) + ": invalid value '" + v + "' (0 or 1)");
  return std::string(v) == "1";
}

// The most slices a weight of few rows takes (WICK_CUDA_KW_MAX; tests set
// it). 0: the environment not read yet.
std::atomic<int> g_kw_max{0};
std::atomic<int> g_kw_force{0};    // set_kw_force: every weight's count (0: kw_for's rule)
constexpr int kTallKwRows = 8192;  // rows from which a 16-bit weight takes tall_kw()
// Slices of k on tall 16-bit matrices (WICK_CUDA_TALL_KW, for measuring).
int tall_kw() {
  static const int kw = env_int("WICK_CUDA_TALL_KW", 4, {4, 8, 16, 32});
  return kw;
}

// Products of x that can share one launch: the same layout of k.
bool same_layout(const GpuWeight& a, const GpuWeight& b) {
  return a.fmt == b.fmt && a.k_pad == b.k_pad && a.group == b.group;
}

// Shared memory of a CTA: a tile of sums per slice (and per accumulator),
// plus one for the RoPE epilogue. NORM reuses the slices' tiles for its 33
// sums (kw >= 4 tiles of 128).
constexpr size_t kMaxSmem = 160 * 1024;
size_t mm_smem(int kw, int mt, int nt, bool gated, bool rope) {
  return (size_t(kw) * (gated ? 2 : 1) + (rope ? 1 : 0)) * 16 * mt * 8 * nt * sizeof(float);
}
// What a launch may take: kMaxSmem, or less on a GPU with less (A100: 163
// KB; other Ampere and Ada GPUs 99 KB, where 32-row tiles of 32 gated
// slices, 128 KB, give way to 16-row ones).
size_t smem_cap() {
  return std::min(kMaxSmem, size_t(max_smem_optin() - kStaticSmemReserve));
}
// The shared memory of x's stage (XS) for M rows of weights of format f
// and k_pad: 0 where it is off (WICK_CUDA_X_STAGE=0, set_x_stage) or over
// kMaxStage (2 bytes an element and row: 16 rows up to k = 1,472, 8 up to
// 3,008, 1 up to 24,512; 4-bit weights' pads take 1/8 more).
constexpr size_t kMaxStage = 48 * 1024;
int xs_rs_of(Fmt f, int k_pad) {  // xs_row_pairs of the format (16-bit: BF16's)
  return f == Fmt::U4   ? xs_row_pairs<Fmt::U4>(k_pad)
         : f == Fmt::I8 ? xs_row_pairs<Fmt::I8>(k_pad)
                        : xs_row_pairs<Fmt::BF16>(k_pad);
}
size_t x_stage_bytes(Fmt f, int M, int k_pad) {
  if (!x_stage() || M < 1 || M > 16) return 0;
  const size_t bytes = size_t(M) * size_t(xs_rs_of(f, k_pad)) * 4;
  return bytes <= kMaxStage ? bytes : 0;
}

// Whether 64-row tiles (4 x 4, or 4 x 2 gated: 8 KiB a slice) of kw slices
// fit: up to 20 slices; more take 32-row tiles, which never change the sums.
bool rows64_fit(int kw) {
  return mm_smem(kw, 4, 4, false, false) <= smem_cap();
}
// Whether 32-row tiles (2 x 2, 2 KiB a slice and accumulator) fit.
bool rows32_fit(int kw, bool gated) {
  return mm_smem(kw, 2, 2, gated, false) <= smem_cap();
}

// Per kernel, once: up to 160 KiB of shared memory (what the GPU has, if
// less, besides the kernel's static memory), and the most warps a CTA can
// have with its registers.
template <auto Kernel>
int max_warps_of() {
  static const int max_warps = [] {
    cudaFuncAttributes a{};
    WICK_CUDA_CHECK(cudaFuncGetAttributes(&a, Kernel));
    if (a.sharedSizeBytes > size_t(kStaticSmemReserve))
      throw std::logic_error("a product kernel's static shared memory is over kStaticSmemReserve");
    const size_t dynamic = size_t(device_smem_optin() - kStaticSmemReserve);
    WICK_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(std::min(kMaxSmem, dynamic))));
    return std::max(1, a.maxThreadsPerBlock / 32);
  }();
  return max_warps;
}

// CTAs of kw slices an SM holds of the one-row decode kernel of format F
// (gated or not, x staged): what slice_count() sizes a wave by. The same
// kernel whatever WICK_CUDA_X_STAGE says, as the count fixes the sums' order.
template <Fmt F, bool GATED>
int decode_ctas_per_sm(int kw, int k_pad) {
  constexpr auto kKernel = mm_kernel<F, 1, 1, GATED, false, false, false, 0, true>;
  const int n_warps = std::min({kw, 32, max_warps_of<kKernel>()});
  const size_t stage = size_t(xs_rs_of(F, k_pad)) * 4;
  const size_t smem = mm_smem(kw, 1, 1, GATED, false) + (stage <= kMaxStage ? stage : 0);
  int n = 0;
  WICK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, n_warps * 32, smem));
  return n;
}
template <Fmt F>
int decode_ctas_per_sm(bool gated, int kw, int k_pad) {
  return gated ? decode_ctas_per_sm<F, true>(kw, k_pad) : decode_ctas_per_sm<F, false>(kw, k_pad);
}
int decode_ctas_per_sm(Fmt f, bool gated, int kw, int k_pad) {
  switch (f) {
    case Fmt::BF16:
      return decode_ctas_per_sm<Fmt::BF16>(gated, kw, k_pad);
    case Fmt::F16:
      return decode_ctas_per_sm<Fmt::F16>(gated, kw, k_pad);
    case Fmt::I8:
      return decode_ctas_per_sm<Fmt::I8>(gated, kw, k_pad);
    case Fmt::U4:
      return decode_ctas_per_sm<Fmt::U4>(gated, kw, k_pad);
    default:
      throw std::logic_error("kw_for: f32 weights take the f32 kernel");
  }
}

// Slices of k per output element: a function of the weights launched
// together (n_rows: all their rows; w: the tallest) and of the GPU, never
// of the batch. Tall 16-bit matrices (gate, up, the output head: from 8,192
// rows, decoded with 4-tile warps) take WICK_CUDA_TALL_KW, 4: at 8 slices
// they streamed 69-73 % of 3.0 TB/s on an H100, at 4 74-88 % (Llama-1B to
// 8B, wick_gpu_bench, 2026-11-28). The others the most slices whose CTAs
// all fit one wave (slice_count, slices.cpp), each launch's count cached.
int kw_for(const GpuWeight& w, int n_rows, bool gated) {
  if (const int forced = g_kw_force.load()) return forced;
  if (w.n_out >= kTallKwRows && (w.fmt == Fmt::BF16 || w.fmt == Fmt::F16)) return tall_kw();
  static const bool waves = env_flag("WICK_CUDA_KW_WAVES", true);  // 0: the rule before (measuring)
  static std::mutex mu;
  static std::map<std::array<int, 6>, int> known;
  const std::array<int, 6> key{int(w.fmt), int(gated), w.n_out, n_rows, w.k_pad, kw_max()};
  std::lock_guard<std::mutex> lock(mu);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  SliceProblem sp;
  sp.n_out = w.n_out;
  sp.n_rows = n_rows;
  sp.n_chunks = w.k_pad / k_chunk(w.fmt);
  sp.kw_max = kw_max();
  sp.n_sms = n_sms();
  sp.waves = waves;
  const int kw =
      slice_count(sp, [&](int k) { return decode_ctas_per_sm(w.fmt, gated, k, w.k_pad); });
  known.emplace(key, kw);
  return kw;
}
int kw_for(const GpuWeight& w) {
  return kw_for(w, w.n_out, false);
}

// The slice count of products launched together (q, k and v): the tallest
// one's and all their rows (the CTAs of the launch), for all. Per weight, q
// of 3,072+ rows (3B models and up) took 8 and its k and v 16 or 32, which
// split the launch and left the fused RoPE epilogue unused. q, k and v
// always go together (matmul() and the fused launch group them alike), so
// each keeps one reduction order in every path.
int kw_for_launch(const MatmulJob* jobs, int n_jobs) {
  const GpuWeight* tallest = jobs[0].w;
  int n_rows = 0;
  for (int j = 0; j < n_jobs; ++j) {
    n_rows += jobs[j].w->n_out;
    if (jobs[j].w->n_out > tallest->n_out) tallest = jobs[j].w;
  }
  return kw_for(*tallest, n_rows, false);
}

template <auto Kernel, int MT, bool ROPE>
void launch_kernel(Params& p, int n_tiles_x, int n_tiles_y, size_t smem, cudaStream_t st) {
  // a warp a slice for the small decode tiles (a warp takes several slices
  // past 32 or past what its registers allow), 8 for the larger ones
  const int n_warps = std::min({p.kw, MT == 1 ? 32 : 8, max_warps_of<Kernel>()});
  // the RoPE epilogue takes one element a thread: 128 threads at least
  if (ROPE && n_warps < 4) throw std::logic_error("mm: the RoPE epilogue needs 4 warps a CTA");
  launch_early(Kernel, dim3(unsigned(n_tiles_x), unsigned(n_tiles_y)), dim3(n_warps * 32), smem, st,
               p);
}

int decode_tall_rows();

// Each job's first tile in grid.x for tiles of 8 nt weight rows; the tiles
// of all the jobs.
int set_tile_starts(Params& p, int nt) {
  int total = 0;
  for (int j = 0; j < p.n_jobs; ++j) {
    p.jobs[j].tile_start = total;
    total += ceil_div(p.jobs[j].w.n_out, 8 * nt);
  }
  return total;
}

// dp_kernel: a thread a row of the CTA's NT tiles and a slice (whole warps;
// 128 threads at least for the RoPE epilogue, one element a thread).
constexpr size_t kMaxDpStage = 64 * 1024;  // x's integer form: 1 row up to k ~24,000, 4 ~6,000
// False where its registers do not allow the threads (the mma kernel then).
template <Fmt F, int IG, bool GATED, bool ROPE, int NT = 1>
bool launch_dp(Params& p, int n_tiles_x, size_t smem, cudaStream_t st) {
  constexpr auto kKernel = dp_kernel<F, IG, GATED, ROPE, NT>;
  const int n_warps = ceil_div(std::max(8 * NT * p.kw, ROPE ? 128 : 32), 32);
  if (n_warps > max_warps_of<kKernel>()) return false;  // (also sets its shared memory allowance)
  launch_early(kKernel, dim3(unsigned(n_tiles_x)), dim3(unsigned(32 * n_warps)), smem, st, p);
  return true;
}

template <Fmt F, int MT, int NT, bool GATED, bool GROUPED, bool ROPE = false, bool NORM = false,
          int IG = 0>
void launch(Params& p, int n_tiles_x, int n_tiles_y, cudaStream_t st) {
  const size_t smem = mm_smem(p.kw, MT, NT, GATED, ROPE);
  if (smem > smem_cap())
    throw std::logic_error("mm: " + std::to_string(p.kw) + " slices of " + std::to_string(16 * MT) +
                           "x" + std::to_string(8 * NT) + " tiles need " +
                           std::to_string(smem / 1024) + " KiB of shared memory");
  // bf16 products of up to 16 rows, one tile a warp: x staged (XS) where
  // its rows fit (the 16-bit tall matrices' 4-tile kernels, bound by memory,
  // spilled 2.6 times as much with it)
  if constexpr (MT == 1 && NT == 1 && !GROUPED && IG == 0) {
    const size_t xs = x_stage_bytes(F, p.M, p.k_pad);
    if (xs && smem + xs <= smem_cap()) {
      p.xs_rs = xs_rs_of(F, p.k_pad);
      return launch_kernel<mm_kernel<F, MT, NT, GATED, GROUPED, ROPE, NORM, IG, true>, MT, ROPE>(
          p, n_tiles_x, n_tiles_y, smem + xs, st);
    }
  }
  // integer products of up to kDpRows rows by dp4a, where x's stage fits
  if constexpr (IG != 0 && MT == 1 && NT == 1 && !GROUPED && !NORM)
    if (const size_t stage = dp_stage_bytes(k_chunk(F), p.M, p.k_pad);
        int_dp4a() && p.M <= kDpRows && stage <= kMaxDpStage) {
      // tall plain products (the output head) in CTAs of 4 tiles: a quarter
      // of the CTAs to start and to stage x, whose bytes are then a sixth of
      // the weights' instead of a third at k = 2,048 (a warp a slice, one
      // x load for all its threads)
      if constexpr (!GATED && !ROPE) {
        int n_rows = 0;
        for (int j = 0; j < p.n_jobs; ++j) n_rows += p.jobs[j].w.n_out;
        const size_t smem4 = mm_smem(p.kw, 1, 4, false, false) + stage;
        if (n_rows >= decode_tall_rows() && smem4 <= smem_cap()) {
          Params p4 = p;
          if (launch_dp<F, IG, false, false, 4>(p4, set_tile_starts(p4, 4), smem4, st)) return;
        }
      }
      if (smem + stage <= smem_cap() &&
          launch_dp<F, IG, GATED, ROPE>(p, n_tiles_x, smem + stage, st))
        return;
    }
  // integer products' 8-bit decode kernels at 128 registers (mm_kernel_r128)
  if constexpr (IG != 0 && F == Fmt::I8 && MT == 1 && NT == 1 && !GROUPED)
    if (int_r128() >= (GATED ? 2 : 1))
      return launch_kernel<mm_kernel_r128<F, MT, NT, GATED, GROUPED, ROPE, NORM, IG>, MT, ROPE>(
          p, n_tiles_x, n_tiles_y, smem, st);
  launch_kernel<mm_kernel<F, MT, NT, GATED, GROUPED, ROPE, NORM, IG>, MT, ROPE>(
      p, n_tiles_x, n_tiles_y, smem, st);
}

// Decode tiles of tall 16-bit matrices (the output head): WICK_CUDA_TALL_NT
// 8-row tiles per warp (1, 2 or 4) from WICK_CUDA_TALL_ROWS rows. For
// measuring: a tile shape never changes the reduction order.
int decode_tall_nt() {
  static const int nt = env_int("WICK_CUDA_TALL_NT", 4, {1, 2, 4});
  return nt;
}
int decode_tall_rows() {
  static const int rows = env_int("WICK_CUDA_TALL_ROWS", 8192);
  return rows;
}
std::atomic<int> g_tiles_force{0};  // set_decode_tiles: 8-row tiles a warp (0: the rule)

// Integer products (p.xa set): one 8-row tile a warp, 16 rows a CTA in
// decode steps, 32 past 16 rows; 4-bit weights past 32 rows (what the tiled
// kernel leaves: under 64 rows, or too few tiles) two 8-row tiles a warp,
// so that half as many CTAs read x from L2 (a tile shape never changes a
// result's bits; not gated: that kernel spills 292 bytes).
// Grouped (experts'): each tile's rows, 16 or 32, as its list was cut.
template <Fmt F, int IG, bool GATED, bool GROUPED, typename Tiles>
void dispatch_int(Params& p, Tiles tiles, int n_tiles_y, cudaStream_t st) {
  if constexpr (GROUPED) {
    // (4-bit gate/up: 16-row tiles only, grouped_tile_rows; its 32-row kernel spills)
    const int rows = p.tile_rows;
    if (rows > 32 || (F == Fmt::U4 && GATED && rows > 16))
      throw std::logic_error("matmul_grouped: integer products in tiles of " +
                             std::to_string(rows) + " rows");
    if constexpr (F == Fmt::U4 && GATED)
      return launch<F, 1, 1, GATED, true, false, false, IG>(p, tiles(1), n_tiles_y, st);
    else if (rows == 16)
      return launch<F, 1, 1, GATED, true, false, false, IG>(p, tiles(1), n_tiles_y, st);
    else
      return launch<F, 2, 1, GATED, true, false, false, IG>(p, tiles(1), n_tiles_y, st);
  }
  if (p.M <= 16) {
    // (two tiles a warp: forced only, set_decode_tiles, to measure whether
    // more loads in flight help; gated ones would spill)
    if constexpr (!GATED)
      if (g_tiles_force.load() == 2)
        return launch<F, 1, 2, GATED, false, false, false, IG>(p, tiles(2), 1, st);
    return launch<F, 1, 1, GATED, false, false, false, IG>(p, tiles(1), 1, st);
  }
  if constexpr (F == Fmt::U4 && !GATED)
    if (p.M > 32)
      return launch<F, 2, 2, GATED, false, false, false, IG>(p, tiles(2), ceil_div(p.M, 32), st);
  launch<F, 2, 1, GATED, false, false, false, IG>(p, tiles(1), ceil_div(p.M, 32), st);
}

// Tile shapes by batch rows: decode keeps many CTAs over the weight rows;
// prefill reuses each loaded weight across more rows. For GROUPED, the
// caller's tile list was cut at rows_per_tile(M) rows.
template <Fmt F, bool GATED, bool GROUPED>
void dispatch_rows(Params& p, int n_tiles_y, cudaStream_t st) {
  auto tiles = [&](int nt) { return set_tile_starts(p, nt); };
  auto ty = [&](int mt) { return GROUPED ? n_tiles_y : ceil_div(p.M, 16 * mt); };
  if constexpr (F == Fmt::I8 || F == Fmt::U4) {
    if (p.xa.q) {
      if constexpr (F == Fmt::I8)
        if (p.jobs[0].w.group == 16)
          return dispatch_int<F, 16, GATED, GROUPED>(p, tiles, n_tiles_y, st);
      return dispatch_int<F, 32, GATED, GROUPED>(p, tiles, n_tiles_y, st);
    }
  }
  // rows a CTA covers (a grouped launch: as its tile list was cut)
  const int tile_rows = GROUPED                    ? p.tile_rows
                        : p.M <= 16                ? 16
                        : !rows32_fit(p.kw, GATED) ? 16
                        : p.M <= 32                ? 32
                        : rows64_fit(p.kw)         ? 64
                                                   : 32;
  if (tile_rows == 16) {
    // Tall matrices (the output head, gate/up) take several 8-row tiles per
    // warp: more loads in flight per lane, fewer CTAs to start.
    // (16-bit weights only: for 8- and 4-bit ones the wider tile's decoding
    // costs more than it saves, 580 -> 490 tok/s on Llama-1B Q8_0, and their
    // gated 4-tile kernels spill; so those are never compiled)
    if constexpr (!GROUPED && (F == Fmt::BF16 || F == Fmt::F16)) {
      int n_rows = 0;
      for (int j = 0; j < p.n_jobs; ++j) n_rows += p.jobs[j].w.n_out;
      const int forced = g_tiles_force.load();
      int nt = forced ? forced : n_rows >= decode_tall_rows() ? decode_tall_nt() : 1;
      // (many slices on a GPU of less shared memory: one tile, the same sums)
      if (nt > 1 && mm_smem(p.kw, 1, nt, GATED, false) > smem_cap()) nt = 1;
      if (nt == 4) return launch<F, 1, 4, GATED, GROUPED>(p, tiles(4), ty(1), st);
      if (nt == 2) return launch<F, 1, 2, GATED, GROUPED>(p, tiles(2), ty(1), st);
    }
    launch<F, 1, 1, GATED, GROUPED>(p, tiles(1), ty(1), st);
  } else if (tile_rows == 32) {
    launch<F, 2, 2, GATED, GROUPED>(p, tiles(2), ty(2), st);
  } else if constexpr (GATED) {
    launch<F, 4, 2, GATED, GROUPED>(p, tiles(2), ty(4), st);
  } else {
    launch<F, 4, 4, GATED, GROUPED>(p, tiles(4), ty(4), st);
  }
}

template <bool GATED, bool GROUPED>
void dispatch(Params& p, int n_tiles_y, cudaStream_t st) {
  switch (p.jobs[0].w.fmt) {
    case Fmt::BF16:
      return dispatch_rows<Fmt::BF16, GATED, GROUPED>(p, n_tiles_y, st);
    case Fmt::F16:
      return dispatch_rows<Fmt::F16, GATED, GROUPED>(p, n_tiles_y, st);
    case Fmt::I8:
      return dispatch_rows<Fmt::I8, GATED, GROUPED>(p, n_tiles_y, st);
    case Fmt::U4:
      return dispatch_rows<Fmt::U4, GATED, GROUPED>(p, n_tiles_y, st);
    default:
      throw std::logic_error("mm: f32 weights take the f32 kernel");
  }
}

// f32 weights (--gpu-f32): CUDA cores, one warp per output column; each
// lane sums its k = 4 lane + 128 i in order, then a fixed shuffle tree.
__global__ void mm_f32_kernel(GpuWeight w, const float* x, int M, int n_in, float* y,
                              const float* bias) {
  const int lane = threadIdx.x & 31;
  const int o = int(blockIdx.x) * (blockDim.x / 32) + int(threadIdx.x / 32);
  if (o >= w.n_out) return;
  const float* wr = static_cast<const float*>(w.q) + size_t(o) * size_t(w.k_pad);
  for (int r0 = 0; r0 < M; r0 += 8) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 4 * lane; k < w.k_pad; k += 128) {
      const float4 wv = *reinterpret_cast<const float4*>(wr + k);
      const float wk[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        if (r0 + r >= M) break;
        const float* xr = x + size_t(r0 + r) * size_t(n_in);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (k + j < n_in) acc[r] = __fadd_rn(acc[r], __fmul_rn(wk[j], xr[k + j]));
      }
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      float v = acc[r];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(~0u, v, off));
      if (lane == 0 && r0 + r < M) y[size_t(r0 + r) * w.n_out + o] = bias ? v + bias[o] : v;
    }
  }
}

void launch_f32(const GpuWeight& w, const float* x, int M, float* y, const float* bias,
                cudaStream_t st) {
  mm_f32_kernel<<<ceil_div(w.n_out, 4), 128, 0, st>>>(w, x, M, w.n_in, y, bias);
  WICK_CUDA_LAUNCHED();
}

__global__ void silu_mul_kernel(float* g, const float* u, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = g[i];
    g[i] = v / (1.f + expf(-v)) * u[i];
  }
}

// A launch's parameters for products of x [M, w.n_in] shaped as w (jobs unset).
Params params_for(const GpuWeight& w, const float* x, int M) {
  Params p{};
  p.x = x;
  p.M = M;
  p.n_in = w.n_in;
  p.k_pad = w.k_pad;
  p.kw = kw_for(w);
  return p;
}

std::atomic<int> g_fuse_norm{-1};  // -1: WICK_CUDA_FUSE_NORM not read yet

// The fused decode launches (ROPE or NORM): one 16x8 tile a CTA, the
// weight's format picked at run time (integer products where p.xa is set);
// false for f32 weights.
template <bool ROPE, bool NORM>
bool launch_fused(Params& p, int n_tiles, cudaStream_t st) {
  const Fmt f = p.jobs[0].w.fmt;
  if constexpr (!NORM) {
    if (p.xa.q && f == Fmt::I8 && p.jobs[0].w.group == 16)
      return launch<Fmt::I8, 1, 1, false, false, ROPE, NORM, 16>(p, n_tiles, 1, st), true;
    if (p.xa.q && f == Fmt::I8)
      return launch<Fmt::I8, 1, 1, false, false, ROPE, NORM, 32>(p, n_tiles, 1, st), true;
    if (p.xa.q && f == Fmt::U4)
      return launch<Fmt::U4, 1, 1, false, false, ROPE, NORM, 32>(p, n_tiles, 1, st), true;
  }
  switch (f) {
    case Fmt::BF16:
      launch<Fmt::BF16, 1, 1, false, false, ROPE, NORM>(p, n_tiles, 1, st);
      return true;
    case Fmt::F16:
      launch<Fmt::F16, 1, 1, false, false, ROPE, NORM>(p, n_tiles, 1, st);
      return true;
    case Fmt::I8:
      launch<Fmt::I8, 1, 1, false, false, ROPE, NORM>(p, n_tiles, 1, st);
      return true;
    case Fmt::U4:
      launch<Fmt::U4, 1, 1, false, false, ROPE, NORM>(p, n_tiles, 1, st);
      return true;
    default:
      return false;
  }
}

std::atomic<int> g_int{-1};         // -1: WICK_CUDA_INT_MMA not read yet
std::atomic<int> g_norm_int{-1};    // -1: WICK_CUDA_NORM_INT not read yet
std::atomic<int> g_tiled_u4{-1};    // -1: WICK_CUDA_TILED_U4 not read yet
std::atomic<int> g_predecode{-1};   // -1: WICK_CUDA_PREDECODE not read yet
std::atomic<int> g_smem_limit{-1};  // -1: WICK_CUDA_SMEM_LIMIT not read yet
std::atomic<int> g_int_r128{-1};    // -1: WICK_CUDA_INT_R128 not read yet
std::atomic<int> g_x_stage{-1};     // -1: WICK_CUDA_X_STAGE not read yet
std::atomic<int> g_int_dp4a{-1};    // -1: WICK_CUDA_INT_DP4A not read yet

// A switch read from `name` on first use (unless a setter came first).
bool env_switch(std::atomic<int>& v, const char* name, bool fallback) {
  if (v.load() < 0) {
    int unread = -1;
    v.compare_exchange_strong(unread, env_flag(name, fallback) ? 1 : 0);
  }
  return v.load() == 1;
}

// Integer products load a chunk's scales (mins) of a row as one vector:
// 16-byte aligned arrays (each its own allocation, prepare_matrix).
void check_int_weight(const GpuWeight& w) {
  if ((reinterpret_cast<uintptr_t>(w.scale) | reinterpret_cast<uintptr_t>(w.min)) % 16)
    throw std::logic_error("matmul: integer products need 16-byte aligned scales");
}

// x in integer form for products of w (int_path): its norm's (ni, where
// its shape is the product's), or quantized into xb.
IntAct int_act(const GpuWeight& w, const float* x, int M, void* xb, cudaStream_t st,
               const NormInt* ni) {
  check_int_weight(w);
  if (ni && ni->M == M && ni->n == w.n_in && w.k_pad == k_pad_of(w.fmt, w.n_in) &&
      (w.fmt == Fmt::U4 ? ni->for_u4 : ni->for_i8))
    return norm_int_act(*ni, w.fmt);
  if (!xb) throw std::logic_error("matmul: integer products need the scratch buffer");
  return quantize_act(x, M, w.n_in, w.k_pad, w.fmt == Fmt::U4, xb, st);
}

// matmul() at kw_gated slices where > 0 (a gate/up's two products apart,
// at the fused launch's count), else each launch's own (kw_for_launch).
void matmul_at(const MatmulJob* jobs, int n_jobs, const float* x, int M, void* xb, cudaStream_t st,
               const NormInt* ni, int kw_gated) {
  if (M <= 0 || n_jobs <= 0) return;
  // Jobs fuse into one launch when they share the layout and the reduction.
  int start = 0;
  while (start < n_jobs) {
    const GpuWeight& w0 = *jobs[start].w;
    if (w0.fmt == Fmt::F32) {
      launch_f32(w0, x, M, jobs[start].y, jobs[start].bias, st);
      ++start;
      continue;
    }
    Params p = params_for(w0, x, M);
    const int first = start;
    while (start < n_jobs && p.n_jobs < kMaxJobs && same_layout(*jobs[start].w, w0)) {
      p.jobs[p.n_jobs++] = Job{*jobs[start].w, jobs[start].y, jobs[start].bias, 0};
      ++start;
    }
    p.kw = kw_gated > 0 ? kw_gated : kw_for_launch(jobs + first, p.n_jobs);
    if (int_path(w0)) {  // x in integer form, for either kernel
      for (int j = 0; j < p.n_jobs; ++j) check_int_weight(p.jobs[j].w);
      p.xa = int_act(w0, x, M, xb, st, ni);
    }
    TiledProblem t{jobs + first, p.n_jobs};
    t.x = x;
    t.M = M;
    t.kw = p.kw;
    t.xb = xb;
    t.xa = p.xa.q ? &p.xa : nullptr;
    if (!matmul_tiled(t, st)) dispatch<false, false>(p, 0, st);
  }
}

// gate and up of one launch's layout (a caller splits unlike weights).
void check_gate_up_alike(const GpuWeight& gate, const GpuWeight& up, const char* who) {
  if (gate.fmt == Fmt::F32 || gate.fmt != up.fmt || gate.group != up.group ||
      gate.k_pad != up.k_pad)
    throw std::logic_error(std::string(who) + ": the caller splits unlike weights");
}

}  // namespace

void matmul(const MatmulJob* jobs, int n_jobs, const float* x, int M, void* xb, cudaStream_t st,
            const NormInt* ni) {
  matmul_at(jobs, n_jobs, x, M, xb, st, ni, 0);
}

void matmul_gate_up_apart(const GpuWeight& gate, const GpuWeight& up, const float* x, int M,
                          float* g, float* u, void* xb, cudaStream_t st, const NormInt* ni) {
  check_gate_up_alike(gate, up, "matmul_gate_up_apart");
  const int kw = kw_for(gate, gate.n_out, true);
  const MatmulJob jg{&gate, g, nullptr}, ju{&up, u, nullptr};
  matmul_at(&jg, 1, x, M, xb, st, ni, kw);
  matmul_at(&ju, 1, x, M, xb, st, ni, kw);
}

bool matmul_qkv_rope_kv(const MatmulJob (&jobs)[3], const float* x, int M, const RopeKv& r,
                        void* xb, cudaStream_t st, const NormInt* ni) {
  static const bool on = env_flag("WICK_CUDA_FUSE_ROPE", true);  // 0: two kernels (measuring)
  if (!on || M < 1 || M > 16 || matmul_path() == MatmulPath::Tiled) return false;
  const GpuWeight &wq = *jobs[0].w, &wk = *jobs[1].w, &wv = *jobs[2].w;
  const int hd = r.head_dim;
  if (wq.fmt == Fmt::F32 || hd < 8 || hd % 8 || wq.n_out % hd || wk.n_out % hd ||
      wv.n_out != wk.n_out)
    return false;
  Params p = params_for(wq, x, M);
  p.kw = kw_for_launch(jobs, 3);  // as matmul() gives the three
  p.n_jobs = 3;
  p.rope = r;
  int n_tiles = 0;
  for (int j = 0; j < 3; ++j) {
    const GpuWeight& w = *jobs[j].w;
    if (!same_layout(w, wq)) return false;
    p.jobs[j] = Job{w, jobs[j].y, jobs[j].bias, n_tiles};
    n_tiles += ceil_div(w.n_out, 8);
  }
  if (int_path(wq)) {
    if (!xb) return false;
    check_int_weight(wk);
    check_int_weight(wv);
    p.xa = int_act(wq, x, M, xb, st, ni);
  }
  return launch_fused<true, false>(p, n_tiles, st);
}

int kw_max() {
  if (g_kw_max.load() == 0) {
    int unread = 0;
    const int kw = env_int("WICK_CUDA_KW_MAX", 32);
    if (kw < 4 || kw > 32)
      throw std::invalid_argument("WICK_CUDA_KW_MAX: 4 to 32, not " + std::to_string(kw));
    g_kw_max.compare_exchange_strong(unread, kw);
  }
  return g_kw_max.load();
}

void set_kw_max(int kw) {
  if (kw < 4 || kw > 32) throw std::invalid_argument("set_kw_max: 4 to 32");
  g_kw_max = kw;
}

void set_kw_force(int kw) {
  if (kw != 0 && (kw < 4 || kw > 32)) throw std::invalid_argument("set_kw_force: 0, or 4 to 32");
  g_kw_force = kw;
}

void set_decode_tiles(int nt) {
  if (nt != 0 && nt != 1 && nt != 2 && nt != 4)
    throw std::invalid_argument("set_decode_tiles: 0, 1, 2 or 4");
  g_tiles_force = nt;
}

void set_fuse_norm(bool on) {
  g_fuse_norm = on ? 1 : 0;
}

bool int_products() {
  return env_switch(g_int, "WICK_CUDA_INT_MMA", false);
}

void set_int_products(bool on) {
  g_int = on ? 1 : 0;
}

bool norm_int() {
  return env_switch(g_norm_int, "WICK_CUDA_NORM_INT", true);
}

void set_norm_int(bool on) {
  g_norm_int = on ? 1 : 0;
}

bool tiled_u4() {
  return env_switch(g_tiled_u4, "WICK_CUDA_TILED_U4", true);
}

void set_tiled_u4(bool on) {
  g_tiled_u4 = on ? 1 : 0;
}

int smem_limit() {
  if (g_smem_limit.load() < 0) {
    int unread = -1;
    const char* e = std::getenv("WICK_CUDA_SMEM_LIMIT");  // (0: none, as documented)
    const int v = e && std::string(e) == "0" ? 0 : env_int("WICK_CUDA_SMEM_LIMIT", 0);
    if (v && v < 48 * 1024)
      throw std::invalid_argument("WICK_CUDA_SMEM_LIMIT: at least 49152 bytes, not " +
                                  std::to_string(v));
    g_smem_limit.compare_exchange_strong(unread, v);
  }
  return g_smem_limit.load();
}

void set_smem_limit(int bytes) {
  if (bytes && bytes < 48 * 1024) throw std::invalid_argument("set_smem_limit: 0 or >= 49152");
  g_smem_limit = bytes;
}

bool predecode() {
  return env_switch(g_predecode, "WICK_CUDA_PREDECODE", true);
}

void set_predecode(bool on) {
  g_predecode = on ? 1 : 0;
}

int int_r128() {
  if (g_int_r128.load() < 0) {
    int unread = -1;
    g_int_r128.compare_exchange_strong(unread, env_int("WICK_CUDA_INT_R128", 1, {0, 1, 2}));
  }
  return g_int_r128.load();
}

void set_int_r128(int level) {
  if (level < 0 || level > 2) throw std::invalid_argument("set_int_r128: 0, 1 or 2");
  g_int_r128 = level;
}

bool x_stage() {
  return env_switch(g_x_stage, "WICK_CUDA_X_STAGE", true);
}

void set_x_stage(bool on) {
  g_x_stage = on ? 1 : 0;
}

bool int_dp4a() {
  return env_switch(g_int_dp4a, "WICK_CUDA_INT_DP4A", true);
}

void set_int_dp4a(bool on) {
  g_int_dp4a = on ? 1 : 0;
}

bool int_path(const GpuWeight& w) {
  return (w.fmt == Fmt::I8 || w.fmt == Fmt::U4) && int_products();
}

bool fuse_norm() {
  return env_switch(g_fuse_norm, "WICK_CUDA_FUSE_NORM", false);
}

bool matmul_add_rmsnorm(const MatmulJob& job, const float* in, int M, const AddNorm& a,
                        cudaStream_t st) {
  if (M != 1 || !fuse_norm() || matmul_path() == MatmulPath::Tiled) return false;
  const GpuWeight& w = *job.w;
  if (w.fmt == Fmt::F32 || job.bias || !a.counter || int_path(w)) return false;
  Params p = params_for(w, in, 1);
  p.n_jobs = 1;
  p.jobs[0] = Job{w, job.y, nullptr, 0};
  p.norm = a;
  return launch_fused<false, true>(p, ceil_div(w.n_out, 8), st);
}

bool matmul_gate_up(const GpuWeight& gate, const GpuWeight& up, const float* x, int M, float* out,
                    void* xb, cudaStream_t st, const NormInt* ni, const NormInt* out_int,
                    int* counters) {
  if (M <= 0) return false;
  check_gate_up_alike(gate, up, "matmul_gate_up");
  Params p{};
  p.jobs[0] = Job{gate, nullptr, nullptr, 0};
  p.n_jobs = 1;
  p.up = up;
  p.y_gated = out;
  p.x = x;
  p.M = M;
  p.n_in = gate.n_in;
  p.k_pad = gate.k_pad;
  p.kw = kw_for(gate, gate.n_out, true);
  if (int_path(gate)) {
    check_int_weight(up);
    p.xa = int_act(gate, x, M, xb, st, ni);
  }
  // the output's integer form: the decode kernel's 16-row launch (dispatch_int)
  if (out_int && counters && p.xa.q && M <= 16 && matmul_path() != MatmulPath::Tiled) {
    if (out_int->M != M || out_int->n != gate.n_out)
      throw std::logic_error("matmul_gate_up: the integer form's shape is not the output's");
    p.out_form = int_out(*out_int);
    p.out_counters = counters;
    dispatch<true, false>(p, 0, st);
    return true;
  }
  const MatmulJob job{&gate, nullptr, nullptr};
  TiledProblem t{&job, 1, &up, out, x, M, p.kw, xb, p.xa.q ? &p.xa : nullptr};
  if (!matmul_tiled(t, st)) dispatch<true, false>(p, 0, st);
  return false;
}

int grouped_tile_rows(int n_rows, const GpuWeight& gate, const GpuWeight& down) {
  // integer products: their kernels take up to 32 rows, 16 for 4-bit gate/up
  // (its 32-row kernel spills); 64 only where any expert's slice count fits
  // (kw_for gives at most kw_max)
  const bool int_gate = int_path(gate), int_down = int_path(down);
  if (n_rows <= 16 || (int_gate && gate.fmt == Fmt::U4)) return 16;
  if (!int_gate && !rows32_fit(kw_max(), true)) return 16;  // (a GPU of less shared memory)
  return n_rows <= 32 || int_gate || int_down || !rows64_fit(kw_max()) ? 32 : 64;
}

void matmul_grouped(const GroupedMatmul& g, cudaStream_t st) {
  if (g.n_rows <= 0) return;
  if (g.shape.fmt == Fmt::F32) throw std::logic_error("matmul_grouped: f32 experts");
  Params p{};
  p.jobs[0] = Job{g.shape, g.y, nullptr, 0};
  p.n_jobs = 1;
  p.x = g.x;
  p.M = g.n_rows;  // picks the tile shape; each tile bounds its own rows
  p.n_in = g.shape.n_in;
  p.k_pad = g.shape.k_pad;
  p.kw = kw_for(g.shape, g.shape.n_out, g.which == 0);
  p.experts = g.experts;
  p.tiles = g.tiles;
  p.tile_rows = g.tile_rows;
  p.which = g.which;
  if (int_path(g.shape)) {  // every expert's rows quantized at once, for either kernel
    if (!g.xq) throw std::logic_error("matmul_grouped: integer products need the scratch buffer");
    check_int_weight(g.shape);
    p.xa =
        quantize_act(g.x, g.n_rows, g.shape.n_in, g.shape.k_pad, g.shape.fmt == Fmt::U4, g.xq, st);
  }
  if (g.which == 0) {
    p.y_gated = g.y;
    p.up = g.shape;
    dispatch<true, true>(p, g.n_tiles, st);
  } else {
    dispatch<false, true>(p, g.n_tiles, st);
  }
}

void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t st) {
  if (n <= 0) return;
  silu_mul_kernel<<<std::min<int64_t>(4096, (n + 255) / 256), 256, 0, st>>>(gate, up, n);
  WICK_CUDA_LAUNCHED();
}

}  // namespace wick::cuda
