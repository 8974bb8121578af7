// Launchers of the CUDA kernels, callable from host C++ (no CUDA syntax here).
// Every pointer is device memory; every launch goes on `st` and returns at once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/batch.h"
#include "backend/cuda/gpu_weight.h"
#include "backend/sample.h"

namespace wick::cuda {

// ---- act_quant.cu ----
// x's integer form for integer products (matmul_int.cuh), made by the norm
// that wrote x (rmsnorm / add_rmsnorm given one) or by the gate/up product
// (matmul_gate_up given one, for down), in both stored orders:
// for 8-bit weights and for 4-bit ones, each with the rows those weights'
// k_pad apart. Products of its M rows of n take it instead of quantizing x
// again: the same bits, one kernel less. The caller vouches that x is still
// what its maker wrote.
struct NormInt {
  void* buf = nullptr;  // norm_int_bytes(M, n) bytes
  int M = 0, n = 0;
  bool for_i8 = true, for_u4 = true;  // the forms made (for 8-bit, 4-bit weights)
};
size_t norm_int_bytes(int M, int n);
// The activations of one product in integer form (act_quant.cu). The
// stored order of a row's elements is k's, or for U4 weights, in each 8,
// the 4 even elements and then the 4 odd ones.
struct IntAct {
  const uint8_t* q = nullptr;  // [M][2 k_pad]: per 4 stored elements, their q1 bytes, then q2
  const float* d = nullptr;    // [M][k_pad / 32]: d / 256 of each block
  const int* s = nullptr;      // [M][k_pad / 16]: the sum of 256 q1 + q2 over each 16
};

// x [M][n_in] in integer form (zeros past n_in) in `scratch`, of
// int_act_bytes(M, k_pad) bytes; nibbles: U4's stored order (act_quant.cu).
IntAct quantize_act(const float* x, int M, int n_in, int k_pad, bool nibbles, void* scratch,
                    cudaStream_t st);
size_t int_act_bytes(int M, int k_pad);
// The integer form in ni (made by a norm or gate/up) for weights of format f
// (k's order for I8, U4's for U4; rows k_pad_of(f, n) apart).
IntAct norm_int_act(const NormInt& ni, Fmt f);
// The forms a kernel writes beside its output (the norms, gate/up,
// attention): each order's levels (null: not wanted), rows k_i8 / k_u4 apart.
struct IntOut {
  IntAct i8, u4;
  int k_i8 = 0, k_u4 = 0;
  constexpr bool any() const { return i8.q || u4.q; }
  constexpr int k_pad() const {  // the longer padded row of the forms written
    const int a = i8.q ? k_i8 : 0, b = u4.q ? k_u4 : 0;
    return a > b ? a : b;
  }
};
IntOut int_out(const NormInt& ni);

// Activation quantizations launched so far, in this process (tests check
// which products took a norm's form).
uint64_t quantize_act_launches();

// ---- matmul.cu ----
// y [M, w.n_out] = x [M, w.n_in] . w^T (+ bias [n_out]). Each output element
// is reduced in an order fixed by the weight's shape alone, whatever M is.
struct MatmulJob {
  const GpuWeight* w;
  float* y;
  const float* bias;  // may be null
};
// Up to 3 products of the same x in one launch (q, k, v). xb: scratch of
// matmul_scratch_bytes(M, k_pad) bytes for the tiled (prefill) kernel, which
// computes the same bits as the decode kernel, and for integer products
// (int_path: required); null keeps the decode kernel.
// ni: x's integer form from its norm, or null (here and below).
void matmul(const MatmulJob* jobs, int n_jobs, const float* x, int M, void* xb, cudaStream_t st,
            const NormInt* ni = nullptr);
// out [M, n_ff] = silu(x . gate^T) * (x . up^T). With out_int (integer
// products of up to 16 rows, so the decode kernel): out's integer form too
// (NormInt's layout, n = n_ff), for the down product, with quantize_act's
// bits; counters: ceil(n_ff / 32) ints, zero between launches (the kernel
// leaves them so). Returns whether it wrote that form.
bool matmul_gate_up(const GpuWeight& gate, const GpuWeight& up, const float* x, int M, float* out,
                    void* xb, cudaStream_t st, const NormInt* ni = nullptr,
                    const NormInt* out_int = nullptr, int* counters = nullptr);
// g = x . gate^T and u = x . up^T apart (a LoRA term adds to either before
// silu(g) * u), at matmul_gate_up's slice count: rows without an adapter
// keep the fused launch's bits. The weights as matmul_gate_up's.
void matmul_gate_up_apart(const GpuWeight& gate, const GpuWeight& up, const float* x, int M,
                          float* g, float* u, void* xb, cudaStream_t st,
                          const NormInt* ni = nullptr);
// The counters matmul_gate_up's integer output takes for n_ff columns.
inline int gated_int_counters(int n_ff) {
  return (n_ff + 31) / 32;
}
size_t matmul_scratch_bytes(int M, int k_pad);
// q, k, v of a decode batch with RoPE and the KV cache write in the
// product's epilogue: the bits of matmul() then rope_kv_write(), one kernel
// instead of two. Returns false, launching nothing, where it does not apply
// (more than 16 rows, weights that do not share one launch, f32 weights,
// WICK_CUDA_FUSE_ROPE=0, integer products without xb, matmul()'s scratch);
// the caller then runs the two.
struct RopeKv {
  const int32_t* pos = nullptr;     // [M] RoPE positions
  const int32_t* slots = nullptr;   // [M] cache slots
  const float* inv_freq = nullptr;  // [head_dim / 2]
  void* k_cache = nullptr;          // one layer: [n_slots, kv_dim], f16 or f32 (no Q8)
  void* v_cache = nullptr;
  bool cache_f16 = true;
  bool rotate_k = true;  // false: the cache keeps keys before RoPE
  int head_dim = 0;
};
bool matmul_qkv_rope_kv(const MatmulJob (&jobs)[3], const float* x, int M, const RopeKv& r,
                        void* xb, cudaStream_t st, const NormInt* ni = nullptr);
// proj = in . w^T for a one-row batch, then x += proj and y = rmsnorm(x) * w
// (add_rmsnorm's bits), the norm taken by the product's last CTA: one kernel
// instead of two. Returns false, launching nothing, where it does not apply
// (more than one row, f32 weights, a bias, WICK_CUDA_FUSE_NORM off).
struct AddNorm {
  float* x = nullptr;        // [n] the residual stream (n = the weight's n_out)
  const float* w = nullptr;  // [n] the norm's weights
  float eps = 0.f;
  float* y = nullptr;      // [n]
  int* counter = nullptr;  // one int, zero between launches (the kernel leaves it so)
};
bool matmul_add_rmsnorm(const MatmulJob& job, const float* in, int M, const AddNorm& a,
                        cudaStream_t st);
// The most slices of k a weight of <= 2,048 rows takes (WICK_CUDA_KW_MAX, default
// 32; 4 to 32): sets every later product's reduction order (tests set it).
void set_kw_max(int kw);
int kw_max();
// Every weight's slice count, whatever its shape (4 to 32; 0, the default:
// kw_for's rule): for benchmarks that search the rule's table.
void set_kw_force(int kw);
// 8-row tiles a warp takes in decode products of up to 16 rows of 16-bit
// weights (1, 2 or 4; 0, the default: 4 from WICK_CUDA_TALL_ROWS rows, else
// 1), and of 8- and 4-bit weights with integer products, not gated (1 or 2;
// 0, the default: 1; bf16 products of them always 1). A tile shape never
// changes a result's bits: for benchmarks.
void set_decode_tiles(int nt);
// Whether matmul_add_rmsnorm fuses (WICK_CUDA_FUSE_NORM, default off; tests set it).
void set_fuse_norm(bool on);
bool fuse_norm();
// Integer products for 8- and 4-bit weights (matmul_int.cuh): the weights'
// levels against x quantized to two int8 levels per block of 32, on the
// tensor cores, the same sums in the decode and tiled kernels; off: bf16
// products.
// WICK_CUDA_INT_MMA (0 or 1, default 0: slower on an H200, session 57); tests set it. It
// holds for every later product (a model's results change with it).
void set_int_products(bool on);
bool int_products();
// Integer products' decode kernels of 8-bit weights held to 128 registers
// (WICK_CUDA_INT_R128: 0 none, 1 the default: those not gated, 2 gated too,
// which spill 184 bytes): more warps an SM, the same bits.
void set_int_r128(int level);
int int_r128();
// Whether bf16 products of up to 16 rows stage x in shared memory as bf16
// once a CTA (matmul.cu, XS; WICK_CUDA_X_STAGE, default 1; the same bits
// either way: for measuring and tests).
void set_x_stage(bool on);
bool x_stage();
// Whether integer products of up to 4 rows (decode steps) take dp4a on the
// CUDA cores (matmul_dp4a.cuh; WICK_CUDA_INT_DP4A, default 1) instead of the
// tensor cores' mma: the same integer sums, so the same bits either way.
void set_int_dp4a(bool on);
bool int_dp4a();
// Whether products of w take integer products: they need matmul()'s scratch
// (xb) at every batch size then.
bool int_path(const GpuWeight& w);
// Whether the backend's norms (and decode steps' gate/up) make their
// output's integer form for the products after them (NormInt;
// WICK_CUDA_NORM_INT, default 1; the same bits either way: for measuring and
// tests).
void set_norm_int(bool on);
bool norm_int();
// Whether 4-bit weights' prefill takes the tiled kernel (WICK_CUDA_TILED_U4,
// default 1; 0: the decode kernel's tiles, as before it had them; the same
// bits either way: for measuring).
void set_tiled_u4(bool on);
bool tiled_u4();
// Whether the tiled kernel decodes 8- and 4-bit weights once a CTA into a
// bf16 tile that its warps share (WICK_CUDA_PREDECODE, default 1; 0: each
// warp decodes the weights of its own tiles; the same bits either way).
void set_predecode(bool on);
bool predecode();
// A lower ceiling on the kernels' shared memory than the GPU's own
// (WICK_CUDA_SMEM_LIMIT, bytes, >= 49,152; 0: none), so that the shapes and
// kernels a smaller GPU takes (an A100's 163 KB, an RTX 4090's 99 KB) run
// and are tested on any GPU; the same bits either way.
void set_smem_limit(int bytes);
int smem_limit();
// Which kernel computes products (tests compare the two): Auto picks by shape.
enum class MatmulPath { Auto, Tiled, DecodeKernel };
void set_matmul_path(MatmulPath path);

// Mixture of experts: rows grouped by expert. tiles[i] = (expert, first
// row, rows, 0) with rows <= tile_rows (grouped_tile_rows); expert < 0 unused.
struct GroupedMatmul {
  const GpuWeight* experts;  // device: [n_expert][3] gate, up, down
  GpuWeight shape;           // one expert's weight of the kind computed (host copy)
  int which;                 // 0: silu(gate) * up, 2: down
  const int4* tiles;
  int n_tiles;
  int n_rows;      // rows of all experts together
  const float* x;  // [n_rows, shape.n_in]
  float* y;        // [n_rows, shape.n_out]
  // integer products (int_path(shape)): x's integer form, of
  // matmul_scratch_bytes(n_rows, shape.k_pad) bytes
  void* xq = nullptr;
  int tile_rows = 16;  // the most rows a tile holds (grouped_tile_rows)
};
// Rows a tile of the experts' products holds at most (16, 32 or 64), for
// both of a layer's products (gate/up and down; their kernels by weight type).
int grouped_tile_rows(int n_rows, const GpuWeight& gate, const GpuWeight& down);
void matmul_grouped(const GroupedMatmul& g, cudaStream_t st);
void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t st);

// ---- lora.cu ----
// One LoRA term of a weight as the device reads it: a [rank, n_in] and
// b [n_out, rank] dense (F32, BF16 or F16; rows a_stride / b_stride
// elements apart), scale [rank]; its ranks take t's columns [t_off, t_off + rank).
struct LoraTerm {
  const void* a = nullptr;
  const void* b = nullptr;
  const float* scale = nullptr;
  Fmt a_fmt = Fmt::F32, b_fmt = Fmt::F32;
  int32_t a_stride = 0, b_stride = 0;
  int32_t rank = 0;
  int32_t adapter = 0;  // 0: every row; k: rows whose adapter_of is k
  int32_t t_off = 0;
};
// y [n_rows, n_out] += b (scale * (a x)) for each of a weight's n_terms terms
// (device table, t_off ascending, in list order) that applies to a row;
// adapter_of [n_rows] or null (named adapters' terms then apply to no row);
// t: scratch of n_rows * total_rank floats.
void lora_add(const LoraTerm* terms, int n_terms, int total_rank, const int32_t* adapter_of,
              const float* x, int n_rows, int n_in, int n_out, float* t, float* y, cudaStream_t st);

// ---- elementwise.cu ----
void embed(const GpuWeight& tok, const int32_t* ids, int n, float* out, cudaStream_t st);
// ni (of n_rows rows of n): y's integer form there too.
void rmsnorm(const float* x, const float* w, int n_rows, int n, float eps, float* y,
             cudaStream_t st, const NormInt* ni = nullptr);
void add_rmsnorm(float* x, const float* r, const float* w, int n_rows, int n, float eps, float* y,
                 cudaStream_t st, const NormInt* ni = nullptr);
void add(float* y, const float* x, int64_t n, cudaStream_t st);
void scale(float* x, float s, int64_t n, cudaStream_t st);  // x *= s
void add_bias(float* y, const float* b, int n_rows, int n, cudaStream_t st);
void rope(float* x, const int32_t* pos, int n_rows, int n_heads, int head_dim,
          const float* inv_freq, cudaStream_t st);
// One layer of the KV cache as the kernels address it. Q8: q8_0's values
// (a scale d and 32 int8 q a block, each element q d), laid out planar:
// [n_slots][kv_dim] int8, then [n_slots][kv_dim / 32] f16 scales. That is
// row_bytes(Q8_0, kv_dim) a slot, as the engine sizes the cache, with rows
// of whole 32-byte sectors for the attention kernels' loads.
enum class KvType : uint8_t { F32, F16, Q8 };
struct KvLayer {
  KvType type = KvType::F16;
  void* k = nullptr;  // [n_slots][kv_dim] elements of type (Q8: the int8 q)
  void* v = nullptr;
  void* k_scale = nullptr;  // Q8: [n_slots][kv_dim / 32] f16 d
  void* v_scale = nullptr;
};
// RoPE on q and (when rotate_k) k, then k and v into slot rows of one
// layer's cache (kv_dim per row; Q8: kv_dim a multiple of 32, each block of
// 32 quantized as the CPU's quantize_row_q8_0 does, the same bytes).
void rope_kv_write(float* q, float* k, const float* v, const KvLayer& cache, bool rotate_k,
                   const int32_t* slots, const int32_t* pos, int n_tokens, int n_head,
                   int n_head_kv, int head_dim, const float* inv_freq, cudaStream_t st);
// table [n_pos][head_dim]: cos(p f_i) for i < head_dim / 2, then sin(p f_i),
// as the RoPE kernels compute them (for rotating pre-RoPE keys).
void rope_table(const float* inv_freq, int head_dim, int n_pos, float* table, cudaStream_t st);
void kv_write(const float* k, const float* v, const KvLayer& cache, const int32_t* slots,
              int n_tokens, int kv_dim, cudaStream_t st);
// out[t] = |k_t - K[slots[t]]|^2 + |v_t - V[slots[t]]|^2 over one layer's cache rows
// (k, v rounded as the cache stores them first).
void kv_deviation(const float* k, const float* v, const KvLayer& cache, const int32_t* slots,
                  int n_tokens, int kv_dim, float* out, cudaStream_t st);
void gather_rows(const float* x, const int32_t* rows, int n_rows, int n, float* out,
                 cudaStream_t st);

// ---- attention.cu ----
struct AttnArgs {
  const float* q;  // [n_tokens, n_head, head_dim]
  KvLayer cache;   // one layer, rows of n_head_kv * head_dim
  float* out;      // [n_tokens, n_head * head_dim]
  float* partial;  // scratch, attention_partial_floats() of them
  int n_head, n_head_kv, head_dim, sliding_window;
  const float* rope = nullptr;  // pre-RoPE keys: rope_table rows to rotate them by, else null
  float score_factor = 1.f;     // on q.k / sqrt(head_dim) (YaRN)
  // the output's integer form too (for the o product's integer products;
  // int_out of a NormInt for rows of n_head * head_dim), where attention()
  // can (it says whether it wrote it)
  IntOut out_form{};
};
// Keys are split into partitions of this many positions, each reduced on
// its own and combined in partition order (flash-decoding).
constexpr int kAttnPartition = 512;
size_t attention_partial_floats(const BatchArgs& b, int n_head, int head_dim);
// Whether decode batches of this head_dim may take the decode kernel on this
// GPU (its shared memory, WICK_CUDA_SMEM_LIMIT, WICK_CUDA_ATTN_DECODE); a
// batch then also needs few enough CTAs (at most half the SMs).
bool attention_decode_kernel(int head_dim);
// Returns whether it wrote the output's integer form (asked for in a): the
// decode kernel's batches (up to 16 rows of a KV head's group in a run, few
// enough CTAs) of an f16 cache, head_dim >= 32; elsewhere it writes none.
bool attention(const AttnArgs& a, const BatchArgs& b, cudaStream_t st);

// ---- moe.cu ----
void moe_route(const float* logits, int n_tokens, int n_expert, int k, bool norm, int32_t* ids,
               float* w, cudaStream_t st);
// Scratch floats moe_mlp needs for n_tokens * k rows.
size_t moe_scratch_floats(int n_tokens, int k, int n_embd, int n_ff);
size_t moe_scratch_ints(int n_tokens, int k, int n_expert);
// Scratch bytes for the experts' x in integer form (0: bf16 products).
size_t moe_scratch_int_bytes(int n_tokens, int k, const GpuWeight& gate_shape,
                             const GpuWeight& down_shape);
// out [n_tokens, n_embd] = sum of w * down(silu(gate x) * up x) over each
// token's experts, in expert order. experts: device [n_expert][3];
// shape: host copies of one expert's gate and down weights; xq: of
// moe_scratch_int_bytes (may be null where that is 0).
void moe_mlp(const GpuWeight* experts, int n_expert, const GpuWeight& gate_shape,
             const GpuWeight& down_shape, const float* x, int n_tokens, int k, const int32_t* ids,
             const float* w, float* out, float* scratch, int32_t* iscratch, void* xq,
             cudaStream_t st);

// ---- sample.cu ----
// One token per row of logits [n_rows, n_vocab] (modified in place by the
// penalties), as Backend::sample describes; rows, pairs and ids are device
// memory, scratch holds sample_scratch_bytes(n_rows, n_vocab) bytes.
size_t sample_scratch_bytes(int n_rows, int n_vocab);
void sample(float* logits, int n_rows, int n_vocab, const SampleRow* rows, const int32_t* pairs,
            int32_t* ids, void* scratch, cudaStream_t st);

}  // namespace wick::cuda
