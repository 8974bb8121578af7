// Generation: greedy continuations against HF transformers, the sampler's
// processors, multi-turn prefix reuse, the model pool, and bad requests.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <thread>

#include "backend/cpu/ops.h"
#include "engine/model_pool.h"
#include "engine/session.h"
#include "engine_run.h"
#include "helpers.h"
#include "io/error.h"
#include "sampling/sampler.h"
#include "text/chat_template.h"

namespace wick::test {
namespace {

class Greedy : public ::testing::TestWithParam<std::string> {};

TEST_P(Greedy, ContinuationMatchesTransformers) {
  WICK_REQUIRE_SHARED();
  const std::string dir = tiny_dir(GetParam());
  expect_reference_greedy(load_model_and_tokenizer(dir), dir, GetParam());
}

INSTANTIATE_TEST_SUITE_P(AllArchs, Greedy, ::testing::ValuesIn(archs()),
                         [](const auto& info) { return info.param; });

// ---- sampler

SamplingParams params(float t, int k, float p, float minp) {
  SamplingParams s;
  s.temperature = t;
  s.top_k = k;
  s.top_p = p;
  s.min_p = minp;
  return s;
}

std::vector<int32_t> kept_ids(Sampler& s) {
  std::vector<int32_t> ids;
  for (auto& c : s.candidates()) ids.push_back(c.id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

TEST(Sampler, TopKTopPMinPMasksAreExact) {
  // probabilities at temperature 1: softmax of log(p) = p
  const std::vector<float> p = {0.05f, 0.40f, 0.10f, 0.25f, 0.15f, 0.05f};
  std::vector<float> logits;
  for (float x : p) logits.push_back(std::log(x));
  {
    Sampler s(params(1, 0, 1, 0), 6);
    s.load_candidates(logits);
    s.top_k(3);
    EXPECT_EQ(kept_ids(s), (std::vector<int32_t>{1, 3, 4}));
  }
  {
    Sampler s(params(1, 0, 1, 0), 6);
    s.load_candidates(logits);
    s.softmax();
    s.top_p(0.65f);  // 0.40 + 0.25 = 0.65 reaches it
    EXPECT_EQ(kept_ids(s), (std::vector<int32_t>{1, 3}));
    s.load_candidates(logits);
    s.softmax();
    s.top_p(0.66f);  // needs the 0.15 too
    EXPECT_EQ(kept_ids(s), (std::vector<int32_t>{1, 3, 4}));
  }
  {
    Sampler s(params(1, 0, 1, 0), 6);
    s.load_candidates(logits);
    s.softmax();
    s.min_p(0.3f);  // floor 0.12: keeps 0.40, 0.25, 0.15
    EXPECT_EQ(kept_ids(s), (std::vector<int32_t>{1, 3, 4}));
    s.load_candidates(logits);
    s.softmax();
    s.min_p(0.5f);  // floor 0.20
    EXPECT_EQ(kept_ids(s), (std::vector<int32_t>{1, 3}));
  }
}

TEST(Sampler, PenaltyArithmetic) {
  SamplingParams sp = params(0, 0, 1, 0);
  sp.repeat_penalty = 2.0f;
  sp.repeat_last_n = 3;
  sp.presence_penalty = 0.5f;
  sp.frequency_penalty = 0.25f;
  Sampler s(sp, 5);
  std::vector<float> l = {4.f, -4.f, 1.f, 2.f, 3.f};
  // history: id 0 once long ago (outside the window), then 1, 1, 3
  std::vector<int32_t> hist = {0, 1, 1, 3};
  s.apply_penalties(l, hist);
  EXPECT_FLOAT_EQ(l[0], 4.f);                          // outside the window
  EXPECT_FLOAT_EQ(l[1], -4.f * 2 - 0.5f - 2 * 0.25f);  // negative: multiplied; seen twice
  EXPECT_FLOAT_EQ(l[2], 1.f);
  EXPECT_FLOAT_EQ(l[3], 2.f / 2 - 0.5f - 0.25f);  // positive: divided; seen once
  EXPECT_FLOAT_EQ(l[4], 3.f);
  // repeat_last_n = 0: the whole history
  sp.repeat_last_n = 0;
  sp.presence_penalty = sp.frequency_penalty = 0;
  Sampler all(sp, 5);
  std::vector<float> l2 = {4.f, 0.f, 0.f, 0.f, 0.f};
  all.apply_penalties(l2, hist);
  EXPECT_FLOAT_EQ(l2[0], 2.f);
}

TEST(Sampler, SeedMakesRunsReproducible) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[size_t(i)] = std::sin(float(i));
  auto draw = [&](uint64_t seed) {
    SamplingParams sp = params(1.0f, 0, 1, 0);
    sp.seed = seed;
    Sampler s(sp, 100);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) {
      auto l = logits;
      out.push_back(s.sample(l, {}));
    }
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

// Sampled frequencies follow the softmax at temperature 0.7: chi-square over
// 8 categories, 40,000 draws, below the 0.999 quantile for 7 degrees of freedom.
TEST(Sampler, ChiSquareFollowsSoftmax) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.2f, -0.3f, 0.9f, 0.0f, -1.0f, 0.4f};
  const float T = 0.7f;
  SamplingParams sp = params(T, 0, 1, 0);
  sp.seed = 12345;
  Sampler s(sp, 8);
  const int n = 40000;
  std::vector<int> counts(8);
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    counts[size_t(s.sample(l, {}))]++;
  }
  double z = 0;
  for (float x : logits) z += std::exp(x / T);
  double chi2 = 0;
  for (size_t i = 0; i < 8; ++i) {
    const double e = n * std::exp(logits[i] / T) / z;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_LT(chi2, 24.32) << "chi-square " << chi2;
}

TEST(Sampler, InvalidParametersNameTheField) {
  EXPECT_NE(params(-1, 0, 1, 0).validate().find("temperature"), std::string::npos);
  EXPECT_NE(params(1, -3, 1, 0).validate().find("top_k"), std::string::npos);
  EXPECT_NE(params(1, 0, 1.5f, 0).validate().find("top_p"), std::string::npos);
  EXPECT_NE(params(1, 0, 1, 2).validate().find("min_p"), std::string::npos);
  EXPECT_NE(params(NAN, 0, 1, 0).validate().find("temperature"), std::string::npos);
  SamplingParams sp;
  sp.repeat_penalty = 0;
  EXPECT_NE(sp.validate().find("repeat_penalty"), std::string::npos);
  EXPECT_EQ(SamplingParams{}.validate(), "");
}

// ---- the default model

std::vector<int32_t> chat_ids(const LoadedModel& m, const nlohmann::ordered_json& messages) {
  ChatTemplate t(m.tokenizer->chat_template, "smollm2");
  auto text = t.render({{"messages", messages}, {"add_generation_prompt", true}});
  return m.tokenizer->encode(text, {.add_special = false, .parse_special = true});
}

TEST(DefaultModel, AnswersParis) {
  auto m = default_model();
  if (!m) WICK_SKIP_OR_FAIL("default model missing (WICK_TEST_MODEL)");
  Session s(m, 2048);
  GenerateRequest req;
  req.prompt =
      chat_ids(*m, nlohmann::ordered_json::array(
                       {{{"role", "user"}, {"content", "What is the capital of France?"}}}));
  req.sampling = SamplingParams::greedy();
  req.max_tokens = 32;
  std::string streamed;
  auto res = s.generate(req, [&](std::string_view t) {
    streamed += t;
    return true;
  });
  EXPECT_NE(res.text.find("Paris"), std::string::npos) << res.text;
  EXPECT_EQ(streamed, res.text);
  EXPECT_EQ(res.stop_reason, "eos");
  std::printf("[ report ] smollm2 greedy: %s\n", res.text.c_str());
}

TEST(DefaultModel, SecondTurnPrefillsOnlyNewTokensAndMatchesAFreshRun) {
  auto m = default_model();
  if (!m) WICK_SKIP_OR_FAIL("default model missing (WICK_TEST_MODEL)");
  auto messages = nlohmann::ordered_json::array(
      {{{"role", "user"}, {"content", "What is the capital of France?"}}});
  Session chat(m, 2048);
  GenerateRequest req;
  req.sampling = SamplingParams::greedy();
  req.max_tokens = 24;
  req.prompt = chat_ids(*m, messages);
  auto r1 = chat.generate(req);
  const size_t cached_after_turn1 = chat.cached_tokens().size();
  messages.push_back({{"role", "assistant"}, {"content", r1.text}});
  messages.push_back({{"role", "user"}, {"content", "And of Germany?"}});
  req.prompt = chat_ids(*m, messages);
  auto r2 = chat.generate(req);
  // everything turn one left in the cache is reused (its full blocks)
  EXPECT_EQ(size_t(r2.n_reused), cached_after_turn1);
  EXPECT_EQ(r2.n_prefilled, r2.n_prompt - r2.n_reused);
  // Reuse is block-granular: besides the new tokens only turn one's last,
  // partial block (under block_size tokens) is computed again. (The last
  // answer token of turn one was never fed back.)
  const int32_t bs = chat.engine().config().block_size;
  const int32_t n_computed1 = r1.n_prompt + int32_t(r1.tokens.size()) - 1;
  EXPECT_GT(r2.n_reused, n_computed1 - bs);
  EXPECT_LT(r2.n_prefilled, r2.n_prompt - n_computed1 + bs);
  Session fresh(m, 2048);
  auto r3 = fresh.generate(req);
  EXPECT_EQ(r3.n_reused, 0);
  EXPECT_EQ(r2.tokens, r3.tokens);
  EXPECT_EQ(r2.text, r3.text);
  std::printf("[ report ] turn 2: %d prompt tokens, %d reused, %d prefilled: %s\n", r2.n_prompt,
              r2.n_reused, r2.n_prefilled, r2.text.c_str());
}

TEST(DefaultModel, StopStringsAndBadRequests) {
  auto m = default_model();
  if (!m) WICK_SKIP_OR_FAIL("default model missing (WICK_TEST_MODEL)");
  Session s(m, 64);
  GenerateRequest req;
  req.prompt =
      chat_ids(*m, nlohmann::ordered_json::array(
                       {{{"role", "user"}, {"content", "What is the capital of France?"}}}));
  req.sampling = SamplingParams::greedy();
  req.max_tokens = 24;
  req.stop = {" Paris"};
  auto res = s.generate(req);
  EXPECT_EQ(res.stop_reason, "stop");
  EXPECT_EQ(res.text, "The capital of France is");
  // too long for the context: a clear error, unless truncation is asked for
  req.prompt.assign(100, 1);
  try {
    s.generate(req);
    ADD_FAILURE() << "a prompt longer than the context was accepted";
  } catch (const GenerateError& e) {
    EXPECT_NE(std::string(e.what()).find("the prompt has 100 tokens but the context holds 64"),
              std::string::npos);
  }
  req.truncate = true;
  req.max_tokens = 4;
  EXPECT_NO_THROW(s.generate(req));
  req.truncate = false;
  req.prompt = {1, 2, 99999999};
  EXPECT_THROW(s.generate(req), GenerateError);
  req.prompt = {1, 2};
  req.sampling.temperature = -1;
  EXPECT_THROW(s.generate(req), GenerateError);
  req.sampling = SamplingParams::greedy();
  req.max_tokens = -5;
  EXPECT_THROW(s.generate(req), GenerateError);
}

// ---- the pool

TEST(ModelPool, LoadsOnceAcrossThreadsAndEvictsLeastRecentlyUsed) {
  WICK_REQUIRE_SHARED();
  ModelPool pool(2, 0);
  std::vector<std::shared_ptr<const LoadedModel>> got(4);
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&, i] { got[size_t(i)] = pool.get(tiny_dir("qwen2")); });
  for (auto& t : ts) t.join();
  EXPECT_EQ(pool.n_loads(), 1u);
  for (auto& g : got) EXPECT_EQ(g.get(), got[0].get());
  pool.get(tiny_dir("llama"));
  pool.get(tiny_dir("qwen2"));    // qwen2 is now the most recent
  pool.get(tiny_dir("mistral"));  // evicts llama
  EXPECT_EQ(pool.n_loaded(), 2u);
  EXPECT_EQ(pool.n_loads(), 3u);
  pool.get(tiny_dir("qwen2"));
  EXPECT_EQ(pool.n_loads(), 3u);  // still loaded
  pool.get(tiny_dir("llama"));
  EXPECT_EQ(pool.n_loads(), 4u);  // was evicted, loaded again
  EXPECT_THROW(pool.get("no-such-model-name"), ModelError);
  EXPECT_EQ(pool.n_loaded(), 2u);
}

// The threads of this process (Linux: /proc/self/task).
size_t n_process_threads() {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// A load's parallel regions (the default model's embedding packs in
// parallel) leave no OpenMP workers on the thread that asked for it:
// libgomp keeps a team for every thread that has started a region, for that
// thread's life, and once a process holds more workers than cores every
// team sleeps at each region's end (a server that loaded on its main thread
// decoded at a third of the CLI's rate: docs/perf.md, session 70).
TEST(LoadThreads, LeaveNoOpenMpWorkersOnTheLoadingThread) {
  const char* path = std::getenv("WICK_TEST_MODEL");
  if (!path || !std::filesystem::exists(path))
    WICK_SKIP_OR_FAIL("default model missing (WICK_TEST_MODEL)");
  const int saved = cpu::n_threads();
  cpu::set_n_threads(2);  // (a team of one has no workers to leave)
  const size_t before = n_process_threads();
  std::promise<void> loaded, done;
  std::exception_ptr failed;
  std::thread asker([&] {
    try {
      load_model_and_tokenizer(path, {}, BackendOptions{});
    } catch (...) {
      failed = std::current_exception();
    }
    loaded.set_value();
    done.get_future().wait();  // alive, as a server's thread stays
  });
  loaded.get_future().wait();
  // the asker alone is new (a loader's team leaves as its thread ends)
  size_t n = n_process_threads();
  for (int i = 0; i < 200 && n > before + 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = n_process_threads();
  }
  done.set_value();
  asker.join();
  cpu::set_n_threads(saved);
  ASSERT_FALSE(failed) << "the load threw";
  EXPECT_EQ(n, before + 1);
}

}  // namespace
}  // namespace wick::test
