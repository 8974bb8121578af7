#include "model/shaped.h"

#include <cstddef>
#include <cstring>
#include <map>

#include "backend/cpu/ops.h"
#include "io/error.h"
#include "io/quant_blocks.h"

namespace wick {

namespace {

struct Shape {
  Arch arch;
  int64_t n_vocab, n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim;
  float rope_theta, rms_eps;
  bool qkv_bias, qk_norm;
};

const std::map<std::string, Shape>& shapes() {
  static const std::map<std::string, Shape> s{
      {"smollm2-135m", {Arch::Llama, 49152, 576, 1536, 30, 9, 3, 64, 1e5f, 1e-5f, false, false}},
      {"qwen2.5-0.5b", {Arch::Qwen2, 151936, 896, 4864, 24, 14, 2, 64, 1e6f, 1e-6f, true, false}},
      {"qwen3-0.6b", {Arch::Qwen3, 151936, 1024, 3072, 28, 16, 8, 128, 1e6f, 1e-6f, false, true}},
      {"llama3.2-1b", {Arch::Llama, 128256, 2048, 8192, 16, 32, 8, 64, 5e5f, 1e-5f, false, false}},
      {"granite3-2b", {Arch::Granite, 49155, 2048, 8192, 40, 32, 8, 64, 5e6f, 1e-5f, false, false}},
      // the sizes where a GPU's large projections are large (8B: 16 GB in bf16)
      {"llama3.2-3b", {Arch::Llama, 128256, 3072, 8192, 28, 24, 8, 128, 5e5f, 1e-5f, false, false}},
      {"llama3.1-8b",
       {Arch::Llama, 128256, 4096, 14336, 32, 32, 8, 128, 5e5f, 1e-5f, false, false}},
  };
  return s;
}

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

// Random rows of `t`: small floats (|x| < 0.04), or random quants with
// scales of a trained model's size. Rows are filled in parallel.
void fill_random_weight(DType t, int64_t n_out, int64_t n_in, uint8_t* dst, uint64_t seed) {
  const size_t rb = row_bytes(t, n_in);
#pragma omp parallel for schedule(static) num_threads(cpu::n_threads())
  for (int64_t r = 0; r < n_out; ++r) {
    uint64_t s = mix(seed ^ uint64_t(r) * 0x100000001B3ull);
    uint8_t* row = dst + size_t(r) * rb;
    auto next = [&] { return s = mix(s); };
    auto small = [&] { return (float(next() >> 40) / float(1 << 24) - 0.5f) * 0.08f; };
    switch (t) {
      case DType::F32:
        for (int64_t i = 0; i < n_in; ++i) reinterpret_cast<float*>(row)[i] = small();
        break;
      case DType::F16:
        for (int64_t i = 0; i < n_in; ++i)
          reinterpret_cast<uint16_t*>(row)[i] = f32_to_f16(small());
        break;
      case DType::BF16:
        for (int64_t i = 0; i < n_in; ++i)
          reinterpret_cast<uint16_t*>(row)[i] = f32_to_bf16(small());
        break;
      default: {
        for (size_t i = 0; i < rb; i += 8) {
          const uint64_t v = next();
          std::memcpy(row + i, &v, std::min<size_t>(8, rb - i));
        }
        // every f16 scale field sane: d (and m/dmin) around 0.002
        const size_t bb = traits(t).block_bytes;
        const std::vector<size_t> offs =
            t == DType::Q6_K   ? std::vector<size_t>{offsetof(BlockQ6_K, d)}
            : t == DType::Q3_K ? std::vector<size_t>{offsetof(BlockQ3_K, d)}
            : t == DType::Q2_K
                ? std::vector<size_t>{offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)}
            : (t == DType::Q4_1 || t == DType::Q4_K || t == DType::Q5_1 || t == DType::Q5_K)
                ? std::vector<size_t>{0, 2}
                : std::vector<size_t>{0};
        for (size_t b = 0; b < rb / bb; ++b)
          for (size_t o : offs) {
            const uint16_t d = f32_to_f16(0.001f + small() * 0.01f);
            std::memcpy(row + b * bb + o, &d, 2);
          }
      }
    }
  }
}

bool is_shaped_name(const std::string& path) {
  return path.rfind("shaped:", 0) == 0;
}

std::unique_ptr<Model> make_shaped_model(const std::string& name) {
  const size_t a = name.find(':'), b = name.find(':', a + 1);
  const std::string shape = name.substr(a + 1, b == std::string::npos ? b : b - a - 1);
  const std::string tname = b == std::string::npos ? "bf16" : name.substr(b + 1);
  auto it = shapes().find(shape);
  std::string known;
  for (auto& [k, v] : shapes()) known += (known.empty() ? "" : ", ") + k;
  if (it == shapes().end()) throw_model("{}: unknown shape '{}' (known: {})", name, shape, known);
  const auto t = dtype_from_name(tname);
  if (!t || !traits(*t).supported || *t == DType::Q8_1 || *t == DType::Q8_K)
    throw_model("{}: unknown weight type '{}'", name, tname);
  const Shape& s = it->second;
  auto m = std::make_unique<Model>();
  m->path = name;
  ModelConfig& c = m->config;
  c.arch = s.arch;
  c.n_vocab = s.n_vocab;
  c.n_embd = s.n_embd;
  c.n_layer = s.n_layer;
  c.n_head = s.n_head;
  c.n_head_kv = s.n_head_kv;
  c.head_dim = s.head_dim;
  c.n_ff = s.n_ff;
  c.n_ctx_train = 32768;
  c.rms_eps = s.rms_eps;
  c.rope_theta = s.rope_theta;
  c.tie_embeddings = true;
  c.qkv_bias = s.qkv_bias;
  c.qk_norm = s.qk_norm;
  if (c.arch == Arch::Granite) {  // granite-3.1-2b's multipliers
    c.embd_scale = 12.f;
    c.resid_scale = 0.22f;
    c.attn_scale = 0.015625f;
    c.logit_scale = 8.f;
  }
  c.validate(name);
  uint64_t seed = 1;
  auto mat = [&](int64_t n_out, int64_t n_in) {
    if (n_in % traits(*t).block_size)
      throw_model("{}: rows of {} do not split into {} blocks", name, n_in, tname);
    auto& buf = m->owned.emplace_back(size_t(n_out) * row_bytes(*t, n_in));
    fill_random_weight(*t, n_out, n_in, buf.data(), ++seed);
    m->n_params += n_out * n_in;
    m->n_params_by_dtype[tname] += n_out * n_in;
    return Weight{*t, n_out, n_in, buf.data()};
  };
  auto vec = [&](int64_t n, bool ones) {
    auto& buf = m->owned.emplace_back(size_t(n) * 4);
    auto* f = reinterpret_cast<float*>(buf.data());
    fill_random_weight(DType::F32, 1, n, buf.data(), ++seed);
    if (ones)
      for (int64_t i = 0; i < n; ++i) f[i] = 1.f;
    m->n_params += n;
    m->n_params_by_dtype["f32"] += n;
    return Weight{DType::F32, 1, n, buf.data()};
  };
  auto& W = m->weights;
  W.tok_embd = mat(c.n_vocab, c.n_embd);
  W.output = W.tok_embd;
  W.output_norm = vec(c.n_embd, true);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    LayerWeights& l = W.layers.emplace_back();
    l.attn_norm = vec(c.n_embd, true);
    l.ffn_norm = vec(c.n_embd, true);
    l.wq = mat(c.q_dim(), c.n_embd);
    l.wk = mat(c.kv_dim(), c.n_embd);
    l.wv = mat(c.kv_dim(), c.n_embd);
    l.wo = mat(c.n_embd, c.q_dim());
    if (c.qkv_bias) {
      l.bq = vec(c.q_dim(), false);
      l.bk = vec(c.kv_dim(), false);
      l.bv = vec(c.kv_dim(), false);
    }
    if (c.qk_norm) {
      l.q_norm = vec(c.head_dim, true);
      l.k_norm = vec(c.head_dim, true);
    }
    l.w_gate = mat(c.n_ff, c.n_embd);
    l.w_up = mat(c.n_ff, c.n_embd);
    l.w_down = mat(c.n_embd, c.n_ff);
  }
  m->tokenizer_kind = "none";
  return m;
}

}  // namespace wick
