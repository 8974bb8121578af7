// Sampling on the device, one block of 1024 threads per row (so a row's
// result does not depend on the other rows): the penalties, then either the
// argmax (temperature 0) or temperature, top-k, softmax, top-p, min-p and a
// draw with u = sample_uniform(seed, counter). Every reduction is an integer
// sum or has a fixed order, so a result is bit-reproducible run to run.
// Rows are read with 16-byte loads; one SM's throughput bounds a pass over
// a row, so the paths keep the passes few and their per-element work small.
//
// Fast path, 0 < top_k <= 1024 (the CPU's sampler exactly):
//   1. each thread's largest logit is a representative; theta, the k-th
//      largest of the first ceil(k/32) representatives of each warp, is
//      reached by k elements, so it bounds the k-th largest logit below;
//   2. the elements >= theta (a raw-logit bound first: cheap), usually a few
//      more than k, are gathered in shared memory, their ids in scratch;
//      when more than 1024, a radix select over the listed ones finds the
//      exact k-th key and the k above it are gathered instead;
//   3. a bitonic sort by key = (logit desc, id asc), by_logit's order;
//   4. softmax, top-p, min-p and the draw over the sorted top-k as the CPU
//      does them: double sums in its order, exp in double rounded to float
//      (glibc's expf but in rare double-rounding cases).
//
// General path, top_k == 0 or > 1024 (the CPU's distribution):
//   G0. the largest logit and its id; G1. with 1024 < top_k < n_vocab, the
//   k-th key by a radix select; G2. e = exp(l - max) of the kept logits into
//   scratch (-1 for the others) and their sum in double, in a fixed order;
//   G3. p = e / sum; min-p keeps p >= min_p * p_max, a prefix of the sorted
//   order. Top-p: a radix select over the keys (e desc, id asc) weighted by
//   p in 2^-61 fixed point (integer shared atomics: exact, so the result
//   does not depend on the order of the adds) finds the smallest prefix
//   whose mass reaches top_p; G4. the kept mass, by segments of ids;
//   G5. the draw walks the kept tokens in id order (a block-wide prefix sum
//   of the segments, then one thread's segment).
//   Where this differs from the CPU (the distribution is the same):
//   - the walk is in id order, not by decreasing probability, so a given u
//     picks another token than the CPU's walk would;
//   - tokens of exactly equal e are ordered by id, the CPU orders them by
//     logit then id (only where exp rounds two logits to one value);
//   - exp is CUDA's expf (2 ulp), the sum a tree of doubles, p = e * (1 /
//     sum) in float, and the top-p prefix sums are exact where the CPU
//     rounds a double at each add: a token's p may differ in its last bit,
//     and a top-p or min-p cut exactly at a boundary may differ;
//   - a p below 2^-61 counts as 0 in the draw.
//
// scratch: per row, n_vocab rounded up to 4 floats: the general path's e,
// or the fast path's candidate ids.
#include <climits>
#include <cstdint>
#include <stdexcept>

#include "backend/cuda/device.cuh"
#include "backend/cuda/kernels.h"

namespace wick::cuda {

namespace {

constexpr int kThreads = 1024;  // a block per row
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCand = 1024;  // the fast path's top_k limit and candidate buffer
constexpr int kDigit = 11;      // radix-select digit
constexpr int kBins = 1 << kDigit;
constexpr float kFix = 0x1p61f;   // fixed-point scale of probabilities (sums stay below 2^63)
using Mass = unsigned long long;  // a fixed-point probability mass (atomicAdd's 64-bit type)

// Shared memory of the block, carved per phase.
constexpr int kSmemBytes = kBins * 8 + kBins * 4;  // radix: weights (u64) + counts (u32)
static_assert(kMaxCand * (8 + 4 + 8) <= kSmemBytes, "fast path: keys, p, prefix sums");
static_assert(3 * kThreads * 8 <= kSmemBytes, "the sort's two halves and the warps' tops");

// ---- device twin of sample_uniform (backend/sample.h): the same arithmetic ----
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ double uniform01(uint64_t seed, uint64_t counter) {
  return double(mix64(seed ^ mix64(counter)) >> 11) * 0x1.0p-53;
}

// ---- keys ----
// A float as an unsigned integer of the same order. -0 is +0 (by_logit ties
// them and breaks the tie by id); NaN is below everything.
__device__ __forceinline__ uint32_t ord_of(float f) {
  if (f != f) return 0u;
  const uint32_t b = __float_as_uint(f == 0.f ? 0.f : f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float float_of(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7FFFFFFFu) : ~o);
}

// Key of element i with value s: larger value first, then the lower id, as
// one unsigned integer (unique per element). idb bits hold the id.
struct KeyCode {
  int idb;
  uint32_t idmask;
  __device__ uint64_t logit_key(float s, int i) const {
    return (uint64_t(ord_of(s)) << idb) | uint64_t(idmask - uint32_t(i));
  }
  // e >= 0 (bits below 2^30 for e <= 1): the float bits keep the order.
  __device__ uint64_t e_key(float e, int i) const {
    return (uint64_t(__float_as_uint(e)) << idb) | uint64_t(idmask - uint32_t(i));
  }
  __device__ int id_of(uint64_t key) const { return int(idmask - uint32_t(key & idmask)); }
  __device__ float logit_of(uint64_t key) const { return float_of(uint32_t(key >> idb)); }
};

// ---- block-wide helpers (every thread of the block calls them) ----

template <typename T>
__device__ __forceinline__ T warp_incl_scan(T v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const T o = __shfl_up_sync(~0u, v, off);
    if (lane >= off) v += o;
  }
  return v;
}

// Exclusive prefix sum in thread order; `total` gets the block's sum.
template <typename T>
__device__ T block_excl_scan(T v, T& total) {
  __shared__ T sw[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T inc = warp_incl_scan(v);
  if (lane == 31) sw[warp] = inc;
  __syncthreads();
  if (warp == 0) sw[lane] = warp_incl_scan(sw[lane]);
  __syncthreads();
  total = sw[kWarps - 1];
  const T r = (warp ? sw[warp - 1] : T(0)) + inc - v;
  __syncthreads();  // sw is reused by the next call
  return r;
}

// Sum of doubles in a fixed order (butterfly in each warp, then over warps).
__device__ double block_sum(double v) {
  __shared__ double sw[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(~0u, v, off);
  if (lane == 0) sw[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = sw[lane];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(~0u, v, off);
    if (lane == 0) sw[0] = v;
  }
  __syncthreads();
  const double r = sw[0];
  __syncthreads();
  return r;
}

__device__ uint64_t block_max(uint64_t v) {
  __shared__ uint64_t sw[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(~0u, v, off));
  if (lane == 0) sw[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = sw[lane];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(~0u, v, off));
    if (lane == 0) sw[0] = v;
  }
  __syncthreads();
  const uint64_t r = sw[0];
  __syncthreads();
  return r;
}

// (value, id) with the larger value, ties to the lower id; NaN never wins.
__device__ __forceinline__ void arg_better(float& bv, int& bi, float v, int i) {
  if (v > bv || (v == bv && i < bi)) {
    bv = v;
    bi = i;
  }
}
__device__ int block_argmax(float bv, int bi) {
  __shared__ float sv[kWarps];
  __shared__ int si[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    arg_better(bv, bi, __shfl_xor_sync(~0u, bv, off), __shfl_xor_sync(~0u, bi, off));
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {
    bv = sv[lane];
    bi = si[lane];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
      arg_better(bv, bi, __shfl_xor_sync(~0u, bv, off), __shfl_xor_sync(~0u, bi, off));
    if (lane == 0) si[0] = bi;
  }
  __syncthreads();
  const int r = si[0];
  __syncthreads();
  return r;
}

// Sorts the values held by the block's threads, thread i holding element
// i (n a power of two <= kThreads; the threads from n on keep to
// themselves), in decreasing order: returns element i of the sorted order.
// Partners closer than a warp swap by shuffle; the others through buf
// (2 * kThreads values, its halves alternating so that a stage needs one
// barrier). The caller synchronises before buf is written.
__device__ uint64_t bitonic_desc(uint64_t x, int n, uint64_t* buf) {
  const int i = threadIdx.x;
  const bool active = (i & ~31) < n;  // warps wholly past n only meet the barriers
  // the lower index of a pair takes the larger in a decreasing block
  auto merge = [&](uint64_t y, int k, int j) {
    const bool take_max = ((i & k) == 0) == ((i & j) == 0);
    if ((x < y) == take_max) x = y;
  };
  int half = 0;
  for (int k = 2; k <= n; k <<= 1) {
    for (int j = k >> 1; j >= 32; j >>= 1) {
      uint64_t* b = buf + half * kThreads;
      half ^= 1;
      if (active) b[i] = x;
      __syncthreads();
      if (active) merge(b[i ^ j], k, j);
    }
    if (active) {
#pragma unroll
      for (int j = 16; j > 0; j >>= 1)
        if (j < k) merge(__shfl_xor_sync(~0u, x, j), k, j);
    }
  }
  __syncthreads();  // buf is free again
  return x;
}

// Calls f1(i, x) or f4(i, x4) (elements i to i + 3, i a multiple of 4 from
// the row's first 16-byte boundary) for each element of a row: 16-byte
// loads strided over the block, kLoads in flight per thread (the row's
// unaligned head and its tail one element per thread). A thread sees its
// ids in increasing order.
template <int kLoads = 2, class F1, class F4>
__device__ __forceinline__ void for_row4(const float* row, int n, F1&& f1, F4&& f4) {
  static_assert(kLoads == 2 || kLoads == 4);
  const int t = threadIdx.x;
  const int head = min(int(((16 - (reinterpret_cast<uintptr_t>(row) & 15)) & 15) >> 2), n);
  if (t < head) f1(t, row[t]);
  const float4* v = reinterpret_cast<const float4*>(row + head);
  const int nv = (n - head) >> 2;
  int j = t;
  if constexpr (kLoads == 4)
    for (; j + 3 * kThreads < nv; j += 4 * kThreads) {
      const float4 a = v[j], b = v[j + kThreads], c = v[j + 2 * kThreads], d = v[j + 3 * kThreads];
      f4(head + 4 * j, a);
      f4(head + 4 * (j + kThreads), b);
      f4(head + 4 * (j + 2 * kThreads), c);
      f4(head + 4 * (j + 3 * kThreads), d);
    }
  for (; j + kThreads < nv; j += 2 * kThreads) {
    const float4 a = v[j], b = v[j + kThreads];
    f4(head + 4 * j, a);
    f4(head + 4 * (j + kThreads), b);
  }
  for (; j < nv; j += kThreads) f4(head + 4 * j, v[j]);
  const int tail = head + 4 * nv + t;  // fewer than 4 left
  if (tail < n) f1(tail, row[tail]);
}
template <class F>
__device__ __forceinline__ void for_row(const float* row, int n, F&& f) {
  for_row4(row, n, f, [&](int i, float4 x) {
    f(i, x.x);
    f(i + 1, x.y);
    f(i + 2, x.z);
    f(i + 3, x.w);
  });
}

// The first of a thread's elements with the largest of f(x) (NaN never;
// with `any`, -inf too when nothing is larger): f(x) is computed once per
// element, and a 16-byte vector compares its largest value only.
template <int kLoads = 4, class F>
__device__ __forceinline__ void thread_argmax(const float* row, int n, bool any, F&& f, float& bv,
                                              int& bi) {
  bv = -INFINITY;
  bi = -1;
  bool vec = false;
  for_row4<kLoads>(
      row, n,
      [&](int i, float x) {
        const float y = f(x);
        if (y > bv || (any && bi < 0 && y == y)) {
          bv = y;
          bi = i;
          vec = false;
        }
      },
      [&](int i, float4 x) {
        const float m = fmaxf(fmaxf(f(x.x), f(x.y)), fmaxf(f(x.z), f(x.w)));  // NaN: the others
        if (m > bv || (any && bi < 0 && m == m)) {
          bv = m;
          bi = i;
          vec = true;
        }
      });
  if (vec) {  // the first element of the vector that holds the maximum
    const float4 x = *reinterpret_cast<const float4*>(row + bi);
    bi += f(x.x) == bv ? 0 : f(x.y) == bv ? 1 : f(x.z) == bv ? 2 : 3;
  }
}

// Radix select over a set of keys. visit(emit) calls emit(key, weight) for
// each element of the set, over the whole block: key unique, of nbits <= 63
// bits; weight() its weight, asked only of the elements still in play.
// Finds the smallest set of the largest keys whose weight reaches `target`:
// those with key >= thr, `kept` their weight. When the whole set weighs
// less than the target, thr = 0 and kept = the total.
// With W = uint32_t the weights must be 1 (a count); with Mass a count
// histogram beside the weights ends the search once the bin holding the
// target is a single element.
template <typename W>
struct Selected {
  uint64_t thr;
  W kept;
  bool all;  // the set weighs less than the target
};
template <typename W, class Visit>
__device__ Selected<W> radix_select(int nbits, W target, Visit visit, unsigned char* smem) {
  constexpr bool kMass = sizeof(W) == 8;
  W* hw = reinterpret_cast<W*>(smem);
  uint32_t* hc = kMass ? reinterpret_cast<uint32_t*>(smem + kBins * sizeof(W))
                       : reinterpret_cast<uint32_t*>(smem);
  __shared__ int s_bin;
  __shared__ W s_above, s_wbin;
  __shared__ uint32_t s_cbin;
  const int t = threadIdx.x;
  uint64_t prefix = 0;
  W above_all = 0;
  int hi = nbits;
  for (bool first = true;; first = false) {
    const int lo = max(hi - kDigit, 0), nb = 1 << (hi - lo);
    for (int b = t; b < kBins; b += kThreads) {
      hw[b] = 0;
      if constexpr (kMass) hc[b] = 0;
    }
    __syncthreads();
    visit([&](uint64_t key, auto weight) {
      if ((key >> hi) != prefix) return;
      const int b = int((key >> lo) & uint64_t(nb - 1));
      atomicAdd(&hw[b], weight());
      if constexpr (kMass) atomicAdd(&hc[b], 1u);
    });
    __syncthreads();
    // thread t holds bins nb-1-2t and nb-2-2t: the scan counts from the top
    const int b0 = nb - 1 - 2 * t, b1 = b0 - 1;
    const W w0 = b0 >= 0 ? hw[b0] : W(0), w1 = b1 >= 0 ? hw[b1] : W(0);
    W total;
    const W ex = block_excl_scan<W>(W(w0 + w1), total);
    if (first && total < target) return {0, total, true};  // block-uniform
    int hit = -1;
    W above = 0;
    if (ex < target && ex + w0 >= target) {
      hit = b0;
      above = ex;
    } else if (ex + w0 < target && ex + w0 + w1 >= target) {
      hit = b1;
      above = ex + w0;
    }
    if (hit >= 0) {  // exactly one thread
      s_bin = hit;
      s_above = above;
      s_wbin = hw[hit];
      s_cbin = hc[hit];
    }
    __syncthreads();
    const int bin = s_bin;
    above = s_above;
    const W wbin = s_wbin;
    const uint32_t cbin = s_cbin;
    __syncthreads();  // s_* and the histograms are rewritten by the next pass
    prefix = (prefix << (hi - lo)) | uint64_t(bin);
    target -= above;
    above_all += above;
    hi = lo;
    // count: the whole bin is needed; mass: the bin is the one element
    const bool done = kMass ? cbin == 1 : wbin == target;
    if (done || hi == 0) return {prefix << hi, W(above_all + wbin), false};
  }
}

// p in [0, 1] in fixed point (exact for p >= 2^-37).
__device__ __forceinline__ Mass fixed_p(float p) {
  return __float2ull_rz(__fmul_rn(p, kFix));
}

// ---- the paths; each returns the chosen id in every thread ----

__device__ __noinline__ int sample_greedy(const float* row, int n) {
  float bv;
  int bi;
  thread_argmax(
      row, n, false, [](float x) { return x; }, bv, bi);
  const int best = block_argmax(bv, bi < 0 ? INT_MAX : bi);
  // the CPU starts from id 0 and takes strictly larger values: a NaN there
  // stays, and a row of -inf gives 0
  const float x0 = row[0];
  return (x0 != x0 || best == INT_MAX) ? 0 : best;
}

// The CPU's softmax, top-p, min-p and draw over keys[0, k), sorted by
// by_logit: the sequential double sums in one thread (unrolled: only the
// adds wait on each other), the rest spread over the threads.
__device__ __forceinline__ int softmax_and_draw(const uint64_t* keys, int k, const SampleRow& sr,
                                                const KeyCode& kc, unsigned char* smem) {
  float* prob = reinterpret_cast<float*>(smem + kMaxCand * 8);    // [kMaxCand], past keys
  double* cum = reinterpret_cast<double*>(smem + kMaxCand * 12);  // [kMaxCand]
  __shared__ int s_keep, s_kp, s_id;
  __shared__ double s_sum;
  const int t = threadIdx.x;
  const float mx = kc.logit_of(keys[0]);
  float e = 0.f;
  if (t < k) {
    e = __double2float_rn(exp(double(__fsub_rn(kc.logit_of(keys[t]), mx))));
    prob[t] = e;
  }
  if (t == 0) {
    s_keep = k;
    s_kp = k;
  }
  __syncthreads();
  if (t == 0) {
    double sum = 0;
    int i = 0;
    for (; i + 8 <= k; i += 8) {
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = prob[i + j];
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += v[j];
    }
    for (; i < k; ++i) sum += prob[i];
    s_sum = sum;
  }
  __syncthreads();
  if (t < k) prob[t] = __double2float_rn(double(e) / s_sum);
  __syncthreads();
  if (t == 0) {  // the running sums of top-p (and of the kept mass)
    double acc = 0;
    int i = 0;
    for (; i + 8 <= k; i += 8) {
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = prob[i + j];
#pragma unroll
      for (int j = 0; j < 8; ++j) cum[i + j] = acc += v[j];
    }
    for (; i < k; ++i) cum[i] = acc += prob[i];
  }
  __syncthreads();
  // top-p: the first running sum that reaches top_p ends the list
  if (t < k && sr.top_p < 1.f && cum[t] >= double(sr.top_p)) atomicMin(&s_keep, t + 1);
  __syncthreads();
  const int keep = s_keep;
  // min-p: the first token below min_p * p_max (never the first) ends it
  if (t > 0 && t < keep && sr.min_p > 0.f && !(prob[t] >= __fmul_rn(prob[0], sr.min_p)))
    atomicMin(&s_kp, t);
  __syncthreads();
  if (t == 0) {  // the draw: u scaled by the kept mass, walked in order
    const int kept = min(keep, s_kp);
    double r = uniform01(sr.seed, sr.counter) * cum[kept - 1];
    int found = kept - 1;
    for (int i = 0; i < kept; i += 8) {
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = i + j < kept ? prob[i + j] : 0.f;
      int hit = -1;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        r -= v[j];
        if (r < 0 && hit < 0 && i + j < kept) hit = i + j;
      }
      if (hit >= 0) {
        found = hit;
        break;
      }
    }
    s_id = kc.id_of(keys[found]);
  }
  __syncthreads();
  return s_id;
}

// The fast path's top-k when more than kMaxCand elements passed theta:
// the exact k-th key by a radix select over the c listed ids, then the k
// keys above it into keys (in any order).
__device__ __noinline__ void top_k_listed(const float* row, const int32_t* list, int c, int k,
                                          float inv_t, const KeyCode& kc, uint64_t* keys,
                                          unsigned char* smem) {
  __shared__ int s_cnt;
  const int t = threadIdx.x;
  auto candidates = [&](auto&& f) {  // f(key) for each listed element
    for (int j = t; j < c; j += kThreads) {
      const int i = list[j];
      f(kc.logit_key(__fmul_rn(row[i], inv_t), i));
    }
  };
  const uint64_t thr =
      radix_select<uint32_t>(
          32 + kc.idb, uint32_t(k),
          [&](auto&& emit) { candidates([&](uint64_t key) { emit(key, [] { return 1u; }); }); },
          smem)
          .thr;
  if (t == 0) s_cnt = 0;
  __syncthreads();
  candidates([&](uint64_t key) {
    if (key >= thr) keys[atomicAdd(&s_cnt, 1)] = key;  // exactly k <= kMaxCand
  });
  __syncthreads();
}

__device__ __noinline__ int sample_fast(const float* row, int n, const SampleRow& sr, float inv_t,
                                        int k, int32_t* list, const KeyCode& kc,
                                        unsigned char* smem) {
  uint64_t* keys = reinterpret_cast<uint64_t*>(smem);                  // [kMaxCand]
  uint64_t* sort_buf = reinterpret_cast<uint64_t*>(smem);              // [2 * kThreads], over keys
  uint64_t* tops = reinterpret_cast<uint64_t*>(smem + kThreads * 16);  // [kThreads], past sort_buf
  __shared__ int s_cnt;
  __shared__ uint64_t s_theta;
  const int t = threadIdx.x;

  // 1. a representative per thread (its largest logit; any element would
  // do), and theta: k representatives reach it. Each warp sorts its own;
  // theta is the k-th largest of the first m = ceil(k / 32) of each warp
  // (the k-th largest of all, unless a warp holds more than m of those).
  {
    float bv;
    int bi;
    thread_argmax<2>(
        row, n, false, [](float x) { return x; }, bv, bi);
    uint64_t x = bi >= 0 ? kc.logit_key(__fmul_rn(bv, inv_t), bi) : 0ull;
    if (t == 0) s_cnt = 0;
    const int lane = t & 31, warp = t >> 5;
#pragma unroll
    for (int kk = 2; kk <= 32; kk <<= 1)
#pragma unroll
      for (int j = kk >> 1; j > 0; j >>= 1) {
        const uint64_t y = __shfl_xor_sync(~0u, x, j);
        if ((x < y) == (((lane & kk) == 0) == ((lane & j) == 0))) x = y;
      }
    const int m = (k + 31) >> 5;
    if (lane < m) tops[warp * m + lane] = x;
    __syncthreads();
    int pw = 32;
    while (pw < 32 * m) pw <<= 1;
    const uint64_t sorted = bitonic_desc(t < 32 * m ? tops[t] : 0ull, pw, sort_buf);
    if (t == k - 1) s_theta = sorted;
    __syncthreads();
  }
  const uint64_t theta = s_theta;
  const float s_theta_f = kc.logit_of(theta);
  const int i_theta = kc.id_of(theta);
  const bool all = theta == 0 || s_theta_f != s_theta_f;
  // every x whose s = x * inv_t reaches s_theta is >= x_lo (s is within
  // half an ulp of x * inv_t): the scan compares raw logits
  float x_lo = -INFINITY;
  if (!all && isfinite(s_theta_f) && inv_t > 0.f && isfinite(inv_t)) {
    const double sd = s_theta_f;
    x_lo = __double2float_rd((sd - fabs(sd) * 0x1p-20 - 0x1p-140) / double(inv_t));
  }

  // 2. gather the elements >= theta (a superset is fine: all are sorted)
  // into shared memory, and their ids into `list` (scratch, n of them) for
  // when they are too many
  auto gather = [&](int i, float s) {
    if (all || s > s_theta_f || i <= i_theta) {
      const int slot = atomicAdd(&s_cnt, 1);
      if (slot < kMaxCand) keys[slot] = kc.logit_key(s, i);
      list[slot] = i;
    }
  };
  auto check = [&](int i, float x) {
    const float s = __fmul_rn(x, inv_t);
    if (all || s >= s_theta_f) gather(i, s);
  };
  for_row4(
      row, n,
      [&](int i, float x) {
        if (all || x >= x_lo) check(i, x);
      },
      [&](int i, float4 x) {
        if (all || fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)) >= x_lo) {  // rare
          check(i, x.x);
          check(i + 1, x.y);
          check(i + 2, x.z);
          check(i + 3, x.w);
        }
      });
  __syncthreads();
  int c = s_cnt;
  if (c > kMaxCand) {  // too many
    top_k_listed(row, list, c, k, inv_t, kc, keys, smem);
    c = k;
  }

  // 3. by_logit order; the first k are the top-k
  {
    int pw = 1;
    while (pw < c) pw <<= 1;
    const uint64_t x = t < c ? keys[t] : 0ull;
    __syncthreads();  // keys is under sort_buf
    keys[t] = bitonic_desc(x, pw, sort_buf);
    __syncthreads();
  }

  const int id = softmax_and_draw(keys, k, sr, kc, smem);
  return id;
}

__device__ __noinline__ int sample_general(const float* row, int n, const SampleRow& sr,
                                           float inv_t, float* e_row, int stride, const KeyCode& kc,
                                           unsigned char* smem) {
  __shared__ int s_id;
  const int t = threadIdx.x;

  // G0. the top element: mx and its id (ties to the lower id, NaN last)
  uint64_t top;
  {
    float bs;
    int bi;
    thread_argmax(
        row, n, true, [&](float x) { return __fmul_rn(x, inv_t); }, bs, bi);
    top = block_max(bi >= 0 ? kc.logit_key(bs, bi) : 0ull);
  }
  const int top_id = top ? kc.id_of(top) : 0;
  const float mx = kc.logit_of(top);

  // G1. top-k above 1024: the k-th key
  uint64_t thr_k = 0;
  if (sr.top_k > 0 && sr.top_k < n)
    thr_k = radix_select<uint32_t>(
                32 + kc.idb, uint32_t(sr.top_k),
                [&](auto&& emit) {
                  for_row(row, n, [&](int i, float x) {
                    emit(kc.logit_key(__fmul_rn(x, inv_t), i), [] { return 1u; });
                  });
                },
                smem)
                .thr;

  // G2. e of the kept logits into scratch (-1: not kept), and their sum
  // (each vector's four in float, then in double: a fixed order)
  auto e_of = [&](int i, float x) {
    const float s = __fmul_rn(x, inv_t);
    if (thr_k != 0 && kc.logit_key(s, i) < thr_k) return -1.f;
    const float ev = expf(__fsub_rn(s, mx));
    return ev >= 0.f ? ev : -1.f;  // NaN: not kept
  };
  const bool e_vec = (reinterpret_cast<uintptr_t>(row) & 15) == 0;  // then e_row + i is too
  double zpart = 0;
  for_row4(
      row, n,
      [&](int i, float x) {
        const float ev = e_of(i, x);
        e_row[i] = ev;
        zpart += fmaxf(ev, 0.f);
      },
      [&](int i, float4 x) {
        const float4 ev =
            make_float4(e_of(i, x.x), e_of(i + 1, x.y), e_of(i + 2, x.z), e_of(i + 3, x.w));
        if (e_vec) {
          *reinterpret_cast<float4*>(e_row + i) = ev;
        } else {
          e_row[i] = ev.x;
          e_row[i + 1] = ev.y;
          e_row[i + 2] = ev.z;
          e_row[i + 3] = ev.w;
        }
        zpart += __fadd_rn(__fadd_rn(fmaxf(ev.x, 0.f), fmaxf(ev.y, 0.f)),
                           __fadd_rn(fmaxf(ev.z, 0.f), fmaxf(ev.w, 0.f)));
      });
  if (t < stride - n) e_row[n + t] = -1.f;  // the row's padding to 4
  const double z = block_sum(zpart);        // its barriers publish e_row to the block
  // e of the top is 1 when mx is finite; else (all -inf, +inf, NaN) the top
  if (!(z >= 1.0)) return top_id;
  const float inv_z = __double2float_rn(1.0 / z);
  const float floor_p = sr.min_p > 0.f ? __fmul_rn(inv_z, sr.min_p) : 0.f;  // p_max = inv_z

  // G3. the set after min-p (p >= floor_p); top-p by a radix select
  // weighted by p over it. p_of is >= 0 (not NaN) for the elements kept by
  // top-k, and at most inv_z <= 1.
  auto p_of = [&](float ev) { return __fmul_rn(ev, inv_z); };
  uint64_t thr_p = 0;
  float e_min = 0.f;  // the select's set: e >= e_min, p >= floor_p
  if (sr.top_p < 1.f) {
    const Mass target = max(__double2ull_rz(double(sr.top_p) * 0x1p61), 1ull);  // top_p > 0: exact
    // The tokens below tau together weigh less than 1 - top_p, so those
    // above it should reach top_p: try them first (most of a vocabulary
    // usually lies far below), and all when they do not.
    const float tau = __double2float_rz(z * (1.0 - double(sr.top_p)) / double(n) * 0.999);
    auto select = [&]() {
      return radix_select<Mass>(
          30 + kc.idb, target,
          [&](auto&& emit) {
            for_row(e_row, n, [&](int i, float ev) {
              if (!(ev >= e_min) || p_of(ev) < floor_p) return;  // -1: not kept
              emit(kc.e_key(ev, i), [&] { return fixed_p(p_of(ev)); });
            });
          },
          smem);
    };
    e_min = tau;
    Selected<Mass> sel = select();
    if (sel.all) {
      e_min = 0.f;
      sel = select();
    }
    thr_p = sel.thr;
  }

  // G4. the kept mass: each thread sums a contiguous segment of ids, and a
  // scan of the segments gives each one's start (integer sums: exact). The
  // kept are the select's set at keys >= thr_p (its early stop leaves the
  // low bits of thr_p 0, so the set must be the same).
  const uint32_t thr_bits = uint32_t(thr_p >> kc.idb);  // a kept e has bits >= these
  const float e_lo = fmaxf(e_min, __uint_as_float(thr_bits));
  auto q_of = [&](int i, float ev) -> Mass {
    if (!(ev >= e_lo)) return 0ull;  // -1: not kept
    const float p = p_of(ev);
    if (p < floor_p) return 0ull;
    if (__float_as_uint(ev) == thr_bits && kc.e_key(ev, i) < thr_p) return 0ull;
    return fixed_p(p);
  };
  const int seg = (stride / 4 + kThreads - 1) / kThreads * 4;
  const int lo = min(t * seg, n), hi = min(lo + seg, n);
  Mass local = 0;
  for (int i = lo; i < hi; i += 4) {  // i + 3 < stride: the row is padded to 4
    const float4 v = *reinterpret_cast<const float4*>(e_row + i);
    local += q_of(i, v.x) + q_of(i + 1, v.y) + q_of(i + 2, v.z) + q_of(i + 3, v.w);
  }
  if (t == 0) s_id = top_id;  // unreachable: one segment holds r
  Mass mass;
  const Mass start = block_excl_scan<Mass>(local, mass);
  if (mass == 0) return top_id;

  // G5. the draw: the first id, in id order, whose running mass passes r;
  // the segment holding r is walked by its thread
  const Mass r = min(__double2ull_rz(uniform01(sr.seed, sr.counter) * double(mass)), mass - 1);
  if (r >= start && r < start + local) {  // exactly one thread
    Mass acc = start;
    int id = hi - 1;
    for (int i = lo; i < hi; i += 4) {
      const float4 v = *reinterpret_cast<const float4*>(e_row + i);
      const Mass q0 = q_of(i, v.x), q1 = q_of(i + 1, v.y), q2 = q_of(i + 2, v.z),
                 q3 = q_of(i + 3, v.w);
      if (r < acc + q0 + q1 + q2 + q3) {
        id = r < acc + q0 ? i : r < acc + q0 + q1 ? i + 1 : r < acc + q0 + q1 + q2 ? i + 2 : i + 3;
        break;
      }
      acc += q0 + q1 + q2 + q3;
    }
    s_id = id;
  }
  __syncthreads();
  return s_id;
}

__global__ void __launch_bounds__(kThreads, 1)
    sample_kernel(float* logits, int n, const SampleRow* rows, const int32_t* pairs, int32_t* ids,
                  float* scratch, int stride) {
  __shared__ __align__(16) unsigned char smem[kSmemBytes];
  const SampleRow sr = rows[blockIdx.x];
  float* row = logits + size_t(blockIdx.x) * size_t(n);
  const int t = threadIdx.x;

  // penalties: the pairs of a row name distinct tokens, so no two threads
  // touch one logit
  const bool rep = sr.repeat_penalty != 1.f;
  const bool pf = sr.presence_penalty != 0.f || sr.frequency_penalty != 0.f;
  if (rep || pf)
    for (int j = t; j < sr.n_penalty; j += kThreads) {
      const size_t at = 2 * (size_t(sr.penalty_first) + size_t(j));
      const int tok = pairs[at], cnt = pairs[at + 1];
      if (tok < 0 || tok >= n) continue;
      float l = row[tok];
      if (rep) l = l > 0.f ? __fdiv_rn(l, sr.repeat_penalty) : __fmul_rn(l, sr.repeat_penalty);
      if (pf)
        l = __fsub_rn(l,
                      __fadd_rn(sr.presence_penalty, __fmul_rn(float(cnt), sr.frequency_penalty)));
      row[tok] = l;
    }
  __syncthreads();  // the penalised logits are visible to the whole block

  int id;
  if (sr.temperature == 0.f) {
    id = sample_greedy(row, n);
  } else {
    const float inv_t = __fdiv_rn(1.f, sr.temperature);
    const int idb = n > 1 ? 32 - __clz(n - 1) : 1;
    const KeyCode kc{idb, uint32_t((1ull << idb) - 1)};
    const int k = sr.top_k > 0 ? min(sr.top_k, n) : 0;
    float* srow = scratch + size_t(blockIdx.x) * size_t(stride);  // this row's scratch
    if (k > 0 && k <= kMaxCand)
      id = sample_fast(row, n, sr, inv_t, k, reinterpret_cast<int32_t*>(srow), kc, smem);
    else
      id = sample_general(row, n, sr, inv_t, srow, stride, kc, smem);
  }
  if (t == 0) ids[blockIdx.x] = id >= 0 && id < n ? id : 0;  // in range whatever the input
}

int padded(int n_vocab) {
  return (n_vocab + 3) / 4 * 4;
}

}  // namespace

size_t sample_scratch_bytes(int n_rows, int n_vocab) {
  if (n_rows <= 0 || n_vocab <= 0) return 16;
  return size_t(n_rows) * size_t(padded(n_vocab)) * sizeof(float) + 16;  // + 16: alignment
}

void sample(float* logits, int n_rows, int n_vocab, const SampleRow* rows, const int32_t* pairs,
            int32_t* ids, void* scratch, cudaStream_t st) {
  if (n_rows <= 0) return;
  if (n_vocab <= 0) throw std::invalid_argument("sample: n_vocab must be positive");
  // the general path reads scratch rows with 16-byte loads
  auto* e = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch) + 15) & ~uintptr_t(15));
  sample_kernel<<<n_rows, kThreads, 0, st>>>(logits, n_vocab, rows, pairs, ids, e, padded(n_vocab));
  WICK_CUDA_LAUNCHED();
}

}  // namespace wick::cuda
