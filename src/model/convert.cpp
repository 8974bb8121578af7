#include "model/convert.h"

#include <cstring>

#include "io/error.h"
#include "io/gguf.h"
#include "model/model.h"

namespace wick {

namespace {

std::string gguf_arch(Arch a) {
  switch (a) {
    case Arch::Llama:
    case Arch::Mistral:
    case Arch::Mixtral:
      return "llama";
    case Arch::Qwen2:
      return "qwen2";
    case Arch::Qwen3:
      return "qwen3";
    case Arch::Qwen3Moe:
      return "qwen3moe";
  }
  return "?";
}

// One row of f32 values written as type t.
void encode(DType t, const float* x, uint8_t* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, x, size_t(n) * 4);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) reinterpret_cast<uint16_t*>(dst)[i] = f32_to_f16(x[i]);
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) reinterpret_cast<uint16_t*>(dst)[i] = f32_to_bf16(x[i]);
      return;
    case DType::Q8_0:
      quantize_row_q8_0(x, dst, n);
      return;
    default:
      throw_model("convert: cannot write type {}", dtype_name(t));
  }
}

class Emitter {
 public:
  Emitter(GgufWriter& w, DType type) : w_(w), type_(type) {}

  // Converts rows of `src` (dequantized to f32) into the target type.
  // `src_row(r)` gives the stored row to place at output row r.
  template <typename RowMap>
  void matrix(const std::string& name, const std::vector<const Weight*>& parts, RowMap src_row) {
    const Weight& first = *parts[0];
    const int64_t n_in = first.n_in, n_out = first.n_out;
    DType t = type_;
    if (n_in % traits(t).block_size) t = DType::F32;
    const size_t rb = row_bytes(t, n_in);
    std::vector<uint8_t> out(parts.size() * size_t(n_out) * rb);
    std::vector<float> row(static_cast<size_t>(n_in));
    for (size_t p = 0; p < parts.size(); ++p)
      for (int64_t r = 0; r < n_out; ++r) {
        const Weight& w = *parts[p];
        dequantize_row_ref(w.dtype, w.row(src_row(r)), row.data(), n_in);
        encode(t, row.data(), out.data() + (p * size_t(n_out) + size_t(r)) * rb, n_in);
      }
    std::vector<int64_t> shape{n_out, n_in};
    if (parts.size() > 1) shape.insert(shape.begin(), int64_t(parts.size()));
    w_.add_tensor(name, t, shape, out.data(), out.size());
  }
  void matrix(const std::string& name, const Weight& w) {
    matrix(name, {&w}, [](int64_t r) { return r; });
  }
  // Kept in f32 whatever the target (as llama.cpp does for MoE routers):
  // rounding flips expert choices, which costs far more than it saves.
  void matrix_f32(const std::string& name, const Weight& w) {
    DType keep = type_;
    type_ = DType::F32;
    matrix(name, w);
    type_ = keep;
  }
  void vector(const std::string& name, const Weight& w) {
    w_.add_tensor(name, DType::F32, {w.n_in}, w.data, size_t(w.n_in) * 4);
  }

 private:
  GgufWriter& w_;
  DType type_;
};

}  // namespace

void convert_hf_to_gguf(const std::string& hf_dir, const std::string& out_path, DType type) {
  if (type != DType::F32 && type != DType::F16 && type != DType::BF16 && type != DType::Q8_0)
    throw_model("convert: output type {} is not supported (f32, f16, bf16, q8_0)",
                dtype_name(type));
  auto m = load_model(hf_dir);
  if (m->format != ModelFormat::HfFolder) throw_model("convert: {} is not a HF folder", hf_dir);
  const ModelConfig& c = m->config;
  const std::string a = gguf_arch(c.arch);
  GgufWriter w;
  w.set("general.architecture", GgufValue::str(a));
  w.set("general.name", GgufValue::str(std::string("wick-converted ") + arch_name(c.arch)));
  w.set(a + ".context_length", GgufValue::u32(uint32_t(c.n_ctx_train)));
  w.set(a + ".embedding_length", GgufValue::u32(uint32_t(c.n_embd)));
  w.set(a + ".block_count", GgufValue::u32(uint32_t(c.n_layer)));
  if (c.n_ff > 0) w.set(a + ".feed_forward_length", GgufValue::u32(uint32_t(c.n_ff)));
  w.set(a + ".attention.head_count", GgufValue::u32(uint32_t(c.n_head)));
  w.set(a + ".attention.head_count_kv", GgufValue::u32(uint32_t(c.n_head_kv)));
  w.set(a + ".attention.key_length", GgufValue::u32(uint32_t(c.head_dim)));
  w.set(a + ".attention.value_length", GgufValue::u32(uint32_t(c.head_dim)));
  w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::f32(c.rms_eps));
  w.set(a + ".rope.freq_base", GgufValue::f32(c.rope_theta));
  w.set(a + ".rope.dimension_count", GgufValue::u32(uint32_t(c.head_dim)));
  w.set(a + ".vocab_size", GgufValue::u32(uint32_t(c.n_vocab)));
  if (c.sliding_window > 0)
    w.set(a + ".attention.sliding_window", GgufValue::u32(uint32_t(c.sliding_window)));
  if (c.is_moe()) {
    w.set(a + ".expert_count", GgufValue::u32(uint32_t(c.n_expert)));
    w.set(a + ".expert_used_count", GgufValue::u32(uint32_t(c.n_expert_used)));
    if (c.arch == Arch::Qwen3Moe) {
      w.set(a + ".expert_feed_forward_length", GgufValue::u32(uint32_t(c.n_ff_expert)));
      w.set(a + ".expert_weights_norm", GgufValue::boolean(c.norm_topk_prob));
    }
  }
  if (c.rope_type == "linear") {
    w.set(a + ".rope.scaling.type", GgufValue::str("linear"));
    w.set(a + ".rope.scaling.factor", GgufValue::f32(c.rope_freq_factors.at(0)));
  }
  w.set("general.file_type", GgufValue::u32(type == DType::F32    ? 0
                                            : type == DType::F16  ? 1
                                            : type == DType::Q8_0 ? 7
                                                                  : 32));

  Emitter e(w, type);
  const auto& W = m->weights;
  e.matrix("token_embd.weight", W.tok_embd);
  e.vector("output_norm.weight", W.output_norm);
  if (W.output.data != W.tok_embd.data) e.matrix("output.weight", W.output);
  if (c.rope_type == "llama3")
    w.add_tensor("rope_freqs.weight", DType::F32, {c.head_dim / 2}, c.rope_freq_factors.data(),
                 c.rope_freq_factors.size() * 4);
  const bool permute = a == "llama";
  const int64_t hd = c.head_dim;
  // llama.cpp's layout: stored row h*hd + 2i + half holds HF row h*hd + half*hd/2 + i.
  auto perm = [hd, permute](int64_t r) {
    if (!permute) return r;
    int64_t h = r / hd, j = r % hd, i = j / 2, half = j % 2;
    return h * hd + half * (hd / 2) + i;
  };
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& l = W.layers[size_t(il)];
    std::string p = "blk." + std::to_string(il) + ".";
    e.vector(p + "attn_norm.weight", l.attn_norm);
    e.vector(p + "ffn_norm.weight", l.ffn_norm);
    e.matrix(p + "attn_q.weight", {&l.wq}, perm);
    e.matrix(p + "attn_k.weight", {&l.wk}, perm);
    e.matrix(p + "attn_v.weight", l.wv);
    e.matrix(p + "attn_output.weight", l.wo);
    if (c.qkv_bias) {
      std::vector<float> q(size_t(c.q_dim())), k(size_t(c.kv_dim()));
      for (int64_t r = 0; r < c.q_dim(); ++r) q[r] = l.bq.f32()[perm(r)];
      for (int64_t r = 0; r < c.kv_dim(); ++r) k[r] = l.bk.f32()[perm(r)];
      w.add_tensor(p + "attn_q.bias", DType::F32, {c.q_dim()}, q.data(), q.size() * 4);
      w.add_tensor(p + "attn_k.bias", DType::F32, {c.kv_dim()}, k.data(), k.size() * 4);
      e.vector(p + "attn_v.bias", l.bv);
    }
    if (c.o_bias) e.vector(p + "attn_output.bias", l.bo);
    if (c.qk_norm) {
      e.vector(p + "attn_q_norm.weight", l.q_norm);
      e.vector(p + "attn_k_norm.weight", l.k_norm);
    }
    if (!c.layer_is_moe(il)) {
      e.matrix(p + "ffn_gate.weight", l.w_gate);
      e.matrix(p + "ffn_up.weight", l.w_up);
      e.matrix(p + "ffn_down.weight", l.w_down);
      continue;
    }
    e.matrix_f32(p + "ffn_gate_inp.weight", l.router);
    std::vector<const Weight*> g, u, d;
    for (auto& x : l.experts) {
      g.push_back(&x.gate);
      u.push_back(&x.up);
      d.push_back(&x.down);
    }
    auto id = [](int64_t r) { return r; };
    e.matrix(p + "ffn_gate_exps.weight", g, id);
    e.matrix(p + "ffn_up_exps.weight", u, id);
    e.matrix(p + "ffn_down_exps.weight", d, id);
  }
  w.write(out_path);
}

void convert_gguf(const std::string& src, const std::string& out_path, DType type) {
  if (type != DType::F32 && type != DType::F16 && type != DType::BF16 && type != DType::Q8_0)
    throw_model("convert: output type {} is not supported (f32, f16, bf16, q8_0)",
                dtype_name(type));
  GgufFile f(src);
  GgufWriter w;
  for (const auto& [key, v] : f.metadata()) {
    if (key == "general.alignment") continue;  // the writer's own
    w.set(key, key == "general.file_type" ? GgufValue::u32(type == DType::F32    ? 0
                                                           : type == DType::F16  ? 1
                                                           : type == DType::Q8_0 ? 7
                                                                                 : 32)
                                          : v);
  }
  std::vector<float> row;
  for (const std::string& name : f.tensor_order()) {
    const TensorView& t = *f.tensors().find(name);
    const int64_t n_in = t.shape.back(), n_rows = t.numel() / n_in;
    // Vectors and MoE routers stay f32 (as convert_hf_to_gguf writes them);
    // rows that do not fit the type's block size too.
    DType to = type;
    if (t.shape.size() < 2 || name.find("ffn_gate_inp") != std::string::npos ||
        n_in % traits(to).block_size)
      to = DType::F32;
    if (to == t.dtype) {
      w.add_tensor(name, to, t.shape, t.data, t.n_bytes);
      continue;
    }
    const size_t in_rb = row_bytes(t.dtype, n_in), out_rb = row_bytes(to, n_in);
    std::vector<uint8_t> out(size_t(n_rows) * out_rb);
    row.resize(size_t(n_in));
    for (int64_t r = 0; r < n_rows; ++r) {
      dequantize_row_ref(t.dtype, static_cast<const uint8_t*>(t.data) + size_t(r) * in_rb,
                         row.data(), n_in);
      encode(to, row.data(), out.data() + size_t(r) * out_rb, n_in);
    }
    w.add_tensor(name, to, t.shape, out.data(), out.size());
  }
  w.write(out_path);
}

}  // namespace wick
