// Prompt log-probabilities (GenerateRequest::prompt_logprobs, vLLM's): each
// prompt token's log-probability, rank and top alternatives equal what a
// request ending just before that token samples from, in chunks and among
// other requests; the prefix cache never hides a row; a span layout's spans
// have none and its other tokens do; a step's rows stay bounded.
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine_run.h"
#include "helpers.h"
#include "sampling/logprobs.h"

namespace wick::test {
namespace {

using Tokens = std::vector<int32_t>;

Tokens some_tokens(int n, uint32_t seed, int32_t n_vocab) {
  std::mt19937 rng(seed);
  Tokens t(size_t(n), 0);
  for (auto& x : t) x = int32_t(rng() % uint32_t(std::min(n_vocab, 500)));
  return t;
}

GenerateRequest greedy(Tokens prompt, int32_t max_tokens = 1) {
  return greedy_request(std::move(prompt), max_tokens);
}

class PromptLogprobsArch : public ::testing::TestWithParam<std::string> {};

// Entry p equals the distribution a request for prompt[0, p) samples its
// first token from (the same bits: batch invariance), whatever the chunks
// and the other requests in the step.
TEST_P(PromptLogprobsArch, EachEntryIsTheDistributionAfterThePrefix) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir(GetParam()));
  const int32_t V = int32_t(m->config().n_vocab);
  const Tokens prompt = some_tokens(37, 3, V);
  GenerateRequest r = greedy(prompt, 3);
  r.prompt_logprobs = 4;
  r.prefill_chunk = 9;
  EngineConfig cfg;
  cfg.max_batch_tokens = 20;  // chunks of other requests share the steps
  Engine e(m, cfg);
  auto others = std::vector<GenerateRequest>{greedy(some_tokens(25, 4, V), 5), r,
                                             greedy(some_tokens(30, 5, V), 4)};
  const GenerateResult got = run_engine(e, others)[1];
  ASSERT_EQ(got.prompt_logprobs.size(), prompt.size());
  EXPECT_FALSE(got.prompt_logprobs[0].has_value()) << "nothing predicts the first token";
  Engine alone(m, EngineConfig{});
  for (size_t p = 1; p < prompt.size(); ++p) {
    ASSERT_TRUE(got.prompt_logprobs[p].has_value()) << p;
    const TokenLogprob& lp = *got.prompt_logprobs[p];
    GenerateRequest before = greedy(Tokens(prompt.begin(), prompt.begin() + long(p)));
    before.keep_first_logits = true;
    before.top_logprobs = 4;
    const GenerateResult want = run_engine(alone, {before})[0];
    const auto& row = want.first_logits;
    ASSERT_EQ(row.size(), size_t(V));
    EXPECT_EQ(lp.id, prompt[p]);
    EXPECT_EQ(lp.logprob, row[size_t(prompt[p])] - log_sum_exp(row)) << p;
    EXPECT_EQ(lp.rank, rank_of(row, prompt[p])) << p;
    EXPECT_EQ(lp.top, want.logprobs[0].top) << p;
    EXPECT_EQ(lp.rank == 1, lp.top[0].first == prompt[p]) << p;
  }
  EXPECT_EQ(e.blocks().n_used(), 0);
}

INSTANTIATE_TEST_SUITE_P(Archs, PromptLogprobsArch,
                         ::testing::Values("llama", "qwen3", "qwen3_moe"),
                         [](const auto& info) { return info.param; });

// A request for prompt logprobs computes every row: a cached prompt gives
// the same entries again (and reports nothing reused).
TEST(PromptLogprobs, ThePrefixCacheHidesNoRow) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("llama"));
  GenerateRequest r = greedy(some_tokens(70, 7, int32_t(m->config().n_vocab)), 2);
  Engine e(m, EngineConfig{});
  run_engine(e, {r});  // now cached
  r.prompt_logprobs = 0;
  const GenerateResult a = run_engine(e, {r})[0], b = run_engine(e, {r})[0];
  EXPECT_EQ(a.n_reused, 0);
  EXPECT_EQ(b.n_reused, 0);
  ASSERT_EQ(a.prompt_logprobs.size(), r.prompt.size());
  for (size_t p = 1; p < r.prompt.size(); ++p) {
    ASSERT_TRUE(a.prompt_logprobs[p] && b.prompt_logprobs[p]) << p;
    EXPECT_EQ(a.prompt_logprobs[p]->logprob, b.prompt_logprobs[p]->logprob) << p;
    EXPECT_TRUE(a.prompt_logprobs[p]->top.empty());  // 0 alternatives asked
  }
  // and the cache still serves requests that do not ask
  r.prompt_logprobs = -1;
  EXPECT_GT(run_engine(e, {r})[0].n_reused, 0);
}

// Span layouts: a token inside a span is taken from the span cache (no
// entry); the text before and after the spans has entries, one per prompt
// token (the layout's empty slots left out), predicting the next prompt
// token (across the slots).
TEST(PromptLogprobs, SpanTokensHaveNoneAndTheRestHave) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("qwen3"));
  const int32_t V = int32_t(m->config().n_vocab);
  const Tokens head = some_tokens(5, 11, V), d1 = some_tokens(20, 12, V),
               d2 = some_tokens(9, 13, V), tail = some_tokens(12, 14, V);
  GenerateRequest r;
  r.prompt = head;
  for (const Tokens* d : {&d1, &d2}) {
    const int32_t b = int32_t(r.prompt.size());
    r.prompt.insert(r.prompt.end(), d->begin(), d->end());
    r.spans.push_back({b, int32_t(r.prompt.size())});
  }
  r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
  r.sampling = SamplingParams::greedy();
  r.max_tokens = 2;
  r.ignore_eos = true;
  r.prompt_logprobs = 2;
  EngineConfig cfg;
  cfg.span_cache = true;
  cfg.span_recompute = 4;
  Engine e(m, cfg);
  const GenerateResult got = run_engine(e, {r})[0];
  ASSERT_EQ(got.prompt_logprobs.size(), r.prompt.size());
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    // entry i is computed by the row before it: a row of the head or the
    // tail (the head's last row predicts the first span's first token)
    const bool row_before_is_text =
        i > 0 && (i - 1 < head.size() || i - 1 >= size_t(r.spans.back().second));
    EXPECT_EQ(got.prompt_logprobs[i].has_value(), row_before_is_text) << i;
    if (got.prompt_logprobs[i]) {
      EXPECT_EQ(got.prompt_logprobs[i]->id, r.prompt[i]) << i;
      EXPECT_EQ(got.prompt_logprobs[i]->top.size(), 2u);
    }
  }
  EXPECT_EQ(e.blocks().n_used(), 0);
}

// However long the prompt and however large the step, a step computes at
// most kMaxPromptLogitRows rows of prompt logprobs; every entry still comes.
TEST(PromptLogprobs, AStepsRowsStayBounded) {
  WICK_REQUIRE_SHARED();
  auto m = load_model_and_tokenizer(tiny_dir("llama"));
  const int32_t V = int32_t(m->config().n_vocab);
  EngineConfig cfg;
  cfg.max_batch_tokens = 1024;
  int32_t most = 0;
  cfg.before_execute = [&](std::span<const ScheduledSeq> seqs) {
    int32_t rows = 0;
    for (const auto& w : seqs) rows += w.n_prompt_rows;
    most = std::max(most, rows);
  };
  Engine e(m, cfg);
  std::vector<GenerateRequest> reqs;
  for (uint32_t i = 0; i < 3; ++i) {
    reqs.push_back(greedy(some_tokens(300, 20 + i, V), 2));
    reqs.back().prompt_logprobs = 1;
    reqs.back().prefill_chunk = 0;  // the whole prompt in one step, were it not bounded
  }
  for (const GenerateResult& g : run_engine(e, reqs))
    for (size_t p = 1; p < g.prompt_logprobs.size(); ++p)
      ASSERT_TRUE(g.prompt_logprobs[p].has_value()) << p;
  EXPECT_EQ(most, kMaxPromptLogitRows);
}

TEST(PromptLogprobs, OutOfRangeIsAnError) {
  GenerateRequest r = greedy({1, 2, 3});
  r.prompt_logprobs = kMaxPromptLogprobs + 1;
  EXPECT_THROW(validate_request(r, 100), GenerateError);
  r.prompt_logprobs = -2;
  EXPECT_THROW(validate_request(r, 100), GenerateError);
  r.prompt_logprobs = kMaxPromptLogprobs;
  EXPECT_NO_THROW(validate_request(r, 100));
}

}  // namespace
}  // namespace wick::test
