#include "model/convert.h"

#include <cstring>

#include "backend/cpu/ops.h"
#include "io/error.h"
#include "io/gguf.h"
#include "io/quantize.h"
#include "model/lora.h"
#include "model/model.h"

namespace wick {

namespace {

// Quantizes rows of one matrix in parallel; `src(r, row)` fills output row r
// (dequantized to f32).
template <typename RowSource>
std::vector<uint8_t> encode_rows(DType t, int64_t n_rows, int64_t n_in, RowSource src) {
  const size_t rb = row_bytes(t, n_in);
  std::vector<uint8_t> out(size_t(n_rows) * rb);
#pragma omp parallel num_threads(cpu::n_threads())
  {
    std::vector<float> row(static_cast<size_t>(n_in));
#pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < n_rows; ++r) {
      src(r, row.data());
      quantize_row(t, row.data(), out.data() + size_t(r) * rb, n_in);
    }
  }
  return out;
}

// Reports progress in elements written, at most once per tensor.
class Progress {
 public:
  Progress(const ConvertProgress& f, int64_t n_total) : f_(f), n_total_(n_total) {}
  void add(int64_t n, const std::string& name) {
    n_done_ += n;
    if (f_) f_(n_total_ > 0 ? double(n_done_) / double(n_total_) : 1.0, name);
  }

 private:
  const ConvertProgress& f_;
  int64_t n_total_, n_done_ = 0;
};

class Emitter {
 public:
  Emitter(GgufWriter& w, const QuantPlan& plan, const ModelConfig& c, bool tied, Progress& p)
      : w_(w), plan_(plan), c_(c), tied_(tied), progress_(p) {}

  // Converts rows of `parts` (dequantized to f32) into the plan's type.
  // `src_row(r)` gives the stored row to place at output row r.
  template <typename RowMap>
  void matrix(const std::string& name, const std::vector<const Weight*>& parts, RowMap src_row) {
    const Weight& first = *parts[0];
    const int64_t n_in = first.n_in, n_out = first.n_out;
    std::vector<int64_t> shape{n_out, n_in};
    if (parts.size() > 1) shape.insert(shape.begin(), int64_t(parts.size()));
    const DType t = plan_.type_of(name, shape, c_.n_layer, c_.n_expert, tied_,
                                  c_.n_head_kv > 0 ? c_.n_head / c_.n_head_kv : 0);
    auto out = encode_rows(t, int64_t(parts.size()) * n_out, n_in, [&](int64_t r, float* row) {
      const Weight& w = *parts[size_t(r / n_out)];
      dequantize_row_ref(w.dtype, w.row(src_row(r % n_out)), row, n_in);
      if (w.lora) add_lora_row(*w.lora, src_row(r % n_out), row);  // an adapter merged
    });
    w_.add_tensor(name, t, shape, out.data(), out.size());
    progress_.add(int64_t(parts.size()) * n_out * n_in, name);
  }
  void matrix(const std::string& name, const Weight& w) {
    matrix(name, {&w}, [](int64_t r) { return r; });
  }
  void vector(const std::string& name, const Weight& w) {
    w_.add_tensor(name, DType::F32, {w.n_in}, w.data, size_t(w.n_in) * 4);
    progress_.add(w.n_in, name);
  }

 private:
  GgufWriter& w_;
  const QuantPlan& plan_;
  const ModelConfig& c_;
  bool tied_;
  Progress& progress_;
};

QuantPlan plain_plan(DType type) {
  if (type != DType::F32 && type != DType::F16 && type != DType::BF16 && type != DType::Q8_0)
    throw_model("convert: output type {} is not supported (f32, f16, bf16, q8_0)",
                dtype_name(type));
  QuantPlan p;
  p.name = dtype_name(type);
  p.base = type;
  p.llama_rules = false;
  return p;
}

}  // namespace

void convert_hf_to_gguf(const std::string& hf_dir, const std::string& out_path, DType type) {
  convert_hf_to_gguf(hf_dir, out_path, plain_plan(type));
}

void convert_gguf(const std::string& src, const std::string& out_path, DType type) {
  convert_gguf(src, out_path, plain_plan(type));
}

void convert_hf_to_gguf(const std::string& hf_dir, const std::string& out_path,
                        const QuantPlan& plan, const ConvertProgress& progress,
                        std::span<const std::pair<std::string, float>> lora) {
  auto m = load_model(hf_dir);
  if (m->format != ModelFormat::HfFolder) throw_model("convert: {} is not a HF folder", hf_dir);
  apply_lora(*m, lora);
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
  if (is_granite(c.arch)) {  // llama.cpp's names for HF's multipliers
    w.set(a + ".embedding_scale", GgufValue::f32(c.embd_scale));
    w.set(a + ".residual_scale", GgufValue::f32(c.resid_scale));
    if (c.attn_scale > 0.f) w.set(a + ".attention.scale", GgufValue::f32(c.attn_scale));
    w.set(a + ".logit_scale", GgufValue::f32(c.logit_scale));
  }
  if (c.rope_type == "linear") {
    w.set(a + ".rope.scaling.type", GgufValue::str("linear"));
    w.set(a + ".rope.scaling.factor", GgufValue::f32(c.rope_freq_factors.at(0)));
  } else if (c.rope_type == "yarn") {
    // llama.cpp always rounds the ramp's ends outward (transformers' truncate)
    if (!c.yarn_truncate)
      throw_model("convert: {}: yarn rope scaling with truncate=false has no GGUF form", hf_dir);
    w.set(a + ".rope.scaling.type", GgufValue::str("yarn"));
    w.set(a + ".rope.scaling.factor", GgufValue::f32(c.rope_scale));
    w.set(a + ".rope.scaling.original_context_length", GgufValue::u32(uint32_t(c.rope_orig_ctx)));
    const float extra = c.rope_attn_factor / yarn_mscale(c.rope_scale);
    if (extra != 1.f) w.set(a + ".rope.scaling.yarn_attn_factor", GgufValue::f32(extra));
    if (c.yarn_beta_fast != 32.f)
      w.set(a + ".rope.scaling.yarn_beta_fast", GgufValue::f32(c.yarn_beta_fast));
    if (c.yarn_beta_slow != 1.f)
      w.set(a + ".rope.scaling.yarn_beta_slow", GgufValue::f32(c.yarn_beta_slow));
  }
  w.set("general.file_type", GgufValue::u32(plan.file_type()));

  const auto& W = m->weights;
  const bool tied = W.output.data == W.tok_embd.data;
  Progress done(progress, m->n_params);
  Emitter e(w, plan, c, tied, done);
  e.matrix("token_embd.weight", W.tok_embd);
  e.vector("output_norm.weight", W.output_norm);
  if (!tied) e.matrix("output.weight", W.output);
  if (c.rope_type == "llama3")
    w.add_tensor("rope_freqs.weight", DType::F32, {c.head_dim / 2}, c.rope_freq_factors.data(),
                 c.rope_freq_factors.size() * 4);
  const bool permute = gguf_rows_interleaved(c.arch);
  const int64_t hd = c.head_dim;
  // llama.cpp's layout: stored row r holds HF row gguf_hf_row(r)
  auto perm = [hd, permute](int64_t r) { return permute ? gguf_hf_row(r, hd) : r; };
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
    e.matrix(p + "ffn_gate_inp.weight", l.router);  // f32 by the plan
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

void convert_gguf(const std::string& src, const std::string& out_path, const QuantPlan& plan,
                  const ConvertProgress& progress,
                  std::span<const std::pair<std::string, float>> lora) {
  GgufFile f(src);
  // adapters merged: their terms read through the model, rows in HF order
  std::unique_ptr<Model> adapted;
  if (!lora.empty()) {
    adapted = load_model(src);
    apply_lora(*adapted, lora);
  }
  const std::string arch = f.get_str("general.architecture").value_or("");
  const int64_t n_layer = f.get_int(arch + ".block_count").value_or(0);
  const int64_t n_expert = f.get_int(arch + ".expert_count").value_or(0);
  // query heads per KV head for the mixes' attn_v rules (0: taken from attn_v's shape)
  const int64_t n_head = f.get_int(arch + ".attention.head_count").value_or(0);
  const int64_t n_head_kv = f.get_int(arch + ".attention.head_count_kv").value_or(n_head);
  const int64_t n_gqa = n_head > 0 && n_head_kv > 0 ? n_head / n_head_kv : 0;
  const bool tied = !f.tensors().find("output.weight");
  GgufWriter w;
  for (const auto& [key, v] : f.metadata()) {
    if (key == "general.alignment") continue;  // the writer's own
    w.set(key, key == "general.file_type" ? GgufValue::u32(plan.file_type()) : v);
  }
  if (!f.get("general.file_type")) w.set("general.file_type", GgufValue::u32(plan.file_type()));
  int64_t n_total = 0;
  for (const std::string& name : f.tensor_order()) n_total += f.tensors().find(name)->numel();
  Progress done(progress, n_total);
  for (const std::string& name : f.tensor_order()) {
    const TensorView& t = *f.tensors().find(name);
    if (!dtype_traits(uint32_t(t.dtype)) || !dtype_traits(uint32_t(t.dtype))->supported)
      throw_model("{}: tensor {} has type {}, which wick cannot read", src, name,
                  dtype_name(uint32_t(t.dtype)));
    const int64_t n_in = t.shape.back(), n_rows = t.numel() / n_in;
    const DType to = plan.type_of(name, t.shape, n_layer, n_expert, tied, n_gqa);
    const LoraDelta* term = adapted ? lora_of_gguf_tensor(*adapted, name) : nullptr;
    if (to == t.dtype && !term) {
      w.add_tensor(name, to, t.shape, t.data, t.n_bytes);
    } else {
      const size_t in_rb = row_bytes(t.dtype, n_in);
      const bool interleaved = term && gguf_rows_interleaved(adapted->config.arch) &&
                               (name.ends_with("attn_q.weight") || name.ends_with("attn_k.weight"));
      const int64_t hd = adapted ? adapted->config.head_dim : 0;
      auto out = encode_rows(to, n_rows, n_in, [&](int64_t r, float* row) {
        dequantize_row_ref(t.dtype, static_cast<const uint8_t*>(t.data) + size_t(r) * in_rb, row,
                           n_in);
        if (term) add_lora_row(*term, interleaved ? gguf_hf_row(r, hd) : r, row);
      });
      w.add_tensor(name, to, t.shape, out.data(), out.size());
    }
    done.add(t.numel(), name);
  }
  w.write(out_path);
}

}  // namespace wick
