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
// f32 cache (--gpu-f32): one warp per (token, head) on the CUDA cores.
#include <cfloat>

#include "backend/cuda/device.cuh"
#include "backend/cuda/kernels.h"

namespace wick::cuda {

namespace {

constexpr int kRows = 64;  // rows per CTA (4 warps x 16)
constexpr int kKeys = 64;  // keys per chunk
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void ldsm_x2(uint32_t& r0, uint32_t& r1, const void* p) {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x2_trans(uint32_t& r0, uint32_t& r1, const void* p) {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(a));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;  // 0 bytes read: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::);
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

template <int HD>
__global__ void __launch_bounds__(128)
    attn_f16_kernel(const AttnArgs a, const BatchArgs b, int n_row_tiles, int n_parts) {
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
  const int kv_dim = a.n_head_kv * HD;
  const int32_t* table = b.block_table + size_t(seq) * b.max_blocks;
  const int32_t* fill = b.block_fill ? b.block_fill + size_t(seq) * b.max_blocks : nullptr;

  // This lane's two rows (g and g + 8 of the warp's 16).
  int row_tok[2], row_head[2], row_pos[2];
  bool row_ok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int R = rt * kRows + warp * 16 + g + 8 * h;
    row_ok[h] = R < run_len * G;
    row_tok[h] = run_first + (row_ok[h] ? R / G : 0);
    row_head[h] = kvh * G + R % G;
    row_pos[h] = p_first + (row_ok[h] ? R / G : 0);
  }
  // Q fragments (f16), HD / 16 k-steps.
  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int s = 0; s < HD / 16; ++s) {
    float v[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float* q = a.q + (size_t(row_tok[h]) * a.n_head + row_head[h]) * HD + 16 * s + 2 * c;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        v[h][e] = row_ok[h] ? q[e] : 0.f;
        v[h][2 + e] = row_ok[h] ? q[8 + e] : 0.f;
      }
    }
    qf[s][0] = pack_f16(v[0][0], v[0][1]);
    qf[s][1] = pack_f16(v[1][0], v[1][1]);
    qf[s][2] = pack_f16(v[0][2], v[0][3]);
    qf[s][3] = pack_f16(v[1][2], v[1][3]);
  }

  float o[HD / 8][4];
#pragma unroll
  for (int d = 0; d < HD / 8; ++d)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[d][i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float scale = rsqrtf(float(HD)) * kLog2e;

  const int first_key = max(part_lo, key_lo / kKeys * kKeys);
  const int end_key = min(part_hi, key_hi + 1);
  for (int k0 = first_key; k0 < end_key; k0 += kKeys) {
    // K and V of 64 positions into shared memory; past key_hi: zeros.
    __syncthreads();
    for (int i = threadIdx.x; i < kKeys * (HD / 8); i += blockDim.x) {
      const int j = i / (HD / 8), part8 = i % (HD / 8), pos = k0 + j;
      const bool ok = pos <= key_hi && slot_filled(b, fill, pos);
      size_t off = 0;
      if (ok) {
        const int slot = table[pos / b.block_size] * b.block_size + pos % b.block_size;
        off = size_t(slot) * kv_dim + size_t(kvh) * HD + part8 * 8;
      }
      if (!a.rope) cp_async16(&ks[j][part8 * 8], static_cast<const __half*>(a.k_cache) + off, ok);
      cp_async16(&vs[j][part8 * 8], static_cast<const __half*>(a.v_cache) + off, ok);
    }
    if (a.rope) {  // pre-RoPE keys: rotate pairs (i, i + HD/2) by their position on the way in
      constexpr int H2 = HD / 2;
      for (int i = threadIdx.x; i < kKeys * (H2 / 4); i += blockDim.x) {
        const int j = i / (H2 / 4), d = 4 * (i % (H2 / 4)), pos = k0 + j;
        float r0[4] = {0, 0, 0, 0}, r1[4] = {0, 0, 0, 0};
        if (pos <= key_hi && slot_filled(b, fill, pos)) {
          const int slot = table[pos / b.block_size] * b.block_size + pos % b.block_size;
          const __half* kr =
              static_cast<const __half*>(a.k_cache) + size_t(slot) * kv_dim + size_t(kvh) * HD;
          const float* cs = a.rope + size_t(pos) * HD;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float x0 = __half2float(kr[d + e]), x1 = __half2float(kr[H2 + d + e]);
            const float c = cs[d + e], sn = cs[H2 + d + e];
            r0[e] = x0 * c - x1 * sn;
            r1[e] = x1 * c + x0 * sn;
          }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          ks[j][d + e] = __float2half_rn(r0[e]);
          ks[j][H2 + d + e] = __float2half_rn(r1[e]);
        }
      }
    }
    cp_async_wait_all();
    __syncthreads();

    // S = Q K^T for the warp's 16 rows and the chunk's 64 keys.
    float sc[8][4];
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
    // Mask, scale, online softmax (per row: lanes 4g..4g+3 share it).
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = i / 2, pos = k0 + 8 * j + 2 * c + (i & 1);
        const bool ok = row_ok[h] && pos <= row_pos[h] &&
                        pos >= row_lo(row_pos[h], a.sliding_window) && pos >= part_lo &&
                        pos < part_hi && slot_filled(b, fill, pos);
        sc[j][i] = ok ? sc[j][i] * scale : -INFINITY;
        mx[h] = fmaxf(mx[h], sc[j][i]);
      }
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(~0u, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(~0u, mx[h], 2));
      const float m_new = fmaxf(m[h], mx[h]);
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;
      alpha[h] = exp2f(m[h] - m_use[h]);
      m[h] = m_new;
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sc[j][i] = exp2f(sc[j][i] - m_use[i / 2]);
        rs[i / 2] += sc[j][i];
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rs[h] += __shfl_xor_sync(~0u, rs[h], 1);
      rs[h] += __shfl_xor_sync(~0u, rs[h], 2);
      l[h] = l[h] * alpha[h] + rs[h];
    }
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      o[d][0] *= alpha[0];
      o[d][1] *= alpha[0];
      o[d][2] *= alpha[1];
      o[d][3] *= alpha[1];
    }
    // O += P V (P as f16 A fragments straight from the S accumulators).
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
        mma_f16(o[d], p0, p1, p2, p3, b0, b1);
      }
    }
  }

  // Unnormalised partial result of this partition: m, l, o[HD]. A row whose
  // keys all lie in this partition is finished here: o / l is bit for bit
  // what the combine would compute (its weight 2^(m - m) is exactly 1).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!row_ok[h]) continue;
    const int last = row_pos[h] / kAttnPartition;
    if (row_lo(row_pos[h], a.sliding_window) / kAttnPartition == last) {
      if (part != last) continue;  // this row has no keys here
      float* dst = a.out + (size_t(row_tok[h]) * a.n_head + row_head[h]) * HD;
#pragma unroll
      for (int d = 0; d < HD / 8; ++d) {
        dst[8 * d + 2 * c] = o[d][2 * h] / l[h];
        dst[8 * d + 2 * c + 1] = o[d][2 * h + 1] / l[h];
      }
      continue;
    }
    float* dst =
        a.partial + ((size_t(row_tok[h]) * a.n_head + row_head[h]) * n_parts + part) * (HD + 2);
    if (c == 0) {
      dst[0] = m[h];
      dst[1] = l[h];
    }
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      dst[2 + 8 * d + 2 * c] = o[d][2 * h];
      dst[2 + 8 * d + 2 * c + 1] = o[d][2 * h + 1];
    }
  }
}

// Merges a token's partitions in order: out = sum 2^(m_i - M) o_i / sum 2^(m_i - M) l_i.
__global__ void attn_combine_kernel(const AttnArgs a, const BatchArgs b, int n_parts) {
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
  }
}

// f32 cache: one warp per (token, head); lane i holds dims i, i + 32, ...
template <int HD>
__global__ void attn_f32_kernel(const AttnArgs a, const BatchArgs b) {
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
  const float scale = rsqrtf(float(HD));
  float m = -INFINITY, l = 0.f;
  for (int j = lo; j <= pos; ++j) {
    if (!slot_filled(b, fill, j)) continue;
    const size_t slot = size_t(table[j / b.block_size]) * b.block_size + j % b.block_size;
    const float* kr = static_cast<const float*>(a.k_cache) + slot * kv_dim + (h / G) * HD;
    const float* vr = static_cast<const float*>(a.v_cache) + slot * kv_dim + (h / G) * HD;
    float s = 0.f;
    if (a.rope) {  // pre-RoPE key: rotated pair by pair, lane i taking pairs i, i + 32, ...
      const float* cs = a.rope + size_t(j) * HD;
      for (int i = lane; i < HD / 2; i += 32) {
        const float x0 = kr[i], x1 = kr[i + HD / 2];
        s += q[i] * (x0 * cs[i] - x1 * cs[HD / 2 + i]) +
             q[i + HD / 2] * (x1 * cs[i] + x0 * cs[HD / 2 + i]);
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

int n_parts_for(const BatchArgs& b) {
  return std::max(1, ceil_div(b.max_ctx, kAttnPartition));
}

template <int HD>
void launch_f16(const AttnArgs& a, const BatchArgs& b, cudaStream_t st) {
  const int G = a.n_head / a.n_head_kv;
  const int n_row_tiles = ceil_div(int64_t(b.max_run) * G, kRows), n_parts = n_parts_for(b);
  const dim3 grid(unsigned(b.n_runs * n_row_tiles * n_parts), unsigned(a.n_head_kv));
  launch_early(attn_f16_kernel<HD>, grid, dim3(128), 0, st, a, b, n_row_tiles, n_parts);
  if (n_parts == 1) return;  // every row finished in the one partition
  launch_early(attn_combine_kernel, dim3(unsigned(b.n_tokens), unsigned(a.n_head)),
               dim3(std::min(HD, 128)), 0, st, a, b, n_parts);
}

template <int HD>
void launch_f32(const AttnArgs& a, const BatchArgs& b, cudaStream_t st) {
  const int heads_per_block = 4;
  attn_f32_kernel<HD><<<dim3(unsigned(b.n_tokens), unsigned(ceil_div(a.n_head, heads_per_block))),
                        32 * heads_per_block, 0, st>>>(a, b);
  WICK_CUDA_LAUNCHED();
}

}  // namespace

size_t attention_partial_floats(const BatchArgs& b, int n_head, int head_dim) {
  return size_t(b.n_tokens) * size_t(n_head) * size_t(n_parts_for(b)) * size_t(head_dim + 2);
}

void attention(const AttnArgs& a, const BatchArgs& b, cudaStream_t st) {
  if (b.n_tokens <= 0) return;
  if (a.n_head % a.n_head_kv)
    throw std::invalid_argument("attention: n_head is not a multiple of n_head_kv");
  switch (a.head_dim) {
#define WICK_HD(hd)             \
  case hd:                      \
    if (a.cache_f16)            \
      launch_f16<hd>(a, b, st); \
    else                        \
      launch_f32<hd>(a, b, st); \
    return;
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
