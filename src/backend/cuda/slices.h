// How many slices of k the CUDA matrix products cut a weight's rows into
// (matmul.cu's kw): the reduction order of every output element, so a
// function of the weights of a launch and of the GPU, never of the batch.
// Plain C++ (no CUDA), so that CPU-only builds test it.
#pragma once

#include <functional>

namespace wick::cuda {

struct SliceProblem {
  int n_out = 0;      // rows of the launch's tallest weight
  int n_rows = 0;     // rows of all its weights (q, k and v go together)
  int n_chunks = 0;   // chunks of k (k_pad / k_chunk of the format)
  int kw_max = 32;    // WICK_CUDA_KW_MAX
  int n_sms = 0;      // the GPU's multiprocessors
  bool waves = true;  // false: the rule before session 59 (WICK_CUDA_KW_WAVES=0)
};

// ctas_per_sm(kw): how many CTAs of kw slices (8 weight rows each, one row of
// x) one multiprocessor holds at once, as the decode kernel's registers and
// shared memory allow.
int slice_count(const SliceProblem& p, const std::function<int(int)>& ctas_per_sm);

}  // namespace wick::cuda
