// LoRA adapters against PEFT's rule, y = W x + scale * B (A x): the tiny
// llama with an adapter against the float64 numpy forward on the weights with
// scale * B @ A merged in (as PEFT's merge_and_unload gives them), the same
// adapter read from a PEFT folder and from a GGUF adapter laid out as
// llama.cpp's converter writes one, stacked adapters, every architecture
// against its merged weights, batch invariance, and the refusals.
// Fixtures: tests/python/make_lora_fixtures.py (setup.lora_fixtures).
#include <filesystem>

#include "engine/engine.h"
#include "engine/model_pool.h"
#include "engine/session.h"
#include "engine_run.h"
#include "helpers.h"
#include "io/error.h"
#include "model/convert.h"
#include "model/lora.h"
#include "model/quant_plan.h"

namespace wick::test {
namespace {

namespace fs = std::filesystem;
using Adapters = std::vector<std::pair<std::string, float>>;

std::string lora_dir() {
  return data_dir() + "/lora";
}

#define WICK_REQUIRE_LORA_FIXTURES()                                                         \
  do {                                                                                       \
    if (!fs::exists(lora_dir() + "/ids.json"))                                               \
      WICK_SKIP_OR_FAIL("lora fixtures missing at " << lora_dir()                            \
                                                    << " (ctest runs setup.lora_fixtures)"); \
  } while (0)

std::vector<int32_t> lora_ids() {
  return read_json(lora_dir() + "/ids.json").get<std::vector<int32_t>>();
}

std::unique_ptr<Model> with_adapters(const std::string& model, const Adapters& adapters) {
  auto m = load_model(model);
  apply_lora(*m, adapters);
  return m;
}

// The ModelError or IoError message of applying `adapters` to `model`.
std::string refusal(const std::string& model, const Adapters& adapters) {
  try {
    with_adapters(model, adapters);
  } catch (const ModelError& e) {
    return e.what();
  } catch (const IoError& e) {
    return e.what();
  }
  return "(applied)";
}

TEST(Lora, PeftAdapterMatchesTheMergedNumpyReference) {
  WICK_REQUIRE_LORA_FIXTURES();
  const auto ids = lora_ids();
  const auto want = read_f32(lora_dir() + "/llama/ref_one.f32");
  auto m = with_adapters(tiny_dir("llama"), {{lora_dir() + "/llama/peft", 1.f}});
  ASSERT_EQ(m->adapters.size(), 1u);
  const double err = rel_err(run_all_logits(*m, ids), want);
  std::printf("[ report ] PEFT adapter, %zu positions: relative error %.2e\n", ids.size(), err);
  EXPECT_LT(err, 1e-4);
  EXPECT_LT(rel_err(run_all_logits(*m, ids, 7), want), 1e-4);  // prefill in chunks
  // the adapter is not idle at this bound
  EXPECT_GT(rel_err(run_all_logits(*load_model(tiny_dir("llama")), ids), want), 1e-2);
}

// llama.cpp's GGUF adapter of the same A and B (q/k rows interleaved, lora_a
// f16, alpha in the metadata), on the HF folder and on a GGUF of the model.
TEST(Lora, GgufAdapterMatchesTheSameReference) {
  WICK_REQUIRE_LORA_FIXTURES();
  const auto ids = lora_ids();
  const auto want = read_f32(lora_dir() + "/llama/ref_one.f32");
  const Adapters gguf{{lora_dir() + "/llama/adapter.gguf", 1.f}};
  EXPECT_LT(rel_err(run_all_logits(*with_adapters(tiny_dir("llama"), gguf), ids), want), 1e-4);
  const std::string base = lora_dir() + "/llama-gguf-base.gguf";
  convert_hf_to_gguf(tiny_dir("llama"), base, DType::F32);
  EXPECT_LT(rel_err(run_all_logits(*with_adapters(base, gguf), ids), want), 1e-4);
  const Adapters peft{{lora_dir() + "/llama/peft", 1.f}};
  EXPECT_LT(rel_err(run_all_logits(*with_adapters(base, peft), ids), want), 1e-4);
  // scale 0 leaves the model as it is
  EXPECT_EQ(run_all_logits(*with_adapters(base, {{gguf[0].first, 0.f}}), ids),
            run_all_logits(*load_model(base), ids));
  fs::remove(base);
}

// Two adapters at once, the second rsLoRA (alpha / sqrt(r)) at scale 0.5.
TEST(Lora, StackedAdaptersAddTheirTerms) {
  WICK_REQUIRE_LORA_FIXTURES();
  const auto ids = lora_ids();
  auto m = with_adapters(tiny_dir("llama"), {{lora_dir() + "/llama/peft", 1.f},
                                             {lora_dir() + "/llama/peft-rslora", 0.5f}});
  const auto want = read_f32(lora_dir() + "/llama/ref_both.f32");
  EXPECT_LT(rel_err(run_all_logits(*m, ids), want), 1e-4);
  EXPECT_GT(rel_err(read_f32(lora_dir() + "/llama/ref_one.f32"), want), 1e-3);
}

// Biases (qwen2), q/k norms after the projections (qwen3), sliding windows
// (mistral) and MoE models' attention: the adapter equals its merged weights.
TEST(Lora, EveryArchitectureEqualsItsMergedWeights) {
  WICK_REQUIRE_LORA_FIXTURES();
  const auto ids = lora_ids();
  for (const char* arch : {"mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(arch);
    const std::string d = lora_dir() + "/" + arch;
    const auto want = run_all_logits(*load_model(d + "/merged"), ids);
    const double err =
        rel_err(run_all_logits(*with_adapters(tiny_dir(arch), {{d + "/peft", 1.f}}), ids), want);
    std::printf("[ report ] %s: relative error %.2e against the merged weights\n", arch, err);
    EXPECT_LT(err, 1e-5);
    EXPECT_GT(rel_err(run_all_logits(*load_model(tiny_dir(arch)), ids), want), 1e-3);
  }
}

// A token's tokens do not depend on its batch with an adapter either.
TEST(Lora, EngineBatchedEqualsSequential) {
  WICK_REQUIRE_LORA_FIXTURES();
  BackendOptions opt;
  opt.device = Device::Cpu;
  opt.lora = {{lora_dir() + "/llama/peft", 1.f}};
  auto m = load_model_and_tokenizer(tiny_dir("llama"), {}, opt);
  ASSERT_FALSE(m->model->lora.empty());
  EngineConfig cfg;
  cfg.max_batch_tokens = 40;
  cfg.max_seqs = 4;
  expect_engine_equals_sessions(m, 5, 6, cfg);
}

// Merged into a file (wick quantize --lora, llama.cpp's export-lora): the
// written model alone answers as the model with the adapter.
TEST(Lora, MergedIntoAFileAnswersAsTheAdapter) {
  WICK_REQUIRE_LORA_FIXTURES();
  const auto ids = lora_ids();
  const auto want = read_f32(lora_dir() + "/llama/ref_one.f32");
  const Adapters peft{{lora_dir() + "/llama/peft", 1.f}};
  const Adapters gguf{{lora_dir() + "/llama/adapter.gguf", 1.f}};
  const QuantPlan f32 = *quant_plan_from_name("f32"), q8 = *quant_plan_from_name("q8_0");
  const std::string d = lora_dir() + "/merged-", base = d + "base.gguf";
  convert_hf_to_gguf(tiny_dir("llama"), d + "hf.gguf", f32, {}, peft);
  EXPECT_LT(rel_err(run_all_logits(*load_model(d + "hf.gguf"), ids), want), 1e-4);
  // GGUF to GGUF: the adapter's q/k rows and the file's both interleaved
  convert_hf_to_gguf(tiny_dir("llama"), base, DType::F32);
  convert_gguf(base, d + "gguf.gguf", f32, {}, gguf);
  EXPECT_LT(rel_err(run_all_logits(*load_model(d + "gguf.gguf"), ids), want), 1e-4);
  // quantized after the merge: within q8_0's error, far closer than without the adapter
  convert_gguf(base, d + "q8.gguf", q8, {}, gguf);
  convert_gguf(base, d + "q8-plain.gguf", q8, {});
  const double err = rel_err(run_all_logits(*load_model(d + "q8.gguf"), ids), want);
  const double plain = rel_err(run_all_logits(*load_model(d + "q8-plain.gguf"), ids), want);
  std::printf("[ report ] merged then q8_0: relative error %.2e (without the adapter %.2e)\n", err,
              plain);
  EXPECT_LT(err, 4e-2);
  EXPECT_GT(plain, 5 * err);
  for (const char* f : {"hf.gguf", "base.gguf", "gguf.gguf", "q8.gguf", "q8-plain.gguf"})
    fs::remove(d + f);
}

TEST(Lora, RefusalsNameWhatDoesNotFit) {
  WICK_REQUIRE_LORA_FIXTURES();
  const std::string llama = tiny_dir("llama"), d = lora_dir();
  EXPECT_NE(refusal(llama, {{d + "/bad/dora", 1.f}}).find("use_dora"), std::string::npos);
  // an expert's projection is not a target
  const std::string experts = refusal(tiny_dir("qwen3_moe"), {{d + "/bad/experts", 1.f}});
  EXPECT_NE(experts.find("experts.0.gate_proj"), std::string::npos) << experts;
  EXPECT_NE(experts.find("attention (q, k, v, o)"), std::string::npos) << experts;
  // a dense-MLP adapter on a MoE model
  const std::string moe = refusal(tiny_dir("qwen3_moe"), {{d + "/qwen3/peft", 1.f}});
  EXPECT_NE(moe.find("mixture of experts"), std::string::npos) << moe;
  // another architecture's GGUF adapter
  EXPECT_NE(refusal(tiny_dir("qwen3"), {{d + "/llama/adapter.gguf", 1.f}})
                .find("an adapter for 'llama' models"),
            std::string::npos);
  // a model where an adapter belongs
  const std::string base = d + "/llama-not-an-adapter.gguf";
  convert_hf_to_gguf(llama, base, DType::F32);
  EXPECT_NE(refusal(llama, {{base, 1.f}}).find("not a LoRA adapter"), std::string::npos);
  fs::remove(base);
  EXPECT_NE(refusal(llama, {{d + "/nowhere", 1.f}}).find("no such adapter"), std::string::npos);
  // a folder without adapter_config.json
  EXPECT_NE(refusal(llama, {{d + "/llama", 1.f}}).find("adapter_config.json"), std::string::npos);
  // applied once
  auto m = with_adapters(llama, {{d + "/llama/peft", 1.f}});
  EXPECT_THROW(apply_lora(*m, Adapters{{d + "/llama/peft", 1.f}}), ModelError);
}

}  // namespace
}  // namespace wick::test
