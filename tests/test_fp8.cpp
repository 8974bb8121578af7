// HF FP8 checkpoints (model/fp8.h) against ml_dtypes: each tiny model's
// checkpoint (block, per-row and per-tensor scales; e4m3 and e5m2; f32 and
// bf16 scales) loads as exactly the bf16 weights ml_dtypes dequantizes, so it
// answers as they do; the codes of both formats; the refusals.
// Fixtures: tests/python/make_fp8_fixtures.py (setup.fp8_fixtures).
#include <cmath>
#include <cstring>
#include <filesystem>

#include "helpers.h"
#include "io/error.h"
#include "model/convert.h"
#include "model/fp8.h"
#include "model/quant_plan.h"
#include "model/quantize_weights.h"

namespace wick::test {
namespace {

namespace fs = std::filesystem;

std::string fp8_dir() {
  return data_dir() + "/fp8";
}

#define WICK_REQUIRE_FP8_FIXTURES()                                                        \
  do {                                                                                     \
    if (!fs::exists(fp8_dir() + "/variants.json"))                                         \
      WICK_SKIP_OR_FAIL("fp8 fixtures missing at " << fp8_dir()                            \
                                                   << " (ctest runs setup.fp8_fixtures)"); \
  } while (0)

// Every matrix of the model, named, in a fixed order.
std::vector<std::pair<std::string, const Weight*>> matrices(const Model& m) {
  std::vector<std::pair<std::string, const Weight*>> out;
  const ModelWeights& W = m.weights;
  out.push_back({"tok_embd", &W.tok_embd});
  out.push_back({"output", &W.output});
  for (size_t il = 0; il < W.layers.size(); ++il) {
    const LayerWeights& l = W.layers[il];
    const std::string p = "layer " + std::to_string(il) + " ";
    for (auto [n, w] : {std::pair{"wq", &l.wq},
                        {"wk", &l.wk},
                        {"wv", &l.wv},
                        {"wo", &l.wo},
                        {"w_gate", &l.w_gate},
                        {"w_up", &l.w_up},
                        {"w_down", &l.w_down},
                        {"router", &l.router}})
      out.push_back({p + n, w});
    for (size_t e = 0; e < l.experts.size(); ++e) {
      const ExpertWeights& x = l.experts[e];
      const std::string q = p + "expert " + std::to_string(e) + " ";
      out.push_back({q + "gate", &x.gate});
      out.push_back({q + "up", &x.up});
      out.push_back({q + "down", &x.down});
    }
  }
  return out;
}

std::string refusal(const std::string& dir) {
  try {
    load_model(dir);
  } catch (const ModelError& e) {
    return e.what();
  } catch (const IoError& e) {
    return std::string("IoError: ") + e.what();
  }
  return "(loaded)";
}

std::vector<int32_t> prompt_ids() {
  return {1, 17, 300, 42, 511, 8, 99, 250, 3, 77, 128, 400, 5};
}

TEST(Fp8, CheckpointsLoadAsTheBf16WeightsMlDtypesDequantizes) {
  WICK_REQUIRE_FP8_FIXTURES();
  for (const std::string name : read_json(fp8_dir() + "/variants.json")) {
    SCOPED_TRACE(name);
    auto fp8 = load_model(fp8_dir() + "/" + name + "/fp8");
    auto want = load_model(fp8_dir() + "/" + name + "/want");
    const auto a = matrices(*fp8), b = matrices(*want);
    ASSERT_EQ(a.size(), b.size());
    int64_t n_quantized = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const Weight &x = *a[i].second, &y = *b[i].second;
      SCOPED_TRACE(a[i].first);
      if (y.empty()) {
        EXPECT_TRUE(x.empty());
        continue;
      }
      ASSERT_EQ(x.dtype, y.dtype);
      ASSERT_EQ(x.n_out, y.n_out);
      ASSERT_EQ(x.n_in, y.n_in);
      const size_t n_bytes = size_t(y.n_out) * row_bytes(y.dtype, y.n_in);
      EXPECT_EQ(std::memcmp(x.data, y.data, n_bytes), 0);
      n_quantized += y.dtype == DType::BF16;
    }
    EXPECT_GE(n_quantized, 14);  // 7 linear weights a layer, 2 layers
    // The checkpoint counts its parameters as stored.
    const char* stored = name.find("e5m2") != std::string::npos ? "f8_e5m2" : "f8_e4m3";
    EXPECT_GT(fp8->n_params_by_dtype[stored], 0);
    EXPECT_EQ(fp8->n_params, want->n_params);
    // So it answers as the dequantized model, prefill in one pass or chunks.
    const auto ids = prompt_ids();
    const auto ref = run_all_logits(*want, ids);
    EXPECT_EQ(run_all_logits(*fp8, ids), ref);
    EXPECT_EQ(run_all_logits(*fp8, ids, 4), run_all_logits(*want, ids, 4));
    // And it is not the unquantized model (the fixture quantized something).
    const std::string tiny = name.substr(0, name.find('-'));
    EXPECT_GT(rel_err(run_all_logits(*load_model(tiny_dir(tiny)), ids), ref), 1e-4);
  }
}

TEST(Fp8, EveryCodeIsTheOcpFormatsValue) {
  WICK_REQUIRE_FP8_FIXTURES();
  for (auto [t, file] : {std::pair{DType::F8_E4M3, "e4m3"}, {DType::F8_E5M2, "e5m2"}}) {
    const auto want = read_f32(fp8_dir() + "/" + file + ".f32");
    ASSERT_EQ(want.size(), 256u);
    for (int c = 0; c < 256; ++c) {
      const float got = fp8_to_f32(t, uint8_t(c));
      if (std::isnan(want[size_t(c)])) {
        EXPECT_TRUE(std::isnan(got)) << file << " code " << c;
      } else {
        EXPECT_EQ(got, want[size_t(c)]) << file << " code " << c;
      }
    }
  }
  // e5m2 is the high byte of an f16
  for (int c = 0; c < 256; ++c) {
    const float got = fp8_to_f32(DType::F8_E5M2, uint8_t(c)), half = f16_to_f32(uint16_t(c << 8));
    EXPECT_TRUE(std::isnan(got) ? std::isnan(half) : got == half) << "e5m2 code " << c;
  }
  EXPECT_EQ(fp8_to_f32(DType::F8_E4M3, 0x7e), 448.f);
  EXPECT_EQ(fp8_to_f32(DType::F8_E4M3, 0x01), std::ldexp(1.f, -9));
}

TEST(Fp8, QuantizedAndConvertedAsTheDequantizedModel) {
  WICK_REQUIRE_FP8_FIXTURES();
  const std::string d = fp8_dir() + "/llama-block/";
  const auto ids = prompt_ids();
  // --quantize q8_0 on load
  const auto plan = *quant_plan_from_name("q8_0");
  auto fp8 = load_model(d + "fp8");
  auto want = load_model(d + "want");
  // the loader's bf16 copies of the FP8 matrices, by their index in `owned`
  std::vector<size_t> bf16_copies;
  for (const auto& [name, w] : matrices(*fp8))
    for (size_t i = 0; i < fp8->owned.size(); ++i)
      if (!w->empty() && w->dtype == DType::BF16 && fp8->owned[i].data() == w->data)
        bf16_copies.push_back(i);
  EXPECT_EQ(bf16_copies.size(), 14u);
  EXPECT_GT(quantize_weights(*fp8, plan), 0);
  quantize_weights(*want, plan);
  for (size_t i : bf16_copies) EXPECT_TRUE(fp8->owned[i].empty()) << "owned[" << i << "] kept";
  EXPECT_EQ(run_all_logits(*fp8, ids), run_all_logits(*want, ids));
  // wick convert: a GGUF file of the checkpoint
  const std::string out = ::testing::TempDir() + "/fp8-llama.gguf",
                    out_want = ::testing::TempDir() + "/fp8-llama-want.gguf";
  convert_hf_to_gguf(d + "fp8", out, DType::BF16);
  convert_hf_to_gguf(d + "want", out_want, DType::BF16);
  EXPECT_EQ(run_all_logits(*load_model(out), ids), run_all_logits(*load_model(out_want), ids));
  fs::remove(out);
  fs::remove(out_want);
}

TEST(Fp8, BadCheckpointsAreRefusedByName) {
  WICK_REQUIRE_FP8_FIXTURES();
  const std::string b = fp8_dir() + "/bad/";
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  auto has = [](const std::string& s, std::initializer_list<const char*> parts) {
    for (const char* p : parts)
      if (s.find(p) == std::string::npos) return ::testing::AssertionFailure() << s;
    return ::testing::AssertionSuccess();
  };
  EXPECT_TRUE(has(refusal(b + "nan-code"), {q.c_str(), "at [3, 5]", "nan", "0x7f"}));
  EXPECT_TRUE(has(refusal(b + "no-scale"), {q.c_str(), "has no scale", "_scale_inv"}));
  EXPECT_TRUE(has(refusal(b + "scale-shape"),
                  {"_scale_inv", "has shape [3, 3]", "weight_block_size [48, 40]", "[2, 2]"}));
  EXPECT_TRUE(has(refusal(b + "scale-inf"), {"_scale_inv", "holds inf at 1"}));
  EXPECT_TRUE(has(refusal(b + "gptq"), {"config.json", "'gptq' is not supported"}));
  EXPECT_TRUE(has(refusal(b + "norm-fp8"), {"model.norm.weight", "matrices only"}));
  EXPECT_TRUE(has(refusal(b + "method-number"), {"quant_method is 8, not a string"}));
  EXPECT_TRUE(has(refusal(b + "int4-packed"), {"format 'pack-quantized' is not supported"}));
}

}  // namespace
}  // namespace wick::test
