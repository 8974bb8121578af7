// Model lifecycle and embeddings below the HTTP layer: keep_alive parsing,
// the pool's keep-alive expiry, the forward's hidden-state output against
// transformers' final hidden states, Engine::embed's batch invariance, and
// copy / delete inside the model store only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/engine.h"
#include "engine/model_store.h"
#include "helpers.h"
#include "io/error.h"
#include "server/keep_alive.h"

namespace wick {
namespace {

using namespace std::chrono_literals;
using server::KeepAlive;
using test::tiny_dir;

TEST(KeepAlive, ParsesGoDurationsAndSeconds) {
  const std::pair<const char*, int64_t> ok[] = {
      {"5m", 300000}, {"1h30m", 5400000}, {"10s", 10000},    {"1.5h", 5400000},    {"300ms", 300},
      {"0", 0},       {"0s", 0},          {"3600", 3600000}, {"2h45m30s", 9930000}};
  for (auto& [text, ms] : ok) {
    auto d = server::parse_duration(text);
    ASSERT_TRUE(d) << text;
    EXPECT_EQ(d->count(), ms) << text;
  }
  for (const char* forever : {"-1", "-5m", "-1h"})
    EXPECT_EQ(server::parse_duration(forever), server::kKeepForever) << forever;
  for (const char* bad : {"", "5x", "m", "1..5s", "abc", "5m3", "1.5", " 5m"})
    EXPECT_FALSE(server::parse_duration(bad)) << bad;
}

TEST(KeepAlive, BodyFieldTakesNumbersAndStrings) {
  using server::json;
  const KeepAlive dflt{300000};
  EXPECT_EQ(server::keep_alive_of(json::object(), dflt), dflt);
  EXPECT_EQ(server::keep_alive_of(json{{"keep_alive", nullptr}}, dflt), dflt);
  EXPECT_EQ(server::keep_alive_of(json{{"keep_alive", 0}}, dflt).count(), 0);
  EXPECT_EQ(server::keep_alive_of(json{{"keep_alive", 2.5}}, dflt).count(), 2500);
  EXPECT_EQ(server::keep_alive_of(json{{"keep_alive", -1}}, dflt), server::kKeepForever);
  EXPECT_EQ(server::keep_alive_of(json{{"keep_alive", "1h"}}, dflt).count(), 3600000);
  for (const json& bad : {json("soon"), json(true), json::array()}) {
    try {
      server::keep_alive_of(json{{"keep_alive", bad}}, dflt);
      ADD_FAILURE() << bad.dump() << " was taken";
    } catch (const server::ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "keep_alive");
    }
  }
  EXPECT_EQ(server::keep_alive_text(KeepAlive{5400000}), "1h30m");
  EXPECT_EQ(server::keep_alive_text(server::kKeepForever), "forever");
}

// A model expires once no Use holds it and its keep-alive has passed since
// the last Use ended; a held model never expires.
TEST(PoolKeepAlive, ExpiresOnlyIdleModelsPastTheirKeepAlive) {
  WICK_REQUIRE_SHARED();
  ModelPool pool(4, 0);
  const std::string path = tiny_dir("llama");
  auto m = pool.get(path);
  const auto t0 = ModelPool::Clock::now();
  EXPECT_EQ(pool.expire(t0 + 1000h), 0u) << "a pool's default keep-alive is forever";
  EXPECT_FALSE(pool.loaded()[0].expires_at);
  {
    auto use = pool.use(m, 10s);
    EXPECT_EQ(pool.expire(ModelPool::Clock::now() + 1h), 0u) << "a held model expired";
    ASSERT_TRUE(pool.loaded()[0].expires_at);
    EXPECT_EQ(pool.loaded()[0].n_uses, 1);
  }
  const auto idle = ModelPool::Clock::now();
  EXPECT_EQ(pool.expire(idle + 5s), 0u);
  EXPECT_EQ(pool.find_loaded(path), m);
  EXPECT_EQ(pool.expire(idle + 11s), 1u);
  EXPECT_EQ(pool.find_loaded(path), nullptr);
  EXPECT_EQ(pool.n_loaded(), 0u);
  // keep_alive 0: gone at the first expire after the request
  m = pool.get(path);
  pool.use(m, 0ms);
  EXPECT_EQ(pool.expire(), 1u);
  EXPECT_TRUE(pool.loaded().empty());
}

// A request holding a model that was unloaded meanwhile puts it back rather
// than failing or loading a second copy.
TEST(PoolKeepAlive, AUseAfterUnloadPutsTheModelBack) {
  WICK_REQUIRE_SHARED();
  ModelPool pool(4, 0);
  const std::string path = tiny_dir("qwen2");
  auto m = pool.get(path);
  EXPECT_TRUE(pool.unload(path));
  EXPECT_FALSE(pool.unload(path));
  auto use = pool.use(m, 1s);
  EXPECT_EQ(pool.find_loaded(path), m);
  EXPECT_EQ(pool.get(path), m);
  EXPECT_EQ(pool.n_loads(), 1u);
}

// The forward's hidden-state mode gives what transformers gives after the
// final norm, at every position (the embeddings' input).
TEST(HiddenStates, MatchTransformersFinalNorm) {
  WICK_REQUIRE_SHARED();
  for (const char* arch : {"llama", "qwen2", "qwen3", "mistral", "granite"}) {
    const std::string dir = tiny_dir(arch);
    auto ref = test::read_json(dir + "/reference.json");
    ModelPool pool(1, 0);
    auto lm = pool.get(dir);
    const ModelConfig& c = lm->config();
    for (auto& p : ref["prompts"]) {
      auto ids = p["ids"].get<std::vector<int32_t>>();
      auto all = test::read_f32(dir + "/" + p["hidden"].get<std::string>());
      const auto shape = p["hidden_shape"].get<std::vector<size_t>>();
      ASSERT_EQ(shape[2], size_t(c.n_embd));
      const size_t last = (shape[0] - 1) * shape[1] * shape[2];
      std::vector<float> want(all.begin() + long(last), all.end());
      ModelRunner runner(lm, int64_t(ids.size() / 16 + 2), 16);
      Batch b;
      b.block_tables = {{}};
      for (int32_t k = 0; k < int32_t(ids.size() / 16 + 1); ++k) b.block_tables[0].push_back(k);
      for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], int32_t(i), 0, true);
      auto got = runner.hidden_states(b);
      std::vector<float> mine(got.begin(), got.end());
      ASSERT_EQ(mine.size(), want.size());
      EXPECT_LT(test::rel_err(mine, want), 1e-4) << arch;
    }
  }
}

// The hidden rows are exactly what the head reads: the output matrix times
// them gives the logits mode's bits.
TEST(HiddenStates, TheHeadOfThemIsTheLogits) {
  WICK_REQUIRE_SHARED();
  ModelPool pool(1, 0);
  auto lm = pool.get(tiny_dir("llama"));
  const std::vector<int32_t> ids = {1, 328, 384, 353, 219, 207, 297, 389, 171};
  auto batch = [&] {
    Batch b;
    b.block_tables = {{0}};
    for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], int32_t(i), 0, i % 3 == 0);
    return b;
  };
  ModelRunner runner(lm, 4, 16);
  Batch b1 = batch(), b2 = batch();
  auto logits = runner.execute(b1);
  std::vector<float> want(logits.begin(), logits.end());
  auto h = runner.hidden_states(b2);
  std::vector<float> mine(want.size());
  lm->backend().matmul(lm->device->weights.output, h.data(), int64_t(b2.logit_rows.size()),
                       mine.data());
  EXPECT_EQ(0, std::memcmp(mine.data(), want.data(), want.size() * 4));
}

std::vector<std::vector<int32_t>> embed_inputs() {
  std::vector<std::vector<int32_t>> in = {{1, 328, 384, 353, 219}, {1, 411, 106}, {7}};
  std::vector<int32_t> longer;
  for (int32_t i = 0; i < 70; ++i) longer.push_back((i * 37 + 5) % 500);
  in.push_back(longer);
  return in;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// The same input gives the same vector, bit for bit, alone, in a batch, and
// cut into chunks (an input longer than a step); vectors are unit length.
TEST(Embed, BatchInvariantAndNormalised) {
  WICK_REQUIRE_SHARED();
  ModelPool pool(1, 0);
  auto lm = pool.get(tiny_dir("llama"));
  EngineConfig cfg;
  cfg.n_blocks = 64;
  cfg.n_ctx = 512;
  Engine engine(lm, cfg);
  EngineConfig small = cfg;
  small.max_batch_tokens = 24;  // the 70-token input in 3 chunks, the others in groups
  Engine chunked(lm, small);
  const auto inputs = embed_inputs();
  for (Pooling p : {Pooling::Mean, Pooling::Last}) {
    const auto batch = engine.embed(inputs, p);
    const auto batch_chunked = chunked.embed(inputs, p);
    ASSERT_EQ(batch.size(), inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto alone = engine.embed({inputs[i]}, p);
      EXPECT_TRUE(same_bits(alone[0].values, batch[i].values)) << pooling_name(p) << " " << i;
      EXPECT_TRUE(same_bits(batch_chunked[i].values, batch[i].values))
          << pooling_name(p) << " " << i;
      EXPECT_EQ(batch[i].n_tokens, int32_t(inputs[i].size()));
      double norm = 0;
      for (float v : batch[i].values) norm += double(v) * v;
      EXPECT_NEAR(norm, 1.0, 1e-5);
      ASSERT_EQ(batch[i].values.size(), size_t(lm->config().n_embd));
    }
    EXPECT_EQ(engine.blocks().n_used(), 0) << "borrowed blocks were not given back";
  }
  // mean and last differ (except for a one-token input)
  EXPECT_FALSE(same_bits(engine.embed({inputs[0]}, Pooling::Mean)[0].values,
                         engine.embed({inputs[0]}, Pooling::Last)[0].values));
  EXPECT_TRUE(same_bits(engine.embed({inputs[2]}, Pooling::Mean)[0].values,
                        engine.embed({inputs[2]}, Pooling::Last)[0].values));
}

// Last-token pooling is the normalised final hidden state of the last token
// (checked against transformers' hidden states).
TEST(Embed, LastPoolingIsTheLastHiddenStateNormalised) {
  WICK_REQUIRE_SHARED();
  const std::string dir = tiny_dir("qwen3");
  auto ref = test::read_json(dir + "/reference.json");
  auto& p = ref["prompts"][1];
  auto ids = p["ids"].get<std::vector<int32_t>>();
  auto all = test::read_f32(dir + "/" + p["hidden"].get<std::string>());
  const auto shape = p["hidden_shape"].get<std::vector<size_t>>();
  const size_t dim = shape[2];
  std::vector<double> want(all.end() - long(dim), all.end());
  double norm = 0;
  for (double v : want) norm += v * v;
  ModelPool pool(1, 0);
  Engine engine(pool.get(dir), EngineConfig{.n_blocks = 16, .n_ctx = 256});
  auto got = engine.embed({ids}, Pooling::Last)[0].values;
  ASSERT_EQ(got.size(), dim);
  for (size_t i = 0; i < dim; ++i) EXPECT_NEAR(got[i], want[i] / std::sqrt(norm), 1e-4) << i;
}

// Embeddings run between the steps of running generations: the generations
// give the tokens they give alone, and the vectors stay the same bits.
TEST(Embed, BetweenStepsLeavesGenerationsAlone) {
  WICK_REQUIRE_SHARED();
  ModelPool pool(1, 0);
  auto lm = pool.get(tiny_dir("mistral"));
  EngineConfig cfg;
  cfg.n_blocks = 64;
  cfg.n_ctx = 256;
  cfg.max_batch_tokens = 32;  // the prompts prefill over several steps
  GenerateRequest req;
  for (int32_t i = 0; i < 40; ++i) req.prompt.push_back((i * 13 + 2) % 500);
  req.sampling = SamplingParams::greedy();
  req.max_tokens = 12;
  req.ignore_eos = true;
  auto run = [&](bool with_embeds) {
    Engine e(lm, cfg);
    std::vector<std::vector<int32_t>> tokens(2);
    for (int k = 0; k < 2; ++k) {
      GenerateRequest r = req;
      r.prompt[0] = 7 + k;
      e.add_request(r, {.on_text = {}, .on_done = [&, k](const GenerateResult& g) {
                          tokens[size_t(k)] = g.tokens;
                        }});
    }
    const auto inputs = embed_inputs();
    const auto first = with_embeds ? e.embed(inputs, Pooling::Mean) : std::vector<Embedding>{};
    while (e.step())
      if (with_embeds) {
        const auto again = e.embed(inputs, Pooling::Mean);
        for (size_t i = 0; i < inputs.size(); ++i)
          EXPECT_TRUE(same_bits(again[i].values, first[i].values)) << i;
      }
    EXPECT_EQ(e.blocks().n_used(), 0);
    return tokens;
  };
  const auto plain = run(false);
  EXPECT_EQ(plain[0].size(), 12u);
  EXPECT_EQ(run(true), plain);
}

TEST(Embed, BadInputsAreTheRequestsFault) {
  WICK_REQUIRE_SHARED();
  ModelPool pool(1, 0);
  Engine engine(pool.get(tiny_dir("llama")), EngineConfig{.n_blocks = 8, .n_ctx = 64});
  EXPECT_THROW(engine.embed({{}}, Pooling::Mean), GenerateError);
  EXPECT_THROW(engine.embed({{1, 600}}, Pooling::Mean), GenerateError);  // vocab 512
  EXPECT_THROW(engine.embed({std::vector<int32_t>(65, 3)}, Pooling::Mean), GenerateError);
  // more than the cache holds at once: groups that fit, one after the other
  std::vector<std::vector<int32_t>> many(10, std::vector<int32_t>(60, 3));
  EXPECT_EQ(engine.embed(many, Pooling::Mean).size(), 10u);
  EXPECT_EQ(engine.blocks().n_used(), 0);
}

namespace fs = std::filesystem;

class StoreEdits : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("wick-store-edit-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "store" / "folder-model");
    fs::create_directories(root_ / "outside");
    std::ofstream(root_ / "store" / "inside.gguf") << "inside";
    std::ofstream(root_ / "store" / "folder-model" / "config.json") << "{}";
    std::ofstream(root_ / "outside" / "secret.gguf") << "secret";
    fs::create_symlink(root_ / "outside" / "secret.gguf", root_ / "store" / "escape.gguf");
    fs::create_symlink(root_ / "store" / "inside.gguf", root_ / "store" / "alias.gguf");
    if (const char* old = std::getenv("WICK_MODELS")) saved_ = old;
    setenv("WICK_MODELS", (root_ / "store").c_str(), 1);
  }
  void TearDown() override {
    if (saved_.empty())
      unsetenv("WICK_MODELS");
    else
      setenv("WICK_MODELS", saved_.c_str(), 1);
    fs::remove_all(root_);
  }
  static bool refused(const std::function<void()>& f, const std::string& says) {
    try {
      f();
    } catch (const ModelError& e) {
      if (std::string(e.what()).find(says) != std::string::npos) return true;
      ADD_FAILURE() << e.what();
    }
    return false;
  }
  fs::path root_;
  std::string saved_;
};

TEST_F(StoreEdits, CopyStaysInsideTheStore) {
  copy_stored_model("inside", "copy");
  EXPECT_EQ(fs::hard_link_count(root_ / "store" / "copy.gguf"), 2u);
  EXPECT_FALSE(resolve_model_name("copy").empty());
  copy_stored_model("folder-model", "folder-copy");
  EXPECT_TRUE(fs::exists(root_ / "store" / "folder-copy" / "config.json"));
  for (const char* to : {"../evil", "/tmp/evil", "a/b", ".hidden", "", "x\\y"})
    EXPECT_TRUE(refused([&] { copy_stored_model("inside", to); }, "invalid model name")) << to;
  EXPECT_FALSE(fs::exists(root_ / "evil.gguf"));
  EXPECT_TRUE(refused([&] { copy_stored_model("inside", "copy"); }, "already exists"));
  EXPECT_TRUE(refused([&] { copy_stored_model("inside", "escape"); }, "already exists"));
  for (const char* from : {"escape", "../outside/secret", "missing"})
    EXPECT_TRUE(refused([&] { copy_stored_model(from, "stolen"); }, "unknown model")) << from;
  EXPECT_FALSE(fs::exists(root_ / "store" / "stolen.gguf"));
}

TEST_F(StoreEdits, DeleteRemovesTheEntryOnly) {
  delete_stored_model("alias");  // the symlink goes, its target stays
  EXPECT_FALSE(fs::exists(root_ / "store" / "alias.gguf"));
  EXPECT_TRUE(fs::exists(root_ / "store" / "inside.gguf"));
  for (const char* name : {"escape", "../outside/secret", "/etc/passwd", "..", "missing"})
    EXPECT_TRUE(refused([&] { delete_stored_model(name); }, "unknown model")) << name;
  EXPECT_TRUE(fs::exists(root_ / "outside" / "secret.gguf"));
  EXPECT_TRUE(fs::is_symlink(root_ / "store" / "escape.gguf"));
  delete_stored_model("folder-model");
  EXPECT_FALSE(fs::exists(root_ / "store" / "folder-model"));
  delete_stored_model("inside");
  EXPECT_FALSE(fs::exists(root_ / "store" / "inside.gguf"));
}

}  // namespace
}  // namespace wick
