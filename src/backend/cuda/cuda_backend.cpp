// CudaBackend: device memory, weights uploaded once in their stored type
// (repacked, see gpu_weight.h), an f16 (or f32) KV cache, one stream, and
// CUDA graphs for repeated step shapes.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <unordered_map>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/repack.h"

namespace wick {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string cuda_status() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cudaGetErrorString(e);
  }
  std::string s = std::to_string(n) + " device(s)";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) == cudaSuccess) s += std::string(", ") + p.name;
  }
  return s;
}

namespace {

using cuda::GpuWeight;

double mib(size_t b) {
  return double(b) / double(1 << 20);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opt) : opt_(opt) {
    WICK_CUDA_CHECK(cudaSetDevice(opt.gpu_index));
    cudaDeviceProp p{};
    WICK_CUDA_CHECK(cudaGetDeviceProperties(&p, opt.gpu_index));
    name_ = fmt::format("cuda ({}, sm_{}{})", p.name, p.major, p.minor);
    if (p.major < 8)
      throw std::runtime_error(name_ +
                               ": wick's CUDA kernels need compute capability 8.0 or newer");
    WICK_CUDA_CHECK(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking));
    size_t free_b = 0, total_b = 0;
    WICK_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    budget_ = size_t(double(total_b) * opt.gpu_memory_fraction);
    if (budget_ > free_b) budget_ = free_b;
    WICK_CUDA_CHECK(cudaMallocHost(&pinned_, pinned_bytes_));
    WICK_CUDA_CHECK(cudaEventCreateWithFlags(&upload_done_, cudaEventDisableTiming));
    if (const char* g = std::getenv("WICK_CUDA_GRAPHS"); g && std::string(g) == "0")
      graphs_on_ = false;
    if (const char* sk = std::getenv("WICK_CUDA_SKIP")) {
      skip_ = std::string(",") + sk + ",";
      for (size_t a = 1, b; a < skip_.size(); a = b + 1) {
        b = skip_.find(',', a);
        const std::string k = skip_.substr(a, b - a);
        static const char* kinds[] = {"norm", "qkv",     "rope", "attn",
                                      "o",    "gate_up", "down", "head"};
        if (std::find(std::begin(kinds), std::end(kinds), k) == std::end(kinds))
          throw std::invalid_argument("WICK_CUDA_SKIP: unknown kernel kind '" + k +
                                      "' (norm, qkv, rope, attn, o, gate_up, down, head)");
      }
    }
    norm_counter_ = alloc(sizeof(int));  // matmul_add_rmsnorm's count of finished CTAs
    WICK_CUDA_CHECK(cudaMemsetAsync(norm_counter_.data(), 0, sizeof(int), st()));
    WICK_CUDA_CHECK(cudaStreamSynchronize(st()));
    spdlog::debug("{}: {:.0f} MiB of {:.0f} MiB usable", name_, mib(budget_), mib(total_b));
  }
  ~CudaBackend() override {
    bind();
    drop_graphs();
    // every buffer goes while the stream still exists (release syncs on it)
    for (auto& [k, b] : expert_tables_) b.reset();
    lora_tables_.clear();
    owned_.clear();
    for (Buffer* b :
         {&batch_buf_, &partial_, &moe_f_, &moe_i_, &moe_q_, &sample_buf_, &xb_, &norm_counter_,
          &lora_t_, &norm_form_.buf, &gated_form_.buf, &attn_form_.buf, &gated_counters_})
      b->reset();
    auto tabs = std::move(rope_tabs_);  // (their release looks into rope_tabs_)
    rope_tabs_.clear();
    tabs.clear();
    cudaEventDestroy(upload_done_);
    cudaFreeHost(pinned_);
    cudaStreamDestroy(st_);
  }

  // Makes this backend's GPU the calling thread's device (CUDA's is per
  // thread): a model loads on a thread of its own (cpu::on_own_thread) and
  // runs on another, the engine's; allocations, copies and each step's
  // upload come here first.
  void bind() const {
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess || d != opt_.gpu_index)
      WICK_CUDA_CHECK(cudaSetDevice(opt_.gpu_index));
  }

  std::string name() const override { return name_; }
  Device device() const override { return Device::Cuda; }

  Buffer alloc(size_t bytes) override {
    bind();
    bytes = std::max<size_t>(bytes, 16);
    // cudaMalloc fails inside a capture, and a graph must not own memory
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    WICK_CUDA_CHECK(cudaStreamIsCapturing(st_, &capturing));  // (st_: writes nothing)
    if (capturing != cudaStreamCaptureStatusNone)
      throw std::logic_error(fmt::format(
          "CUDA backend: {:.1f} MiB allocated while a step is recorded as a graph (a buffer the "
          "step's first run should have sized)",
          mib(bytes)));
    if (used_ + bytes > budget_)
      throw std::runtime_error(fmt::format(
          "out of GPU memory: {:.1f} MiB more would pass the budget of {:.0f} MiB ({:.0f} MiB in "
          "use); raise --gpu-memory-fraction, shorten --ctx-size / --kv-memory, or use a smaller "
          "or quantized model",
          mib(bytes), mib(budget_), mib(used_)));
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(
          fmt::format("out of GPU memory: cudaMalloc of {:.1f} MiB failed ({})", mib(bytes),
                      cudaGetErrorString(e)));
    }
    used_ += bytes;
    sizes_[p] = bytes;
    return Buffer(this, p, bytes);
  }
  void release(void* p) override {
    drop_graphs();               // a recorded graph may point into this memory
    cudaStreamSynchronize(st_);  // (st_: freeing writes nothing; a freed norm output below)
    if (auto it = sizes_.find(p); it != sizes_.end()) {
      const auto* base = static_cast<const uint8_t*>(p);
      for (IntForm* f : {&norm_form_, &gated_form_, &attn_form_}) {  // (the address may come back)
        const auto* y = reinterpret_cast<const uint8_t*>(f->y);
        if (y >= base && y < base + it->second) f->y = nullptr;
      }
      used_ -= it->second;
      sizes_.erase(it);
    }
    cudaFree(p);
    // a rope table made from frequencies at p: the address may come back with others
    if (auto it = rope_tabs_.find(p); it != rope_tabs_.end()) {
      Buffer tab = std::move(it->second.tab);  // released after the erase
      rope_tabs_.erase(it);
    }
  }
  void copy_to_device(void* dst, const void* src, size_t n) override {
    bind();
    WICK_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, st()));
    WICK_CUDA_CHECK(cudaStreamSynchronize(st()));
  }
  // (st_, not st(): these write nothing on the device)
  void copy_to_host(void* dst, const void* src, size_t n) override {
    bind();
    WICK_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, st_));
    WICK_CUDA_CHECK(cudaStreamSynchronize(st_));
  }
  void sync() override { WICK_CUDA_CHECK(cudaStreamSynchronize(st_)); }
  // 64 sequences of 512 + 128 on an H100: 8,553 -> 11,954 generated tok/s
  // over the wall clock at 2,048 tokens a step instead of 512 (docs/perf.md)
  int32_t default_step_tokens() const override { return 2048; }
  // What is left of the budget, and no more than the device has free now
  // (another model may share the GPU).
  size_t kv_budget() const override {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = 0;
    const size_t left = budget_ > used_ ? budget_ - used_ : 0;
    return std::max<size_t>(1, std::min(left, free_b / 10 * 9));
  }

  Weight prepare_matrix(const Weight& host) override {
    cuda::Repacked r = cuda::repack(host, opt_.gpu_f32);
    GpuWeight& g = descs_.emplace_back();
    g.fmt = r.fmt;
    g.n_out = r.n_out;
    g.n_in = r.n_in;
    g.k_pad = r.k_pad;
    g.group = r.group;
    if (g.group & (g.group - 1))  // the kernels shift by it (group_index)
      throw std::logic_error("CUDA: scale groups of " + std::to_string(g.group) + " elements");
    g.q = upload_owned(r.q.data(), r.q.size());
    if (!r.scale.empty())
      g.scale = static_cast<const float*>(upload_owned(r.scale.data(), r.scale.size() * 4));
    if (!r.min.empty())
      g.min = static_cast<const float*>(upload_owned(r.min.data(), r.min.size() * 4));
    g.min8 = r.min8;
    if (g.fmt == cuda::Fmt::I8 || g.fmt == cuda::Fmt::U4)
      int_rows_[g.n_in] |= g.fmt == cuda::Fmt::U4 ? 2 : 1;
    Weight w = host;
    w.data = g.q;
    w.aux = &g;
    return w;
  }
  Weight prepare_vector(const Weight& host) override {
    Weight w = host;
    w.data = upload_owned(host.data, size_t(host.n_in) * 4);
    return w;
  }
  void release_matrix(const Weight& w) override {
    const GpuWeight* g = &desc(w);
    for (const void* p :
         {g->q, static_cast<const void*>(g->scale), static_cast<const void*>(g->min)})
      if (p) owned_.erase(p);
    descs_.remove_if([&](const GpuWeight& d) { return &d == g; });
  }
  void release_vector(const Weight& w) override { owned_.erase(w.data); }
  void prepare_experts(std::span<const ExpertWeights> host, std::span<ExpertWeights> out) override {
    std::vector<GpuWeight> table;
    for (size_t e = 0; e < host.size(); ++e) {
      out[e].gate = prepare_matrix(host[e].gate);
      out[e].up = prepare_matrix(host[e].up);
      out[e].down = prepare_matrix(host[e].down);
      for (const Weight* w : {&out[e].gate, &out[e].up, &out[e].down}) table.push_back(desc(*w));
    }
    Buffer b = alloc(table.size() * sizeof(GpuWeight));
    copy_to_device(b.data(), table.data(), table.size() * sizeof(GpuWeight));
    expert_tables_[out[0].gate.aux] = std::move(b);
  }

  DType kv_dtype() const override {
    return opt_.gpu_f32 ? DType::F32 : opt_.kv_cache_dtype == "q8_0" ? DType::Q8_0 : DType::F16;
  }
  std::unique_ptr<KvStore> create_kv(const KvSpec& spec) override {
    // q8_0 (kernels.h's KvLayer): whole blocks of 32 a row
    if (kv_dtype() == DType::Q8_0 && spec.kv_dim % 32)
      throw std::runtime_error(fmt::format(
          "--kv-cache-dtype q8_0: rows of whole blocks of 32 (this model's K/V rows: {})",
          spec.kv_dim));
    auto kv = std::make_unique<KvStore>();
    kv->n_layer = spec.n_layer;
    kv->n_slots = spec.n_blocks * spec.block_size;
    kv->kv_dim = spec.kv_dim;
    kv->block_size = spec.block_size;
    kv->dtype = kv_dtype();
    kv->pre_rope = spec.pre_rope;
    const size_t bytes = size_t(spec.n_layer) * kv->layer_bytes();
    kv->k = alloc(bytes);
    kv->v = alloc(bytes);
    WICK_CUDA_CHECK(cudaMemsetAsync(kv->k.data(), 0, bytes, st()));
    WICK_CUDA_CHECK(cudaMemsetAsync(kv->v.data(), 0, bytes, st()));
    return kv;
  }

  void copy_blocks(KvStore& kv, std::span<const std::pair<int32_t, int32_t>> pairs) override {
    bind();
    // (q8_0: the int8 plane's rows and the scales' rows, each a run of a block's slots)
    const bool q8 = kv.dtype == DType::Q8_0;
    const size_t row = q8 ? size_t(kv.kv_dim) : row_bytes(kv.dtype, kv.kv_dim);
    const size_t block_bytes = size_t(kv.block_size) * row;
    const size_t scale_block_bytes = size_t(kv.block_size) * size_t(kv.kv_dim / 32) * 2;
    for (int64_t il = 0; il < kv.n_layer; ++il) {
      const cuda::KvLayer l = layer(kv, il);
      for (auto [src, dst] : pairs) {
        for (void* base : {l.k, l.v}) copy_run(base, src, dst, block_bytes);
        if (q8)
          for (void* base : {l.k_scale, l.v_scale}) copy_run(base, src, dst, scale_block_bytes);
      }
    }
  }
  void copy_run(void* base, int32_t src, int32_t dst, size_t bytes) {
    auto* b = static_cast<uint8_t*>(base);
    WICK_CUDA_CHECK(cudaMemcpyAsync(b + size_t(dst) * bytes, b + size_t(src) * bytes, bytes,
                                    cudaMemcpyDeviceToDevice, st()));
  }
  // Layer il of the cache as the kernels address it.
  static cuda::KvLayer layer(const KvStore& kv, int64_t il) {
    cuda::KvLayer l;
    l.k = kv.k_layer<void>(il);
    l.v = kv.v_layer<void>(il);
    l.type = kv.dtype == DType::F32   ? cuda::KvType::F32
             : kv.dtype == DType::F16 ? cuda::KvType::F16
                                      : cuda::KvType::Q8;
    if (l.type == cuda::KvType::Q8) {
      const size_t q_bytes = size_t(kv.n_slots) * size_t(kv.kv_dim);
      l.k_scale = static_cast<uint8_t*>(l.k) + q_bytes;
      l.v_scale = static_cast<uint8_t*>(l.v) + q_bytes;
    }
    return l;
  }
  BatchArgs upload(const Batch& b) override {
    bind();  // (every step starts here)
    const auto& ints = b.packed();
    const size_t bytes = ints.size() * 4;
    if (batch_buf_.bytes() < bytes) batch_buf_ = alloc(std::max<size_t>(bytes * 2, 64 << 10));
    // the previous upload must have left the pinned buffer before it is reused
    WICK_CUDA_CHECK(cudaEventSynchronize(upload_done_));
    if (bytes > pinned_bytes_) grow_pinned(bytes + bytes / 2);
    std::memcpy(pinned_, ints.data(), bytes);
    WICK_CUDA_CHECK(
        cudaMemcpyAsync(batch_buf_.data(), pinned_, bytes, cudaMemcpyHostToDevice, st()));
    WICK_CUDA_CHECK(cudaEventRecord(upload_done_, st()));
    return b.args(batch_buf_.as<int32_t>());
  }

  // WICK_CUDA_GRAPHS=0 turns graphs off (for profilers that time each kernel).
  bool can_graph() const override { return graphs_on_ && !trace && !opt_.gpu_f32; }
  bool replay(uint64_t key) override {
    bind();
    auto it = graphs_.find(key);
    if (it == graphs_.end()) return false;
    WICK_CUDA_CHECK(cudaGraphLaunch(it->second, st()));
    return true;
  }
  void capture_begin() override {
    WICK_CUDA_CHECK(cudaStreamBeginCapture(st(), cudaStreamCaptureModeThreadLocal));
  }
  void capture_abort() override {
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(st(), &g) == cudaSuccess && g) cudaGraphDestroy(g);
    cudaGetLastError();  // an invalidated capture's error is not the caller's
  }
  void capture_end(uint64_t key) override {
    cudaGraph_t g = nullptr;
    WICK_CUDA_CHECK(cudaStreamEndCapture(st(), &g));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    WICK_CUDA_CHECK(e);
    graphs_[key] = exec;
  }

  // LoRA terms: each adapted weight's terms in a device table (lora.cu).
  bool applies_lora() const override { return true; }
  void set_adapter_rows(const int32_t* adapter_of, int64_t n_rows) override {
    adapter_of_ = adapter_of;
    n_adapter_rows_ = n_rows;
  }
  void lora_changed(const Weight& w) override;

  // ---- kernels ----
  void embed(const Weight& tok, const BatchArgs& b, float* out) override {
    cuda::embed(desc(tok), b.token_ids, b.n_tokens, out, st());
  }
  void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps,
               float* y) override {
    if (skip("norm")) return;
    const cuda::NormInt* ni = norm_int_for(n_rows, n);
    cuda::rmsnorm(x, w, int(n_rows), int(n), eps, y, st(), ni);
    if (ni) norm_made(y);
  }
  void add_rmsnorm(float* x, const float* r, const float* w, int64_t n_rows, int64_t n, float eps,
                   float* y) override {
    if (skip("norm")) return;
    const cuda::NormInt* ni = norm_int_for(n_rows, n);
    cuda::add_rmsnorm(x, r, w, int(n_rows), int(n), eps, y, st(), ni);
    if (ni) norm_made(y);
  }
  void matmul(const Weight& w, const float* x, int64_t n_rows, float* y) override {
    const cuda::MatmulJob job{&desc(w), y, nullptr};
    const GpuWeight& d = *job.w;
    if (skip(d.n_out >= 32000 ? "head" : d.n_in == d.n_out ? "o" : "down")) return;
    const ReadsX r(*this, x, n_rows);
    cuda::matmul(&job, 1, x, int(n_rows), mm_scratch(&job, 1, n_rows), st(), r.ni);
    add_lora(w, x, n_rows, y);
  }
  void matmul_add_rmsnorm(const Weight& w, const float* in, int64_t n_rows, float* proj, float* x,
                          const float* norm, float eps, float* y) override {
    const cuda::MatmulJob job{&desc(w), proj, nullptr};
    const cuda::AddNorm a{x, norm, eps, y, norm_counter_.as<int>()};
    // (WICK_CUDA_SKIP measures the product and the norm apart: two kernels;
    // a LoRA term comes between the product and the add)
    // (st_, counted only if it launched: the down product's x may have its
    // integer form from gate/up, which a count here would call stale)
    if (skip_.empty() && !w.lora && cuda::matmul_add_rmsnorm(job, in, int(n_rows), a, st_)) {
      ++n_stream_uses_;
      return;
    }
    Backend::matmul_add_rmsnorm(w, in, n_rows, proj, x, norm, eps, y);
  }
  void matmul_qkv(const Weight* w[3], const float* bias[3], const float* x, int64_t n_rows,
                  float* out[3]) override {
    if (skip("qkv")) return;
    cuda::MatmulJob jobs[3];
    for (int i = 0; i < 3; ++i) jobs[i] = {&desc(*w[i]), out[i], bias[i]};
    const ReadsX r(*this, x, n_rows);
    cuda::matmul(jobs, 3, x, int(n_rows), mm_scratch(jobs, 3, n_rows), st(), r.ni);
    for (int i = 0; i < 3; ++i) add_lora(*w[i], x, n_rows, out[i]);
  }
  void matmul_gate_up(const Weight& gate, const Weight& up, const float* x, int64_t n_rows,
                      float* g, float* u) override {
    if (skip("gate_up")) return;
    const ReadsX r(*this, x, n_rows);
    const GpuWeight &dg = desc(gate), &du = desc(up);
    if (dg.fmt == cuda::Fmt::F32 || dg.fmt != du.fmt || dg.group != du.group ||
        dg.k_pad != du.k_pad) {
      Backend::matmul_gate_up(gate, up, x, n_rows, g, u);  // two products, then silu * up
      return;
    }
    const cuda::MatmulJob job{&dg, g, nullptr};  // (up: gate's layout)
    if (gate.lora || up.lora) {                  // the terms add to g and u before silu(g) * u
      cuda::matmul_gate_up_apart(dg, du, x, int(n_rows), g, u, mm_scratch(&job, 1, n_rows), st(),
                                 r.ni);
      add_lora(gate, x, n_rows, g);
      add_lora(up, x, n_rows, u);
      silu_mul(g, u, n_rows * gate.n_out);
      return;
    }
    // decode steps with integer products: g's integer form too, for down
    // (not where x is itself gate/up's output: its form is being read)
    const cuda::NormInt* out = r.form == &gated_form_ ? nullptr : gated_int_for(dg, n_rows);
    void* xb = mm_scratch(&job, 1, n_rows);
    if (cuda::matmul_gate_up(dg, du, x, int(n_rows), g, xb, st(), r.ni, out,
                             out ? gated_counters_.as<int>() : nullptr)) {
      gated_form_.y = g;
      gated_form_.stamp = n_stream_uses_;
    }
  }
  void add_bias(float* y, const float* b, int64_t n_rows, int64_t n) override {
    cuda::add_bias(y, b, int(n_rows), int(n), st());
  }
  void add(float* y, const float* x, int64_t n) override { cuda::add(y, x, n, st()); }
  void scale(float* x, float s, int64_t n) override { cuda::scale(x, s, n, st()); }
  void silu_mul(float* gate, const float* up, int64_t n) override {
    cuda::silu_mul(gate, up, n, st());
  }
  void rope(float* x, const BatchArgs& b, int64_t n_heads, int64_t head_dim,
            const float* inv_freq) override {
    cuda::rope(x, b.rope_pos, b.n_tokens, int(n_heads), int(head_dim), inv_freq, st());
  }
  void kv_write(KvStore& kv, int64_t il, const BatchArgs& b, const float* k,
                const float* v) override {
    cuda::kv_write(k, v, layer(kv, il), b.slots, b.n_tokens, int(kv.kv_dim), st());
  }
  void kv_deviation(const KvStore& kv, int64_t il, const BatchArgs& b, const float* k,
                    const float* v, float* out) override {
    cuda::kv_deviation(k, v, layer(kv, il), b.slots, b.n_tokens, int(kv.kv_dim), out, st());
  }
  void rope_kv_write(float* q, float* k, const float* v, KvStore& kv, int64_t il,
                     const BatchArgs& b, const AttnShape& s, const float* inv_freq) override {
    if (skip("rope")) return;
    cuda::rope_kv_write(q, k, v, layer(kv, il), !kv.pre_rope, b.slots, b.rope_pos, b.n_tokens,
                        int(s.n_head), int(s.n_head_kv), int(s.head_dim), inv_freq, st());
  }
  void qkv_rope_kv_write(const Weight* w[3], const float* bias[3], const float* x, float* out[3],
                         KvStore& kv, int64_t il, const BatchArgs& b, const AttnShape& s) override {
    cuda::MatmulJob jobs[3];
    for (int i = 0; i < 3; ++i) jobs[i] = {&desc(*w[i]), out[i], bias[i]};
    cuda::RopeKv r;
    r.pos = b.rope_pos;
    r.slots = b.slots;
    r.inv_freq = s.inv_freq;
    r.k_cache = kv.k_layer<void>(il);
    r.v_cache = kv.v_layer<void>(il);
    r.cache_f16 = kv.dtype == DType::F16;
    r.rotate_k = !kv.pre_rope;
    r.head_dim = int(s.head_dim);
    // (WICK_CUDA_SKIP measures qkv and rope apart: the two kernels; LoRA
    // terms come between the products and RoPE; a q8_0 cache's blocks of 32
    // are quantized by rope_kv_write's warps)
    const bool lora = w[0]->lora || w[1]->lora || w[2]->lora;
    const ReadsX rx(*this, x, b.n_tokens);
    if (skip_.empty() && !lora && kv.dtype != DType::Q8_0 &&
        cuda::matmul_qkv_rope_kv(jobs, x, int(b.n_tokens), r, mm_scratch(jobs, 3, b.n_tokens), st(),
                                 rx.ni))
      return;
    Backend::qkv_rope_kv_write(w, bias, x, out, kv, il, b, s);
  }
  void attention(const float* q, const KvStore& kv, int64_t il, const BatchArgs& b,
                 const AttnShape& s, float* out) override {
    if (skip("attn")) return;
    const size_t need = cuda::attention_partial_floats(b, int(s.n_head), int(s.head_dim));
    if (kv.dtype != DType::F32 && partial_.bytes() < need * 4) partial_ = alloc(need * 4 * 5 / 4);
    cuda::AttnArgs a{q,
                     layer(kv, il),
                     out,
                     partial_.as<float>(),
                     int(s.n_head),
                     int(s.n_head_kv),
                     int(s.head_dim),
                     int(s.sliding_window),
                     kv.pre_rope ? rope_rows(s.inv_freq, int(s.head_dim), b.max_ctx) : nullptr,
                     s.score_factor};
    // decode steps with integer products: out's integer form too, for o
    // (f16 and q8_0 caches, head_dim 32 and up: where cuda::attention can write it)
    attn_form_.y = nullptr;
    const int64_t n = s.n_head * s.head_dim;
    const bool can = b.n_tokens <= 16 && kv.dtype != DType::F32 && s.head_dim >= 32;
    const cuda::NormInt* ni = can ? int_form_for(attn_form_, b.n_tokens, n) : nullptr;
    if (ni) a.out_form = cuda::int_out(*ni);
    if (cuda::attention(a, b, st()) && ni) {
      attn_form_.y = out;
      attn_form_.stamp = n_stream_uses_;
    }
  }
  void moe_route(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, bool norm,
                 int32_t* ids, float* w) override {
    cuda::moe_route(logits, int(n_tokens), int(n_expert), int(k), norm, ids, w, st());
  }
  void moe_mlp(std::span<const ExpertWeights> experts, const float* x, int64_t n_tokens, int64_t k,
               const int32_t* ids, const float* w, float* out) override {
    const GpuWeight &gate = desc(experts[0].gate), &down = desc(experts[0].down);
    if (gate.fmt == cuda::Fmt::F32)
      return moe_mlp_host_routed(experts, x, n_tokens, k, ids, w, out);
    const int E = int(experts.size());
    const size_t nf = cuda::moe_scratch_floats(int(n_tokens), int(k), down.n_out, gate.n_out);
    const size_t ni = cuda::moe_scratch_ints(int(n_tokens), int(k), E);
    if (moe_f_.bytes() < nf * 4) moe_f_ = alloc(nf * 4);
    if (moe_i_.bytes() < ni * 4) moe_i_ = alloc(ni * 4);
    const size_t nq = cuda::moe_scratch_int_bytes(int(n_tokens), int(k), gate, down);
    if (moe_q_.bytes() < nq) moe_q_ = alloc(nq);
    const auto* table = expert_tables_.at(experts[0].gate.aux).as<GpuWeight>();
    cuda::moe_mlp(table, E, gate, down, x, int(n_tokens), int(k), ids, w, out, moe_f_.as<float>(),
                  moe_i_.as<int32_t>(), nq ? moe_q_.data() : nullptr, st());
  }
  bool can_sample() const override { return true; }
  void sample(float* logits, int64_t n_rows, int64_t n_vocab, std::span<const SampleRow> rows,
              std::span<const int32_t> pairs, int32_t* ids) override {
    if (n_rows <= 0) return;
    // rows, pairs and the ids travel in one device buffer
    const size_t rows_b = (rows.size_bytes() + 15) / 16 * 16,
                 pairs_b = (pairs.size_bytes() + 15) / 16 * 16;
    const size_t ids_b = size_t(n_rows) * 4,
                 scratch_b = cuda::sample_scratch_bytes(int(n_rows), int(n_vocab));
    const size_t total = rows_b + pairs_b + ids_b + 16 + scratch_b;
    if (sample_buf_.bytes() < total) sample_buf_ = alloc(total * 2);
    auto* base = sample_buf_.as<uint8_t>();
    std::vector<uint8_t> host(rows_b + pairs_b);
    std::memcpy(host.data(), rows.data(), rows.size_bytes());
    if (!pairs.empty()) std::memcpy(host.data() + rows_b, pairs.data(), pairs.size_bytes());
    WICK_CUDA_CHECK(cudaMemcpyAsync(base, host.data(), host.size(), cudaMemcpyHostToDevice, st()));
    auto* d_ids = reinterpret_cast<int32_t*>(base + rows_b + pairs_b);
    void* scratch = base + (rows_b + pairs_b + ids_b + 15) / 16 * 16;
    cuda::sample(logits, int(n_rows), int(n_vocab), reinterpret_cast<const SampleRow*>(base),
                 reinterpret_cast<const int32_t*>(base + rows_b), d_ids, scratch, st());
    copy_to_host(ids, d_ids, ids_b);
  }
  void gather_logit_rows(const float* x, const BatchArgs& b, int64_t n, float* out) override {
    cuda::gather_rows(x, b.logit_rows, b.n_logits, int(n), out, st());
  }

 private:
  const GpuWeight& desc(const Weight& w) const {
    if (!w.aux) throw std::logic_error("a weight not prepared by the CUDA backend");
    return *static_cast<const GpuWeight*>(w.aux);
  }
  const void* upload_owned(const void* src, size_t bytes) {
    Buffer b = alloc(bytes);
    copy_to_device(b.data(), src, bytes);
    const void* p = b.data();
    owned_.emplace(p, std::move(b));
    return p;
  }
  // y += the LoRA terms of w that apply to the step's rows.
  void add_lora(const Weight& w, const float* x, int64_t n_rows, float* y) {
    if (!w.lora) return;
    auto it = lora_tables_.find(&desc(w));
    if (it == lora_tables_.end())
      throw std::logic_error(
          "CUDA backend: a weight's LoRA terms were linked without lora_changed");
    const LoraTable& t = it->second;
    if (!adapter_of_ && t.all_named) return;  // no row chose an adapter
    if (adapter_of_ && n_rows != n_adapter_rows_)
      throw std::logic_error("LoRA: a named adapter's product over rows that are not the step's");
    const size_t need = size_t(n_rows) * size_t(t.total_rank) * 4;
    if (lora_t_.bytes() < need) lora_t_ = alloc(need * 2);
    cuda::lora_add(t.terms.as<cuda::LoraTerm>(), t.n_terms, t.total_rank, adapter_of_, x,
                   int(n_rows), int(w.n_in), int(w.n_out), lora_t_.as<float>(), y, st());
  }
  // The rope table for pre-RoPE keys, grown (doubling) to cover n_pos
  // positions: one per frequency buffer (each runner has its own), so that
  // runners taking turns never remake a table while a step is recorded.
  const float* rope_rows(const float* inv_freq, int head_dim, int n_pos) {
    RopeTab& t = rope_tabs_[inv_freq];
    if (head_dim != t.head_dim || n_pos > t.n_pos) {
      const int n = std::max(n_pos, head_dim == t.head_dim ? 2 * t.n_pos : n_pos);
      t.tab = alloc(size_t(n) * size_t(head_dim) * 4);
      cuda::rope_table(inv_freq, head_dim, n, t.tab.as<float>(), st());
      t.head_dim = head_dim;
      t.n_pos = n;
    }
    return t.tab.as<float>();
  }
  // Pinned host memory for batch uploads, grown when a batch needs more
  // (long block tables, span layouts' fill tables); the old one is idle.
  void grow_pinned(size_t bytes) {
    void* p = nullptr;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(
          fmt::format("out of pinned host memory: {:.1f} MiB for a batch upload", mib(bytes)));
    }
    cudaFreeHost(pinned_);
    pinned_ = p;
    pinned_bytes_ = bytes;
  }
  // The tiled matmul's bf16 copy of the activations, grown to the largest
  // product seen (graphs are recorded on a shape's second step, by when it
  // has its size).
  // ---- outputs' integer forms (kernels.h, NormInt) ----
  // With integer products, a norm of rows as long as some 8/4-bit weight's
  // also writes its output's integer form, and so do attention (for o) and
  // gate/up (for down) in decode steps; the products that read that output next take it
  // instead of quantizing it again. It is y's only while nothing else ran:
  // st() counts the stream's uses, the maker records the count, and products
  // (which never write their x) record it again after their own launches.
  struct IntForm {
    Buffer buf;
    cuda::NormInt ni;
    const float* y = nullptr;  // the output whose form ni holds (null: none)
    uint64_t stamp = 0;        // n_stream_uses_ when it was last y's
  };
  cudaStream_t st() {
    ++n_stream_uses_;
    return st_;
  }
  // f's NormInt for n_rows x n, in the orders the model's weights of rows of
  // n take (null: none, or the switches off)
  const cuda::NormInt* int_form_for(IntForm& f, int64_t n_rows, int64_t n) {
    f.y = nullptr;
    const auto kinds = int_rows_.find(n);
    if (!cuda::int_products() || !cuda::norm_int() || kinds == int_rows_.end()) return nullptr;
    const size_t need = cuda::norm_int_bytes(int(n_rows), int(n));
    if (f.buf.bytes() < need) f.buf = alloc(need);
    f.ni = cuda::NormInt{f.buf.data(), int(n_rows), int(n), (kinds->second & 1) != 0,
                         (kinds->second & 2) != 0};
    return &f.ni;
  }
  const cuda::NormInt* norm_int_for(int64_t n_rows, int64_t n) {
    return int_form_for(norm_form_, n_rows, n);
  }
  void norm_made(const float* y) {
    norm_form_.y = y;
    norm_form_.stamp = n_stream_uses_;
  }
  // gate/up's output form: decode steps (the decode kernel's 16-row launch
  // writes it) of integer products; its counters zeroed once
  const cuda::NormInt* gated_int_for(const GpuWeight& gate, int64_t n_rows) {
    gated_form_.y = nullptr;
    if (n_rows > 16 || !cuda::int_path(gate)) return nullptr;
    const cuda::NormInt* ni = int_form_for(gated_form_, n_rows, gate.n_out);
    const size_t need = size_t(cuda::gated_int_counters(gate.n_out)) * sizeof(int);
    if (ni && gated_counters_.bytes() < need) {
      gated_counters_ = alloc(need);  // (all of it: alloc may round up, a later n_ff use it)
      WICK_CUDA_CHECK(cudaMemsetAsync(gated_counters_.data(), 0, gated_counters_.bytes(), st()));
    }
    return ni;
  }
  // Held by a product of x over its launches (and those of the products a
  // fallback makes of it): ni, x's integer form where the stream's last use
  // was its maker or a product of x.
  struct ReadsX {
    CudaBackend& be;
    IntForm* form = nullptr;
    const cuda::NormInt* ni = nullptr;
    ReadsX(CudaBackend& b, const float* x, int64_t n_rows) : be(b) {
      for (IntForm* f : {&b.norm_form_, &b.gated_form_, &b.attn_form_})
        if (x && f->y == x && f->ni.M == n_rows &&
            (f->stamp == b.n_stream_uses_ || b.n_readers_ > 0)) {
          form = f;
          ni = &f->ni;
          ++b.n_readers_;
          break;
        }
    }
    ~ReadsX() {
      if (!form) return;
      --be.n_readers_;
      form->stamp = be.n_stream_uses_;
    }
    ReadsX(const ReadsX&) = delete;
    ReadsX& operator=(const ReadsX&) = delete;
  };
  void* mm_scratch(const cuda::MatmulJob* jobs, int n_jobs, int64_t n_rows) {
    // decode batches stay on the decode kernel, which needs none but for
    // integer products; matmul() may split the jobs into launches of
    // different k_pad, each using it whole (the largest counts)
    size_t need = 0;
    for (int j = 0; j < n_jobs; ++j)
      if (n_rows >= 64 || cuda::int_path(*jobs[j].w))
        need = std::max(need, cuda::matmul_scratch_bytes(int(n_rows), jobs[j].w->k_pad));
    if (!need) return nullptr;
    if (xb_.bytes() < need) xb_ = alloc(need);
    return xb_.data();
  }
  void drop_graphs() {
    for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
    graphs_.clear();
  }
  // f32 experts (--gpu-f32): routing comes to the host, each expert runs on its rows.
  void moe_mlp_host_routed(std::span<const ExpertWeights> experts, const float* x, int64_t n_tokens,
                           int64_t k, const int32_t* ids, const float* w, float* out);

  BackendOptions opt_;
  bool graphs_on_ = true;
  std::string name_;
  cudaStream_t st_ = nullptr;
  size_t budget_ = 0, used_ = 0;
  std::unordered_map<void*, size_t> sizes_;
  std::list<GpuWeight> descs_;                     // stable addresses: Weight::aux points here
  std::unordered_map<const void*, Buffer> owned_;  // prepared weights, by address
  std::map<const void*, Buffer> expert_tables_;
  struct LoraTable {
    Buffer terms;  // [n_terms] cuda::LoraTerm
    int n_terms = 0, total_rank = 0;
    bool all_named = true;  // no term of adapter 0 (every row)
  };
  std::unordered_map<const GpuWeight*, LoraTable> lora_tables_;  // by adapted weight
  const int32_t* adapter_of_ = nullptr;  // the step's rows' named adapters (set_adapter_rows)
  int64_t n_adapter_rows_ = 0;
  // WICK_CUDA_SKIP=norm,qkv,rope,attn,o,gate_up,down,head: kernels left out, for
  // timing what each costs inside a decode step (the output is garbage).
  bool skip(const char* what) const {
    return !skip_.empty() && skip_.find(std::string(",") + what + ",") != std::string::npos;
  }
  std::string skip_;
  Buffer batch_buf_, partial_, moe_f_, moe_i_, moe_q_, sample_buf_, xb_, norm_counter_, lora_t_,
      gated_counters_;
  uint64_t n_stream_uses_ = 0;
  int n_readers_ = 0;  // ReadsX in scope with x's integer form
  IntForm norm_form_, gated_form_, attn_form_;
  // n_in of the 8/4-bit weights: 1 some 8-bit, 2 some 4-bit (the forms norms make)
  std::map<int64_t, int> int_rows_;
  struct RopeTab {
    Buffer tab;  // [n_pos][head_dim]: cos of the half, then sin
    int head_dim = 0, n_pos = 0;
  };
  std::unordered_map<const void*, RopeTab> rope_tabs_;  // by frequency buffer
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 16 << 20;
  cudaEvent_t upload_done_ = nullptr;
  std::unordered_map<uint64_t, cudaGraphExec_t> graphs_;
};

void CudaBackend::lora_changed(const Weight& w) {
  drop_graphs();  // recorded steps launch the old table's terms
  const GpuWeight* key = &desc(w);
  if (!w.lora) {
    lora_tables_.erase(key);
    return;
  }
  std::vector<cuda::LoraTerm> terms;
  LoraTable t;
  for (const LoraDelta* l = w.lora; l; l = l->next) {
    const GpuWeight &a = desc(l->a), &b = desc(l->b);
    for (const GpuWeight* m : {&a, &b})
      if (m->fmt != cuda::Fmt::F32 && m->fmt != cuda::Fmt::BF16 && m->fmt != cuda::Fmt::F16)
        throw std::runtime_error("CUDA backend: a LoRA term must be f32, bf16 or f16");
    if (a.n_in != w.n_in || b.n_out != w.n_out || b.n_in != a.n_out)
      throw std::logic_error("CUDA backend: a LoRA term's shape does not fit its weight");
    cuda::LoraTerm& d = terms.emplace_back();
    d.a = a.q;
    d.b = b.q;
    d.scale = l->scale.f32();
    d.a_fmt = a.fmt;
    d.b_fmt = b.fmt;
    d.a_stride = a.k_pad;
    d.b_stride = b.k_pad;
    d.rank = a.n_out;
    d.adapter = l->adapter;
    d.t_off = t.total_rank;
    t.total_rank += a.n_out;
    t.all_named &= l->adapter != 0;
  }
  t.n_terms = int(terms.size());
  t.terms = alloc(terms.size() * sizeof(cuda::LoraTerm));
  copy_to_device(t.terms.data(), terms.data(), terms.size() * sizeof(cuda::LoraTerm));
  lora_tables_[key] = std::move(t);
}

void CudaBackend::moe_mlp_host_routed(std::span<const ExpertWeights> experts, const float* x,
                                      int64_t n_tokens, int64_t k, const int32_t* ids,
                                      const float* w, float* out) {
  const int64_t D = experts[0].down.n_out, F = experts[0].gate.n_out, n = n_tokens * k;
  std::vector<int32_t> h_ids(static_cast<size_t>(n));
  std::vector<float> h_w(static_cast<size_t>(n));
  copy_to_host(h_ids.data(), ids, size_t(n) * 4);
  copy_to_host(h_w.data(), w, size_t(n) * 4);
  Buffer xs = alloc(size_t(n * D) * 4), g = alloc(size_t(n * F) * 4), u = alloc(size_t(n * F) * 4),
         os = alloc(size_t(n * D) * 4), rows = alloc(size_t(n) * 4);
  std::vector<float> acc(size_t(n_tokens * D), 0.f), o(size_t(n * D));
  for (int64_t e = 0; e < int64_t(experts.size()); ++e) {
    std::vector<int32_t> r;
    std::vector<float> rw;
    for (int64_t i = 0; i < n; ++i)
      if (h_ids[size_t(i)] == e) {
        r.push_back(int32_t(i / k));
        rw.push_back(h_w[size_t(i)]);
      }
    if (r.empty()) continue;
    copy_to_device(rows.data(), r.data(), r.size() * 4);
    cuda::gather_rows(x, rows.as<int32_t>(), int(r.size()), int(D), xs.as<float>(), st());
    matmul(experts[size_t(e)].gate, xs.as<float>(), int64_t(r.size()), g.as<float>());
    matmul(experts[size_t(e)].up, xs.as<float>(), int64_t(r.size()), u.as<float>());
    silu_mul(g.as<float>(), u.as<float>(), int64_t(r.size()) * F);
    matmul(experts[size_t(e)].down, g.as<float>(), int64_t(r.size()), os.as<float>());
    copy_to_host(o.data(), os.data(), r.size() * size_t(D) * 4);
    for (size_t i = 0; i < r.size(); ++i)
      for (int64_t j = 0; j < D; ++j)
        acc[size_t(r[i] * D + j)] += o[i * size_t(D) + size_t(j)] * rw[i];
  }
  copy_to_device(out, acc.data(), acc.size() * 4);
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opt) {
  return std::make_unique<CudaBackend>(opt);
}

}  // namespace wick
