// CPU kernels behind CpuBackend. Activations are f32 rows; weights keep
// their stored type and are dequantized inside the products.
#pragma once

#include <cstdint>
#include <future>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace wick::cpu {

void set_n_threads(int n);  // 0 = all cores, at most the cgroup's CPU limit (cpu_limit.h)
int n_threads();
// Runs f on a thread of its own and returns what it returns (or throws what it
// throws), for work with parallel regions off the thread that runs the model
// (a load's packing and conversions): libgomp keeps a team of workers for
// every thread that has started a region, for that thread's life, and once a
// process holds more of them than there are cores it has every team sleep at
// each region's end (a decode step has hundreds). This thread's team goes
// with it. (docs/perf.md, session 70: a server decoded at a third of the
// CLI's rate.)
template <class F>
auto on_own_thread(F&& f) {
  return std::async(std::launch::async, std::forward<F>(f)).get();
}
// Per-thread scratch of at least n floats, grown and reused (no allocation per call).
float* thread_buf(size_t n);

void embed(const Weight& tok, const int32_t* ids, int64_t n, float* out);  // out [n, n_in]
void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y);
// y[r, o] = sum_i w[o, i] * x[r, i];  x [n_rows, w.n_in], y [n_rows, w.n_out]
void matmul(const Weight& w, const float* x, int64_t n_rows, float* y);
// ys[i] = x . ws[i]^T for several weights of the same n_in (q, k, v; gate, up): the bits of
// matmul for each, in one pass over x and one parallel region where their packed forms allow.
void matmul_shared_input(std::span<const Weight* const> ws, const float* x, int64_t n_rows,
                         float* const* ys);
// Several products (the experts of a layer): each y = x . w^T with the bits of matmul, in one
// parallel region over all their panels where the weights share a packed form. A job reading
// the same x and rows as the one before it shares its converted activations.
struct MatmulJob {
  const Weight* w;
  const float* x;  // [n_rows, w.n_in]
  int64_t n_rows;
  float* y;  // [n_rows, w.n_out]
};
void matmul_many(std::span<const MatmulJob> jobs);
void add_bias(float* y, const float* b, int64_t n_rows, int64_t n);
void add(float* y, const float* x, int64_t n);           // y += x
void scale(float* x, float s, int64_t n);                // x *= s
void silu_mul(float* gate, const float* up, int64_t n);  // gate = silu(gate) * up
// NeoX-style RoPE (pairs i and i + head_dim/2) in place: x [n_rows, n_heads, head_dim].
void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
          const float* inv_freq);
// k, v [n, kv_dim] into rows slots[i] of one layer's K and V storage (f32; f16
// rounded to nearest; q8_0 blocks of 32, as wick quantize writes them).
void kv_write(void* k_layer, void* v_layer, DType dtype, int64_t kv_dim, const int32_t* slots,
              int64_t n, const float* k, const float* v);
// out[t] = |k_t - k_layer[slots[t]]|^2 + |v_t - v_layer[slots[t]]|^2, summed in element order.
void kv_deviation(const void* k_layer, const void* v_layer, DType dtype, int64_t kv_dim,
                  const int32_t* slots, int64_t n, const float* k, const float* v, float* out);
// cos and sin of every (position, frequency) for rotating pre-RoPE keys,
// computed as rope() computes them; grown on demand.
class RopeTable {
 public:
  void ensure(const float* inv_freq, int64_t head_dim, int64_t n_pos);
  const float* row(int64_t pos) const { return cs_.data() + pos * head_dim_; }  // cos | sin

 private:
  std::vector<float> freq_;  // the frequencies it was made for
  int64_t head_dim_ = 0, n_pos_ = 0;
  std::vector<float> cs_;  // [n_pos][head_dim]: cos of the half, then sin
};

// out [n_tokens, n_head * head_dim]: causal attention of q over each token's
// own sequence, through the batch's block table (skipping holes past a
// block's fill), on one layer's storage (f32, f16, bf16 or q8_0 rows); `rope` set for
// pre-RoPE keys.
void attention(const float* q, const void* k_layer, const void* v_layer, DType dtype,
               int64_t kv_dim, const BatchArgs& b, const AttnShape& s, const RopeTable* rope,
               float* out);

// How attention reads the cache: a work item of every KV head reading its chunks' whole
// rows, or of one head reading its slice of each row. Auto (the default) takes whole rows
// for decode-sized stretches when that leaves work for every thread; tests and benchmarks
// pin one. Either way gives the same bits.
enum class KvReads { Auto, WholeRows, HeadSlices };
void set_kv_reads(KvReads r);

// Mixture of experts (see Backend::moe_route / moe_mlp).
void moe_route(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, bool norm,
               int32_t* ids, float* w);
struct MoeScratch {
  std::vector<float> x, gate, up, out;  // the rows of a group of experts, expert by expert
  std::vector<float> row_w;             // routing weight of each routed row, expert by expert
  std::vector<int32_t> rows;            // the token of each routed row, expert by expert
  std::vector<int32_t> first, next;     // each expert's first routed row; a fill cursor
  std::vector<MatmulJob> jobs;
};
void moe_mlp(std::span<const ExpertWeights> experts, const float* x, int64_t n_tokens, int64_t k,
             const int32_t* ids, const float* w, float* out, MoeScratch& s);

}  // namespace wick::cpu
