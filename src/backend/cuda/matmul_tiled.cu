// The prefill matmul: the products of matmul.cu's kernel, in the same order,
// from shared-memory tiles, so that a token's result has the same bits
// whichever of the two kernels computed it (batch invariance across the
// prefill and decode paths; asserted by CudaMatmulTiled.*).
//
// matmul.cu fixes each output element's order: k in chunks of KC, slice w of
// KW takes chunks w, w + KW, ... in order (E/4 mma steps each, a lane's 16
// weight bytes decoded by decode<F>), the slices' sums added in slice order.
// The decode kernel gives each slice its own warp; here one warp walks the
// slices one after another, keeping the slice's sum (acc) apart from the
// running total, so it needs no split of k across warps and can reuse each
// staged tile across a (16 MT) x (8 NT) warp tile. The activations are converted
// to bf16 once (the same rounding as the decode kernel's), and chunks are
// staged with cp.async, KS chunks per stage in a ring of NS stages, in slice
// order. Integer products (IG, int_path) stage x's integer form instead (2
// bytes an element as well) and take matmul_int.cuh's int_chunk. Formats:
// bf16, f16, and 8- and 4-bit weights (decoded as the decode kernel does).
#include <algorithm>
#include <atomic>

#include "backend/cuda/kernels.h"
#include "backend/cuda/matmul_common.cuh"
#include "backend/cuda/matmul_int.cuh"
#include "backend/cuda/matmul_tiled.h"

namespace wick::cuda {

namespace {

std::atomic<int> g_path{0};  // MatmulPath

struct TJob {
  GpuWeight w;
  float* y;
  const float* bias;
  int tile_start;
};

struct TParams {
  TJob jobs[kMaxTiledJobs];
  int n_jobs;
  const uint32_t* xb;  // [M][k_pad / 2] bf16 pairs (IG: xa.q, 2 k_pad bytes a row)
  IntAct xa;           // IG: x in integer form (matmul_int.cuh)
  int M, k_pad, kw;
  GpuWeight up;    // GATED: the second weight (jobs[0] is the gate)
  float* y_gated;  // GATED: silu(gate) * up
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Chunks per stage (one barrier each) and stages in the ring. (A 4-bit
// chunk is 128 elements: its x tile alone is 32 KB at 128 rows; three
// stages, 120 KB, leave the SM's shared memory half free.)
template <Fmt F>
constexpr int chunks_per_stage() {
  return F == Fmt::I8 || F == Fmt::U4 ? 1 : 2;
}
template <Fmt F>
constexpr int stages() {
  return F == Fmt::I8 ? 4 : 3;
}
template <Fmt F, int WM, int WN, int MT, int NT, bool GATED>
constexpr int smem_bytes() {
  constexpr int KC = 4 * kE<F>, BM = 16 * MT * WM, BN = 8 * NT * WN;
  return stages<F>() * chunks_per_stage<F>() * (BM * 2 * KC + (GATED ? 2 : 1) * BN * 64);
}

// Walks the chunks of k in slice order: slice 0's chunks 0, kw, 2 kw, ...,
// then slice 1's, ... Slices past the last chunk are empty.
struct ChunkOrder {
  int w = 0, ch = 0;
  __device__ __forceinline__ void next(int kw, int n_chunks) {
    ch += kw;
    if (ch >= n_chunks) ch = ++w;
  }
};

// The stage's rows of x (A_ROW bytes): byte o of row r is stored at o ^
// a_swizzle(r), which permutes the row's 16-byte segments so that the lanes
// of one shared-memory wavefront read distinct banks. 8-bit weights' rows
// are 128 bytes, each row on the same banks: bf16 products read 16 bytes at
// 32 c + 16 v of rows g, g + 1 in a quarter warp (XOR 16: the odd row's
// segments on the banks the even row leaves); integer products, groups of
// 32, 16 bytes at 64 q + {0, 32, 16, 48}[c] (XOR 64: the other half);
// groups of 16, 8 bytes at 32 q + 8 c of rows g .. g + 3 in a half warp
// (XOR 32 (r & 3): four 32-byte blocks). 4-bit weights' rows are 256
// bytes: integer products read as 8-bit ones with groups of 32 (XOR 64);
// bf16 products read 16 bytes at 64 c + 16 v, so lanes c and c + 2 of one
// row meet on the same banks too: XOR 16 where the offset is in the row's
// second half, and 32 on odd rows (a_offset). 16-bit weights' 64-byte rows
// already fall on distinct banks. Rows r and r + 8 share a swizzle.
template <Fmt F, int IG>
__device__ __forceinline__ int a_swizzle(int row) {
  if constexpr (F == Fmt::U4 && IG != 0) return 64 * (row & 1);
  if constexpr (F != Fmt::I8) return 0;
  if constexpr (IG == 16) return 32 * (row & 3);
  if constexpr (IG == 32) return 64 * (row & 1);
  return 16 * (row & 1);
}
// Where byte o of a staged row of x is stored (16-byte segments stay whole).
template <Fmt F, int IG>
__device__ __forceinline__ int a_offset(int row, int o) {
  if constexpr (F == Fmt::U4 && IG == 0) return o ^ (16 * ((o >> 7) & 1)) ^ (32 * (row & 1));
  return o ^ a_swizzle<F, IG>(row);
}

// IG (8-bit weights, int_path): integer products for weight groups of IG,
// int_chunk's sums from the staged chunk (x's integer form has bf16's 2
// bytes an element, so the stages are the same); 0: bf16 products.
template <Fmt F, int WM, int WN, int MT, int NT, bool GATED, int IG = 0>
__global__ void __launch_bounds__(WM* WN * 32, 1)
    mm_tiled_kernel(const __grid_constant__ TParams p) {
  constexpr int E = kE<F>, KC = 4 * E, NACC = GATED ? 2 : 1, NS = stages<F>();
  constexpr int BM = 16 * MT * WM, BN = 8 * NT * WN, NTHR = WM * WN * 32;
  constexpr int A_ROW = 2 * KC, A_BYTES = BM * A_ROW, B_BYTES = BN * 64;
  extern __shared__ __align__(16) uint8_t sm[];
  constexpr int KS = chunks_per_stage<F>(), CHUNK = A_BYTES + NACC * B_BYTES;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int wm = warp / WN, wn = warp % WN;
  int j = 0;
  while (j + 1 < p.n_jobs && int(blockIdx.x) >= p.jobs[j + 1].tile_start) ++j;
  const GpuWeight& W = p.jobs[j].w;
  const int n0 = (int(blockIdx.x) - p.jobs[j].tile_start) * BN, m0 = int(blockIdx.y) * BM;
  const int n_chunks = p.k_pad / KC, kw = p.kw;
  const MinForm mins = min_form<GATED>(W, p.up);  // (as the decode kernel: the same bits)

  // This thread's 16-byte copies of a chunk: A rows a_row + i * A_STEP at
  // byte part * 16 of the row's chunk, B rows b_row + i * B_STEP likewise.
  constexpr int AV = A_ROW / 16, A_STEP = NTHR / AV, N_ACP = BM / A_STEP;
  constexpr int B_STEP = NTHR / 4, N_BCP = BN / B_STEP;
  static_assert(NTHR % AV == 0 && BM % A_STEP == 0 && BN % B_STEP == 0, "copy split");
  const int a_row = int(threadIdx.x) / AV, a_part = int(threadIdx.x) % AV;
  const int b_row = int(threadIdx.x) / 4, b_part = int(threadIdx.x) % 4;
  const size_t a_pitch = size_t(p.k_pad) * 2,
               b_pitch =
                   F == Fmt::U4 ? size_t(p.k_pad) / 2 : size_t(p.k_pad) * (F == Fmt::I8 ? 1 : 2);
  const uint8_t* a_src =
      reinterpret_cast<const uint8_t*>(p.xb) + size_t(m0 + a_row) * a_pitch + 16 * a_part;
  const uint8_t* b_src[NACC];
#pragma unroll
  for (int a = 0; a < NACC; ++a)
    b_src[a] = static_cast<const uint8_t*>((a == 0 ? W : p.up).q) + size_t(n0 + b_row) * b_pitch +
               16 * b_part;

  auto load_chunk = [&](uint8_t* dst, int ch) {
#pragma unroll
    for (int i = 0; i < N_ACP; ++i) {
      const bool ok = m0 + a_row + i * A_STEP < p.M;
      const uint8_t* src = a_src + size_t(i) * A_STEP * a_pitch + size_t(ch) * A_ROW;
      const int row = a_row + i * A_STEP;
      cp_async16(dst + row * A_ROW + a_offset<F, IG>(row, 16 * a_part),
                 ok ? src : reinterpret_cast<const uint8_t*>(p.xb), ok);
    }
#pragma unroll
    for (int a = 0; a < NACC; ++a)
#pragma unroll
      for (int i = 0; i < N_BCP; ++i) {
        const bool ok = n0 + b_row + i * B_STEP < W.n_out;
        const uint8_t* src = b_src[a] + size_t(i) * B_STEP * b_pitch + size_t(ch) * 64;
        cp_async16(dst + A_BYTES + a * B_BYTES + (b_row + i * B_STEP) * 64 + 16 * b_part,
                   ok ? src : static_cast<const uint8_t*>(W.q), ok);
      }
  };

  float acc[NACC][MT][NT][4], total[NACC][MT][NT][4];
#pragma unroll
  for (int a = 0; a < NACC; ++a)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[a][mt][nt][i] = total[a][mt][nt][i] = 0.f;

  // IG: the warp tile's rows of x (scales and sums: global memory), whether
  // each 16-row tile's rows 8-15 are read, the scales of the lane's columns
  IntRows xr[MT];
  bool rows8[MT];
  IntCols<NACC, NT> cols;
  if constexpr (IG != 0) {
    int_tiles<F, IG, MT>(p.xa, p.k_pad, p.M, m0 + wm * 16 * MT, g, c, xr, rows8);
    set_int_cols(cols, W, p.up, p.k_pad,
                 [&](int nt, int jc) { return n0 + wn * 8 * NT + 8 * nt + 2 * c + jc; });
  }

  ChunkOrder ld, use;
  // bf16 products: the lane's 16 bytes of weight a's 8-row tile nt in stage
  // s, and (8/4-bit) their group's scale and min (zeros past n_out)
  auto staged_b = [&](const uint8_t* s, int a, int nt, float& sc, float& mn) {
    const GpuWeight& Wa = a == 0 ? W : p.up;
    const int row = wn * 8 * NT + 8 * nt + g;
    sc = mn = 0.f;
    if constexpr (F == Fmt::I8 || F == Fmt::U4) {
      if (n0 + row < Wa.n_out) {
        const size_t gi = group_index(Wa, n0 + row, use.ch * KC + E * c);
        sc = __ldg(Wa.scale + gi);
        mn = group_min(Wa, gi, sc);
      }
    }
    return *reinterpret_cast<const uint4*>(s + A_BYTES + a * B_BYTES + row * 64 + 16 * c);
  };
  auto load_stage = [&](int stage) {
#pragma unroll
    for (int q = 0; q < KS; ++q)
      if (ld.w < kw && ld.ch < n_chunks) {
        load_chunk(sm + (stage * KS + q) * CHUNK, ld.ch);
        ld.next(kw, n_chunks);
      }
    cp_async_commit();
  };
  const int n_stages = (n_chunks + KS - 1) / KS;
#pragma unroll
  for (int s = 0; s < NS - 1; ++s) load_stage(s);
  for (int it = 0; it < n_stages; ++it) {
    cp_async_wait<NS - 2>();
    __syncthreads();  // stage it has landed; stage (it - 1) % NS is free again
    load_stage((it + NS - 1) % NS);
#pragma unroll
    for (int q = 0; q < KS; ++q) {
      if (it * KS + q >= n_chunks) break;
      const uint8_t* s = sm + ((it % NS) * KS + q) * CHUNK;
      if constexpr (IG != 0) {
        uint32_t b[NACC][NT][IntShape<F, IG>::NG][IntShape<F, IG>::NB];
#pragma unroll
        for (int a = 0; a < NACC; ++a)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const int row = wn * 8 * NT + 8 * nt + g;
            int_fragments<F, IG>(
                *reinterpret_cast<const uint4*>(s + A_BYTES + a * B_BYTES + row * 64 + 16 * c), c,
                b[a][nt]);
          }
        // x's bytes from the stage: rows r, r + 8 of each 16-row tile
        IntRows xs[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          xs[mt] = xr[mt];
          const int r = wm * 16 * MT + 16 * mt + g;
          xs[mt].q[0] = s + r * A_ROW;
          xs[mt].q[1] = xs[mt].q[0] + 8 * A_ROW;
          xs[mt].lane = 2 * IntShape<F, IG>::first(0, c);
          xs[mt].swizzle = a_swizzle<F, IG>(r);
        }
        int_chunk<F, IG, MT, NT, NACC, true>(xs, 0, rows8, cols, use.ch, b, acc);
      } else if constexpr (F == Fmt::U4) {
        // a lane's 32 weights are 16 bf16 pairs: each word of them decoded
        // right before its two mma steps, once for the warp tile's MT row
        // tiles (registers for the sums, not for 16 B words per tile)
        uint4 raw[NACC][NT];
        float sc[NACC][NT], mn[NACC][NT];
#pragma unroll
        for (int a = 0; a < NACC; ++a)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) raw[a][nt] = staged_b(s, a, nt, sc[a][nt], mn[a][nt]);
#pragma unroll
        for (int v = 0; v < 4; ++v) {  // steps 2 v, 2 v + 1: elements 8 v .. 8 v + 7
          uint32_t b[NACC][NT][4];
#pragma unroll
          for (int a = 0; a < NACC; ++a)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const uint4 r = raw[a][nt];
              const uint32_t word = v == 0 ? r.x : v == 1 ? r.y : v == 2 ? r.z : r.w;
              if (mins.eight)
                decode_u4_word<true>(word, sc[a][nt], mn[a][nt], b[a][nt]);
              else
                decode_u4_word(word, sc[a][nt], mn[a][nt], b[a][nt]);
            }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const int r = wm * 16 * MT + 16 * mt + g, o = a_offset<F, IG>(r, 2 * E * c + 16 * v);
            const uint4 l = *reinterpret_cast<const uint4*>(s + r * A_ROW + o);
            const uint4 h = *reinterpret_cast<const uint4*>(s + (r + 8) * A_ROW + o);
#pragma unroll
            for (int a = 0; a < NACC; ++a)
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) {
                mma_bf16(acc[a][mt][nt], l.x, h.x, l.y, h.y, b[a][nt][0], b[a][nt][1]);
                mma_bf16(acc[a][mt][nt], l.z, h.z, l.w, h.w, b[a][nt][2], b[a][nt][3]);
              }
          }
        }
      } else {
        uint32_t b[NACC][NT][E / 2];
#pragma unroll
        for (int a = 0; a < NACC; ++a)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            float sc, mn;
            const uint4 raw = staged_b(s, a, nt, sc, mn);
            if (F == Fmt::I8 && mins.none)  // (Q8_0: 16 of a chunk's 72 decode instructions)
              decode<F, false>(raw, sc, mn, b[a][nt]);
            else
              decode<F>(raw, sc, mn, b[a][nt]);
          }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const int r = wm * 16 * MT + 16 * mt + g;
          // this lane's E activations of rows r and r + 8: elements [E c, E c + E) of the chunk
          uint32_t lo[E / 2], hi[E / 2];
#pragma unroll
          for (int v = 0; v < E / 8; ++v) {
            const int o = a_offset<F, IG>(r, 2 * E * c + 16 * v);
            const uint4 l = *reinterpret_cast<const uint4*>(s + r * A_ROW + o);
            const uint4 h = *reinterpret_cast<const uint4*>(s + (r + 8) * A_ROW + o);
            lo[4 * v] = l.x, lo[4 * v + 1] = l.y, lo[4 * v + 2] = l.z, lo[4 * v + 3] = l.w;
            hi[4 * v] = h.x, hi[4 * v + 1] = h.y, hi[4 * v + 2] = h.z, hi[4 * v + 3] = h.w;
          }
#pragma unroll
          for (int st = 0; st < E / 4; ++st)
#pragma unroll
            for (int a = 0; a < NACC; ++a)
#pragma unroll
              for (int nt = 0; nt < NT; ++nt)
                mma_bf16(acc[a][mt][nt], lo[2 * st], hi[2 * st], lo[2 * st + 1], hi[2 * st + 1],
                         b[a][nt][2 * st], b[a][nt][2 * st + 1]);
        }
      }
      const int slice = use.w;
      use.next(kw, n_chunks);
      if (use.w != slice) {  // the slice is complete: total = s0 + s1 + ... in slice order
#pragma unroll
        for (int a = 0; a < NACC; ++a)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                total[a][mt][nt][i] =
                    slice == 0 ? acc[a][mt][nt][i] : total[a][mt][nt][i] + acc[a][mt][nt][i];
                acc[a][mt][nt][i] = 0.f;
              }
      }
    }
  }
  cp_async_wait<0>();
  // empty slices (kw > n_chunks) add their zero, as the decode kernel does
  for (int w = n_chunks; w < kw; ++w)
#pragma unroll
    for (int a = 0; a < NACC; ++a)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) total[a][mt][nt][i] = total[a][mt][nt][i] + 0.f;

  float* y = GATED ? p.y_gated : p.jobs[j].y;
  const float* bias = p.jobs[j].bias;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = m0 + wm * 16 * MT + 16 * mt + g + 8 * (i / 2);
        const int col = n0 + wn * 8 * NT + 8 * nt + 2 * c + (i % 2);
        if (r >= p.M || col >= W.n_out) continue;
        float v = total[0][mt][nt][i];
        if constexpr (GATED) {
          v = v / (1.f + expf(-v)) * total[NACC - 1][mt][nt][i];
        } else {
          if (bias) v += bias[col];
        }
        y[size_t(r) * W.n_out + col] = v;
      }
}

// x [M][n_in] f32 -> [M][k_pad] bf16, zeros past n_in: the decode kernel's
// conversion (pack_bf16 of each pair), once per product instead of per tile.
__global__ void to_bf16_kernel(const float* x, int M, int n_in, int k_pad, uint32_t* xb) {
  const int64_t half = k_pad / 2, n = int64_t(M) * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / half;
    const int k = int(i % half) * 2;
    const float* src = x + r * n_in;
    xb[i] = pack_bf16(k < n_in ? src[k] : 0.f, k + 1 < n_in ? src[k + 1] : 0.f);
  }
}

template <Fmt F, int WM, int WN, int MT, int NT, bool GATED, int IG = 0>
void launch(TParams& p, cudaStream_t st) {
  constexpr int BM = 16 * MT * WM, BN = 8 * NT * WN, SMEM = smem_bytes<F, WM, WN, MT, NT, GATED>();
  auto kernel = mm_tiled_kernel<F, WM, WN, MT, NT, GATED, IG>;
  static bool raised = false;
  if (!raised) {
    WICK_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    raised = true;
  }
  int n_tiles = 0;
  for (int j = 0; j < p.n_jobs; ++j) {
    p.jobs[j].tile_start = n_tiles;
    n_tiles += ceil_div(p.jobs[j].w.n_out, BN);
  }
  kernel<<<dim3(unsigned(n_tiles), unsigned(ceil_div(p.M, BM))), WM * WN * 32, SMEM, st>>>(p);
  WICK_CUDA_LAUNCHED();
}

// CTAs of a (WM x WN)-warp tile over the jobs.
int n_ctas(const TParams& p, int bm, int bn) {
  int n = 0;
  for (int j = 0; j < p.n_jobs; ++j) n += ceil_div(p.jobs[j].w.n_out, bn);
  return n * ceil_div(p.M, bm);
}

// The largest CTA tile that still gives every SM six warps or more (the
// kernel hides its latencies with warps, not with a deep pipeline), else
// the smallest, 32 x 8 NT warp tiles in one-warp CTAs.
// (IG: warp tiles of 32 rows, for the registers of the weights' scales and
// fragments beside each slice's sums and the total. 4-bit weights: two
// 8-column tiles a warp, and 16 rows for gated integer products, whose
// 128-element chunks carry 4 groups' scales a column: wider tiles spill.)
// 8- and 16-bit weights' bf16 products, not gated, take 4 column tiles a
// warp; where those tiles' 4- and 8-warp CTAs are too few (q/k/v, o and
// down of 1B models at 512 rows), 8-warp CTAs of 2-column-tile warps (128 x
// 64, as 4-bit weights' and gate/up's) come before 2- and 1-warp CTAs: on an
// H200 Q8_0's q/k/v, o and down ran at 49-65 TFLOP/s in 1-warp CTAs, Q4_0's
// at 88-119 in these (session 57). A tile shape never changes a result's bits.
template <Fmt F, bool GATED, int IG = 0>
void dispatch_tile(TParams& p, cudaStream_t st) {
  constexpr bool U4 = F == Fmt::U4;
  constexpr int NT = GATED || U4 ? 2 : 4, MT = IG ? (U4 && GATED ? 1 : 2) : 4, R = 16 * MT;
  const int want = 6 * n_sms();
  if (8 * n_ctas(p, 2 * R, 32 * NT) >= want) return launch<F, 2, 4, MT, NT, GATED, IG>(p, st);
  if (4 * n_ctas(p, 2 * R, 16 * NT) >= want) return launch<F, 2, 2, MT, NT, GATED, IG>(p, st);
  if constexpr (NT == 4 && IG == 0)  // (a 2 x 2 of them has as many warps as this)
    if (8 * n_ctas(p, 2 * R, 64) >= want) return launch<F, 2, 4, MT, 2, GATED>(p, st);
  if (2 * n_ctas(p, R, 16 * NT) >= want) return launch<F, 1, 2, MT, NT, GATED, IG>(p, st);
  if (n_ctas(p, R, 8 * NT) >= want) return launch<F, 1, 1, MT, NT, GATED, IG>(p, st);
  launch<F, 1, 1, (MT < 2 ? MT : 2), NT, GATED, IG>(p, st);
}

}  // namespace

void set_matmul_path(MatmulPath path) {
  g_path = int(path);
}

size_t matmul_scratch_bytes(int M, int k_pad) {
  // the bf16 copy of x, or its integer form (int_path)
  return std::max(size_t(std::max(M, 0)) * size_t(k_pad) * 2, int_act_bytes(M, k_pad));
}

MatmulPath matmul_path() {
  return MatmulPath(g_path.load());
}

bool matmul_tiled(const TiledProblem& t, cudaStream_t st) {
  const MatmulPath path = MatmulPath(g_path.load());
  if (path == MatmulPath::DecodeKernel || !t.xb || t.M <= 0) return false;
  const Fmt f = t.jobs[0].w->fmt;
  if (f != Fmt::BF16 && f != Fmt::F16 && f != Fmt::I8 && f != Fmt::U4) return false;
  const bool force = path == MatmulPath::Tiled;
  if (f == Fmt::U4 && !force && !tiled_u4()) return false;  // (WICK_CUDA_TILED_U4=0)
  // too few rows to share a staged weight tile: the decode kernel streams better
  if (!force && t.M < 64) return false;
  TParams p{};
  p.n_jobs = t.n_jobs;
  for (int j = 0; j < t.n_jobs; ++j) p.jobs[j] = TJob{*t.jobs[j].w, t.jobs[j].y, t.jobs[j].bias, 0};
  p.xb = static_cast<const uint32_t*>(t.xb);
  p.M = t.M;
  p.k_pad = t.jobs[0].w->k_pad;
  p.kw = t.kw;
  const bool gated = t.up != nullptr;
  if (gated) {
    p.up = *t.up;
    p.y_gated = t.y_gated;
  }
  // decide before converting: a refused problem launches nothing
  const int NT = gated || f == Fmt::U4 ? 2 : 4;  // (dispatch_tile's)
  if (!force && n_ctas(p, 32, 8 * NT) < n_sms()) return false;
  if (t.xa) {  // x is in xb already, in integer form
    p.xa = *t.xa;
    p.xb = reinterpret_cast<const uint32_t*>(t.xa->q);
    if (f == Fmt::U4) {  // (groups of 32)
      gated ? dispatch_tile<Fmt::U4, true, 32>(p, st) : dispatch_tile<Fmt::U4, false, 32>(p, st);
      return true;
    }
    const bool g16 = t.jobs[0].w->group == 16;
    if (gated)
      g16 ? dispatch_tile<Fmt::I8, true, 16>(p, st) : dispatch_tile<Fmt::I8, true, 32>(p, st);
    else
      g16 ? dispatch_tile<Fmt::I8, false, 16>(p, st) : dispatch_tile<Fmt::I8, false, 32>(p, st);
    return true;
  }
  const int64_t words = int64_t(t.M) * (p.k_pad / 2);
  to_bf16_kernel<<<int(std::min<int64_t>(4096, (words + 255) / 256)), 256, 0, st>>>(
      t.x, t.M, t.jobs[0].w->n_in, p.k_pad, static_cast<uint32_t*>(t.xb));
  WICK_CUDA_LAUNCHED();
  switch (f) {
    case Fmt::BF16:
      gated ? dispatch_tile<Fmt::BF16, true>(p, st) : dispatch_tile<Fmt::BF16, false>(p, st);
      return true;
    case Fmt::F16:
      gated ? dispatch_tile<Fmt::F16, true>(p, st) : dispatch_tile<Fmt::F16, false>(p, st);
      return true;
    case Fmt::U4:
      gated ? dispatch_tile<Fmt::U4, true>(p, st) : dispatch_tile<Fmt::U4, false>(p, st);
      return true;
    default:
      gated ? dispatch_tile<Fmt::I8, true>(p, st) : dispatch_tile<Fmt::I8, false>(p, st);
      return true;
  }
}

}  // namespace wick::cuda
