// Mixture of experts on the device: routing, grouping rows by expert (a
// counting sort), the grouped expert products, and the weighted sum. Nothing
// crosses to the host, so the step can be captured in a CUDA graph.
#include <algorithm>

#include "backend/cuda/device.cuh"
#include "backend/cuda/kernels.h"

namespace wick::cuda {

namespace {

// One thread per token, in the CPU's order: softmax, then the k largest
// (ties to the lower id), renormalised over the chosen when `norm`.
__global__ void route_kernel(const float* logits, int n_tokens, int n_expert, int k, bool norm,
                             int32_t* ids, float* w) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n_tokens) return;
  const float* r = logits + size_t(t) * n_expert;
  float mx = -INFINITY;
  for (int e = 0; e < n_expert; ++e) mx = fmaxf(mx, r[e]);
  float sum = 0.f;
  for (int e = 0; e < n_expert; ++e) sum += expf(r[e] - mx);
  float top = 0.f;
  int32_t* my_ids = ids + size_t(t) * k;
  float* my_w = w + size_t(t) * k;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float bv = -INFINITY;
    for (int e = 0; e < n_expert; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= my_ids[i] == e;
      const float p = expf(r[e] - mx) / sum;
      if (!taken && (best < 0 || p > bv)) {
        best = e;
        bv = p;
      }
    }
    my_ids[j] = best;
    my_w[j] = bv;
    top += bv;
  }
  if (norm)
    for (int j = 0; j < k; ++j) my_w[j] /= top;
}

// A stable counting sort of the (token, slot) pairs by expert, and the
// tile list of the grouped products. One thread: the counts are small.
__global__ void group_kernel(const int32_t* ids, int n_pairs, int n_expert, int tile_rows,
                             int32_t* perm, int32_t* pos_of_pair, int32_t* offsets, int4* tiles,
                             int max_tiles) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (int e = 0; e <= n_expert; ++e) offsets[e] = 0;
  for (int i = 0; i < n_pairs; ++i) ++offsets[ids[i] + 1];
  for (int e = 0; e < n_expert; ++e) offsets[e + 1] += offsets[e];
  int n_tiles = 0;
  for (int e = 0; e < n_expert; ++e) {
    const int cnt = offsets[e + 1] - offsets[e];
    for (int r = 0; r < cnt; r += tile_rows)
      if (n_tiles < max_tiles)
        tiles[n_tiles++] = make_int4(e, offsets[e] + r, min(tile_rows, cnt - r), 0);
  }
  for (int i = n_tiles; i < max_tiles; ++i) tiles[i] = make_int4(-1, 0, 0, 0);
  // fill: offsets[e] walks forward, then is restored
  for (int i = 0; i < n_pairs; ++i) {
    const int at = offsets[ids[i]]++;
    perm[at] = i;
    pos_of_pair[i] = at;
  }
}

__global__ void gather_kernel(const float* x, const int32_t* perm, int k, int d, float* xs) {
  const float* src = x + size_t(perm[blockIdx.x] / k) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) xs[size_t(blockIdx.x) * d + i] = src[i];
}

// out[t] = sum over t's experts in increasing id of w * os[row], as the CPU adds them.
__global__ void combine_kernel(const float* os, const int32_t* ids, const float* w,
                               const int32_t* pos_of_pair, int k, int d, float* out) {
  const int t = blockIdx.x;
  int order[16];
  for (int j = 0; j < k; ++j) order[j] = j;
  for (int a = 1; a < k; ++a)  // insertion sort of the slots by expert id
    for (int b = a; b > 0 && ids[t * k + order[b]] < ids[t * k + order[b - 1]]; --b) {
      const int tmp = order[b];
      order[b] = order[b - 1];
      order[b - 1] = tmp;
    }
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
      const int slot = t * k + order[j];
      acc = __fadd_rn(acc, __fmul_rn(os[size_t(pos_of_pair[slot]) * d + i], w[slot]));
    }
    out[size_t(t) * d + i] = acc;
  }
}

// Tiles of at most `rows` rows: each expert's last one may be partial.
int max_tiles(int n_pairs, int n_expert, int rows) {
  return ceil_div(n_pairs, rows) + n_expert;
}

}  // namespace

void moe_route(const float* logits, int n_tokens, int n_expert, int k, bool norm, int32_t* ids,
               float* w, cudaStream_t st) {
  if (n_tokens <= 0) return;
  if (k > 16) throw std::invalid_argument("moe: more than 16 experts per token");
  route_kernel<<<ceil_div(n_tokens, 64), 64, 0, st>>>(logits, n_tokens, n_expert, k, norm, ids, w);
  WICK_CUDA_LAUNCHED();
}

size_t moe_scratch_floats(int n_tokens, int k, int n_embd, int n_ff) {
  return size_t(n_tokens) * k * (2 * size_t(n_embd) + size_t(n_ff));
}

size_t moe_scratch_ints(int n_tokens, int k, int n_expert) {
  const int pairs = n_tokens * k;
  // (16-row tiles: the most tiles grouped_tile_rows allows)
  return 2 * size_t(pairs) + size_t(n_expert + 1) + 4 * size_t(max_tiles(pairs, n_expert, 16)) + 4;
}

size_t moe_scratch_int_bytes(int n_tokens, int k, const GpuWeight& gate_shape,
                             const GpuWeight& down_shape) {
  size_t bytes = 0;
  for (const GpuWeight* w : {&gate_shape, &down_shape})
    if (int_path(*w)) bytes = std::max(bytes, matmul_scratch_bytes(n_tokens * k, w->k_pad));
  return bytes;
}

void moe_mlp(const GpuWeight* experts, int n_expert, const GpuWeight& gate_shape,
             const GpuWeight& down_shape, const float* x, int n_tokens, int k, const int32_t* ids,
             const float* w, float* out, float* scratch, int32_t* iscratch, void* xq,
             cudaStream_t st) {
  if (n_tokens <= 0) return;
  const int pairs = n_tokens * k, D = down_shape.n_out, F = gate_shape.n_out;
  float* xs = scratch;                 // [pairs, D] rows of x by expert
  float* hs = xs + size_t(pairs) * D;  // [pairs, F]
  float* os = hs + size_t(pairs) * F;  // [pairs, D]
  int32_t* perm = iscratch;
  int32_t* pos_of_pair = perm + pairs;
  int32_t* offsets = pos_of_pair + pairs;
  // int4 tiles, 16-byte aligned
  uintptr_t t = reinterpret_cast<uintptr_t>(offsets + n_expert + 1);
  int4* tiles = reinterpret_cast<int4*>((t + 15) / 16 * 16);
  const int rows = grouped_tile_rows(pairs, gate_shape, down_shape),
            n_tiles = max_tiles(pairs, n_expert, rows);

  group_kernel<<<1, 32, 0, st>>>(ids, pairs, n_expert, rows, perm, pos_of_pair, offsets, tiles,
                                 n_tiles);
  WICK_CUDA_LAUNCHED();
  gather_kernel<<<pairs, 128, 0, st>>>(x, perm, k, D, xs);
  WICK_CUDA_LAUNCHED();
  // (integer products: each quantizes its x into xq, down's after gate's ran)
  matmul_grouped({experts, gate_shape, 0, tiles, n_tiles, pairs, xs, hs, xq, rows}, st);
  matmul_grouped({experts, down_shape, 2, tiles, n_tiles, pairs, hs, os, xq, rows}, st);
  combine_kernel<<<n_tokens, 128, 0, st>>>(os, ids, w, pos_of_pair, k, D, out);
  WICK_CUDA_LAUNCHED();
}

}  // namespace wick::cuda
