// Integer products of 8- and 4-bit weights (WICK_CUDA_INT_MMA=1): the
// weights' integer levels go to the tensor cores as they are stored, against
// activations quantized once per product (act_quant.cu), instead of each
// weight being decoded to bf16 on every use (a Q8_0 chunk's bf16 products:
// ~240 instructions, 16 of them conversions at 16 a clock an SM; these:
// ~110, none by that unit; docs/perf.md).
//
// The activations: per row and block of 32, d = amax / 127, q1 = rn(x / d),
// q2 = rn(256 (x - d q1) / d), both clamped to +-127, so x ~ (d / 256) (256 q1
// + q2), within d / 512 of x (a 16-bit form: about 100 times finer than bf16
// for a block's large elements). A weight group's sum is an exact integer,
// 256 c1 + c2 from the two levels' mma sums, so its order within the group
// never matters; the groups are then folded into the f32 accumulator in k
// order, one FMA each (and one for the min term), like the CPU's I8 path. The
// slices and their partial sums around this are the decode kernel's
// (matmul.cu) and the tiled kernel's (matmul_tiled.cu, 8-bit weights), which
// both call int_chunk: a result's bits depend on its row of x and its weight
// row alone, whatever the batch.
//
// Lane (g, c) loads the 16 bytes matmul.cu gives it, elements [E c, E c + E)
// of weight row g in the chunk; an mma step needs the 4 lanes c of a row to
// hold one group's elements. So the lanes exchange words first: with groups
// of 32 8-bit weights, lanes c and c ^ 2 swap halves (each lane then holds 8
// of each of the chunk's two groups); with groups of 16, or 4-bit weights
// (a lane holds one whole group), the 4 lanes transpose their 4 words (lane c
// then holds word c of each group). 4-bit words unpack to two words of bytes,
// the even elements and the odd ones, so the activations of U4 weights are
// stored in that order too (evens, then odds, in each 8). Each lane then
// loads the scales (and mins) of its two output columns, which fetch_b
// brought into L1. scripts/emulate_int_mma.py replays all of this lane by
// lane on the CPU.
#pragma once

#include "backend/cuda/kernels.h"
#include "backend/cuda/matmul_common.cuh"

namespace wick::cuda {

// One row's integer form in one stored order, as a kernel writes it.
struct IntRowOut {
  uint8_t* q = nullptr;  // null: not wanted
  float* d = nullptr;
  int* s = nullptr;
  int n_blocks = 0;  // k_pad / 32
  bool nibbles = false;
};

// Row `row` of a (rows k_pad apart) as a kernel writes it; none where a
// has no levels (a form not wanted).
__device__ __forceinline__ IntRowOut int_row_out(const IntAct& a, int row, int k_pad,
                                                 bool nibbles) {
  if (!a.q) return IntRowOut{};
  const size_t r = size_t(row);
  return IntRowOut{const_cast<uint8_t*>(a.q) + r * size_t(2 * k_pad),
                   const_cast<float*>(a.d) + r * size_t(k_pad / 32),
                   const_cast<int*>(a.s) + r * size_t(k_pad / 16), k_pad / 32, nibbles};
}

// Row `row` of each of f's forms, as quantize_block takes them.
struct IntRowOuts {
  IntRowOut o[2];
};
__device__ __forceinline__ IntRowOuts int_row_outs(const IntOut& f, int row) {
  return IntRowOuts{{int_row_out(f.i8, row, f.k_i8, false), int_row_out(f.u4, row, f.k_u4, true)}};
}

// One block of 32 of a row in integer form, one lane an element (whole
// warps): lane holds element 32 b + lane, v (zero past the row), written to
// each of out (where it has block b): the two levels, d / 256 and the
// 16-sums (IntAct's layout). quantize_act's kernel and the norms'
// (elementwise.cu) share it: the same bits.
template <int N>
__device__ __forceinline__ void quantize_block(float v, int lane, int b,
                                               const IntRowOut (&out)[N]) {
  float amax = fabsf(v);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, off));
  // (fmaxf drops a NaN: the block's scale carries it instead, so that the
  // products show it as bf16 products would)
  const float dd = __any_sync(~0u, isnan(v)) ? __int_as_float(0x7fc00000) : __fdiv_rn(amax, 127.f);
  int q1 = 0, q2 = 0;
  if (amax > 0.f && !isnan(dd)) {
    q1 = max(-127, min(127, __float2int_rn(__fdiv_rn(v, dd))));
    const float rest = __fsub_rn(v, __fmul_rn(dd, float(q1)));
    q2 = max(-127, min(127, __float2int_rn(__fdiv_rn(__fmul_rn(rest, 256.f), dd))));
  }
  int sum = 256 * q1 + q2;
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(~0u, sum, off);  // per 16
  const int e = 32 * b + lane, w = e & 7;
#pragma unroll
  for (int o = 0; o < N; ++o) {
    if (!out[o].q || b >= out[o].n_blocks) continue;
    // U4's order: in each 8, the even elements, then the odd ones; per 4
    // stored elements their q1 bytes, then their q2 bytes
    const int p = out[o].nibbles ? (e & ~7) + (w & 1) * 4 + (w >> 1) : e;
    uint8_t* dst = out[o].q + (p / 4) * 8 + p % 4;
    dst[0] = uint8_t(int8_t(q1));
    dst[4] = uint8_t(int8_t(q2));
    if (lane % 16 == 0) out[o].s[2 * b + lane / 16] = sum;
    if (lane == 0) out[o].d[b] = __fdiv_rn(dd, 256.f);
  }
}

// The shape of a chunk for integer products: NG weight groups, NB B
// registers an mma step (2: m16n8k32, 1: m16n8k16 for groups of 16), and
// the groups' first stored elements for lane c (each lane supplies 8 of
// each group, or 4 for groups of 16, from there).
template <Fmt F, int IG>
struct IntShape {
  static constexpr int KC = k_chunk(F);
  static constexpr int NG = KC / IG;
  static constexpr int NB = IG == 16 ? 1 : 2;
  static constexpr int N32 = KC / 32;  // activation blocks a chunk
  __device__ static int first(int q, int c) {
    if constexpr (F == Fmt::I8 && IG == 32) return 32 * q + (c < 2 ? 16 * c : 16 * c - 24);
    if constexpr (IG == 16) return 16 * q + 4 * c;
    return 32 * q + 8 * c;  // U4
  }
};

// D = A . B, m16n8k32 (A s8, B s8 or u8), s32 sums from zero.
template <bool B_U8>
__device__ __forceinline__ void imma_k32(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#ifdef WICK_CUDA_EMU
  const uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
  ::wick_emu::imma(d, a, 4, b, 2, 32, B_U8);
#else
  if constexpr (B_U8)
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
  else
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#endif
}
// D = A . B, m16n8k16, s8 x s8, s32 sums from zero.
__device__ __forceinline__ void imma_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
#ifdef WICK_CUDA_EMU
  const uint32_t a[2] = {a0, a1};
  ::wick_emu::imma(d, a, 2, &b0, 1, 16, false);
#else
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%7,%7,%7,%7};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#endif
}

// Within each 4-lane row group: r[q] becomes lane q's r[c] (two butterfly
// stages; in each, a lane sends the words it is about to replace).
__device__ __forceinline__ void transpose4(uint32_t (&r)[4], int c) {
#pragma unroll
  for (int s = 1; s <= 2; s <<= 1) {
    const bool high = c & s;
#pragma unroll
    for (int lo = 0; lo < 4; ++lo) {
      if (lo & s) continue;
      const uint32_t got = __shfl_xor_sync(~0u, high ? r[lo] : r[lo + s], s);
      if (high)
        r[lo] = got;
      else
        r[lo + s] = got;
    }
  }
}

// The B registers of a lane for each group of the chunk, from its raw 16 bytes.
template <Fmt F, int IG>
__device__ __forceinline__ void int_fragments(
    const uint4 raw, int c, uint32_t (&b)[IntShape<F, IG>::NG][IntShape<F, IG>::NB]) {
  uint32_t r[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (F == Fmt::I8 && IG == 32) {  // lanes c, c ^ 2 swap halves
    const bool lo = c < 2;
    const uint32_t t0 = __shfl_xor_sync(~0u, lo ? r[2] : r[0], 2),
                   t1 = __shfl_xor_sync(~0u, lo ? r[3] : r[1], 2);
    b[0][0] = lo ? r[0] : t0;
    b[0][1] = lo ? r[1] : t1;
    b[1][0] = lo ? t0 : r[2];
    b[1][1] = lo ? t1 : r[3];
  } else {
    transpose4(r, c);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if constexpr (F == Fmt::I8) {
        b[q][0] = r[q];
      } else {  // nibbles: the even elements' bytes, then the odd ones'
        b[q][0] = r[q] & 0x0f0f0f0fu;
        b[q][1] = (r[q] >> 4) & 0x0f0f0f0fu;
      }
    }
  }
}

// The scales and mins of a lane's output columns 2c, 2c + 1 in each 8-row
// tile (weights [n_out][k_pad / group]; min null: none, or 8 scale where
// min8): off, each column's row times the groups a row.
template <int NACC, int NT>
struct IntCols {
  const float* scale[NACC];
  const float* min[NACC];
  bool min8[NACC];
  int off[NT][2];
};

// cols for weights w and (gated) u, whose layout is w's: row_of(nt, jc),
// the weight row of the lane's output column 2c + jc in 8-row tile nt (a
// row past n_out reads the last one's scales: its sums are dropped).
template <int NACC, int NT, typename RowOf>
__device__ __forceinline__ void set_int_cols(IntCols<NACC, NT>& cols, const GpuWeight& w,
                                             const GpuWeight& u, int k_pad, RowOf row_of) {
#pragma unroll
  for (int a = 0; a < NACC; ++a) {
    const GpuWeight& wa = a == 0 ? w : u;
    cols.scale[a] = wa.scale;
    cols.min[a] = wa.min;
    cols.min8[a] = wa.min8;
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int jc = 0; jc < 2; ++jc)
      cols.off[nt][jc] = min(row_of(nt, jc), w.n_out - 1) * (k_pad / w.group);
}

// A lane's two rows of x in one 16-row tile, rows r and r + 8, from its
// first stored element of the row (chunk 0, group 0). Rows past M read row
// M - 1 instead: an mma row only reaches the same output row, which the
// epilogue drops.
struct IntRows {
  const uint8_t* q[2];
  const float* d[2];
  const int* s[2];
  // from a shared-memory stage (int_chunk's SMEM): q is the rows' start, the
  // lane's bytes at (lane + offset) ^ swizzle (matmul_tiled.cu, a_swizzle)
  int lane = 0, swizzle = 0;
};
template <Fmt F, int IG>
__device__ __forceinline__ IntRows int_rows(const IntAct& xa, int k_pad, int M, int r, int c) {
  IntRows t;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const size_t row = size_t(min(r + 8 * h, M - 1));
    t.q[h] = xa.q + row * size_t(2 * k_pad) + 2 * IntShape<F, IG>::first(0, c);
    t.d[h] = xa.d + row * size_t(k_pad / 32);
    t.s[h] = xa.s + row * size_t(k_pad / 16);
  }
  return t;
}

// The lane's rows of x in each 16-row tile from row r0 (int_rows), and
// whether the tile reads its rows 8-15 (any below M).
template <Fmt F, int IG, int MT>
__device__ __forceinline__ void int_tiles(const IntAct& xa, int k_pad, int M, int r0, int g, int c,
                                          IntRows (&xr)[MT], bool (&rows8)[MT]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int r = r0 + 16 * mt;
    xr[mt] = int_rows<F, IG>(xa, k_pad, M, r + g, c);
    rows8[mt] = r + 8 < M;
  }
}

// N consecutive values from p (aligned to their size), as a vector load:
// global memory (read-only during the kernel), or a shared-memory stage (SMEM).
template <int N, bool SMEM = false, typename T>
__device__ __forceinline__ void load_n(const T* p, T (&v)[N]) {
  static_assert(sizeof(T) == 4 && (N == 2 || N == 4), "two or four words");
  if constexpr (N == 2) {
    const uint2 u =
        SMEM ? *reinterpret_cast<const uint2*>(p) : __ldg(reinterpret_cast<const uint2*>(p));
    memcpy(&v[0], &u.x, 4), memcpy(&v[1], &u.y, 4);
  } else {
    const uint4 u =
        SMEM ? *reinterpret_cast<const uint4*>(p) : __ldg(reinterpret_cast<const uint4*>(p));
    memcpy(&v[0], &u.x, 4), memcpy(&v[1], &u.y, 4), memcpy(&v[2], &u.z, 4), memcpy(&v[3], &u.w, 4);
  }
}

// A lane's 16 (or 8) bytes of x at p: global memory (read-only during the
// kernel), or a shared-memory stage (SMEM).
template <bool SMEM>
__device__ __forceinline__ uint4 load_x16(const uint8_t* p) {
  if constexpr (SMEM) return *reinterpret_cast<const uint4*>(p);
  return __ldg(reinterpret_cast<const uint4*>(p));
}
template <bool SMEM>
__device__ __forceinline__ uint2 load_x8(const uint8_t* p) {
  if constexpr (SMEM) return *reinterpret_cast<const uint2*>(p);
  return __ldg(reinterpret_cast<const uint2*>(p));
}

// One chunk (ch) of integer products into acc, a tile of sums (matmul.cu's
// decode kernel, matmul_tiled.cu's): b, each (weight, tile)'s B registers
// (int_fragments of the lane's 16 bytes); rows8[mt]: whether any of tile
// mt's rows 8-15 is below M. x's bytes come from xr[mt].q at chunk a_ch
// (the decode kernel: ch, from global memory; the tiled kernel: 0, its
// shared-memory stage of the chunk, SMEM), its scales and sums at ch, and
// the weights' scales and mins from cols at ch (SMEM: the stage, ch 0).
template <Fmt F, int IG, int MT, int NT, int NACC, bool SMEM = false>
__device__ __forceinline__ void int_chunk(
    const IntRows (&xr)[MT], int a_ch, const bool (&rows8)[MT], const IntCols<NACC, NT>& cols,
    int ch, const uint32_t (&b)[NACC][NT][IntShape<F, IG>::NG][IntShape<F, IG>::NB],
    float (&acc)[NACC][MT][NT][4]) {
  using S = IntShape<F, IG>;
  constexpr int NG = S::NG, NB = S::NB, N32 = S::N32;
  constexpr bool kU8 = F == Fmt::U4;
  // weights with a stored min, or with min 8 scale (Q4_0: folded into the
  // integer sum, sum (q - 8) x); either needs x's 16-sums
  bool has_min[NACC], min8[NACC], any_min = false;
#pragma unroll
  for (int a = 0; a < NACC; ++a) {
    has_min[a] = cols.min[a] != nullptr;
    min8[a] = cols.min8[a];
    any_min |= has_min[a] || min8[a];
  }
  // the chunk's scales (and mins) of the lane's output columns: NG a column
  float sc[NACC][NT][2][NG], mn[NACC][NT][2][NG];
#pragma unroll
  for (int a = 0; a < NACC; ++a)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int at = cols.off[nt][j] + ch * NG;
        load_n<NG, SMEM>(cols.scale[a] + at, sc[a][nt][j]);
#pragma unroll
        for (int q = 0; q < NG; ++q) mn[a][nt][j][q] = 0.f;
        if (has_min[a]) load_n<NG, SMEM>(cols.min[a] + at, mn[a][nt][j]);
      }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    // each row's block scales (d / 256) and, for weights with a min, 16-sums
    float dx[2][N32];
    int s16[2][2 * N32];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < N32; ++i) dx[h][i] = 0.f;
#pragma unroll
      for (int i = 0; i < 2 * N32; ++i) s16[h][i] = 0;
      if (h == 1 && !rows8[mt]) break;
      load_n<N32, SMEM>(xr[mt].d[h] + ch * N32, dx[h]);
      if (any_min) {
#pragma unroll
        for (int i = 0; i < 2 * N32; i += 4)
          load_n<4, SMEM>(xr[mt].s[h] + ch * 2 * N32 + i, *reinterpret_cast<int(*)[4]>(&s16[h][i]));
      }
    }
#pragma unroll
    for (int q = 0; q < NG; ++q) {
      // A registers per row: q1 of elements 0-3, q2 of 0-3, q1 of 4-7, q2 of 4-7
      const int at = 2 * (a_ch * S::KC + S::first(q, 0));  // bytes past the lane's first
      uint32_t A[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (h == 1 && !rows8[mt]) break;  // (zeros: rows nobody reads)
        const uint8_t* p =
            SMEM ? xr[mt].q[h] + ((xr[mt].lane + at) ^ xr[mt].swizzle) : xr[mt].q[h] + at;
        if constexpr (NB == 2) {
          const uint4 v = load_x16<SMEM>(p);
          A[h][0] = v.x, A[h][1] = v.y, A[h][2] = v.z, A[h][3] = v.w;
        } else {
          const uint2 v = load_x8<SMEM>(p);
          A[h][0] = v.x, A[h][1] = v.y;
        }
      }
      const int q32 = IG == 16 ? q / 2 : q;  // the activation block of group q
#pragma unroll
      for (int a = 0; a < NACC; ++a)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          // each level's sums: c1 (q1) and c2 (q2), rows g and g + 8
          int c1[4] = {0, 0, 0, 0}, c2[4] = {0, 0, 0, 0};
          const uint32_t b0 = b[a][nt][q][0], b1 = b[a][nt][q][NB - 1];
          if (!SMEM && !rows8[mt]) {
            // no row 8-15 read (a decode step of <= 8 rows): one mma, with row
            // g's two levels as its rows g and g + 8 (A[0] as loaded); the
            // same integers as two
            int cc[4];
            if constexpr (NB == 2)
              imma_k32<kU8>(cc, A[0][0], A[0][1], A[0][2], A[0][3], b0, b1);
            else
              imma_k16(cc, A[0][0], A[0][1], b0);
            c1[0] = cc[0], c1[1] = cc[1], c2[0] = cc[2], c2[1] = cc[3];
          } else if constexpr (NB == 2) {
            imma_k32<kU8>(c1, A[0][0], A[1][0], A[0][2], A[1][2], b0, b1);
            imma_k32<kU8>(c2, A[0][1], A[1][1], A[0][3], A[1][3], b0, b1);
          } else {
            imma_k16(c1, A[0][0], A[1][0], b0);
            imma_k16(c2, A[0][1], A[1][1], b0);
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (i >= 2 && !rows8[mt]) continue;  // rows nobody reads
            const int h = i / 2, j = i % 2;
            const int xs = IG == 16 ? s16[h][q] : s16[h][2 * q] + s16[h][2 * q + 1];
            // |256 c1 + c2 (- 8 xs)| < 2^28: one rounding (6e-8) at most
            const int sum = c1[i] * 256 + c2[i] - (min8[a] ? 8 * xs : 0);
            float& out = acc[a][mt][nt][i];
            out = __fmaf_rn(__int2float_rn(sum), __fmul_rn(dx[h][q32], sc[a][nt][j][q]), out);
            if (has_min[a])
              out = __fmaf_rn(-mn[a][nt][j][q], __fmul_rn(__int2float_rn(xs), dx[h][q32]), out);
          }
        }
    }
  }
}

}  // namespace wick::cuda
