// Token controls: logit_bias (added before the penalties), min_tokens
// (end-of-generation ids masked until then) and ignore_eos, checked against
// plain decoding's logits; biased requests in a batch leave the others
// alone, and speculative decoding gives plain decoding's tokens under them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine_run.h"

namespace wick::test {
namespace {

TEST(Sampler, LogitBiasComesBeforeThePenalties) {
  SamplingParams p = SamplingParams::greedy();
  p.logit_bias = {{2, 3.f}};
  std::vector<float> row = {2, 1, 0};
  EXPECT_EQ(Sampler(p, 3).sample(row, {}), 2);  // 0 + 3 beats 2
  EXPECT_FLOAT_EQ(row[2], 3.f);
  // repeat penalty 2 on id 2: (0 + 3) / 2 = 1.5 < 2 (penalty first would give 0 * 2 + 3 = 3)
  p.repeat_penalty = 2.f;
  row = {2, 1, 0};
  const std::vector<int32_t> history = {2};
  EXPECT_EQ(Sampler(p, 3).sample(row, history), 0);
  EXPECT_FLOAT_EQ(row[2], 1.5f);
  // the sampled path's distribution sees the bias too: 5 - 100 against 0, 0
  p = SamplingParams{};
  p.top_k = 0, p.top_p = 1, p.min_p = 0, p.temperature = 1;
  p.logit_bias = {{0, -100.f}};
  row = {5, 0, 0};
  Sampler s(p, 3);
  for (const auto& c : s.distribution(row, {}))
    EXPECT_NEAR(c.p, c.id == 0 ? std::exp(-95.0) / 2 : 0.5, 1e-6) << c.id;
  EXPECT_LT(s.distribution(row = {5, 0, 0}, {}).back().p, 1e-40);
}

TEST(Sampler, LogitBiasIsValidated) {
  SamplingParams p;
  p.logit_bias = {{3, 100.f}, {4, -100.f}};
  EXPECT_EQ(p.validate(), "");
  p.logit_bias = {{3, 100.5f}};
  EXPECT_NE(p.validate().find("logit_bias"), std::string::npos);
  p.logit_bias = {{3, NAN}};
  EXPECT_NE(p.validate().find("logit_bias"), std::string::npos);
  p.logit_bias = {{-1, 1.f}};
  EXPECT_NE(p.validate().find("logit_bias"), std::string::npos);
}

class TokenControls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(tiny_dir("llama")))
      WICK_SKIP_OR_FAIL("../shared/fixtures not found at " << shared_dir());
    m_ = load_model_and_tokenizer(tiny_dir("llama"));
    ASSERT_FALSE(m_->eog_ids.empty());
    n_vocab_ = int32_t(m_->config().n_vocab);
  }
  GenerateRequest request(int32_t n_prompt, int32_t max_tokens, uint32_t seed = 7) {
    std::mt19937 rng(seed);
    return greedy_request(random_tokens(rng, n_prompt, n_vocab_), max_tokens);
  }
  GenerateResult run(const GenerateRequest& r) {
    Engine e(m_, EngineConfig{});
    return run_one(e, r);
  }
  std::shared_ptr<const LoadedModel> m_;
  int32_t n_vocab_ = 0;
};

// A ban of the greedy token gives the best of the rest of plain decoding's
// logits; the rest of the run follows from that token.
TEST_F(TokenControls, ABanGivesTheNextBestOfThePlainLogits) {
  GenerateRequest r = request(12, 6);
  r.keep_first_logits = true;
  const GenerateResult plain = run(r);
  ASSERT_EQ(plain.tokens.size(), 6u);
  std::vector<float> logits = plain.first_logits;
  const int32_t banned = plain.tokens[0];
  logits[size_t(banned)] = -INFINITY;
  const int32_t next_best =
      int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  r.sampling.logit_bias = {{banned, -100.f}};
  const GenerateResult biased = run(r);
  EXPECT_EQ(biased.tokens[0], next_best);
  for (int32_t id : biased.tokens) EXPECT_NE(id, banned);
  // the biased first logits are the model's (the bias is the sampler's)
  EXPECT_EQ(biased.first_logits, plain.first_logits);
}

TEST_F(TokenControls, APlusHundredBiasForcesItsToken) {
  GenerateRequest r = request(9, 8);
  const int32_t forced = 300;
  r.sampling.logit_bias = {{forced, 100.f}};
  const GenerateResult g = run(r);
  EXPECT_EQ(g.tokens, std::vector<int32_t>(8, forced));
}

// End-of-generation forced by a bias: it comes only once min_tokens are out.
TEST_F(TokenControls, MinTokensHoldsTheEndBack) {
  const int32_t eos = m_->eog_ids.front();
  GenerateRequest r = request(10, 20);
  r.ignore_eos = false;
  r.sampling.logit_bias = {{eos, 100.f}};
  GenerateResult g = run(r);
  EXPECT_EQ(g.tokens, std::vector<int32_t>{eos});
  EXPECT_EQ(g.stop_reason, "eos");
  r.min_tokens = 5;
  g = run(r);
  ASSERT_EQ(g.tokens.size(), 6u);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(m_->is_eog(g.tokens[size_t(i)])) << i;
  EXPECT_EQ(g.tokens.back(), eos);
  EXPECT_EQ(g.stop_reason, "eos");
  // ignore_eos: the forced end is a token like any other
  r.min_tokens = 0;
  r.ignore_eos = true;
  g = run(r);
  EXPECT_EQ(g.tokens, std::vector<int32_t>(20, eos));
  EXPECT_EQ(g.stop_reason, "length");
}

// Biased, held-back and sampled requests batched with plain ones: each
// equals its run alone (the host path leaves the batch's others alone).
TEST_F(TokenControls, BatchedRequestsEqualTheirRunsAlone) {
  std::vector<GenerateRequest> reqs;
  for (uint32_t i = 0; i < 8; ++i) {
    GenerateRequest r = request(5 + int32_t(i) * 3, 10, 100 + i);
    if (i % 4 == 1) r.sampling.logit_bias = {{int32_t(i * 50), 5.f}, {int32_t(i * 50 + 1), -100.f}};
    if (i % 4 == 2) {
      r.ignore_eos = false;
      r.min_tokens = 4;
      r.sampling.logit_bias = {{m_->eog_ids.front(), 100.f}};
    }
    if (i % 4 == 3) {
      r.sampling = SamplingParams{};
      r.sampling.seed = i;
      r.sampling.logit_bias = {{int32_t(i), 3.f}};
    }
    reqs.push_back(r);
  }
  EngineConfig cfg;
  cfg.max_batch_tokens = 32;  // chunked prefills mixed with decodes
  const auto alone = run_one_by_one(m_, cfg, reqs);
  Engine e(m_, cfg);
  const auto together = run_engine(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(together[i].tokens, alone[i].tokens) << i;
  EXPECT_EQ(alone[2].tokens.size(), 5u);  // four held back, then the forced end
}

// Drafts are verified under the bias and the hold-back: speculative
// decoding gives plain decoding's tokens.
TEST_F(TokenControls, SpeculationGivesPlainTokensUnderThem) {
  std::vector<GenerateRequest> reqs;
  for (uint32_t i = 0; i < 4; ++i) {
    GenerateRequest r = request(24, 24, 200 + i);
    r.sampling.logit_bias = {{int32_t(7 + i), 2.f}, {int32_t(20 + i), -100.f}};
    if (i % 2) {
      r.ignore_eos = false;
      r.min_tokens = 6;
      r.sampling.logit_bias.emplace_back(m_->eog_ids.front(), 3.f);
    }
    reqs.push_back(r);
  }
  EngineConfig plain;
  const auto want = run_one_by_one(m_, plain, reqs);
  EngineConfig spec;
  spec.spec.method = SpecMethod::Ngram;
  spec.spec.ngram_min = 1;
  Engine e(m_, spec);
  const auto got = run_engine(e, reqs);
  int32_t proposed = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
    proposed += got[i].n_spec_proposed;
  }
  EXPECT_GT(proposed, 0);  // drafts were verified, not skipped
}

TEST_F(TokenControls, BadValuesAreRequestErrors) {
  Engine e(m_, EngineConfig{});
  GenerateRequest r = request(4, 2);
  r.sampling.logit_bias = {{n_vocab_, 1.f}};
  EXPECT_THROW(e.add_request(r, {}), GenerateError);
  r.sampling.logit_bias = {{0, 101.f}};
  EXPECT_THROW(e.add_request(r, {}), GenerateError);
  r.sampling.logit_bias.clear();
  r.min_tokens = -1;
  EXPECT_THROW(e.add_request(r, {}), GenerateError);
}

}  // namespace
}  // namespace wick::test
