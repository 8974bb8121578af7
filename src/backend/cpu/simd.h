// Innermost CPU kernels, compiled once per ISA (generic, AVX2, AVX-512, AVX-512
// with VNNI and BF16) and chosen once at run time from what the processor supports.
// "amx" is the AVX-512 BF16 set with the BF16 path's products on AMX tiles.
#pragma once

#include <cstdint>

#include "io/dtype.h"

namespace wick::cpu {

struct PackedMatrix;
struct ActRows;
struct ActBlock;

struct SimdKernels {
  const char* isa;
  float (*dot)(const float* a, const float* b, int64_t n);
  // y[i] += a * x[i]
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  // Dequantizes n elements of a row into dst (any supported dtype).
  void (*dequant_row)(DType t, const void* src, float* dst, int64_t n);
  // dot(x, dequantized row w): bit-identical to dequant_row + dot, fused where
  // the ISA has a kernel for the type. buf holds n floats for the fallback.
  float (*dot_row)(DType t, const void* w, const float* x, int64_t n, float* buf);

  // The blocked matrix multiply on packed weights (packed.h).
  bool bf16_dp;  // has vdpbf16ps: the BF16 path
  // y [a.n_rows, m.n_out], the columns of panels [p0, p1) only.
  void (*gemm)(const PackedMatrix& m, const ActRows& a, int64_t p0, int64_t p1, float* y);
  // Rows of x (n_in a multiple of 32) into the I8 (1 level) or I8X3 (3 levels) paths' form.
  void (*quantize_rows)(const float* x, int64_t ldx, int64_t n_rows, int64_t n_in, int n_levels,
                        int8_t* q, int64_t ldq, ActBlock* blk, int64_t ldb);
  // Rows of x into the BF16 path's form (bf16 pairs; only where bf16_dp).
  void (*bf16_rows)(const float* x, int64_t ldx, int64_t n_rows, int64_t n_in, uint32_t* h,
                    int64_t ldh);

  // One query head over the live keys of a chunk of 64 (attention.cpp): kt the chunk's keys
  // transposed [hd][64], v the value rows, st = (max, sum, out[hd]) of the online softmax.
  void (*attn_chunk)(const float* q, int64_t hd, float scale, const float* kt,
                     const float* const* v, uint64_t live, float* st);
  // Two (three) query heads of the KV head at once (q[2], st[2]), the chunk's loads shared;
  // the same bits as two (three) attn_chunk calls.
  void (*attn_chunk2)(const float* const* q, int64_t hd, float scale, const float* kt,
                      const float* const* v, uint64_t live, float* const* st);
  void (*attn_chunk3)(const float* const* q, int64_t hd, float scale, const float* kt,
                      const float* const* v, uint64_t live, float* const* st);
  void (*silu_mul)(float* gate, const float* up, int64_t n);  // gate = silu(gate) * up
  // n_rows rows of n elements of type t (f16, bf16 or q8_0; src_stride bytes apart) widened into
  // f32 rows (dst_stride apart).
  void (*kv_rows)(DType t, const void* src, size_t src_stride, float* dst, int64_t dst_stride,
                  int64_t n_rows, int64_t n);
  void (*f16_from_f32)(const float* src, uint16_t* dst, int64_t n);  // rounded to nearest even
  // kt [hd][64] = 64 rows of hd elements of type t, f32, f16 or q8_0 (nullptr: zeros), as f32
  // transposed (a chunk's keys for attn_chunk); q8_0 rows start at a block.
  void (*keys_t)(const void* const* rows, DType t, int64_t hd, float* kt);

  // Attention over a bf16 cache on AMX tiles: the amx set's, nullptr in the others
  // (attention_amx.inc). attn_bf16_kv lays a chunk's 64 key and value rows (bf16, hd elements;
  // nullptr: zeros) out as B tiles; attn_bf16 takes n_rows query rows (bf16, hd rounded up to
  // 32 apart, zeros past hd and past n_rows to a multiple of 16) through the chunk: row r's
  // live keys, its state st + r * n_st as attn_chunk's. attn_bf16_done after a work item's
  // calls (the tiles released).
  void (*attn_bf16_kv)(const uint16_t* const* k, const uint16_t* const* v, int64_t hd, uint32_t* kb,
                       uint32_t* vb);
  void (*attn_bf16)(const uint16_t* q, int64_t n_rows, int64_t hd, float scale, const uint32_t* kb,
                    const uint32_t* vb, const uint64_t* live, float* st, int64_t n_st);
  void (*attn_bf16_done)();
};

// The best for this CPU; WICK_ISA=generic|avx2|avx512|avx512bf16|amx overrides. In the ASan
// tree, that set built without sanitizers (simd.cpp); simd_for() gives the checked one.
const SimdKernels& simd();
// WICK_CPU_PREFETCH=1: the products prefetch the weights they stream from memory in software
// (off by default: on the machines measured last the hardware's prefetch alone read them
// 5-30 % faster in decode, docs/perf.md). Read once.
extern const bool sw_prefetch;
const SimdKernels* simd_for(const char* isa);  // nullptr when not compiled in or unsupported here

}  // namespace wick::cpu
