// The kernel interface the forward pass runs on. One orchestration
// (model/forward.cpp) calls these; the CPU implements them now and CUDA
// behind the same signatures. Every pointer a kernel takes is in the
// backend's memory (host memory for the CPU, device memory for CUDA);
// activations are f32 rows. Weights are prepared once at load (the backend
// may repack or upload them), and the batch is uploaded once per step.
//
// A backend is used by one thread at a time (the engine thread), and the
// results of queued work are visible to the host after copy_to_host().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/batch.h"
#include "backend/sample.h"
#include "backend/weight.h"

namespace wick {

class Backend;

// Memory owned by a backend; frees itself.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* be, void* p, size_t bytes) : be_(be), p_(p), bytes_(bytes) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  ~Buffer() { reset(); }
  void reset();
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  Backend* be_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Paged KV storage for every layer: slot s of layer l holds the key and the
// value rows (kv_dim elements each, of `dtype`) of one token. Block b holds
// slots [b * block_size, (b + 1) * block_size).
struct KvStore {
  int64_t n_layer = 0, n_slots = 0, kv_dim = 0, block_size = 0;
  DType dtype = DType::F32;
  // Keys stored before RoPE and rotated by their position when attention
  // reads them (the span cache: a span's blocks serve any offset).
  bool pre_rope = false;
  Buffer k, v;  // [n_layer][n_slots][kv_dim]

  int64_t n_blocks() const { return n_slots / block_size; }
  size_t layer_bytes() const { return size_t(n_slots) * row_bytes(dtype, kv_dim); }
  template <typename T>
  T* k_layer(int64_t il) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(k.data()) + size_t(il) * layer_bytes());
  }
  template <typename T>
  T* v_layer(int64_t il) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(v.data()) + size_t(il) * layer_bytes());
  }
};

struct AttnShape {
  int64_t n_head, n_head_kv, head_dim;
  int64_t sliding_window;           // 0 = none; else each token sees this many positions
  const float* inv_freq = nullptr;  // [head_dim / 2] RoPE frequencies (for pre-RoPE keys)
  float score_factor = 1.f;         // on q.k / sqrt(head_dim) (YaRN: its attention factor squared)
};

struct KvSpec {
  int64_t n_layer = 0, n_blocks = 0, block_size = 0, kv_dim = 0;
  bool pre_rope = false;
};

// Named intermediates, for comparing backends tensor by tensor: called with
// the name, the layer (-1 outside layers) and the host copy of the rows.
using TraceFn = std::function<void(std::string_view name, int64_t layer, const float* data,
                                   int64_t n_rows, int64_t n_cols)>;

enum class Device { Cpu, Cuda, Auto };
Device parse_device(const std::string& s);  // "cpu", "cuda", "auto"; throws otherwise
const char* device_name(Device d);

struct BackendOptions {
  Device device = Device::Auto;
  bool gpu_f32 = false;               // keep f32 weights (and KV) in f32 on a GPU
  double gpu_memory_fraction = 0.90;  // of the device's memory wick may use
  int gpu_index = 0;
  std::string quantize;  // at load: f32/f16/bf16 matrices quantized to this plan ("" keeps them)
  // The KV cache's type: "f32" (the CPU, or a GPU with gpu_f32), "f16",
  // "q8_0" or "" (the device's default: f32 on the CPU, f16 on a GPU, f32
  // there with gpu_f32).
  std::string kv_cache_dtype;
  // At load: rope scaling over the model's (none/linear/yarn; "" keeps it),
  // its scale, and YaRN's trained context (0: the model's).
  std::string rope_scaling;
  float rope_scale = 0.f;
  int64_t yarn_orig_ctx = 0;
  // At load: LoRA adapters (a GGUF file or a PEFT folder) and their scales.
  std::vector<std::pair<std::string, float>> lora;
  // At load: named adapters (name, path), each applied only to the requests
  // that choose it (GenerateRequest::adapter; a server's --lora-modules), on
  // the model that lora_modules_model names (a path or stored name) alone.
  // Adapter k is lora_modules[k - 1]; an empty name: one removed (numbers
  // are never reused).
  std::vector<std::pair<std::string, std::string>> lora_modules;
  std::string lora_modules_model;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu (avx512)", "cuda (NVIDIA H100 ...)"
  virtual Device device() const = 0;

  // Memory. Copies to the host wait for the work queued before them.
  virtual Buffer alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void sync() {}
  // Bytes the KV cache may take (the device's budget left after the weights),
  // or 0 when the backend sets no limit of its own (the CPU).
  virtual size_t kv_budget() const { return 0; }
  // The engine's tokens a step where the config leaves it open (0): a GPU's
  // prefill wants longer steps than a CPU's (docs/perf.md, 2026-11-27).
  virtual int32_t default_step_tokens() const { return 512; }

  // Weights, once at load. A matrix keeps its stored type (a backend may
  // repack it); a vector (norms, biases) becomes f32. The returned weights'
  // memory lives as long as the backend.
  virtual Weight prepare_matrix(const Weight& host) = 0;
  virtual Weight prepare_vector(const Weight& host) = 0;
  // Give back early what prepare_matrix / prepare_vector made of a weight
  // nothing will read again (a LoRA adapter removed while serving).
  virtual void release_matrix(const Weight& w) {}
  virtual void release_vector(const Weight& w) {}
  // The experts of one MoE layer (the backend may place them side by side).
  virtual void prepare_experts(std::span<const ExpertWeights> host,
                               std::span<ExpertWeights> out) = 0;
  // Whether this backend's products add a weight's LoRA term (Weight::lora);
  // a model with adapters is refused by one that does not.
  virtual bool applies_lora() const { return false; }
  // w's list of LoRA terms (prepared by this backend) changed: terms linked
  // at load or while serving, or unlinked; called outside any step.
  virtual void lora_changed(const Weight& w) {}
  // The named adapter of each row of the products that follow (the step's
  // tokens, BatchArgs::adapter_of, in backend memory), or null: a term of a
  // named adapter is added to no row. Set by forward() around each step.
  virtual void set_adapter_rows(const int32_t* adapter_of, int64_t n_rows) {}

  virtual DType kv_dtype() const { return DType::F32; }  // what make_kv stores
  virtual std::unique_ptr<KvStore> create_kv(const KvSpec& spec) = 0;
  std::unique_ptr<KvStore> make_kv(int64_t n_layer, int64_t n_blocks, int64_t block_size,
                                   int64_t kv_dim, bool pre_rope = false) {
    return create_kv(KvSpec{n_layer, n_blocks, block_size, kv_dim, pre_rope});
  }
  // Copies whole KV blocks (source, destination), every layer: a private copy
  // of a shared span block before some of its tokens are recomputed.
  virtual void copy_blocks(KvStore& kv, std::span<const std::pair<int32_t, int32_t>> pairs) = 0;
  // Copies a finished batch into backend memory; valid until the next upload.
  virtual BatchArgs upload(const Batch& b) = 0;

  // Graphs: a backend that can record the kernels of a step replays them for
  // a later step with the same key (same shapes, same buffers). Freeing
  // backend memory drops every recorded graph.
  virtual bool can_graph() const { return false; }
  virtual bool replay(uint64_t key) { return false; }  // true when a graph ran
  virtual void capture_begin() {}
  virtual void capture_end(uint64_t key) {}
  virtual void capture_abort() {}  // a step failed while recorded: nothing kept

  // ---- kernels ----
  // out [n_tokens, n_embd]: the embedding rows of the batch's tokens.
  virtual void embed(const Weight& tok, const BatchArgs& b, float* out) = 0;
  // y = x / rms(x) * w per row of n (y may be x).
  virtual void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps,
                       float* y) = 0;
  // x += r, then y = rmsnorm(x, w): the residual add fused with the next norm.
  virtual void add_rmsnorm(float* x, const float* r, const float* w, int64_t n_rows, int64_t n,
                           float eps, float* y) {
    add(x, r, n_rows * n);
    rmsnorm(x, w, n_rows, n, eps, y);
  }
  // y[r, o] = sum_i w[o, i] * x[r, i];  x [n_rows, w.n_in], y [n_rows, w.n_out].
  // Each output element is reduced in an order that does not depend on n_rows.
  virtual void matmul(const Weight& w, const float* x, int64_t n_rows, float* y) = 0;
  // proj = in . w^T, then add_rmsnorm(x, proj, norm, ..., y): a block's last
  // product with the residual add and the next norm (one kernel on a GPU for
  // one-row batches); rows of w.n_out.
  virtual void matmul_add_rmsnorm(const Weight& w, const float* in, int64_t n_rows, float* proj,
                                  float* x, const float* norm, float eps, float* y) {
    matmul(w, in, n_rows, proj);
    add_rmsnorm(x, proj, norm, n_rows, w.n_out, eps, y);
  }
  // out[i] = x . w[i]^T + bias[i] for q, k and v (bias[i] may be null).
  virtual void matmul_qkv(const Weight* w[3], const float* bias[3], const float* x, int64_t n_rows,
                          float* out[3]) {
    for (int i = 0; i < 3; ++i) {
      matmul(*w[i], x, n_rows, out[i]);
      if (bias[i]) add_bias(out[i], bias[i], n_rows, w[i]->n_out);
    }
  }
  // gate = silu(gate @ x) * (up @ x): the two products of a gated MLP.
  virtual void matmul_gate_up(const Weight& gate, const Weight& up, const float* x, int64_t n_rows,
                              float* g, float* u) {
    matmul(gate, x, n_rows, g);
    matmul(up, x, n_rows, u);
    silu_mul(g, u, n_rows * gate.n_out);
  }
  virtual void add_bias(float* y, const float* b, int64_t n_rows, int64_t n) = 0;
  virtual void add(float* y, const float* x, int64_t n) = 0;           // y += x
  virtual void scale(float* x, float s, int64_t n) = 0;                // x *= s
  virtual void silu_mul(float* gate, const float* up, int64_t n) = 0;  // gate = silu(gate) * up
  // NeoX-style RoPE (pairs i and i + head_dim/2) in place at the batch's
  // RoPE positions (b.rope_pos: filled slots only, holes not counted):
  // x [n_tokens, n_heads, head_dim]; inv_freq [head_dim / 2].
  virtual void rope(float* x, const BatchArgs& b, int64_t n_heads, int64_t head_dim,
                    const float* inv_freq) = 0;
  // k, v [n_tokens, kv_dim] into the cache slots of layer il.
  virtual void kv_write(KvStore& kv, int64_t il, const BatchArgs& b, const float* k,
                        const float* v) = 0;
  // RoPE on q and k (k only when the store keeps rotated keys), then k and
  // v into the cache (fusable on a GPU).
  virtual void rope_kv_write(float* q, float* k, const float* v, KvStore& kv, int64_t il,
                             const BatchArgs& b, const AttnShape& s, const float* inv_freq) {
    rope(q, b, s.n_head, s.head_dim, inv_freq);
    if (!kv.pre_rope) rope(k, b, s.n_head_kv, s.head_dim, inv_freq);
    kv_write(kv, il, b, k, v);
  }
  // matmul_qkv on the batch's tokens, then rope_kv_write on its outputs
  // (s.inv_freq): one kernel on a GPU for decode batches.
  virtual void qkv_rope_kv_write(const Weight* w[3], const float* bias[3], const float* x,
                                 float* out[3], KvStore& kv, int64_t il, const BatchArgs& b,
                                 const AttnShape& s) {
    matmul_qkv(w, bias, x, b.n_tokens, out);
    rope_kv_write(out[0], out[1], out[2], kv, il, b, s, s.inv_freq);
  }
  // out[t] = |k_t - K[slot_t]|^2 + |v_t - V[slot_t]|^2: how far row t's K/V
  // (k, v [n_tokens, kv_dim], before RoPE where the store keeps keys so) lie
  // from what layer il of the cache holds at its slot. Reads the cache only
  // (the span cache's selective recompute measures cached spans with it).
  virtual void kv_deviation(const KvStore& kv, int64_t il, const BatchArgs& b, const float* k,
                            const float* v, float* out) = 0;
  // out [n_tokens, n_head * head_dim]: causal attention of each token over
  // its own sequence, through its block table, skipping the slots past a
  // block's fill (holes before a span); pre-RoPE keys are rotated by their
  // RoPE position (slot less the holes before it; s.inv_freq) as they are
  // read. Causality and sliding windows count slots.
  virtual void attention(const float* q, const KvStore& kv, int64_t il, const BatchArgs& b,
                         const AttnShape& s, float* out) = 0;
  // Mixture of experts. Routing: softmax over n_expert logits per token,
  // the k largest (ties to the lower id), their weights renormalised when
  // `norm`. ids/w [n_tokens, k].
  virtual void moe_route(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k,
                         bool norm, int32_t* ids, float* w) = 0;
  // out [n_tokens, n_embd] = sum over chosen experts of w * down(silu(gate x) * up x).
  virtual void moe_mlp(std::span<const ExpertWeights> experts, const float* x, int64_t n_tokens,
                       int64_t k, const int32_t* ids, const float* w, float* out) = 0;
  // out[i] = x[rows[i]] for the batch's logit rows; rows of n floats.
  virtual void gather_logit_rows(const float* x, const BatchArgs& b, int64_t n, float* out) = 0;

  // Chooses one token per logits row on the backend (logits [n_rows, n_vocab]
  // in backend memory, modified by the penalties); pairs holds each row's
  // (token, count) penalty pairs back to back; ids [n_rows] is host memory.
  // Backends without it (the CPU) return false and the caller samples on the host.
  virtual bool can_sample() const { return false; }
  virtual void sample(float* logits, int64_t n_rows, int64_t n_vocab,
                      std::span<const SampleRow> rows, std::span<const int32_t> pairs,
                      int32_t* ids) {}

  // Called at named points of the forward when set (slow: copies to the host).
  TraceFn trace;
};

// The backend for a device (Auto: CUDA when built with it and a GPU is
// present, else the CPU). Throws std::runtime_error naming what is missing.
std::unique_ptr<Backend> make_backend(const BackendOptions& opt);
bool cuda_available();  // built with CUDA and a GPU is visible

}  // namespace wick
