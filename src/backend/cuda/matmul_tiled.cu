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
// to bf16 once (the same rounding as the decode kernel's), in the mma's A
// quads (quad_offset), and chunks are staged with cp.async, with their
// weights' group scales and mins (Stage), KS chunks per stage in a ring of NS
// stages, in slice order. Integer products (IG, int_path) stage x's integer
// form instead (2 bytes an element as well, with its block scales and sums)
// and take matmul_int.cuh's int_chunk. Formats: bf16, f16, and 8- and 4-bit
// weights (decoded as the decode kernel does).
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
#ifdef WICK_CUDA_EMU
  ::wick_emu::cp_async(smem, gmem, 16, pred ? 16 : 0);
#else
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(pred ? 16 : 0));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef WICK_CUDA_EMU
  ::wick_emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// 8 bytes (the .ca form: .cg copies only 16); zeros where !pred.
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, bool pred) {
#ifdef WICK_CUDA_EMU
  ::wick_emu::cp_async(smem, gmem, 8, pred ? 8 : 0);
#else
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(gmem),
               "r"(pred ? 8 : 0));
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef WICK_CUDA_EMU
  ::wick_emu::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Chunks per stage (one barrier each) and stages in the ring. (A 4-bit
// chunk is 128 elements: its x tile alone is 32 KB at 128 rows; three
// stages of gate/up, 132 KB with the scales, leave the SM's shared memory
// 95 KB.) PRE (weights decoded once a CTA, one chunk ahead): a stage more,
// since the chunk after the one in use must have landed too.
template <Fmt F>
constexpr int chunks_per_stage() {
  return F == Fmt::I8 || F == Fmt::U4 ? 1 : 2;
}
template <Fmt F, bool PRE = false>
constexpr int stages() {
  return (F == Fmt::I8 ? 4 : 3) + (PRE ? 1 : 0);
}
// One staged chunk (bytes from its start): x's tile (A), each weight's tile
// (B), and for 8/4-bit weights each weight's group scales and mins of the
// chunk (4 floats a row: a chunk holds 2 or 4 groups of 8-bit weights, 4 of
// 4-bit ones; mins where the weight stores them), and for integer products
// (IG) x's block scales d and 16-sums s of the chunk. All of it comes with
// the chunk's cp.async group, so the loop reads no global memory: the
// scales were __ldg'd right before their decode, one L1/L2 wait per weight
// tile and chunk (SASS, session 61).
template <Fmt F, int WM, int WN, int MT, int NT, bool GATED, int IG>
struct Stage {
  static constexpr int KC = 4 * kE<F>, BM = 16 * MT * WM, BN = 8 * NT * WN, NACC = GATED ? 2 : 1;
  static constexpr int N32 = KC / 32;  // x's blocks of 32 a chunk
  static constexpr bool kGroups = F == Fmt::I8 || F == Fmt::U4;
  static constexpr int A_ROW = 2 * KC, A_BYTES = BM * A_ROW, B_BYTES = BN * 64;
  static constexpr int G_ROW = 16, G_BYTES = kGroups ? BN * G_ROW : 0;  // one weight's scales
  static constexpr int SCALE = A_BYTES + NACC * B_BYTES, MIN = SCALE + NACC * G_BYTES;
  static constexpr int XD_ROW = 4 * N32, XS_ROW = 8 * N32;  // d: N32 floats; s: 2 N32 ints
  static constexpr int XD = MIN + NACC * G_BYTES, XS = XD + (IG ? BM * XD_ROW : 0);
  static constexpr int CHUNK = XS + (IG ? BM * XS_ROW : 0);
  static_assert(CHUNK % 16 == 0 && SCALE % 16 == 0 && XD % 16 == 0, "16-byte parts");
  // PRE: a chunk's weights decoded to bf16 (each weight's BN rows of KC), two
  // of them after the ring
  static constexpr int D_ROW = 2 * KC, D_W = BN * D_ROW, D_BYTES = NACC * D_W;
};
template <Fmt F, int WM, int WN, int MT, int NT, bool GATED, int IG, bool PRE>
constexpr int smem_bytes() {
  using L = Stage<F, WM, WN, MT, NT, GATED, IG>;
  return stages<F, PRE>() * chunks_per_stage<F>() * L::CHUNK + (PRE ? 2 * L::D_BYTES : 0);
}

// A chunk's per-row values, ROWS rows of UNITS 8-byte copies (a power of
// two; all the CTA's NTHR threads): row r at src + r * pitch (floats) into
// dst + 8 UNITS r; zeros from row n_ok on and past the row's first
// units_ok copies. (Compile-time counts: the loop unrolls, and the
// per-thread offsets do not depend on the chunk.)
template <int ROWS, int UNITS, int NTHR>
__device__ __forceinline__ void stage_rows(uint8_t* dst, const float* src, size_t pitch, int n_ok,
                                           int units_ok = UNITS) {
#pragma unroll
  for (int i = 0; i < (ROWS * UNITS + NTHR - 1) / NTHR; ++i) {
    const int u = int(threadIdx.x) + i * NTHR;
    if (ROWS * UNITS % NTHR != 0 && u >= ROWS * UNITS) break;
    const int r = u / UNITS, part = u % UNITS;
    const bool ok = r < n_ok && part < units_ok;
    cp_async8(dst + 8 * u, ok ? src + size_t(r) * pitch + 2 * part : src, ok);
  }
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

// Integer products' stage of x (A_ROW bytes a row): byte o of row r is
// stored at o ^ a_swizzle(r), which permutes the row's 16-byte segments so
// that the lanes of one shared-memory wavefront read distinct banks. Groups
// of 32 (and 4-bit weights, read as 8-bit ones with groups of 32), 16 bytes
// at 64 q + {0, 32, 16, 48}[c] of rows g, g + 1 in a quarter warp: XOR 64
// on odd rows (the other half); groups of 16, 8 bytes at 32 q + 8 c of rows
// g .. g + 3 in a half warp: XOR 32 (r & 3), four 32-byte blocks. Rows r
// and r + 8 share a swizzle.
template <Fmt F, int IG>
__device__ __forceinline__ int a_swizzle(int row) {
  if constexpr (IG == 16) return 32 * (row & 3);
  return 64 * (row & 1);
}

// bf16 products' x is stored in quads (to_bf16_kernel): rows r and r + 8 of
// each 16-row tile share a pair row, pair p of row r at word 2 p + (r / 8) %
// 2, so that an mma step's A registers (row g's pair, row g + 8's, the next
// pair of each) are one 16-byte load, not two loads and four moves (SASS,
// session 61: ~300 moves a chunk and warp of the 8-bit kernel, beside 64
// HMMA). Lane c's step st is at byte 4 E c + 16 st of its pair row's chunk
// (2 A_ROW bytes); pair rows are 128-byte multiples apart, so a quarter warp
// (pair rows g, g + 1, lanes c 0-3) needs 8 distinct 16-byte segments of
// 128: the offset's segment bits are XORed with the bits of c above them and
// the pair row's parity (scripts/emulate_tiled_stage.py checks the reads and
// the banks).
// Byte o of a row whose lanes c read LANE bytes each at LANE c + 16 j, rows
// a multiple of 128 bytes apart, read by rows r, r + 1 in a quarter warp.
template <int LANE>
__device__ __forceinline__ int seg_swizzle(int row, int o) {
  const int odd = row & 1;
  if constexpr (LANE == 32) return o ^ (16 * odd);
  if constexpr (LANE == 64) return o ^ (16 * (((o >> 7) & 1) | (odd << 1)));
  return o ^ (16 * (((o >> 7) & 3) | (odd << 2)));  // 128
}
template <Fmt F>
__device__ __forceinline__ int quad_offset(int pair_row, int o) {
  return seg_swizzle<4 * kE<F>>(pair_row, o);  // lane c's steps at 4 E c + 16 st
}

// PRE: a chunk's weights decoded once a CTA (decode_chunk) instead of by
// each of the WM warps whose tiles use them (2: half the decode, which in
// the 8-bit kernel was ~240 of a chunk's ~490 instructions a warp; SASS,
// session 61), into a bf16 tile of rows of KC elements; lane c's E/2 pairs
// of a row at 2 E c, swizzled as the quads.
template <Fmt F>
__device__ __forceinline__ int dq_offset(int row, int o) {
  return seg_swizzle<2 * kE<F>>(row, o);
}

// IG (8-bit weights, int_path): integer products for weight groups of IG,
// int_chunk's sums from the staged chunk (x's integer form has bf16's 2
// bytes an element, so the stages are the same); 0: bf16 products.
template <Fmt F, int WM, int WN, int MT, int NT, bool GATED, int IG = 0, bool PRE = false>
__global__ void __launch_bounds__(WM* WN * 32, 1)
    mm_tiled_kernel(const __grid_constant__ TParams p) {
  using L = Stage<F, WM, WN, MT, NT, GATED, IG>;
  constexpr int E = kE<F>, KC = L::KC, NACC = L::NACC, NS = stages<F, PRE>();
  constexpr int BM = L::BM, BN = L::BN, NTHR = WM * WN * 32;
  constexpr int A_ROW = L::A_ROW, A_BYTES = L::A_BYTES, B_BYTES = L::B_BYTES;
  extern __shared__ __align__(16) uint8_t sm[];
  constexpr int KS = chunks_per_stage<F>(), CHUNK = L::CHUNK;
  static_assert(!PRE || (IG == 0 && KS == 1 && L::kGroups && NS >= 3), "decoded once a CTA");
  uint8_t* const dbuf = sm + NS * KS * CHUNK;  // PRE: two decoded chunks
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int wm = warp / WN, wn = warp % WN;
  int j = 0;
  while (j + 1 < p.n_jobs && int(blockIdx.x) >= p.jobs[j + 1].tile_start) ++j;
  const GpuWeight& W = p.jobs[j].w;
  const int n0 = (int(blockIdx.x) - p.jobs[j].tile_start) * BN, m0 = int(blockIdx.y) * BM;
  const int n_chunks = p.k_pad / KC, kw = p.kw;
  const MinForm mins = min_form<GATED>(W, p.up);            // (as the decode kernel: the same bits)
  const int g_shift = L::kGroups ? __ffs(W.group) - 1 : 0;  // (groups: 16 or 32)

  // This thread's 16-byte copies of a chunk: A rows (integer products) or
  // pair rows (bf16 products: 2 A_ROW bytes of a chunk, quad_offset's) a_row
  // + i * A_STEP at byte part * 16 of the row's chunk, B rows b_row + i *
  // B_STEP likewise.
  constexpr int A_UNIT = IG ? A_ROW : 2 * A_ROW, A_UNITS = IG ? BM : BM / 2;
  constexpr int AV = A_UNIT / 16, A_STEP = NTHR / AV, N_ACP = A_UNITS / A_STEP;
  constexpr int B_STEP = NTHR / 4, N_BCP = BN / B_STEP;
  static_assert(NTHR % AV == 0 && A_UNITS % A_STEP == 0 && BN % B_STEP == 0, "copy split");
  const int a_row = int(threadIdx.x) / AV, a_part = int(threadIdx.x) % AV;
  const int b_row = int(threadIdx.x) / 4, b_part = int(threadIdx.x) % 4;
  const size_t a_pitch = size_t(p.k_pad) * (IG ? 2 : 4),
               b_pitch =
                   F == Fmt::U4 ? size_t(p.k_pad) / 2 : size_t(p.k_pad) * (F == Fmt::I8 ? 1 : 2);
  const uint8_t* a_src = reinterpret_cast<const uint8_t*>(p.xb) +
                         size_t((IG ? m0 : m0 / 2) + a_row) * a_pitch + 16 * a_part;
  const uint8_t* b_src[NACC];
#pragma unroll
  for (int a = 0; a < NACC; ++a)
    b_src[a] = static_cast<const uint8_t*>((a == 0 ? W : p.up).q) + size_t(n0 + b_row) * b_pitch +
               16 * b_part;

  auto load_chunk = [&](uint8_t* dst, int ch) {
#pragma unroll
    for (int i = 0; i < N_ACP; ++i) {
      const int row = a_row + i * A_STEP;  // (bf16 products: a pair row, of tile row / 8)
      const bool ok = IG ? m0 + row < p.M : m0 + 16 * (row / 8) < p.M;
      const uint8_t* src = a_src + size_t(i) * A_STEP * a_pitch + size_t(ch) * A_UNIT;
      const int o = IG ? (16 * a_part) ^ a_swizzle<F, IG>(row) : quad_offset<F>(row, 16 * a_part);
      cp_async16(dst + row * A_UNIT + o, ok ? src : reinterpret_cast<const uint8_t*>(p.xb), ok);
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
    if constexpr (L::kGroups) {  // the chunk's groups of each weight row: 2 or 4 floats
      const int n_groups = KC >> g_shift;
      const size_t pitch = size_t(p.k_pad >> g_shift),
                   at = size_t(n0) * pitch + size_t(ch) * n_groups;
#pragma unroll
      for (int a = 0; a < NACC; ++a) {
        const GpuWeight& Wa = a == 0 ? W : p.up;
        stage_rows<BN, L::G_ROW / 8, NTHR>(dst + L::SCALE + a * L::G_BYTES, Wa.scale + at, pitch,
                                           W.n_out - n0, n_groups / 2);
        if (Wa.min)
          stage_rows<BN, L::G_ROW / 8, NTHR>(dst + L::MIN + a * L::G_BYTES, Wa.min + at, pitch,
                                             W.n_out - n0, n_groups / 2);
      }
    }
    if constexpr (IG != 0) {  // x's block scales and 16-sums of the chunk
      constexpr int N32 = L::N32;
      stage_rows<BM, L::XD_ROW / 8, NTHR>(dst + L::XD,
                                          p.xa.d + size_t(m0) * (p.k_pad / 32) + ch * N32,
                                          size_t(p.k_pad / 32), p.M - m0);
      stage_rows<BM, L::XS_ROW / 8, NTHR>(
          dst + L::XS,
          reinterpret_cast<const float*>(p.xa.s + size_t(m0) * (p.k_pad / 16) + ch * 2 * N32),
          size_t(p.k_pad / 16), p.M - m0);
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

  // IG: whether each 16-row tile's rows 8-15 are read, and the lane's
  // output columns in the stage's scales (row times 4 floats; the
  // pointers are set a chunk)
  bool rows8[MT];
  IntCols<NACC, NT> cols;
  if constexpr (IG != 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) rows8[mt] = m0 + wm * 16 * MT + 16 * mt + 8 < p.M;
#pragma unroll
    for (int a = 0; a < NACC; ++a) cols.min8[a] = (a == 0 ? W : p.up).min8;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int jc = 0; jc < 2; ++jc)
        cols.off[nt][jc] = (wn * 8 * NT + 8 * nt + 2 * c + jc) * (L::G_ROW / 4);
  }

  ChunkOrder ld, use;
  // bf16 products: lane load cl (16 bytes) of weight a's tile row `row` in
  // stage s, and (8/4-bit) its group's scale and min (group_min's; zeros
  // past n_out, where the stage holds zeros)
  auto stage_load = [&](const uint8_t* s, int a, int row, int cl, float& sc, float& mn) {
    const GpuWeight& Wa = a == 0 ? W : p.up;
    sc = mn = 0.f;
    if constexpr (L::kGroups) {
      const int at = row * L::G_ROW + 4 * ((E * cl) >> g_shift);
      sc = *reinterpret_cast<const float*>(s + L::SCALE + a * L::G_BYTES + at);
      mn = Wa.min    ? *reinterpret_cast<const float*>(s + L::MIN + a * L::G_BYTES + at)
           : Wa.min8 ? 8.f * sc
                     : 0.f;
    }
    return *reinterpret_cast<const uint4*>(s + A_BYTES + a * B_BYTES + row * 64 + 16 * cl);
  };
  // the lane's load of weight a's 8-row tile nt
  auto staged_b = [&](const uint8_t* s, int a, int nt, float& sc, float& mn) {
    return stage_load(s, a, wn * 8 * NT + 8 * nt + g, c, sc, mn);
  };
  // PRE: the weights of the chunk in stage s decoded into d (all threads;
  // thread t takes lane loads t, t + NTHR, ...: row (u / 4) % BN, lane u % 4
  // of weight u / (4 BN), decoded as the lane would, same bits)
  auto decode_chunk = [&](const uint8_t* s, uint8_t* d) {
    constexpr int UNITS = NACC * BN * 4;
#pragma unroll
    for (int i = 0; i < (UNITS + NTHR - 1) / NTHR; ++i) {
      const int u = int(threadIdx.x) + i * NTHR;
      if (UNITS % NTHR != 0 && u >= UNITS) break;
      const int a = u / (4 * BN), row = (u / 4) % BN, cu = u % 4;
      float sc, mn;
      const uint4 raw = stage_load(s, a, row, cu, sc, mn);
      uint32_t b[E / 2];
      if constexpr (F == Fmt::U4) {
        if (mins.eight)
          decode<F, true, true>(raw, sc, mn, b);
        else
          decode<F>(raw, sc, mn, b);
      } else {
        if (mins.none)
          decode<F, false>(raw, sc, mn, b);
        else
          decode<F>(raw, sc, mn, b);
      }
      uint8_t* out = d + a * L::D_W + row * L::D_ROW;
#pragma unroll
      for (int v = 0; v < E / 8; ++v)
        *reinterpret_cast<uint4*>(out + dq_offset<F>(row, 2 * E * cu + 16 * v)) =
            make_uint4(b[4 * v], b[4 * v + 1], b[4 * v + 2], b[4 * v + 3]);
    }
  };
  // PRE: the lane's 4 words v of weight a's tile nt, decoded (dbuf d)
  auto decoded_b = [&](const uint8_t* d, int a, int nt, int v) {
    const int row = wn * 8 * NT + 8 * nt + g;
    return *reinterpret_cast<const uint4*>(d + a * L::D_W + row * L::D_ROW +
                                           dq_offset<F>(row, 2 * E * c + 16 * v));
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
  if constexpr (PRE) {  // chunk 0 decoded here; each iteration decodes the next
    cp_async_wait<NS - 2>();
    __syncthreads();
    decode_chunk(sm, dbuf);
  }
  for (int it = 0; it < n_stages; ++it) {
    // stage it has landed (PRE: it + 1 too; chunk it is decoded), stage
    // (it - 1) % NS is free again (PRE: and decoded chunk it - 1's buffer)
    cp_async_wait<PRE ? NS - 3 : NS - 2>();
    __syncthreads();
    load_stage((it + NS - 1) % NS);
    if constexpr (PRE)
      if (it + 1 < n_stages)
        decode_chunk(sm + ((it + 1) % NS) * CHUNK, dbuf + ((it + 1) & 1) * L::D_BYTES);
    [[maybe_unused]] const uint8_t* d = dbuf + (it & 1) * L::D_BYTES;
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
        // x from the stage: rows r, r + 8 of each 16-row tile, and the
        // weights' scales and mins
        IntRows xs[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const int r = wm * 16 * MT + 16 * mt + g;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            xs[mt].q[h] = s + (r + 8 * h) * A_ROW;
            xs[mt].d[h] = reinterpret_cast<const float*>(s + L::XD + (r + 8 * h) * L::XD_ROW);
            xs[mt].s[h] = reinterpret_cast<const int*>(s + L::XS + (r + 8 * h) * L::XS_ROW);
          }
          xs[mt].lane = 2 * IntShape<F, IG>::first(0, c);
          xs[mt].swizzle = a_swizzle<F, IG>(r);
        }
#pragma unroll
        for (int a = 0; a < NACC; ++a) {
          cols.scale[a] = reinterpret_cast<const float*>(s + L::SCALE + a * L::G_BYTES);
          cols.min[a] = (a == 0 ? W : p.up).min
                            ? reinterpret_cast<const float*>(s + L::MIN + a * L::G_BYTES)
                            : nullptr;
        }
        int_chunk<F, IG, MT, NT, NACC, true>(xs, 0, rows8, cols, 0, b, acc);
      } else if constexpr (F == Fmt::U4) {
        // a lane's 32 weights are 16 bf16 pairs: each word of them decoded
        // right before its two mma steps, once for the warp tile's MT row
        // tiles (registers for the sums, not for 16 B words per tile)
        uint4 raw[NACC][NT];
        float sc[NACC][NT], mn[NACC][NT];
        if constexpr (!PRE) {
#pragma unroll
          for (int a = 0; a < NACC; ++a)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) raw[a][nt] = staged_b(s, a, nt, sc[a][nt], mn[a][nt]);
        }
#pragma unroll
        for (int v = 0; v < 4; ++v) {  // steps 2 v, 2 v + 1: elements 8 v .. 8 v + 7
          uint32_t b[NACC][NT][4];
#pragma unroll
          for (int a = 0; a < NACC; ++a)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              if constexpr (PRE) {
                const uint4 w = decoded_b(d, a, nt, v);
                b[a][nt][0] = w.x, b[a][nt][1] = w.y, b[a][nt][2] = w.z, b[a][nt][3] = w.w;
                continue;
              }
              const uint4 r = raw[a][nt];
              const uint32_t word = v == 0 ? r.x : v == 1 ? r.y : v == 2 ? r.z : r.w;
              if (mins.eight)
                decode_u4_word<true>(word, sc[a][nt], mn[a][nt], b[a][nt]);
              else
                decode_u4_word(word, sc[a][nt], mn[a][nt], b[a][nt]);
            }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const int pr = wm * 8 * MT + 8 * mt + g;  // rows r, r + 8's pair row
            const uint8_t* row = s + pr * A_UNIT;
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // steps 2 v + h
              const uint4 q = *reinterpret_cast<const uint4*>(
                  row + quad_offset<F>(pr, 4 * E * c + 32 * v + 16 * h));
#pragma unroll
              for (int a = 0; a < NACC; ++a)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                  mma_bf16(acc[a][mt][nt], q.x, q.y, q.z, q.w, b[a][nt][2 * h],
                           b[a][nt][2 * h + 1]);
            }
          }
        }
      } else {
        uint32_t b[NACC][NT][E / 2];
#pragma unroll
        for (int a = 0; a < NACC; ++a)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            if constexpr (PRE) {
#pragma unroll
              for (int v = 0; v < E / 8; ++v) {
                const uint4 w = decoded_b(d, a, nt, v);
                b[a][nt][4 * v] = w.x, b[a][nt][4 * v + 1] = w.y;
                b[a][nt][4 * v + 2] = w.z, b[a][nt][4 * v + 3] = w.w;
              }
              continue;
            }
            float sc, mn;
            const uint4 raw = staged_b(s, a, nt, sc, mn);
            if (F == Fmt::I8 && mins.none)  // (Q8_0: 16 of a chunk's 72 decode instructions)
              decode<F, false>(raw, sc, mn, b[a][nt]);
            else
              decode<F>(raw, sc, mn, b[a][nt]);
          }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          // this lane's E activations of rows r and r + 8 (elements [E c, E c + E)
          // of the chunk) in quads: step st's A registers at 4 E c + 16 st
          const int pr = wm * 8 * MT + 8 * mt + g;
#pragma unroll
          for (int st = 0; st < E / 4; ++st) {
            const uint4 q = *reinterpret_cast<const uint4*>(
                s + pr * A_UNIT + quad_offset<F>(pr, 4 * E * c + 16 * st));
#pragma unroll
            for (int a = 0; a < NACC; ++a)
#pragma unroll
              for (int nt = 0; nt < NT; ++nt)
                mma_bf16(acc[a][mt][nt], q.x, q.y, q.z, q.w, b[a][nt][2 * st],
                         b[a][nt][2 * st + 1]);
          }
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

// Rows of x whose bf16 quads the tiled kernel reads: whole 16-row tiles.
__host__ __device__ constexpr int quad_rows(int M) {
  return M > 0 ? (M + 15) / 16 * 16 : 0;
}

// x [M][n_in] f32 -> bf16 pairs in quads (quad_offset): pair row (r / 16) 8
// + r % 8 holds rows r and r + 8 of a 16-row tile, k_pad words, pair p of
// row r at word 2 p + (r / 8) % 2; zeros past n_in and M (to quad_rows(M)).
// The decode kernel's conversion (pack_bf16 of each pair), once per product
// instead of per tile.
__global__ void to_bf16_kernel(const float* x, int M, int n_in, int k_pad, uint32_t* xb) {
  const int64_t n = int64_t(quad_rows(M)) * (k_pad / 2);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pair_row = i / k_pad;
    const int w = int(i % k_pad), k = (w / 2) * 2;
    const int64_t r = pair_row / 8 * 16 + pair_row % 8 + 8 * (w % 2);
    const float* src = x + r * n_in;
    xb[i] = r < M ? pack_bf16(k < n_in ? src[k] : 0.f, k + 1 < n_in ? src[k + 1] : 0.f) : 0u;
  }
}

template <Fmt F, int WM, int WN, int MT, int NT, bool GATED, int IG, bool PRE>
void launch_kernel(TParams& p, cudaStream_t st) {
  constexpr int BM = 16 * MT * WM, BN = 8 * NT * WN;
  constexpr int SMEM = smem_bytes<F, WM, WN, MT, NT, GATED, IG, PRE>();
  static_assert(SMEM <= 227 * 1024, "an SM's shared memory");
  auto kernel = mm_tiled_kernel<F, WM, WN, MT, NT, GATED, IG, PRE>;
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

// Whether a kernel's stages fit this GPU's shared memory (max_smem_optin).
template <Fmt F, int WM, int WN, int MT, int NT, bool GATED, int IG = 0, bool PRE = false>
bool fits() {
  return smem_bytes<F, WM, WN, MT, NT, GATED, IG, PRE>() <= max_smem_optin() - kStaticSmemReserve;
}

// The kernel for a tile shape: PRE where it pays (two warps share each
// weight tile) and fits (the 4-bit gated kernel's decoded chunks would not
// leave it a fourth stage on an H100; an A100 holds the 2 x 2 ones, 126 and
// 156 KiB, not the 2 x 4), unless WICK_CUDA_PREDECODE=0.
template <Fmt F, int WM, int WN, int MT, int NT, bool GATED, int IG = 0>
void launch(TParams& p, cudaStream_t st) {
  constexpr bool kPre = WM == 2 && IG == 0 && (F == Fmt::I8 || (F == Fmt::U4 && !GATED));
  if constexpr (kPre)
    if (predecode() && fits<F, WM, WN, MT, NT, GATED, IG, true>())
      return launch_kernel<F, WM, WN, MT, NT, GATED, IG, true>(p, st);
  launch_kernel<F, WM, WN, MT, NT, GATED, IG, false>(p, st);
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
  // (shapes whose stages a GPU's shared memory cannot hold are passed over;
  // the last one's fit every GPU's 48 KB)
  constexpr int MT1 = MT < 2 ? MT : 2;
  static_assert(smem_bytes<F, 1, 1, MT1, NT, GATED, IG, false>() <= 48 * 1024, "any GPU");
  if (8 * n_ctas(p, 2 * R, 32 * NT) >= want && fits<F, 2, 4, MT, NT, GATED, IG>())
    return launch<F, 2, 4, MT, NT, GATED, IG>(p, st);
  if (4 * n_ctas(p, 2 * R, 16 * NT) >= want && fits<F, 2, 2, MT, NT, GATED, IG>())
    return launch<F, 2, 2, MT, NT, GATED, IG>(p, st);
  if constexpr (NT == 4 && IG == 0)  // (a 2 x 2 of them has as many warps as this)
    if (8 * n_ctas(p, 2 * R, 64) >= want && fits<F, 2, 4, MT, 2, GATED>())
      return launch<F, 2, 4, MT, 2, GATED>(p, st);
  if (2 * n_ctas(p, R, 16 * NT) >= want && fits<F, 1, 2, MT, NT, GATED, IG>())
    return launch<F, 1, 2, MT, NT, GATED, IG>(p, st);
  // (one-warp CTAs of the same warp tile never have more warps than these
  // two-warp ones: ceil(n / 8 NT) <= 2 ceil(n / 16 NT); no launch for them)
  launch<F, 1, 1, MT1, NT, GATED, IG>(p, st);
}

}  // namespace

void set_matmul_path(MatmulPath path) {
  g_path = int(path);
}

size_t matmul_scratch_bytes(int M, int k_pad) {
  // the bf16 copy of x in quads (whole 16-row tiles), or its integer form (int_path)
  return std::max(size_t(quad_rows(M)) * size_t(k_pad) * 2, int_act_bytes(M, k_pad));
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
  const int64_t words = int64_t(quad_rows(t.M)) * (p.k_pad / 2);
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
