// The prefill matmul (matmul_tiled.cu), called by matmul.cu's launchers for
// problems with enough rows; it computes matmul.cu's products in matmul.cu's
// order, from shared-memory tiles. Host code, no CUDA syntax.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backend/cuda/kernels.h"

namespace wick::cuda {

constexpr int kMaxTiledJobs = 3;

struct TiledProblem {
  const MatmulJob* jobs;  // same format, k_pad and group; jobs[0] is the gate when up is set
  int n_jobs;
  const GpuWeight* up = nullptr;  // gated: out = silu(x . gate^T) * (x . up^T)
  float* y_gated = nullptr;
  const float* x;  // [M, n_in] f32
  int M;
  int kw;    // slices of k, as the decode kernel's kw_for
  void* xb;  // scratch, matmul_scratch_bytes(M, k_pad); null: never tiled
  // integer products (int_path): x already in integer form (in xb), the
  // decode kernel's sums; null: bf16 products of x, converted into xb
  const IntAct* xa = nullptr;
};

// Launches the tiled kernel and returns true, or returns false (nothing
// launched) when it does not apply: an f32 weight, or too few rows or tiles
// for it to beat the decode kernel. With xa (8- and 4-bit weights), its
// integer products give the decode kernel's bits.
bool matmul_tiled(const TiledProblem& t, cudaStream_t st);
MatmulPath matmul_path();  // what set_matmul_path() chose

}  // namespace wick::cuda
