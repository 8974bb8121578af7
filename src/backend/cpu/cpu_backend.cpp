#include "backend/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <list>
#include <new>
#include <stdexcept>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/simd.h"

namespace wick {

namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(DType kv_dtype = DType::F32) : kv_dtype_(kv_dtype) {}
  std::string name() const override { return std::string("cpu (") + cpu::simd().isa + ")"; }
  Device device() const override { return Device::Cpu; }

  Buffer alloc(size_t bytes) override {
    void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return Buffer(this, p, bytes);
  }
  void release(void* p) override { std::free(p); }
  void copy_to_device(void* dst, const void* src, size_t n) override {
    if (dst != src) std::memcpy(dst, src, n);
  }
  void copy_to_host(void* dst, const void* src, size_t n) override {
    if (dst != src) std::memcpy(dst, src, n);
  }

  // Matrices are repacked into panels for the blocked multiply (Weight::aux);
  // the mapped rows stay as they are (embedding lookups read them).
  Weight prepare_matrix(const Weight& host) override {
    Weight w = host;
    if (cpu::can_pack(w.dtype, w.n_in)) w.aux = &packed_.emplace_back(cpu::pack_weight(host)).m;
    return w;
  }
  Weight prepare_vector(const Weight& host) override { return host; }  // already f32
  void release_matrix(const Weight& w) override {
    packed_.remove_if([&](const cpu::PackedWeight& p) { return &p.m == w.aux; });
  }
  void prepare_experts(std::span<const ExpertWeights> host, std::span<ExpertWeights> out) override {
    for (size_t e = 0; e < host.size(); ++e)
      out[e] = {prepare_matrix(host[e].gate), prepare_matrix(host[e].up),
                prepare_matrix(host[e].down)};
  }

  DType kv_dtype() const override { return kv_dtype_; }
  std::unique_ptr<KvStore> create_kv(const KvSpec& spec) override {
    if (kv_dtype_ == DType::Q8_0 && spec.kv_dim % 32)
      throw std::runtime_error("CPU KV cache: q8_0 rows need a multiple of 32 values");
    auto kv = std::make_unique<KvStore>();
    kv->n_layer = spec.n_layer;
    kv->n_slots = spec.n_blocks * spec.block_size;
    kv->kv_dim = spec.kv_dim;
    kv->block_size = spec.block_size;
    kv->dtype = kv_dtype_;
    kv->pre_rope = spec.pre_rope;
    const size_t bytes = size_t(spec.n_layer) * kv->layer_bytes();
    kv->k = alloc(bytes);
    kv->v = alloc(bytes);
    // zeroed, so that reading a never-written slot (a bug) is not UB on NaNs
    std::memset(kv->k.data(), 0, bytes);
    std::memset(kv->v.data(), 0, bytes);
    return kv;
  }
  BatchArgs upload(const Batch& b) override { return b.args(b.packed().data()); }
  void copy_blocks(KvStore& kv, std::span<const std::pair<int32_t, int32_t>> pairs) override {
    const size_t block_bytes = size_t(kv.block_size) * row_bytes(kv.dtype, kv.kv_dim);
    for (int64_t il = 0; il < kv.n_layer; ++il)
      for (auto [src, dst] : pairs)
        for (auto* base : {kv.k_layer<uint8_t>(il), kv.v_layer<uint8_t>(il)})
          std::memcpy(base + size_t(dst) * block_bytes, base + size_t(src) * block_bytes,
                      block_bytes);
  }

  void embed(const Weight& tok, const BatchArgs& b, float* out) override {
    cpu::embed(tok, b.token_ids, b.n_tokens, out);
  }
  void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps,
               float* y) override {
    cpu::rmsnorm(x, w, n_rows, n, eps, y);
  }
  bool applies_lora() const override { return true; }
  void set_adapter_rows(const int32_t* adapter_of, int64_t n_rows) override {
    adapter_of_ = adapter_of;
    n_adapter_rows_ = n_rows;
  }
  void matmul(const Weight& w, const float* x, int64_t n_rows, float* y) override {
    cpu::matmul(w, x, n_rows, y);
    add_lora(w, x, n_rows, y);
  }
  void matmul_qkv(const Weight* w[3], const float* bias[3], const float* x, int64_t n_rows,
                  float* out[3]) override {
    cpu::matmul_shared_input(std::span<const Weight* const>(w, 3), x, n_rows, out);
    for (int i = 0; i < 3; ++i) {
      if (bias[i]) cpu::add_bias(out[i], bias[i], n_rows, w[i]->n_out);
      add_lora(*w[i], x, n_rows, out[i]);
    }
  }
  void matmul_gate_up(const Weight& gate, const Weight& up, const float* x, int64_t n_rows,
                      float* g, float* u) override {
    const Weight* ws[2] = {&gate, &up};
    float* ys[2] = {g, u};
    cpu::matmul_shared_input(ws, x, n_rows, ys);
    add_lora(gate, x, n_rows, g);
    add_lora(up, x, n_rows, u);
    cpu::silu_mul(g, u, n_rows * gate.n_out);
  }
  void add_bias(float* y, const float* b, int64_t n_rows, int64_t n) override {
    cpu::add_bias(y, b, n_rows, n);
  }
  void add(float* y, const float* x, int64_t n) override { cpu::add(y, x, n); }
  void scale(float* x, float s, int64_t n) override { cpu::scale(x, s, n); }
  void silu_mul(float* gate, const float* up, int64_t n) override { cpu::silu_mul(gate, up, n); }
  void rope(float* x, const BatchArgs& b, int64_t n_heads, int64_t head_dim,
            const float* inv_freq) override {
    cpu::rope(x, b.rope_pos, b.n_tokens, n_heads, head_dim, inv_freq);
  }
  void kv_write(KvStore& kv, int64_t il, const BatchArgs& b, const float* k,
                const float* v) override {
    cpu::kv_write(kv.k_layer<void>(il), kv.v_layer<void>(il), kv.dtype, kv.kv_dim, b.slots,
                  b.n_tokens, k, v);
  }
  void kv_deviation(const KvStore& kv, int64_t il, const BatchArgs& b, const float* k,
                    const float* v, float* out) override {
    cpu::kv_deviation(kv.k_layer<void>(il), kv.v_layer<void>(il), kv.dtype, kv.kv_dim, b.slots,
                      b.n_tokens, k, v, out);
  }
  void attention(const float* q, const KvStore& kv, int64_t il, const BatchArgs& b,
                 const AttnShape& s, float* out) override {
    const cpu::RopeTable* rope = nullptr;
    if (kv.pre_rope) {
      rope_.ensure(s.inv_freq, s.head_dim, b.max_ctx);
      rope = &rope_;
    }
    cpu::attention(q, kv.k_layer<void>(il), kv.v_layer<void>(il), kv.dtype, kv.kv_dim, b, s, rope,
                   out);
  }
  void moe_route(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, bool norm,
                 int32_t* ids, float* w) override {
    cpu::moe_route(logits, n_tokens, n_expert, k, norm, ids, w);
  }
  void moe_mlp(std::span<const ExpertWeights> experts, const float* x, int64_t n_tokens, int64_t k,
               const int32_t* ids, const float* w, float* out) override {
    thread_local cpu::MoeScratch s;
    cpu::moe_mlp(experts, x, n_tokens, k, ids, w, out, s);
  }
  void gather_logit_rows(const float* x, const BatchArgs& b, int64_t n, float* out) override {
    for (int32_t i = 0; i < b.n_logits; ++i)
      std::memcpy(out + int64_t(i) * n, x + int64_t(b.logit_rows[i]) * n, size_t(n) * 4);
  }

 private:
  // y += b (a x) for each LoRA term of w that applies: two products of their
  // own, so each row's sums keep matmul's order whatever the batch. A named
  // adapter's term runs on its rows alone, gathered, and is added back.
  void add_lora(const Weight& w, const float* x, int64_t n_rows, float* y) {
    thread_local std::vector<float> xs, t, d;
    thread_local std::vector<int64_t> rows;
    for (const LoraDelta* l = w.lora; l; l = l->next) {
      const float* in = x;
      int64_t n = n_rows;
      if (l->adapter != 0) {
        rows.clear();
        if (adapter_of_) {
          if (n_rows != n_adapter_rows_)
            throw std::logic_error(
                "LoRA: a named adapter's product over rows that are not the step's");
          for (int64_t r = 0; r < n_rows; ++r)
            if (adapter_of_[r] == l->adapter) rows.push_back(r);
        }
        if (rows.empty()) continue;
        n = int64_t(rows.size());
        xs.resize(size_t(n * w.n_in));
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(&xs[size_t(i * w.n_in)], x + rows[size_t(i)] * w.n_in, size_t(w.n_in) * 4);
        in = xs.data();
      }
      t.resize(size_t(n * l->a.n_out));
      d.resize(size_t(n * w.n_out));
      cpu::matmul(l->a, in, n, t.data());
      const int64_t rank = l->a.n_out;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < rank; ++j) t[size_t(i * rank + j)] *= l->scale.f32()[j];
      cpu::matmul(l->b, t.data(), n, d.data());
      if (l->adapter == 0) {
        cpu::add(y, d.data(), n_rows * w.n_out);
      } else {
        for (int64_t i = 0; i < n; ++i)
          cpu::add(y + rows[size_t(i)] * w.n_out, &d[size_t(i * w.n_out)], w.n_out);
      }
    }
  }

  DType kv_dtype_;
  const int32_t* adapter_of_ = nullptr;  // the step's rows' named adapters (set_adapter_rows)
  int64_t n_adapter_rows_ = 0;
  cpu::RopeTable rope_;  // for pre-RoPE keys (the shared instance is used by one thread at a time)
  std::list<cpu::PackedWeight> packed_;  // stable addresses: Weight::aux points here
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(DType kv_dtype) {
  if (kv_dtype != DType::F32 && kv_dtype != DType::F16 && kv_dtype != DType::BF16 &&
      kv_dtype != DType::Q8_0)
    throw std::runtime_error(std::string("CPU KV cache: ") + dtype_name(kv_dtype) +
                             " is not supported (f32, f16, bf16 or q8_0)");
  return std::make_unique<CpuBackend>(kv_dtype);
}

Backend& cpu_backend() {
  static CpuBackend be;
  return be;
}

}  // namespace wick
