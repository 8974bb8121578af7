// Paged causal attention over the KV cache.
//
// f16 cache: a flash-attention kernel on the tensor cores. A CTA takes a
// tile of 64 rows, a row being one (token, query head) of a run of
// consecutive tokens of one sequence, all heads of one KV head's group, so
// each K/V chunk is read once for the whole group; 4 warps own 16 rows each.
// Keys are cut into partitions of kAttnPartition positions (one CTA each)
// and, inside, chunks of 64 positions aligned to multiples of 64; a row's
// chunks are reduced in order with an online softmax, and the partitions
// are combined in order by a second kernel. Chunks outside a row's own
// range add exact zeros, so a row's result does not depend on the other
// rows of its tile or on the batch: decode and prefill give the same bits.
//
// q8_0 cache (--kv-cache-dtype q8_0): the same kernels, its values widened
// to f16 on their way into shared memory (kv_q8.cuh).
//
// f32 cache (--gpu-f32): one warp per (token, head) on the CUDA cores.
#include <cfloat>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "backend/cuda/device.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_q8.cuh"
#include "backend/cuda/matmul_int.cuh"

namespace wick::cuda {

namespace {

constexpr int kRows = 64;  // rows per CTA (4 warps x 16)
constexpr int kKeys = 64;  // keys per chunk
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void ldsm_x2(uint32_t& r0, uint32_t& r1, const void* p) {
#ifdef WICK_CUDA_EMU
  ::wick_emu::ldmatrix_x2(r0, r1, p, false);
#else
  const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(a));
#endif
}
__device__ __forceinline__ void ldsm_x2_trans(uint32_t& r0, uint32_t& r1, const void* p) {
#ifdef WICK_CUDA_EMU
  ::wick_emu::ldmatrix_x2(r0, r1, p, true);
#else
  const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(a));
#endif
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#ifdef WICK_CUDA_EMU
  ::wick_emu::cp_async(smem, gmem, 16, valid ? 16 : 0);
#else
  const uint32_t a = uint32_t(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;  // 0 bytes read: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(gmem), "r"(n));
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#ifdef WICK_CUDA_EMU
  ::wick_emu::cp_async_wait(-1);
#else
  asm volatile("cp.async.wait_all;\n" ::);
#endif
}

struct Tile {
  int run_first, run_len, seq, p_first;  // tokens run_first.. at positions p_first..
};

__device__ __forceinline__ int row_lo(int pos, int window) {
  return window > 0 ? max(0, pos - window + 1) : 0;
}

// False for a hole: a slot outside its block's valid range (begin << 16 | end).
__device__ __forceinline__ bool slot_filled(const BatchArgs& b, const int32_t* fill, int pos) {
  if (!fill) return true;
  const int v = fill[pos / b.block_size], off = pos % b.block_size;
  return off >= (v >> 16) && off < (v & 0xffff);
}

// ---- the pieces of a row's reduction, shared by the two f16 kernels ----
// A row's keys are reduced chunk by chunk in position order: S = q K^T,
// m' = max(m, max S), p = 2^(S - m'), pv = p V (from zero), then
// o = o a + pv and l = l a + sum p with a = 2^(m - m'). Every step uses the
// same instructions in both kernels (no contraction: explicit roundings), so
// a row's bits do not depend on which kernel or tile computed it.

// This lane's two rows (g and g + 8 of a 16-row tile starting at row R0).
struct Rows {
  int tok[2], head[2], pos[2];
  bool ok[2];
};
__device__ __forceinline__ Rows tile_rows(int R0, int g, int G, int kvh, int run_first, int run_len,
                                          int p_first) {
  Rows r;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int R = R0 + g + 8 * h;
    r.ok[h] = R < run_len * G;
    r.tok[h] = run_first + (r.ok[h] ? R / G : 0);
    r.head[h] = kvh * G + R % G;
    r.pos[h] = p_first + (r.ok[h] ? R / G : 0);
  }
  return r;
}

// Q fragments (f16) of the lane's rows, HD / 16 k-steps.
template <int HD>
__device__ __forceinline__ void load_q(const AttnArgs& a, const Rows& r, int c,
                                       uint32_t (&qf)[HD / 16][4]) {
#pragma unroll
  for (int s = 0; s < HD / 16; ++s) {
    float v[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float* q = a.q + (size_t(r.tok[h]) * a.n_head + r.head[h]) * HD + 16 * s + 2 * c;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        v[h][e] = r.ok[h] ? q[e] : 0.f;
        v[h][2 + e] = r.ok[h] ? q[8 + e] : 0.f;
      }
    }
    qf[s][0] = pack_f16(v[0][0], v[0][1]);
    qf[s][1] = pack_f16(v[1][0], v[1][1]);
    qf[s][2] = pack_f16(v[0][2], v[0][3]);
    qf[s][3] = pack_f16(v[1][2], v[1][3]);
  }
}

// Pre-RoPE keys (span caches): each pair (i, i + HD/2) rotated by its
// position on the way into shared memory. Out of line: the usual cache
// never runs it, and the attention kernels stay small for the i-cache.
template <int HD, int LD, bool Q8>
__device__ __noinline__ void stage_rotated_k(const AttnArgs& a, const BatchArgs& b,
                                             const int32_t* table, const int32_t* fill, int kvh,
                                             int k0, int key_hi, __half (*ks)[LD], int tid,
                                             int n_threads) {
  const int kv_dim = a.n_head_kv * HD;
  constexpr int H2 = HD / 2;
  for (int i = tid; i < kKeys * (H2 / 4); i += n_threads) {
    const int j = i / (H2 / 4), d = 4 * (i % (H2 / 4)), pos = k0 + j;
    float r0[4] = {0, 0, 0, 0}, r1[4] = {0, 0, 0, 0};
    if (pos <= key_hi && slot_filled(b, fill, pos)) {
      const int slot = table[pos / b.block_size] * b.block_size + pos % b.block_size;
      const int at = kvh * HD;             // the key's first element in its slot row
      const int blk = pos / b.block_size;  // RoPE counts only filled slots (holes shift)
      const float* cs =
          a.rope + size_t(fill ? pos - b.block_shift[fill - b.block_fill + blk] : pos) * HD;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x0, x1;
        if constexpr (Q8) {
          const auto* q = static_cast<const int8_t*>(a.cache.k);
          const auto* sd = static_cast<const __half*>(a.cache.k_scale);
          x0 = q8_load(q, sd, size_t(slot), kv_dim, at + d + e);
          x1 = q8_load(q, sd, size_t(slot), kv_dim, at + H2 + d + e);
        } else {
          const __half* kr = static_cast<const __half*>(a.cache.k) + size_t(slot) * kv_dim + at;
          x0 = __half2float(kr[d + e]);
          x1 = __half2float(kr[H2 + d + e]);
        }
        const float c = cs[d + e], sn = cs[H2 + d + e];
        r0[e] = rope_lo(x0, x1, c, sn);
        r1[e] = rope_hi(x0, x1, c, sn);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      ks[j][d + e] = __float2half_rn(r0[e]);
      ks[j][H2 + d + e] = __float2half_rn(r1[e]);
    }
  }
}

// K and V of the kKeys positions from k0 into shared memory (zeros past
// key_hi and in holes), by threads tid, tid + n_threads, ...; the caller
// waits (cp_async_wait_all) and synchronises. Q8: widened to f16 by the
// threads themselves (plain loads: 8 bytes of q and a scale a piece).
template <int HD, int LD, bool Q8>
__device__ __forceinline__ void stage_kv(const AttnArgs& a, const BatchArgs& b,
                                         const int32_t* table, const int32_t* fill, int kvh, int k0,
                                         int key_hi, __half (*ks)[LD], __half (*vs)[LD], int tid,
                                         int n_threads) {
  const int kv_dim = a.n_head_kv * HD;
  // n_threads is a multiple of HD / 8: a thread keeps its 16-byte piece of
  // a key's row and steps over keys, following their block without dividing
  constexpr int P8 = HD / 8;
  const int part8 = tid % P8, dj = n_threads / P8;
  int pos = k0 + tid / P8, blk = pos / b.block_size, in_blk = pos % b.block_size;
  for (int j = tid / P8; j < kKeys; j += dj) {
    const bool ok = pos <= key_hi && slot_filled(b, fill, pos);
    if constexpr (Q8) {
      const int i = kvh * HD + part8 * 8;
      const size_t slot = ok ? size_t(table[blk] * b.block_size + in_blk) : 0;
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const auto* kq = static_cast<const int8_t*>(a.cache.k);
      const auto* vq = static_cast<const int8_t*>(a.cache.v);
      const auto* kd = static_cast<const __half*>(a.cache.k_scale);
      const auto* vd = static_cast<const __half*>(a.cache.v_scale);
      if (!a.rope)
        *reinterpret_cast<uint4*>(&ks[j][part8 * 8]) =
            ok ? q8_load8_f16(kq, kd, slot, kv_dim, i) : zero;
      *reinterpret_cast<uint4*>(&vs[j][part8 * 8]) =
          ok ? q8_load8_f16(vq, vd, slot, kv_dim, i) : zero;
    } else {
      size_t off = 0;
      if (ok)
        off = size_t(table[blk] * b.block_size + in_blk) * kv_dim + size_t(kvh) * HD + part8 * 8;
      if (!a.rope) cp_async16(&ks[j][part8 * 8], static_cast<const __half*>(a.cache.k) + off, ok);
      cp_async16(&vs[j][part8 * 8], static_cast<const __half*>(a.cache.v) + off, ok);
    }
    pos += dj;
    for (in_blk += dj; in_blk >= b.block_size; in_blk -= b.block_size) ++blk;
  }
  if (a.rope) stage_rotated_k<HD, LD, Q8>(a, b, table, fill, kvh, k0, key_hi, ks, tid, n_threads);
}

// Scaled, masked scores of the lane's rows for the chunk at k0 and each
// row's maximum over the chunk (shared by the row's 4 lanes).
template <int HD, int LD>
__device__ __forceinline__ void chunk_scores(const AttnArgs& a, const BatchArgs& b,
                                             const int32_t* fill, const Rows& r,
                                             const uint32_t (&qf)[HD / 16][4],
                                             const __half (*ks)[LD], int k0, int part_lo,
                                             int part_hi, float (&sc)[8][4], float (&mx)[2]) {
  const int lane = threadIdx.x & 31, c = lane & 3;
  const float scale = rsqrtf(float(HD)) * a.score_factor * kLog2e;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[j][i] = 0.f;
#pragma unroll
    for (int s = 0; s < HD / 16; ++s) {
      uint32_t b0, b1;
      ldsm_x2(b0, b1, &ks[8 * j + (lane & 7)][16 * s + 8 * ((lane >> 3) & 1)]);
      mma_f16(sc[j], qf[s][0], qf[s][1], qf[s][2], qf[s][3], b0, b1);
    }
  }
  mx[0] = mx[1] = -INFINITY;
  int lo[2], hi[2];  // a row's keys in this partition: [lo, hi]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lo[h] = max(part_lo, row_lo(r.pos[h], a.sliding_window));
    hi[h] = r.ok[h] ? min(part_hi - 1, r.pos[h]) : -1;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = i / 2, pos = k0 + 8 * j + 2 * c + (i & 1);
      const bool ok = pos >= lo[h] && pos <= hi[h] && slot_filled(b, fill, pos);
      sc[j][i] = ok ? __fmul_rn(sc[j][i], scale) : -INFINITY;
      mx[h] = fmaxf(mx[h], sc[j][i]);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(~0u, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(~0u, mx[h], 2));
  }
}

// The running max m' after a chunk whose max is mx, the value its
// probabilities are taken against, and the rescale a of what came before.
__device__ __forceinline__ void next_max(float m, float mx, float& m_new, float& m_use,
                                         float& alpha) {
  m_new = fmaxf(m, mx);
  m_use = m_new == -INFINITY ? 0.f : m_new;
  alpha = exp2f(__fsub_rn(m, m_use));
}

// p = 2^(S - m_use) in place, the rows' sums of p and pv = p V (from zero).
template <int HD, int LD>
__device__ __forceinline__ void chunk_pv(float (&sc)[8][4], const float (&m_use)[2],
                                         const __half (*vs)[LD], float (&pv)[HD / 8][4],
                                         float (&rs)[2]) {
  const int lane = threadIdx.x & 31;
  rs[0] = rs[1] = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sc[j][i] = exp2f(__fsub_rn(sc[j][i], m_use[i / 2]));
      rs[i / 2] = __fadd_rn(rs[i / 2], sc[j][i]);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rs[h] = __fadd_rn(rs[h], __shfl_xor_sync(~0u, rs[h], 1));
    rs[h] = __fadd_rn(rs[h], __shfl_xor_sync(~0u, rs[h], 2));
  }
#pragma unroll
  for (int d = 0; d < HD / 8; ++d)
#pragma unroll
    for (int i = 0; i < 4; ++i) pv[d][i] = 0.f;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const uint32_t p0 = pack_f16(sc[2 * t][0], sc[2 * t][1]);
    const uint32_t p1 = pack_f16(sc[2 * t][2], sc[2 * t][3]);
    const uint32_t p2 = pack_f16(sc[2 * t + 1][0], sc[2 * t + 1][1]);
    const uint32_t p3 = pack_f16(sc[2 * t + 1][2], sc[2 * t + 1][3]);
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      uint32_t b0, b1;
      ldsm_x2_trans(b0, b1, &vs[16 * t + (lane & 7) + 8 * ((lane >> 3) & 1)][8 * d]);
      mma_f16(pv[d], p0, p1, p2, p3, b0, b1);
    }
  }
}

// A row's result for this partition: the output itself when all its keys
// lie here (o / l is then bit for bit what the combine would compute: its
// weight 2^(m - m) is exactly 1), else the unnormalised partial m, l, o.
// Returns where o goes (dst[d], d < HD), or null; sets m and l when partial.
__device__ __forceinline__ float* row_dst(const AttnArgs& a, int tok, int head, int pos, int part,
                                          int n_parts, bool& partial) {
  const int last = pos / kAttnPartition;
  partial = row_lo(pos, a.sliding_window) / kAttnPartition != last;
  if (!partial)
    return part == last ? a.out + (size_t(tok) * a.n_head + head) * a.head_dim : nullptr;
  return a.partial + ((size_t(tok) * a.n_head + head) * n_parts + part) * (a.head_dim + 2);
}

// Part of token tok's output in integer form (AttnArgs' out_*): the 32
// elements from head * hd + d0 (d0 a multiple of 32), lane i holding
// element d0 + i as v, whole warps: so head_dim a multiple of 32 (launch_f16
// asks for the form only then). The warp of the last block of the last head
// also writes the zero blocks past n_head * hd to the forms' k_pad.
__device__ __forceinline__ void attn_int_out(const AttnArgs& a, int tok, int head, int d0, float v,
                                             int lane) {
  const IntRowOuts out = int_row_outs(a.out_form, tok);
  const int n = a.n_head * a.head_dim, b = (head * a.head_dim + d0) / 32;
  quantize_block(v, lane, b, out.o);
  if (32 * b + 32 == n)
    for (int bb = b + 1; bb < a.out_form.k_pad() / 32; ++bb) quantize_block(0.f, lane, bb, out.o);
}

// Tiles of 64 rows (prefill): a row is one (token, query head) of a run of
// consecutive tokens of one sequence, all heads of one KV head's group, so
// each K/V chunk is read once for the whole group; 4 warps own 16 rows each
// and walk the partition's chunks in order.
template <int HD, bool FILL, bool Q8>
__global__ void __launch_bounds__(128)
    attn_f16_kernel(const __grid_constant__ AttnArgs a, const __grid_constant__ BatchArgs b,
                    int n_row_tiles, int n_parts) {
  constexpr int LD = HD + 8;  // padded smem row (halves): no ldmatrix bank conflicts
  __shared__ __align__(16) __half ks[kKeys][LD];
  __shared__ __align__(16) __half vs[kKeys][LD];

  allow_next_kernel();
  wait_for_previous_kernel();
  const int per_run = n_row_tiles * n_parts;
  const int run = int(blockIdx.x) / per_run, rem = int(blockIdx.x) % per_run;
  const int rt = rem / n_parts, part = rem % n_parts;
  if (run >= b.n_runs) return;
  const int G = a.n_head / a.n_head_kv, kvh = int(blockIdx.y);
  const int run_first = b.runs[2 * run], run_len = b.runs[2 * run + 1];
  if (rt * kRows >= run_len * G) return;
  const int seq = b.seq_of[run_first], p_first = b.positions[run_first];
  const int t_lo = rt * kRows / G, t_hi = min(run_len - 1, (rt * kRows + kRows - 1) / G);
  const int key_hi = p_first + t_hi;  // last key any row of the tile sees
  const int key_lo = row_lo(p_first + t_lo, a.sliding_window);
  const int part_lo = part * kAttnPartition, part_hi = part_lo + kAttnPartition;  // [lo, hi)
  if (part_lo > key_hi || part_hi <= key_lo) return;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int32_t* table = b.block_table + size_t(seq) * b.max_blocks;
  // holes only with span caches: the usual kernel leaves their checks out
  const int32_t* fill = FILL ? b.block_fill + size_t(seq) * b.max_blocks : nullptr;
  const Rows r = tile_rows(rt * kRows + warp * 16, g, G, kvh, run_first, run_len, p_first);
  uint32_t qf[HD / 16][4];
  load_q<HD>(a, r, c, qf);

  float o[HD / 8][4];
#pragma unroll
  for (int d = 0; d < HD / 8; ++d)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[d][i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const int first_key = max(part_lo, key_lo / kKeys * kKeys);
  const int end_key = min(part_hi, key_hi + 1);
  for (int k0 = first_key; k0 < end_key; k0 += kKeys) {
    __syncthreads();
    stage_kv<HD, LD, Q8>(a, b, table, fill, kvh, k0, key_hi, ks, vs, threadIdx.x, blockDim.x);
    cp_async_wait_all();
    __syncthreads();
    float sc[8][4], mx[2], m_use[2], alpha[2], rs[2], pv[HD / 8][4];
    chunk_scores<HD, LD>(a, b, fill, r, qf, ks, k0, part_lo, part_hi, sc, mx);
#pragma unroll
    for (int h = 0; h < 2; ++h) next_max(m[h], mx[h], m[h], m_use[h], alpha[h]);
    chunk_pv<HD, LD>(sc, m_use, vs, pv, rs);
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = __fmaf_rn(l[h], alpha[h], rs[h]);
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[d][i] = __fmaf_rn(o[d][i], alpha[i / 2], pv[d][i]);
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!r.ok[h]) continue;
    bool partial = false;
    float* dst = row_dst(a, r.tok[h], r.head[h], r.pos[h], part, n_parts, partial);
    if (!dst) continue;
    if (partial) {
      if (c == 0) {
        dst[0] = m[h];
        dst[1] = l[h];
      }
      dst += 2;
    }
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      dst[8 * d + 2 * c] = partial ? o[d][2 * h] : o[d][2 * h] / l[h];
      dst[8 * d + 2 * c + 1] = partial ? o[d][2 * h + 1] : o[d][2 * h + 1] / l[h];
    }
  }
}

// Decode (every run's rows fit one 16-row tile): the partition's chunks go
// to the CTA's warps at once, NW per wave, rather than one after another.
// Each warp stages and scores its chunk; the running max before a chunk is
// the max over the chunks before it, so each warp then forms its p and pv
// alone; the rescaled sums are added in chunk order. The same steps as
// attn_f16_kernel's, hence the same bits.
template <int HD>
constexpr int decode_warps() {
  return HD <= 64 ? 8 : 4;
}
template <int HD>
constexpr size_t decode_smem() {
  constexpr int NW = decode_warps<HD>(), LD = HD + 8;
  return size_t(NW) * 2 * kKeys * LD * 2  // K, V per warp (halves)
         + size_t(NW) * 16 * HD * 4       // pv per warp
         + size_t(NW) * 16 * 3 * 4        // chunk max, rescale, row sum per warp
         + 16 * 4;                        // running max
}

template <int HD, bool FILL, bool Q8>
__global__ void __launch_bounds__(decode_warps<HD>() * 32)
    attn_f16_decode_kernel(const __grid_constant__ AttnArgs a, const __grid_constant__ BatchArgs b,
                           int n_parts) {
  constexpr int NW = decode_warps<HD>(), LD = HD + 8, NTH = NW * 32;
  constexpr int PER = 16 * HD / NTH;  // (row, d) elements of o per thread in the combine
  extern __shared__ __align__(16) unsigned char smem[];
  auto* kv = reinterpret_cast<__half(*)[kKeys][LD]>(smem);  // [2 NW][kKeys][LD]
  float* pvs = reinterpret_cast<float*>(smem + size_t(NW) * 2 * kKeys * LD * 2);  // [NW][16][HD]
  float* mxs = pvs + NW * 16 * HD;                                                // [NW][16]
  float* als = mxs + NW * 16;                                                     // [NW][16]
  float* rss = als + NW * 16;                                                     // [NW][16]
  float* m_run = rss + NW * 16;                                                   // [16]

  // The batch's tables were uploaded before the step: read while the kernel
  // before drains (a CTA that returns early waits too, so that the grid's
  // end still implies that kernel's).
  allow_next_kernel();
  const int run = int(blockIdx.x) / n_parts, part = int(blockIdx.x) % n_parts;
  if (run >= b.n_runs) return wait_for_previous_kernel();
  const int G = a.n_head / a.n_head_kv, kvh = int(blockIdx.y);
  const int run_first = b.runs[2 * run], run_len = b.runs[2 * run + 1];
  const int seq = b.seq_of[run_first], p_first = b.positions[run_first];
  const int key_hi = p_first + run_len - 1;
  const int key_lo = row_lo(p_first, a.sliding_window);
  const int part_lo = part * kAttnPartition, part_hi = part_lo + kAttnPartition;
  if (part_lo > key_hi || part_hi <= key_lo) return wait_for_previous_kernel();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int32_t* table = b.block_table + size_t(seq) * b.max_blocks;
  // holes only with span caches: the usual kernel leaves their checks out
  const int32_t* fill = FILL ? b.block_fill + size_t(seq) * b.max_blocks : nullptr;
  const Rows r = tile_rows(0, g, G, kvh, run_first, run_len, p_first);
  wait_for_previous_kernel();  // q and the step's own K/V come from it
  uint32_t qf[HD / 16][4];
  bool have_q = false;  // q is loaded once the first K/V copies are on their way
  __half(*ks)[LD] = kv[2 * warp];
  __half(*vs)[LD] = kv[2 * warp + 1];

  float o[PER], l[PER];
#pragma unroll
  for (int e = 0; e < PER; ++e) o[e] = l[e] = 0.f;
  if (threadIdx.x < 16) m_run[threadIdx.x] = -INFINITY;

  const int first_key = max(part_lo, key_lo / kKeys * kKeys);
  const int end_key = min(part_hi, key_hi + 1);
  for (int w0 = first_key; w0 < end_key; w0 += NW * kKeys) {
    const int k0 = w0 + warp * kKeys;
    const bool active = k0 < end_key;
    const int n_active = min(NW, (end_key - w0 + kKeys - 1) / kKeys);
    float sc[8][4], mx[2] = {-INFINITY, -INFINITY};
    if (active) {
      stage_kv<HD, LD, Q8>(a, b, table, fill, kvh, k0, key_hi, ks, vs, lane, 32);
      if (!have_q) load_q<HD>(a, r, c, qf);
      have_q = true;
      cp_async_wait_all();
      __syncwarp();
      chunk_scores<HD, LD>(a, b, fill, r, qf, ks, k0, part_lo, part_hi, sc, mx);
      if (c == 0) {
        mxs[warp * 16 + g] = mx[0];
        mxs[warp * 16 + g + 8] = mx[1];
      }
    }
    __syncthreads();  // every chunk's max (and m_run) is known
    if (active) {
      float m_use[2], alpha[2], rs[2], pv[HD / 8][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * h;
        float m = m_run[row], m_new;
        for (int w = 0; w < warp; ++w) m = fmaxf(m, mxs[w * 16 + row]);
        next_max(m, mx[h], m_new, m_use[h], alpha[h]);
      }
      chunk_pv<HD, LD>(sc, m_use, vs, pv, rs);
      float* dst = pvs + warp * 16 * HD;
#pragma unroll
      for (int d = 0; d < HD / 8; ++d) {
        dst[g * HD + 8 * d + 2 * c] = pv[d][0];
        dst[g * HD + 8 * d + 2 * c + 1] = pv[d][1];
        dst[(g + 8) * HD + 8 * d + 2 * c] = pv[d][2];
        dst[(g + 8) * HD + 8 * d + 2 * c + 1] = pv[d][3];
      }
      if (c == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          als[warp * 16 + g + 8 * h] = alpha[h];
          rss[warp * 16 + g + 8 * h] = rs[h];
        }
      }
    }
    __syncthreads();  // every chunk's pv
#pragma unroll
    for (int e = 0; e < PER; ++e) {
      const int idx = int(threadIdx.x) + e * NTH, row = idx / HD, d = idx % HD;
      for (int w = 0; w < n_active; ++w) {
        o[e] = __fmaf_rn(o[e], als[w * 16 + row], pvs[(w * 16 + row) * HD + d]);
        l[e] = __fmaf_rn(l[e], als[w * 16 + row], rss[w * 16 + row]);
      }
    }
    if (threadIdx.x < 16) {
      float m = m_run[threadIdx.x];
      for (int w = 0; w < n_active; ++w) m = fmaxf(m, mxs[w * 16 + threadIdx.x]);
      m_run[threadIdx.x] = m;
    }
    __syncthreads();  // before the next wave overwrites the buffers
  }

#pragma unroll
  for (int e = 0; e < PER; ++e) {
    const int idx = int(threadIdx.x) + e * NTH, row = idx / HD, d = idx % HD;
    if (row >= run_len * G) continue;
    const int tok = run_first + row / G, head = kvh * G + row % G, pos = p_first + row / G;
    bool partial = false;
    float* dst = row_dst(a, tok, head, pos, part, n_parts, partial);
    if (!dst) continue;
    if (partial) {
      if (d == 0) {
        dst[0] = m_run[row];
        dst[1] = l[e];
      }
      dst[2 + d] = o[e];
    } else {
      dst[d] = o[e] / l[e];
    }
  }
  if (!a.out_form.any()) return;
    // the rows' integer form, from the values this thread just wrote (a loop
    // of its own, not unrolled: beside the one above it made HD = 128 spill);
    // a warp's 32 lanes hold 32 consecutive d of one row (HD >= 32)
#pragma unroll 1
  for (int e = 0; e < PER; ++e) {
    const int idx = int(threadIdx.x) + e * NTH, row = idx / HD, d = idx % HD;
    if (row >= run_len * G) continue;
    const int tok = run_first + row / G, head = kvh * G + row % G, pos = p_first + row / G;
    bool partial = false;
    const float* dst = row_dst(a, tok, head, pos, part, n_parts, partial);
    if (dst && !partial) attn_int_out(a, tok, head, d & ~31, dst[d], lane);
  }
}

// Merges a token's partitions in order: out = sum 2^(m_i - M) o_i / sum 2^(m_i - M) l_i.
__global__ void attn_combine_kernel(const __grid_constant__ AttnArgs a,
                                    const __grid_constant__ BatchArgs b, int n_parts) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int t = blockIdx.x, h = blockIdx.y, hd = a.head_dim;
  const int pos = b.positions[t];
  const int first = row_lo(pos, a.sliding_window) / kAttnPartition, last = pos / kAttnPartition;
  if (first == last) return;  // finished by the attention kernel
  const float* src = a.partial + (size_t(t) * a.n_head + h) * n_parts * (hd + 2);
  float mx = -INFINITY;
  for (int i = first; i <= last; ++i) mx = fmaxf(mx, src[i * (hd + 2)]);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float num = 0.f, den = 0.f;
    for (int i = first; i <= last; ++i) {
      const float* p = src + i * (hd + 2);
      const float w = exp2f(p[0] - mx);
      num += w * p[2 + d];
      den += w * p[1];
    }
    a.out[(size_t(t) * a.n_head + h) * hd + d] = num / den;
    // (blockDim.x = hd from 32 to 128: whole warps, one pass)
    if (a.out_form.any()) attn_int_out(a, t, h, d & ~31, num / den, int(threadIdx.x) & 31);
  }
}

// f32 cache: one warp per (token, head); lane i holds dims i, i + 32, ...
template <int HD>
__global__ void attn_f32_kernel(const __grid_constant__ AttnArgs a,
                                const __grid_constant__ BatchArgs b) {
  constexpr int PER = (HD + 31) / 32;
  allow_next_kernel();
  const int t = blockIdx.x, h = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
  if (h >= a.n_head) return;
  const int lane = threadIdx.x & 31, G = a.n_head / a.n_head_kv, kv_dim = a.n_head_kv * HD;
  const int pos = b.positions[t], lo = row_lo(pos, a.sliding_window);
  const int32_t* table = b.block_table + size_t(b.seq_of[t]) * b.max_blocks;
  const int32_t* fill = b.block_fill ? b.block_fill + size_t(b.seq_of[t]) * b.max_blocks : nullptr;
  const float* q = a.q + (size_t(t) * a.n_head + h) * HD;
  float qv[PER], acc[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int d = lane + 32 * i;
    qv[i] = d < HD ? q[d] : 0.f;
    acc[i] = 0.f;
  }
  const float scale = rsqrtf(float(HD)) * a.score_factor;
  float m = -INFINITY, l = 0.f;
  for (int j = lo; j <= pos; ++j) {
    if (!slot_filled(b, fill, j)) continue;
    const size_t slot = size_t(table[j / b.block_size]) * b.block_size + j % b.block_size;
    const float* kr = static_cast<const float*>(a.cache.k) + slot * kv_dim + (h / G) * HD;
    const float* vr = static_cast<const float*>(a.cache.v) + slot * kv_dim + (h / G) * HD;
    float s = 0.f;
    if (a.rope) {  // pre-RoPE key: rotated pair by pair, lane i taking pairs i, i + 32, ...
      const int jr = fill ? j - b.block_shift[fill - b.block_fill + j / b.block_size] : j;
      const float* cs = a.rope + size_t(jr) * HD;
      for (int i = lane; i < HD / 2; i += 32) {
        const float x0 = kr[i], x1 = kr[i + HD / 2];
        s += q[i] * rope_lo(x0, x1, cs[i], cs[HD / 2 + i]) +
             q[i + HD / 2] * rope_hi(x0, x1, cs[i], cs[HD / 2 + i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int d = lane + 32 * i;
        if (d < HD) s += qv[i] * kr[d];
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(~0u, s, off);
    s *= scale;
    const float m_new = fmaxf(m, s), alpha = expf(m - m_new), p = expf(s - m_new);
    l = l * alpha + p;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * alpha + (d < HD ? p * vr[d] : 0.f);
    }
    m = m_new;
  }
  float* out = a.out + (size_t(t) * a.n_head + h) * HD;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int d = lane + 32 * i;
    if (d < HD) out[d] = acc[i] / l;
  }
}

// WICK_CUDA_ATTN_DECODE=0 sends decode through the tiled kernel (same bits).
bool decode_kernel_on() {
  static const bool on = [] {
    const char* v = std::getenv("WICK_CUDA_ATTN_DECODE");
    if (v && std::string(v) != "0" && std::string(v) != "1")
      throw std::invalid_argument(std::string("WICK_CUDA_ATTN_DECODE: invalid value '") + v + "'");
    return !v || std::string(v) == "1";
  }();
  return on;
}

int n_parts_for(const BatchArgs& b) {
  return std::max(1, ceil_div(b.max_ctx, kAttnPartition));
}

// The decode kernel spreads a partition's chunks over its warps; with more
// CTAs than half the SMs the tiled kernel, small enough to share an SM with
// its neighbours in the stream, is quicker. Both give the same bits. (Its
// stages take 169-178 KB: a GPU of less shared memory, an A100 or an RTX
// 4090, runs the tiled kernel.)
template <int HD>
bool decode_kernel_fits() {
  return decode_smem<HD>() <= size_t(max_smem_optin() - kStaticSmemReserve);
}
template <int HD>
bool decode_kernel_for(const AttnArgs& a, const BatchArgs& b, int G, int n_parts) {
  const int64_t n_ctas = int64_t(b.n_runs) * a.n_head_kv * n_parts;
  return int64_t(b.max_run) * G <= 16 && 2 * n_ctas <= n_sms() && decode_kernel_on() &&
         decode_kernel_fits<HD>();
}

template <int HD, bool FILL, bool Q8>
void launch_f16_kernels(const AttnArgs& a, const BatchArgs& b, int G, int n_parts,
                        cudaStream_t st) {
  if (decode_kernel_for<HD>(a, b, G, n_parts)) {
    auto kernel = attn_f16_decode_kernel<HD, FILL, Q8>;
    static bool raised = false;
    if (!raised) {
      WICK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(decode_smem<HD>())));
      raised = true;
    }
    const dim3 grid(unsigned(b.n_runs * n_parts), unsigned(a.n_head_kv));
    launch_early(kernel, grid, dim3(decode_warps<HD>() * 32), decode_smem<HD>(), st, a, b, n_parts);
  } else {
    const int n_row_tiles = ceil_div(int64_t(b.max_run) * G, kRows);
    const dim3 grid(unsigned(b.n_runs * n_row_tiles * n_parts), unsigned(a.n_head_kv));
    launch_early(attn_f16_kernel<HD, FILL, Q8>, grid, dim3(128), 0, st, a, b, n_row_tiles, n_parts);
  }
}

// Returns whether the output's integer form was written (asked for in a0).
template <int HD>
bool launch_f16(const AttnArgs& a0, const BatchArgs& b, cudaStream_t st) {
  const int G = a0.n_head / a0.n_head_kv, n_parts = n_parts_for(b);
  AttnArgs a = a0;  // the form: the decode kernel (and the combine), whole warps of one head
  const bool form = a.out_form.any() && HD >= 32 && decode_kernel_for<HD>(a, b, G, n_parts);
  if (!form) a.out_form = IntOut{};
  const bool q8 = a.cache.type == KvType::Q8;
  if (q8 && (a.n_head_kv * HD) % 32)
    throw std::invalid_argument("attention: a q8_0 cache's rows are whole blocks of 32");
  if (b.block_fill)
    q8 ? launch_f16_kernels<HD, true, true>(a, b, G, n_parts, st)
       : launch_f16_kernels<HD, true, false>(a, b, G, n_parts, st);
  else
    q8 ? launch_f16_kernels<HD, false, true>(a, b, G, n_parts, st)
       : launch_f16_kernels<HD, false, false>(a, b, G, n_parts, st);
  if (n_parts > 1)  // (with one, every row finished in it)
    launch_early(attn_combine_kernel, dim3(unsigned(b.n_tokens), unsigned(a.n_head)),
                 dim3(std::min(HD, 128)), 0, st, a, b, n_parts);
  return form;
}

template <int HD>
void launch_f32(const AttnArgs& a, const BatchArgs& b, cudaStream_t st) {
  const int heads_per_block = 4;
  attn_f32_kernel<HD><<<dim3(unsigned(b.n_tokens), unsigned(ceil_div(a.n_head, heads_per_block))),
                        32 * heads_per_block, 0, st>>>(a, b);
  WICK_CUDA_LAUNCHED();
}

}  // namespace

bool attention_decode_kernel(int head_dim) {
  if (!decode_kernel_on()) return false;
  switch (head_dim) {
    case 16:
      return decode_kernel_fits<16>();
    case 32:
      return decode_kernel_fits<32>();
    case 64:
      return decode_kernel_fits<64>();
    case 128:
      return decode_kernel_fits<128>();
    default:
      return false;
  }
}

size_t attention_partial_floats(const BatchArgs& b, int n_head, int head_dim) {
  return size_t(b.n_tokens) * size_t(n_head) * size_t(n_parts_for(b)) * size_t(head_dim + 2);
}

bool attention(const AttnArgs& a, const BatchArgs& b, cudaStream_t st) {
  if (b.n_tokens <= 0) return false;
  if (a.n_head % a.n_head_kv)
    throw std::invalid_argument("attention: n_head is not a multiple of n_head_kv");
  switch (a.head_dim) {
#define WICK_HD(hd)                                                   \
  case hd:                                                            \
    if (a.cache.type != KvType::F32) return launch_f16<hd>(a, b, st); \
    launch_f32<hd>(a, b, st);                                         \
    return false;
    WICK_HD(16)
    WICK_HD(32)
    WICK_HD(64)
    WICK_HD(128)
#undef WICK_HD
    default:
      throw std::invalid_argument("attention: head_dim " + std::to_string(a.head_dim) +
                                  " is not supported on CUDA (16, 32, 64, 128)");
  }
}

}  // namespace wick::cuda
