// RoPE scaling (YaRN, linear) against transformers' rules: the tiny llama
// with YaRN configs against the float64 numpy forward (which applies YaRN as
// transformers does: scaled cos and sin), the frequencies and attention
// factor of released models' settings, the GGUF form, and the command line's
// override. Fixtures: tests/python/make_rope_fixtures.py (setup.rope_fixtures).
#include <unistd.h>

#include <filesystem>

#include "engine/model_pool.h"
#include "helpers.h"
#include "io/error.h"
#include "model/convert.h"

namespace wick::test {
namespace {

namespace fs = std::filesystem;

std::string rope_dir() {
  return data_dir() + "/rope";
}

#define REQUIRE_ROPE_FIXTURES()                                                              \
  do {                                                                                       \
    if (!fs::exists(rope_dir() + "/yarn_cases.json"))                                        \
      WICK_SKIP_OR_FAIL("rope fixtures missing at " << rope_dir()                            \
                                                    << " (ctest runs setup.rope_fixtures)"); \
  } while (0)

std::vector<int32_t> fixture_ids() {
  return read_json(rope_dir() + "/ids.json").get<std::vector<int32_t>>();
}

TEST(RopeScaling, YarnLogitsMatchNumpyReference) {
  REQUIRE_ROPE_FIXTURES();
  const auto ids = fixture_ids();
  for (const char* name : {"llama-yarn", "llama-yarn-explicit"}) {
    SCOPED_TRACE(name);
    const std::string dir = rope_dir() + "/" + name;
    auto m = load_model(dir);
    EXPECT_EQ(m->config.rope_type, "yarn");
    const auto want = read_f32(dir + "/ref_logits.f32");
    const double err = rel_err(run_all_logits(*m, ids), want);
    std::printf("[ report ] %s, %zu positions: relative error %.2e\n", name, ids.size(), err);
    EXPECT_LT(err, 1e-4);
    // in chunks too (prefill in parts reads the cache the same way)
    EXPECT_LT(rel_err(run_all_logits(*m, ids, 37), want), 1e-4);
    // Neither half of YaRN is idle at this bound: without the attention
    // factor, or without the frequencies' divisors, the logits are far off.
    auto no_factor = load_model(dir);
    no_factor->config.rope_attn_factor = 1.f;
    EXPECT_GT(rel_err(run_all_logits(*no_factor, ids), want), 1e-2);
    auto no_divisors = load_model(dir);
    no_divisors->config.rope_freq_factors.clear();
    EXPECT_GT(rel_err(run_all_logits(*no_divisors, ids), want), 1e-2);
  }
}

// n_ctx_train of a YaRN model covers the stretched context.
TEST(RopeScaling, YarnStretchesTheContext) {
  REQUIRE_ROPE_FIXTURES();
  auto m = load_model(rope_dir() + "/llama-yarn");
  EXPECT_EQ(m->config.rope_orig_ctx, 64);
  EXPECT_FLOAT_EQ(m->config.rope_scale, 4.f);
  EXPECT_EQ(m->config.n_ctx_train, 512);  // max_position_embeddings, above 64 x 4
  ModelConfig c = m->config;
  set_yarn(c, "test", 16.f, 64);
  EXPECT_EQ(c.n_ctx_train, 1024);
}

// Released models' settings (Qwen, DeepSeek's mscale pair, gpt-oss's
// truncate=false) and transformers' fall-backs (no factor, betas 0, a
// factor below 1): wick's frequencies and attention factor equal
// transformers' rule.
TEST(RopeScaling, YarnFrequenciesFollowTransformers) {
  REQUIRE_ROPE_FIXTURES();
  const auto cases = read_json(rope_dir() + "/yarn_cases.json");
  ASSERT_GE(cases.size(), 5u);
  for (const auto& k : cases) {
    SCOPED_TRACE(k["rope"].dump());
    const int64_t hd = k["head_dim"];
    nlohmann::json cfg = {{"model_type", "qwen2"},       {"vocab_size", 16},
                          {"hidden_size", 2 * hd},       {"num_hidden_layers", 1},
                          {"num_attention_heads", 2},    {"head_dim", hd},
                          {"intermediate_size", 8},      {"max_position_embeddings", k["max_pos"]},
                          {"rope_parameters", k["rope"]}};
    const ModelConfig c = config_from_hf_json(cfg, "case");
    EXPECT_EQ(c.rope_type, "yarn");
    EXPECT_NEAR(c.rope_attn_factor, k["attention_factor"].get<double>(), 1e-6);
    const auto got = rope_inv_freq(c);
    const auto want = k["inv_freq"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 2e-6 * want[i]) << "frequency " << i;
  }
}

TEST(RopeScaling, BadYarnConfigsAreErrors) {
  nlohmann::json cfg = {
      {"model_type", "llama"},        {"vocab_size", 16},         {"hidden_size", 32},
      {"num_hidden_layers", 1},       {"num_attention_heads", 2}, {"intermediate_size", 8},
      {"max_position_embeddings", 64}};
  for (auto rope :
       {nlohmann::json{{"rope_type", "yarn"}, {"factor", -2.0}},
        nlohmann::json{
            {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 0}},
        nlohmann::json{
            {"rope_type", "yarn"}, {"factor", 1e30}, {"original_max_position_embeddings", 64}},
        nlohmann::json{{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 1.0}},
        nlohmann::json{{"rope_type", "dynamic"}, {"factor", 2.0}}}) {
    cfg["rope_scaling"] = rope;
    try {
      config_from_hf_json(cfg, "cfg.json");
      ADD_FAILURE() << "accepted " << rope.dump();
    } catch (const ModelError& e) {
      EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
    }
  }
}

// `wick convert` writes llama.cpp's YaRN keys, and the GGUF reads back as the
// same frequencies, factor and logits.
TEST(RopeScaling, YarnSurvivesGguf) {
  REQUIRE_ROPE_FIXTURES();
  const auto ids = fixture_ids();
  const std::string tmp =
      (fs::temp_directory_path() / ("wick-yarn-" + std::to_string(::getpid()) + ".gguf")).string();
  for (const char* name : {"llama-yarn", "llama-yarn-explicit"}) {
    SCOPED_TRACE(name);
    const std::string dir = rope_dir() + "/" + name;
    auto hf = load_model(dir);
    if (!hf->config.yarn_truncate) {
      // transformers' truncate=false has no llama.cpp form: a clear error
      EXPECT_THROW(convert_hf_to_gguf(dir, tmp, DType::F32), ModelError);
      EXPECT_FALSE(fs::exists(tmp));
      continue;
    }
    convert_hf_to_gguf(dir, tmp, DType::F32);
    auto gg = load_model(tmp);
    fs::remove(tmp);
    EXPECT_EQ(gg->config.rope_type, "yarn");
    EXPECT_EQ(gg->config.rope_orig_ctx, hf->config.rope_orig_ctx);
    EXPECT_FLOAT_EQ(gg->config.rope_attn_factor, hf->config.rope_attn_factor);
    EXPECT_EQ(gg->config.rope_freq_factors, hf->config.rope_freq_factors);
    EXPECT_EQ(gg->config.n_ctx_train, hf->config.n_ctx_train);
    EXPECT_LT(rel_err(run_all_logits(*gg, ids), read_f32(dir + "/ref_logits.f32")), 1e-4);
  }
  // a GGUF with explicit betas and an extra attention factor keeps them
  const std::string dir = rope_dir() + "/llama-default";
  auto m = load_model(dir);
  set_yarn(m->config, "test", 3.f, 48, 16.f, 2.f, true, 1.3f);
  const ModelConfig want = m->config;
  auto cfg = read_json(dir + "/config.json");
  const fs::path alt = fs::temp_directory_path() / ("wick-yarn-dir-" + std::to_string(::getpid()));
  fs::create_directories(alt);
  fs::copy_file(dir + "/model.safetensors", alt / "model.safetensors");
  cfg["rope_parameters"] = {{"rope_type", "yarn"},
                            {"factor", 3.0},
                            {"rope_theta", 10000.0},
                            {"beta_fast", 16},
                            {"beta_slow", 2},
                            {"attention_factor", 1.3},
                            {"original_max_position_embeddings", 48}};
  std::ofstream(alt / "config.json") << cfg.dump();
  convert_hf_to_gguf(alt.string(), tmp, DType::F32);
  fs::remove_all(alt);
  auto gg = load_model(tmp);
  fs::remove(tmp);
  EXPECT_EQ(gg->config.rope_freq_factors, want.rope_freq_factors);
  EXPECT_NEAR(gg->config.rope_attn_factor, want.rope_attn_factor, 1e-6);
  EXPECT_FLOAT_EQ(gg->config.yarn_beta_fast, 16.f);
  EXPECT_FLOAT_EQ(gg->config.yarn_beta_slow, 2.f);
}

// --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 64 on a model without
// scaling is the model whose config says so.
TEST(RopeScaling, OverrideEqualsTheConfig) {
  REQUIRE_ROPE_FIXTURES();
  const auto ids = fixture_ids();
  BackendOptions opt;
  opt.device = Device::Cpu;
  opt.rope_scaling = "yarn";
  opt.rope_scale = 4.f;
  opt.yarn_orig_ctx = 64;
  auto lm = load_model_at("x", rope_dir() + "/llama-default", {}, opt);
  const auto yarn = load_model(rope_dir() + "/llama-yarn");
  EXPECT_EQ(lm->model->config.rope_freq_factors, yarn->config.rope_freq_factors);
  EXPECT_FLOAT_EQ(lm->model->config.rope_attn_factor, yarn->config.rope_attn_factor);
  auto& be = *lm->device->backend;
  EXPECT_LT(rel_err(run_all_logits(be, lm->model->config, lm->device->weights, ids),
                    read_f32(rope_dir() + "/llama-yarn/ref_logits.f32")),
            1e-4);

  // "none" takes a YaRN model back to plain RoPE and its trained context
  ModelConfig c = yarn->config;
  override_rope(c, "none", 0.f, 0, "m");
  EXPECT_EQ(c.rope_type, "default");
  EXPECT_TRUE(c.rope_freq_factors.empty());
  EXPECT_FLOAT_EQ(c.rope_attn_factor, 1.f);
  EXPECT_EQ(c.n_ctx_train, 64);
  // linear: every frequency divided by the scale, the context stretched
  override_rope(c, "linear", 2.f, 0, "m");
  EXPECT_EQ(c.rope_freq_factors, std::vector<float>(size_t(c.head_dim / 2), 2.f));
  EXPECT_EQ(c.n_ctx_train, 128);
  // yarn with the model's own context when none is given
  override_rope(c, "yarn", 4.f, 0, "m");
  EXPECT_EQ(c.rope_orig_ctx, 64);
  // nothing asked: nothing changes
  const ModelConfig before = c;
  override_rope(c, "", 0.f, 0, "m");
  EXPECT_EQ(c.rope_freq_factors, before.rope_freq_factors);

  EXPECT_THROW(override_rope(c, "yarn", 0.f, 0, "m"), ModelError);  // no scale
  EXPECT_THROW(override_rope(c, "", 4.f, 0, "m"), ModelError);      // scale without a type
  EXPECT_THROW(override_rope(c, "", 0.f, 4096, "m"), ModelError);   // context without a type
  EXPECT_THROW(override_rope(c, "dynamic", 2.f, 0, "m"), ModelError);
  EXPECT_THROW(override_rope(c, "linear", 1e30f, 0, "m"), ModelError);  // past 2^31 positions
}

// Keys stored before RoPE (the span cache) rotate with YaRN's frequencies and
// attend with its factor: the same logits as keys rotated when written.
TEST(RopeScaling, PreRopeKeysMatch) {
  REQUIRE_ROPE_FIXTURES();
  const auto ids = fixture_ids();
  auto m = load_model(rope_dir() + "/llama-yarn");
  auto dm = cpu_model(*m);
  const auto rotated = run_all_logits(*dm->backend, m->config, dm->weights, ids, 50, false);
  const auto pre = run_all_logits(*dm->backend, m->config, dm->weights, ids, 50, true);
  EXPECT_LT(rel_err(pre, rotated), 1e-5);
}

}  // namespace
}  // namespace wick::test
