// Embeddings on the GPU: the forward's hidden-state output against
// transformers' final hidden states, and Engine::embed batch invariant and
// harmless to running generations (whose decode steps are CUDA graphs).
#include <cstring>

#include "engine/engine.h"
#include "gpu/gpu_helpers.h"
#include "helpers.h"

namespace wick::test {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(EmbedOnGpu, HiddenStatesMatchTransformers) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  for (const char* arch : {"llama", "qwen3"}) {
    const std::string dir = tiny_dir(arch);
    auto lm = load_model_and_tokenizer(dir, {}, cuda_opts(true));
    auto ref = read_json(dir + "/reference.json");
    for (auto& p : ref["prompts"]) {
      auto ids = p["ids"].get<std::vector<int32_t>>();
      auto all = read_f32(dir + "/" + p["hidden"].get<std::string>());
      const size_t dim = size_t(lm->config().n_embd);
      std::vector<float> want(all.end() - long(ids.size() * dim), all.end());
      ModelRunner runner(lm, int64_t(ids.size() / 16 + 2), 16);
      Batch b;
      b.block_tables = {{}};
      for (int32_t k = 0; k < int32_t(ids.size() / 16 + 1); ++k) b.block_tables[0].push_back(k);
      for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], int32_t(i), 0, true);
      auto got = runner.hidden_states(b);
      EXPECT_LT(rel_err(std::vector<float>(got.begin(), got.end()), want), 1e-4) << arch;
    }
  }
}

// (bf16 weights and f16 K/V, as served: gpu_f32 would turn CUDA graphs off)
TEST(EmbedOnGpu, BatchInvariantBetweenGraphedSteps) {
  WICK_REQUIRE_GPU();
  WICK_REQUIRE_SHARED();
  auto lm = load_model_and_tokenizer(tiny_dir("llama"), {}, cuda_opts(false));
  EngineConfig cfg;
  cfg.n_blocks = 64;
  cfg.n_ctx = 256;
  cfg.max_batch_tokens = 32;
  std::vector<std::vector<int32_t>> inputs = {{1, 328, 384, 353, 219}, {1, 411, 106}, {7}};
  std::vector<int32_t> longer;
  for (int32_t i = 0; i < 70; ++i) longer.push_back((i * 37 + 5) % 500);
  inputs.push_back(longer);
  GenerateRequest req;
  for (int32_t i = 0; i < 40; ++i) req.prompt.push_back((i * 13 + 2) % 500);
  req.sampling = SamplingParams::greedy();
  req.max_tokens = 16;
  req.ignore_eos = true;
  auto run = [&](bool with_embeds) {
    Engine e(lm, cfg);
    std::vector<int32_t> tokens;
    e.add_request(req,
                  {.on_text = {}, .on_done = [&](const GenerateResult& g) { tokens = g.tokens; }});
    const auto batch = e.embed(inputs, Pooling::Mean);
    for (size_t i = 0; i < inputs.size(); ++i)
      EXPECT_TRUE(same_bits(e.embed({inputs[i]}, Pooling::Mean)[0].values, batch[i].values)) << i;
    while (e.step()) {
      if (with_embeds) {
        EXPECT_TRUE(same_bits(e.embed(inputs, Pooling::Mean)[3].values, batch[3].values));
      }
    }
    return tokens;
  };
  const auto plain = run(false);
  EXPECT_EQ(plain.size(), 16u);
  EXPECT_EQ(run(true), plain);
}

}  // namespace
}  // namespace wick::test
