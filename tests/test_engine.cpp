// The engine: concurrent requests equal sequential ones, verified prefix
// hits, preemption and eviction under a tiny KV budget, block accounting;
// sessions (the CLI's way in) agree with it, at the context limit too.
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "engine/session.h"
#include "engine_run.h"
#include "helpers.h"

namespace wick::test {
namespace {

std::vector<GenerateRequest> mixed_requests(int32_t n_vocab, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<GenerateRequest> out;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    const int len = 3 + int(rng() % 60);
    for (int k = 0; k < len; ++k) r.prompt.push_back(int32_t(rng() % uint32_t(n_vocab)));
    r.sampling = SamplingParams::greedy();
    r.max_tokens = 4 + int(rng() % 20);
    r.ignore_eos = true;
    r.prefill_chunk = i % 3 == 0 ? 5 : 0;  // some prompts in small chunks
    out.push_back(r);
  }
  return out;
}

std::vector<GenerateResult> run_sequential(std::shared_ptr<const LoadedModel> m,
                                           const std::vector<GenerateRequest>& reqs) {
  std::vector<GenerateResult> out;
  for (auto& r : reqs) {
    Session s(m, 512);
    out.push_back(s.generate(r));
  }
  return out;
}

class EngineArch : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineArch, ConcurrentRequestsEqualSequentialOnes) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir(GetParam()));
  auto reqs = mixed_requests(int32_t(m->model->config.n_vocab), 10, 1);
  auto want = run_sequential(m, reqs);
  EngineConfig cfg;
  cfg.max_batch_tokens = 48;  // forces chunked prefills mixed with decodes
  cfg.max_seqs = 6;
  Engine e(m, cfg);
  auto got = run_engine(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  EXPECT_EQ(e.blocks().n_used(), 0);
}

INSTANTIATE_TEST_SUITE_P(Archs, EngineArch, ::testing::Values("llama", "mistral", "qwen3_moe"),
                         [](const auto& info) { return info.param; });

TEST(Engine, PrefixHitGivesColdLogitsAndIsVerifiedPerBlock) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("qwen3"));
  std::vector<int32_t> prompt;
  for (int i = 0; i < 50; ++i) prompt.push_back(int32_t((i * 37 + 11) % 500));
  GenerateRequest r;
  r.prompt = prompt;
  r.sampling = SamplingParams::greedy();
  r.max_tokens = 8;
  r.ignore_eos = true;
  r.keep_first_logits = true;
  Engine e(m, EngineConfig{});
  auto cold = run_engine(e, {r})[0];
  EXPECT_EQ(cold.n_reused, 0);
  auto warm = run_engine(e, {r})[0];
  EXPECT_EQ(warm.n_reused, 48);  // three full blocks of 16; the last 2 tokens are computed
  EXPECT_EQ(warm.first_logits, cold.first_logits);
  EXPECT_EQ(warm.tokens, cold.tokens);
  // one token changed inside the second block: only the first block matches
  GenerateRequest r2 = r;
  r2.prompt[20] = (r2.prompt[20] + 1) % 500;
  auto diff = run_engine(e, {r2})[0];
  EXPECT_EQ(diff.n_reused, 16);
  Engine fresh(m, EngineConfig{});
  auto diff_cold = run_engine(fresh, {r2})[0];
  EXPECT_EQ(diff.first_logits, diff_cold.first_logits);
  EXPECT_EQ(diff.tokens, diff_cold.tokens);
  // with the prefix cache off nothing is reused
  EngineConfig off;
  off.prefix_cache = false;
  Engine noc(m, off);
  run_engine(noc, {r});
  EXPECT_EQ(run_engine(noc, {r})[0].n_reused, 0);
  std::printf("[ report ] prefix cache hit rate over the test: %.2f\n", e.blocks().hit_rate());
}

TEST(Engine, TinyBudgetPreemptsEvictsAndReturnsEveryBlock) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("llama"));
  auto reqs = mixed_requests(int32_t(m->model->config.n_vocab), 12, 7);
  auto want = run_sequential(m, reqs);
  EngineConfig cfg;
  cfg.n_blocks = 10;  // 160 token slots for 12 requests of up to ~85 tokens
  cfg.max_batch_tokens = 64;
  Engine e(m, cfg);
  auto got = run_engine(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  EXPECT_GT(e.n_preemptions(), 0u);
  EXPECT_EQ(e.blocks().n_used(), 0);
  EXPECT_EQ(e.blocks().n_free(), 10);
  std::printf("[ report ] tiny budget: %llu preemptions over %llu steps\n",
              (unsigned long long)e.n_preemptions(), (unsigned long long)e.n_steps());
}

// A config that leaves the step's tokens open (0) gets its backend's
// default: 512 on the CPU (a GPU's 2,048: TinyOnGpuEngine.StepTokensDefaultToTheGpus).
TEST(Engine, StepTokensDefaultToTheBackends) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("llama"));
  EngineConfig cfg;
  cfg.n_blocks = 8;
  EXPECT_EQ(cfg.max_batch_tokens, 0);
  EXPECT_EQ(Engine(m, cfg).config().max_batch_tokens, 512);
  EXPECT_EQ(step_tokens(cfg, m->backend()), 512);
  cfg.max_batch_tokens = 100;
  EXPECT_EQ(Engine(m, cfg).config().max_batch_tokens, 100);
}

TEST(Engine, CancelFreesBlocksAtOnce) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("mixtral"));
  auto reqs = mixed_requests(int32_t(m->model->config.n_vocab), 6, 3);
  EngineConfig cfg;
  cfg.max_batch_tokens = 32;
  Engine e(m, cfg);
  std::vector<std::string> reasons(reqs.size());
  std::vector<int64_t> ids;
  for (size_t i = 0; i < reqs.size(); ++i)
    ids.push_back(e.add_request(reqs[i], {nullptr, [&reasons, i](const GenerateResult& r) {
                                            reasons[i] = r.stop_reason;
                                          }}));
  e.step();
  e.step();
  const int32_t used_before = e.blocks().n_used();
  e.cancel(ids[0]);  // running
  e.cancel(ids[5]);  // probably still waiting
  EXPECT_LT(e.blocks().n_used(), used_before);
  EXPECT_EQ(reasons[0], "cancelled");
  EXPECT_EQ(reasons[5], "cancelled");
  // a client that hangs up through its text callback
  GenerateRequest r = reqs[1];
  int calls = 0;
  e.add_request(r, {[&](std::string_view) { return ++calls < 2; }, nullptr});
  e.run_until_idle();
  EXPECT_EQ(e.blocks().n_used(), 0);
  EXPECT_EQ(e.n_running() + e.n_waiting(), 0);
}

TEST(Engine, BadRequestsAreRejectedBeforeQueueing) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("qwen2"));
  EngineConfig cfg;
  cfg.n_ctx = 64;
  Engine e(m, cfg);
  GenerateRequest r;
  r.prompt = std::vector<int32_t>(80, 1);
  EXPECT_THROW(e.add_request(r, {}), GenerateError);
  r.truncate = true;  // asked for: the newest tokens are kept
  r.max_tokens = 4;
  GenerateResult truncated;
  e.add_request(r, {nullptr, [&](const GenerateResult& g) { truncated = g; }});
  e.run_until_idle();
  EXPECT_LT(truncated.n_prompt, 64);
  EXPECT_EQ(truncated.tokens.size(), 4u);
  r.truncate = false;
  r.prompt = {1, 2, 9999};
  EXPECT_THROW(e.add_request(r, {}), GenerateError);
  r.prompt = {};
  EXPECT_THROW(e.add_request(r, {}), GenerateError);
  r.prompt = {1, 2};
  r.sampling.top_k = -1;
  EXPECT_THROW(e.add_request(r, {}), GenerateError);
  EXPECT_EQ(e.n_waiting(), 0);
}

// The one behaviour at the context limit: a sequence ends with "context"
// once prompt and generated tokens together number n_ctx, through a session
// (the CLI) as through the engine (the server).
TEST(Engine, SessionAndEngineAgreeAtTheContextLimit) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("llama"));
  const int32_t n_ctx = 40;
  EngineConfig cfg;
  cfg.n_ctx = n_ctx;
  for (int32_t n_prompt : {30, 32, n_ctx - 1}) {
    GenerateRequest r;
    for (int32_t i = 0; i < n_prompt; ++i) r.prompt.push_back((i * 53 + 7) % 500);
    r.sampling = SamplingParams::greedy();
    r.max_tokens = 100;
    r.ignore_eos = true;
    r.top_logprobs = 3;  // served by sessions too
    Session s(m, n_ctx);
    auto in_session = s.generate(r);
    Engine e(m, cfg);
    auto in_engine = run_engine(e, {r})[0];
    EXPECT_EQ(in_session.tokens.size(), size_t(n_ctx - n_prompt)) << n_prompt;
    EXPECT_EQ(in_session.stop_reason, "context");
    EXPECT_EQ(in_engine.stop_reason, "context");
    EXPECT_EQ(in_session.tokens, in_engine.tokens) << n_prompt;
    ASSERT_EQ(in_session.logprobs.size(), in_session.tokens.size());
    ASSERT_EQ(in_engine.logprobs.size(), in_engine.tokens.size());
    for (size_t i = 0; i < in_session.logprobs.size(); ++i) {
      EXPECT_EQ(in_session.logprobs[i].id, in_session.tokens[i]);
      EXPECT_EQ(in_session.logprobs[i].logprob, in_engine.logprobs[i].logprob);
      EXPECT_EQ(in_session.logprobs[i].top, in_engine.logprobs[i].top);
    }
    // max_tokens reached on the context's last token: "length" wins, as the server asks it
    r.max_tokens = n_ctx - n_prompt;
    EXPECT_EQ(s.generate(r).stop_reason, "length");
  }
}

// A second turn starts from the full blocks the first one computed (prompt
// and answer), checked token by token, and gives what a fresh session gives.
TEST(Engine, SessionReusesFullBlocksAcrossTurns) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("qwen3"));
  GenerateRequest r;
  for (int32_t i = 0; i < 40; ++i) r.prompt.push_back((i * 37 + 11) % 500);
  r.sampling = SamplingParams::greedy();
  r.max_tokens = 10;
  r.ignore_eos = true;
  r.keep_first_logits = true;
  Session chat(m, 256);
  auto t1 = chat.generate(r);
  EXPECT_EQ(t1.n_reused, 0);
  EXPECT_EQ(t1.n_prefilled, 40);
  // 49 tokens went through the model (the last answer token is never fed back): 3 blocks
  const auto cached = chat.cached_tokens();
  ASSERT_EQ(cached.size(), 48u);
  GenerateRequest r2 = r;
  r2.prompt.insert(r2.prompt.end(), t1.tokens.begin(), t1.tokens.end());
  for (int32_t i = 0; i < 7; ++i) r2.prompt.push_back((i * 11 + 5) % 500);
  EXPECT_TRUE(std::equal(cached.begin(), cached.end(), r2.prompt.begin()));
  auto t2 = chat.generate(r2);
  EXPECT_EQ(t2.n_reused, 48);
  EXPECT_EQ(t2.n_prefilled, t2.n_prompt - 48);
  Session fresh(m, 256);
  auto cold = fresh.generate(r2);
  EXPECT_EQ(cold.n_reused, 0);
  EXPECT_EQ(t2.tokens, cold.tokens);
  EXPECT_EQ(t2.first_logits, cold.first_logits);
  // a changed token in the second block: only the first block is reused
  GenerateRequest r3 = r2;
  r3.prompt[20] = (r3.prompt[20] + 1) % 500;
  auto t3 = chat.generate(r3);
  EXPECT_EQ(t3.n_reused, 16);
  EXPECT_EQ(t3.tokens, Session(m, 256).generate(r3).tokens);
  EXPECT_EQ(chat.engine().blocks().n_used(), 0);
}

}  // namespace
}  // namespace wick::test
