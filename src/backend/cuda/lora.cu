// LoRA terms on the device: y += B (scale * (A x)) for each term of a
// weight that applies to a row (adapter 0: every row; k: rows whose
// adapter_of is k), in the term list's order. Two launches per product,
// whatever the number of adapters: rows find their terms in a device table
// (segmented by adapter, as multi-LoRA servers batch them).
// Each output element's sums run in an order fixed by the shapes alone, so
// a row's result does not depend on the rest of its batch.
#include "backend/cuda/device.cuh"
#include "backend/cuda/kernels.h"

namespace wick::cuda {
namespace {

constexpr int kDownWarps = 8;    // rank rows per block of lora_down
constexpr int kUpThreads = 128;  // outputs per block of lora_up

__device__ __forceinline__ float load(Fmt f, const void* p, int64_t i) {
  switch (f) {
    case Fmt::BF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case Fmt::F16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ bool applies(const LoraTerm& t, const int32_t* adapter_of, int row) {
  return t.adapter == 0 || (adapter_of && adapter_of[row] == t.adapter);
}

// t[row, g] = scale_g * (A_g . x[row]) for the rank row g of every term
// (0 where the term does not apply); one warp per (row, g): lanes take
// strided elements in order, then a fixed butterfly.
__global__ void lora_down(const LoraTerm* terms, int n_terms, int total_rank,
                          const int32_t* adapter_of, const float* x, int n_rows, int n_in,
                          float* t) {
  const int g = blockIdx.x * kDownWarps + int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (g >= total_rank) return;
  int k = 0;
  while (k + 1 < n_terms && g >= terms[k + 1].t_off) ++k;
  const LoraTerm& term = terms[k];
  const int j = g - term.t_off;
  const int64_t a_row = int64_t(j) * term.a_stride;
  for (int row = blockIdx.y; row < n_rows; row += gridDim.y) {
    float out = 0.f;
    if (applies(term, adapter_of, row)) {
      const float* xr = x + int64_t(row) * n_in;
      float s = 0.f;
      for (int i = lane; i < n_in; i += 32) s = fmaf(load(term.a_fmt, term.a, a_row + i), xr[i], s);
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      out = s * term.scale[j];
    }
    if (lane == 0) t[int64_t(row) * total_rank + g] = out;
  }
}

// y[row, o] += B_k[o] . t[row, term k's ranks] for each term k that applies, in order.
__global__ void lora_up(const LoraTerm* terms, int n_terms, int total_rank,
                        const int32_t* adapter_of, const float* t, int n_rows, int n_out,
                        float* y) {
  const int o = blockIdx.x * kUpThreads + int(threadIdx.x);
  if (o >= n_out) return;
  for (int row = blockIdx.y; row < n_rows; row += gridDim.y) {
    const float* tr = t + int64_t(row) * total_rank;
    float* yo = y + int64_t(row) * n_out + o;
    for (int k = 0; k < n_terms; ++k) {
      const LoraTerm& term = terms[k];
      if (!applies(term, adapter_of, row)) continue;
      const int64_t b_row = int64_t(o) * term.b_stride;
      float s = 0.f;
      for (int j = 0; j < term.rank; ++j)
        s = fmaf(load(term.b_fmt, term.b, b_row + j), tr[term.t_off + j], s);
      *yo += s;
    }
  }
}

}  // namespace

void lora_add(const LoraTerm* terms, int n_terms, int total_rank, const int32_t* adapter_of,
              const float* x, int n_rows, int n_in, int n_out, float* t, float* y,
              cudaStream_t st) {
  if (n_rows <= 0 || n_terms <= 0) return;
  const unsigned grid_rows = unsigned(n_rows < 65535 ? n_rows : 65535);  // rows loop past it
  lora_down<<<dim3((total_rank + kDownWarps - 1) / kDownWarps, grid_rows), kDownWarps * 32, 0,
              st>>>(terms, n_terms, total_rank, adapter_of, x, n_rows, n_in, t);
  WICK_CUDA_CHECK(cudaGetLastError());
  lora_up<<<dim3((n_out + kUpThreads - 1) / kUpThreads, grid_rows), kUpThreads, 0, st>>>(
      terms, n_terms, total_rank, adapter_of, t, n_rows, n_out, y);
  WICK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wick::cuda
