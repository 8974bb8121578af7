#include "backend/cuda/slices.h"

#include <algorithm>

namespace wick::cuda {

namespace {

// The largest power of two below kw.
int pow2_below(int kw) {
  int p = 1;
  while (2 * p < kw) p *= 2;
  return p;
}

}  // namespace

// The most slices that still leave a decode launch's CTAs all resident at
// once (one wave), up to a cap: 2 chunks a warp, and 16, or kw_max for
// matrices of at most 1,024 rows and 128 chunks (Qwen2.5-0.5B's down at 32
// decoded 7 % faster on an H200, Llama-3.2-1B's 2,048-row products at 32 5 %
// slower on an H100: docs/perf.md, 2026-11-27). A decode product of a few MB is over
// in a few microseconds, about what a second wave costs to start and fill
// its loads: Llama-3.2-1B's q/k/v (384 CTAs) at 16 slices took three waves
// of one 512-thread 8-bit CTA an SM and streamed 23 % of 3.0 TB/s, at 8
// slices (three CTAs an SM) one wave and 39 % (H200, session 57); its o 23 ->
// 30 %, Llama-3.2-3B's 8-bit o 23 -> 39 % (4 slices then), Llama-1B's bf16
// q/k/v 52 -> 58 % (H100, session 52). Where one wave holds every CTA at
// several counts, more slices keep more loads in flight (bf16 o of Llama-1B:
// 43 % at 8, 60 % at 16). Where none does (gate/up, the output head: more
// CTAs than any wave), 4, the most CTAs an SM: the rule before took 8 from 64
// chunks, and Llama-3.1-8B's Q8_0 head streamed 50 % there against 54 % at 4,
// its gate/up 44 against 46 % (H200, session 57). On a GPU too small for one
// wave of a small matrix (at most 2,048 rows), the cap, as before.
// tests/test_cuda_slices.cpp holds the measured cases.
int slice_count(const SliceProblem& p, const std::function<int(int)>& ctas_per_sm) {
  const int most = p.n_chunks >= 128 && p.n_out <= 1024 ? p.kw_max : std::min(p.kw_max, 16);
  const int cap = std::min(most, std::max(4, p.n_chunks / 2));
  if (!p.waves) return p.n_out > 2048 ? (p.n_chunks >= 64 ? 8 : 4) : cap;
  const long n_ctas = (long(p.n_rows) + 7) / 8;
  for (int kw = cap; kw >= 4; kw = pow2_below(kw))
    if (n_ctas <= long(ctas_per_sm(kw)) * p.n_sms) return kw;
  if (p.n_out > 2048) return 4;
  return cap;
}

}  // namespace wick::cuda
