// Embedding, norms, RoPE, KV writes and element-wise kernels. Row
// reductions use one block per row with a fixed tree, so a row's result
// does not depend on the other rows.
#include <stdexcept>
#include <type_traits>

#include "backend/cuda/device.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_q8.cuh"
#include "backend/cuda/matmul_int.cuh"

namespace wick::cuda {

namespace {

constexpr int kRowThreads = 256;

// Sum over the block in a fixed order (per-thread strided sums, then a tree).
__device__ float block_sum(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(~0u, v, off);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x / 32) ? sh[lane] : 0.f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(~0u, v, off);
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  const float r = sh[0];
  __syncthreads();
  return r;
}

// Element i of row `row` of a prepared weight, exactly as the CPU dequantizes it.
__device__ float weight_at(const GpuWeight& w, int row, int i) {
  const size_t base = size_t(row) * size_t(w.k_pad);
  switch (w.fmt) {
    case Fmt::F32:
      return static_cast<const float*>(w.q)[base + i];
    case Fmt::BF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(w.q)[base + i]);
    case Fmt::F16:
      return __half2float(static_cast<const __half*>(w.q)[base + i]);
    case Fmt::I8: {
      const size_t gi = group_index(w, row, i);
      const float q = float(static_cast<const int8_t*>(w.q)[base + i]);
      return dq(q, w.scale[gi], group_min(w, gi, w.scale[gi]));
    }
    default: {  // U4
      const size_t gi = group_index(w, row, i);
      const uint8_t byte = static_cast<const uint8_t*>(w.q)[(base + i) / 2];
      const float q = float(i % 2 ? byte >> 4 : byte & 15);
      return dq(q, w.scale[gi], group_min(w, gi, w.scale[gi]));
    }
  }
}

__global__ void embed_kernel(GpuWeight w, const int32_t* ids, float* out) {
  const int t = blockIdx.x, row = ids[t];
  for (int i = threadIdx.x; i < w.n_in; i += blockDim.x)
    out[size_t(t) * w.n_in + i] = weight_at(w, row, i);
}

// QUANT: y's integer form too (kernels.h, NormInt), in f's orders (k_u4 >=
// k_i8), each warp's 32 consecutive elements a block, with quantize_act's
// bits.
template <bool ADD, bool QUANT>
__global__ void rmsnorm_kernel(float* x, const float* r, const float* w, int n, float eps, float* y,
                               IntOut f) {
  constexpr int kHeld = 8;  // elements per thread kept in registers (rows up to 8 x 256)
  __shared__ float sh[32];
  // the weights do not depend on the kernel before: fetched while it drains
  float wv[kHeld], xv[kHeld];
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const int i = int(threadIdx.x) + j * int(blockDim.x);
    wv[j] = i < n ? w[i] : 0.f;
  }
  allow_next_kernel();
  wait_for_previous_kernel();
  float* xr = x + size_t(blockIdx.x) * n;
  const float* rr = ADD ? r + size_t(blockIdx.x) * n : nullptr;
  float ss = 0.f;
  auto load = [&](int i) {  // (explicit FMA: matmul.cu's fused norm repeats these bits)
    float v = xr[i];
    if constexpr (ADD) {
      v += rr[i];
      xr[i] = v;
    }
    ss = __fmaf_rn(v, v, ss);
    return v;
  };
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {  // (unrolled: xv stays in registers)
    const int i = int(threadIdx.x) + j * int(blockDim.x);
    if (i < n) xv[j] = load(i);
  }
  for (int i = int(threadIdx.x) + kHeld * int(blockDim.x); i < n; i += blockDim.x) load(i);
  const float inv = rsqrtf(block_sum(ss, sh) / float(n) + eps);
  float* yr = y + size_t(blockIdx.x) * n;
  if constexpr (!QUANT) {
    for (int i = threadIdx.x, j = 0; i < n; i += blockDim.x, ++j)
      yr[i] = j < kHeld ? wv[j] * (xv[j] * inv) : w[i] * (xr[i] * inv);
  } else {
    // the row's integer forms, zeros past n
    const int k_pad = f.k_u4;
    const IntRowOuts out = int_row_outs(f, int(blockIdx.x));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // element base + threadIdx.x (v: its value where below n), whole warps
    auto put = [&](int base, float v) {
      if (base + 32 * warp >= k_pad) return;  // (k_pad is a multiple of 128)
      const int i = base + int(threadIdx.x);
      if (i < n) yr[i] = v;
      quantize_block(i < n ? v : 0.f, lane, i / 32, out.o);
    };
    const int step = int(blockDim.x);
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {  // (unrolled: wv, xv stay in registers)
      const int i = j * step + int(threadIdx.x);
      put(j * step, i < n ? wv[j] * (xv[j] * inv) : 0.f);
    }
    for (int base = kHeld * step; base < k_pad; base += step) {
      const int i = base + int(threadIdx.x);
      put(base, i < n ? w[i] * (xr[i] * inv) : 0.f);
    }
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= s;
}

__global__ void add_bias_kernel(float* y, const float* b, int64_t n_total, int n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_total;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += b[i % n];
}

// One block per token: rotates each head's pairs (i, i + head_dim / 2).
// cs_sn: this thread's cos and sin when every pair it visits has the same i
// (blockDim.x a multiple of head_dim / 2), computed ahead; else null.
__device__ void rotate(float* v, int pos, int head_dim, const float* inv_freq, int n_heads,
                       const float2* cs_sn = nullptr) {
  const int half = head_dim / 2;
  for (int idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    float sn, cs;
    if (cs_sn)
      cs = cs_sn->x, sn = cs_sn->y;
    else
      rope_angle(pos, inv_freq[i], cs, sn);
    float* p = v + h * head_dim;
    const float a = p[i], b = p[i + half];
    p[i] = rope_lo(a, b, cs, sn);
    p[i + half] = rope_hi(a, b, cs, sn);
  }
}

__global__ void rope_kernel(float* x, const int32_t* pos, int n_heads, int head_dim,
                            const float* inv_freq) {
  rotate(x + size_t(blockIdx.x) * n_heads * head_dim, pos[blockIdx.x], head_dim, inv_freq, n_heads);
}

// Element i of a K or V row into its cache row `slot` (plane q; Q8: scales
// d). Q8 quantizes a block of 32 per warp: the callers' loops run i =
// threadIdx.x, + blockDim.x, ... with whole warps and kv_dim a multiple of
// 32, so a warp's lanes hold one block.
template <KvType KT>
__device__ __forceinline__ void cache_put(void* q, void* d, size_t slot, int kv_dim, int i,
                                          float x) {
  const size_t at = slot * size_t(kv_dim) + size_t(i);
  if constexpr (KT == KvType::Q8) {
    const int lane = int(threadIdx.x) & 31;
    q8_store(x, lane, static_cast<int8_t*>(q) + (at - size_t(lane)),
             static_cast<__half*>(d) + at / 32);
  } else if constexpr (KT == KvType::F16) {
    static_cast<__half*>(q)[at] = __float2half_rn(x);
  } else {
    static_cast<float*>(q)[at] = x;
  }
}

// x as the cache would hold it, and element i of row `slot` as the cache
// holds it (both widened to f32).
template <KvType KT>
__device__ __forceinline__ float2 cache_pair(const void* q, const void* d, size_t slot, int kv_dim,
                                             int i, float x) {
  const size_t at = slot * size_t(kv_dim) + size_t(i);
  if constexpr (KT == KvType::Q8) {
    return {q8_round_trip(x),
            q8_load(static_cast<const int8_t*>(q), static_cast<const __half*>(d), slot, kv_dim, i)};
  } else if constexpr (KT == KvType::F16) {
    return {__half2float(__float2half_rn(x)), __half2float(static_cast<const __half*>(q)[at])};
  } else {
    return {x, static_cast<const float*>(q)[at]};
  }
}

template <KvType KT>
__global__ void rope_kv_kernel(float* q, float* k, const float* v, const KvLayer c,
                               const int32_t* slots, const int32_t* pos, int n_head, int n_head_kv,
                               int head_dim, const float* inv_freq, bool rotate_k) {
  // positions, slots and the angles do not depend on the kernel before:
  // computed while it drains
  const int t = blockIdx.x, kv_dim = n_head_kv * head_dim, half = head_dim / 2, p = pos[t];
  const size_t slot = size_t(slots[t]);
  const bool fixed_i = blockDim.x % half == 0;
  float2 cs_sn{0.f, 0.f};
  if (fixed_i) rope_angle(p, inv_freq[threadIdx.x % half], cs_sn.x, cs_sn.y);
  allow_next_kernel();
  wait_for_previous_kernel();
  rotate(q + size_t(t) * n_head * head_dim, p, head_dim, inv_freq, n_head,
         fixed_i ? &cs_sn : nullptr);
  float* kt = k + size_t(t) * kv_dim;
  if (rotate_k) rotate(kt, p, head_dim, inv_freq, n_head_kv, fixed_i ? &cs_sn : nullptr);
  __syncthreads();
  for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
    cache_put<KT>(c.k, c.k_scale, slot, kv_dim, i, kt[i]);
    cache_put<KT>(c.v, c.v_scale, slot, kv_dim, i, v[size_t(t) * kv_dim + i]);
  }
}

template <KvType KT>
__global__ void kv_write_kernel(const float* k, const float* v, const KvLayer c,
                                const int32_t* slots, int kv_dim) {
  const int t = blockIdx.x;
  const size_t slot = size_t(slots[t]);
  for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
    cache_put<KT>(c.k, c.k_scale, slot, kv_dim, i, k[size_t(t) * kv_dim + i]);
    cache_put<KT>(c.v, c.v_scale, slot, kv_dim, i, v[size_t(t) * kv_dim + i]);
  }
}

// One block per row; each row's new K/V rounded as the cache stores it, so
// that equal values give 0.
template <KvType KT>
__global__ void kv_deviation_kernel(const float* k, const float* v, const KvLayer c,
                                    const int32_t* slots, int kv_dim, float* out) {
  __shared__ float sh[32];
  const int t = blockIdx.x;
  const size_t slot = size_t(slots[t]);
  float sum = 0.f;
  for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
    const float2 pk = cache_pair<KT>(c.k, c.k_scale, slot, kv_dim, i, k[size_t(t) * kv_dim + i]);
    const float2 pv = cache_pair<KT>(c.v, c.v_scale, slot, kv_dim, i, v[size_t(t) * kv_dim + i]);
    const float dk = pk.x - pk.y, dv = pv.x - pv.y;
    sum += dk * dk + dv * dv;
  }
  sum = block_sum(sum, sh);
  if (threadIdx.x == 0) out[t] = sum;
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int n, float* out) {
  const float* src = x + size_t(rows[blockIdx.x]) * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[size_t(blockIdx.x) * n + i] = src[i];
}

__global__ void rope_table_kernel(const float* inv_freq, int head_dim, int n_pos, float* table) {
  const int half = head_dim / 2;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < int64_t(n_pos) * half;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int p = int(i / half), f = int(i % half);
    float sn, cs;
    rope_angle(p, inv_freq[f], cs, sn);  // as rotate() computes it
    table[size_t(p) * head_dim + f] = cs;
    table[size_t(p) * head_dim + half + f] = sn;
  }
}

int grid_for(int64_t n) {
  return int(std::min<int64_t>(4096, (n + 255) / 256));
}

}  // namespace

void embed(const GpuWeight& tok, const int32_t* ids, int n, float* out, cudaStream_t st) {
  if (n <= 0) return;
  embed_kernel<<<n, kRowThreads, 0, st>>>(tok, ids, out);
  WICK_CUDA_LAUNCHED();
}

namespace {

template <bool ADD>
void launch_rmsnorm(float* x, const float* r, const float* w, int n_rows, int n, float eps,
                    float* y, cudaStream_t st, const NormInt* ni) {
  if (n_rows <= 0) return;
  const dim3 grid(n_rows), block(n >= 256 ? kRowThreads : 64);
  if (!ni) {
    launch_early(rmsnorm_kernel<ADD, false>, grid, block, 0, st, x, r, w, n, eps, y, IntOut{});
    return;
  }
  if (ni->M != n_rows || ni->n != n)
    throw std::logic_error("rmsnorm: the integer form's shape is not the norm's");
  // (a form not wanted: null levels, which quantize_block skips)
  launch_early(rmsnorm_kernel<ADD, true>, grid, block, 0, st, x, r, w, n, eps, y, int_out(*ni));
}

}  // namespace

void rmsnorm(const float* x, const float* w, int n_rows, int n, float eps, float* y,
             cudaStream_t st, const NormInt* ni) {
  // x is read only (ADD = false never writes it)
  launch_rmsnorm<false>(const_cast<float*>(x), nullptr, w, n_rows, n, eps, y, st, ni);
}

void add_rmsnorm(float* x, const float* r, const float* w, int n_rows, int n, float eps, float* y,
                 cudaStream_t st, const NormInt* ni) {
  launch_rmsnorm<true>(x, r, w, n_rows, n, eps, y, st, ni);
}

void add(float* y, const float* x, int64_t n, cudaStream_t st) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n), 256, 0, st>>>(y, x, n);
  WICK_CUDA_LAUNCHED();
}

void scale(float* x, float s, int64_t n, cudaStream_t st) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), 256, 0, st>>>(x, s, n);
  WICK_CUDA_LAUNCHED();
}

void add_bias(float* y, const float* b, int n_rows, int n, cudaStream_t st) {
  const int64_t total = int64_t(n_rows) * n;
  if (total <= 0) return;
  add_bias_kernel<<<grid_for(total), 256, 0, st>>>(y, b, total, n);
  WICK_CUDA_LAUNCHED();
}

void rope(float* x, const int32_t* pos, int n_rows, int n_heads, int head_dim,
          const float* inv_freq, cudaStream_t st) {
  if (n_rows <= 0) return;
  rope_kernel<<<n_rows, 128, 0, st>>>(x, pos, n_heads, head_dim, inv_freq);
  WICK_CUDA_LAUNCHED();
}

// Calls launch with the cache's type as a compile-time constant
// (std::integral_constant), for the kernel instance of that type. (Every KV
// kernel takes 128 threads: whole warps, as Q8's blocks need.)
template <typename Launch>
void by_kv_type(KvType t, int kv_dim, Launch&& launch) {
  switch (t) {
    case KvType::Q8:
      if (kv_dim % 32) throw std::invalid_argument("q8_0 KV cache: kv_dim is not a multiple of 32");
      return launch(std::integral_constant<KvType, KvType::Q8>{});
    case KvType::F16:
      return launch(std::integral_constant<KvType, KvType::F16>{});
    case KvType::F32:
      return launch(std::integral_constant<KvType, KvType::F32>{});
  }
}

void rope_kv_write(float* q, float* k, const float* v, const KvLayer& c, bool rotate_k,
                   const int32_t* slots, const int32_t* pos, int n_tokens, int n_head,
                   int n_head_kv, int head_dim, const float* inv_freq, cudaStream_t st) {
  if (n_tokens <= 0) return;
  by_kv_type(c.type, n_head_kv * head_dim, [&](auto kt) {
    launch_early(rope_kv_kernel<decltype(kt)::value>, dim3(n_tokens), dim3(128), 0, st, q, k, v, c,
                 slots, pos, n_head, n_head_kv, head_dim, inv_freq, rotate_k);
  });
}

void rope_table(const float* inv_freq, int head_dim, int n_pos, float* table, cudaStream_t st) {
  if (n_pos <= 0) return;
  rope_table_kernel<<<grid_for(int64_t(n_pos) * head_dim / 2), 256, 0, st>>>(inv_freq, head_dim,
                                                                             n_pos, table);
  WICK_CUDA_LAUNCHED();
}

void kv_write(const float* k, const float* v, const KvLayer& c, const int32_t* slots, int n_tokens,
              int kv_dim, cudaStream_t st) {
  if (n_tokens <= 0) return;
  by_kv_type(c.type, kv_dim, [&](auto kt) {
    kv_write_kernel<decltype(kt)::value><<<n_tokens, 128, 0, st>>>(k, v, c, slots, kv_dim);
  });
  WICK_CUDA_LAUNCHED();
}

void kv_deviation(const float* k, const float* v, const KvLayer& c, const int32_t* slots,
                  int n_tokens, int kv_dim, float* out, cudaStream_t st) {
  if (n_tokens <= 0) return;
  by_kv_type(c.type, kv_dim, [&](auto kt) {
    kv_deviation_kernel<decltype(kt)::value><<<n_tokens, 128, 0, st>>>(k, v, c, slots, kv_dim, out);
  });
  WICK_CUDA_LAUNCHED();
}

void gather_rows(const float* x, const int32_t* rows, int n_rows, int n, float* out,
                 cudaStream_t st) {
  if (n_rows <= 0) return;
  gather_rows_kernel<<<n_rows, 256, 0, st>>>(x, rows, n, out);
  WICK_CUDA_LAUNCHED();
}

}  // namespace wick::cuda
