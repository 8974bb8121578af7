// Constrained decoding in the engine with the default model: requests with
// different grammars batched together each follow their own, end by
// themselves ("stop") or at max_tokens ("length", a prefix); end-of-
// generation only where the grammar is complete; no drafts for them; and
// log-probabilities stay the model's (before the mask). Also the sampler's mask.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine_run.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "helpers.h"

namespace wick::test {
namespace {

GenerateRequest chat(const LoadedModel& m, const std::string& question,
                     std::shared_ptr<const grammar::Grammar> g) {
  GenerateRequest r;
  r.prompt =
      m.tokenizer->encode("<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n",
                          {.parse_special = true});
  r.grammar = std::move(g);
  r.max_tokens = 200;
  return r;
}

bool whole_match(const std::shared_ptr<const grammar::Grammar>& g, const std::string& text) {
  grammar::Matcher m(g);
  return m.advance(text) && m.can_end();
}

TEST(Sampler, MaskKeepsOnlyAllowedTokens) {
  std::vector<float> logits = {5, 4, 3, 2, 1, 0};
  const std::vector<uint64_t> allowed = {0b101100};  // ids 2, 3, 5
  SamplingParams p;
  p.temperature = 0;
  Sampler greedy(p, 6);
  auto row = logits;
  EXPECT_EQ(greedy.sample(row, {}, allowed), 2);
  p.temperature = 1.5f;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  Sampler s(p, 6);
  for (int i = 0; i < 200; ++i) {
    row = logits;
    const int32_t id = s.sample(row, {}, allowed);
    EXPECT_TRUE(id == 2 || id == 3 || id == 5) << id;
  }
}

TEST(ConstrainedEngine, BatchedGrammarsEachFollowTheirOwn) {
  auto m = default_model();
  if (!m) WICK_SKIP_OR_FAIL("default model missing (WICK_TEST_MODEL)");
  using nlohmann::ordered_json;
  const auto person = grammar::compile_gbnf(grammar::json_schema_to_gbnf(ordered_json::parse(
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":16},"age":{"type":"integer"}},
          "required":["name","age"]})")));
  const auto yes_no = grammar::compile_gbnf("root ::= (\"yes\" | \"no\") \".\"");
  const auto digits = grammar::compile_gbnf("root ::= [0-9]{3} \"-\" [0-9]{4}");
  std::vector<GenerateRequest> reqs = {
      chat(*m, "Describe a person as JSON.", person), chat(*m, "Is water wet?", yes_no),
      chat(*m, "A phone number?", digits), chat(*m, "Describe a person as JSON.", person),
      chat(*m, "Describe a person as JSON.", person)};
  reqs[1].sampling.temperature = 1.0f;  // sampled, and greedy
  reqs[3].sampling.seed = 11;
  reqs[4].max_tokens = 3;  // cut: a prefix, "length"
  Engine e(m, EngineConfig{});
  std::vector<GenerateResult> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    e.add_request(reqs[i], {nullptr, [&out, i](const GenerateResult& r) { out[i] = r; }});
  e.run_until_idle();
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(out[i].stop_reason, "stop") << i << ": " << out[i].text;
    EXPECT_TRUE(whole_match(reqs[i].grammar, out[i].text)) << i << ": " << out[i].text;
  }
  EXPECT_TRUE(nlohmann::json::parse(out[0].text).contains("age"));
  EXPECT_EQ(out[4].stop_reason, "length");
  EXPECT_EQ(out[4].tokens.size(), 3u);
  grammar::Matcher prefix(person);
  EXPECT_TRUE(prefix.advance(out[4].text)) << out[4].text;
}

TEST(ConstrainedEngine, EosOnlyWhereTheGrammarIsComplete) {
  auto m = default_model();
  if (!m) WICK_SKIP_OR_FAIL("default model missing (WICK_TEST_MODEL)");
  // "a" then any number of "b": the model may end after any b, never before the a
  auto g = grammar::compile_gbnf("root ::= \"a\" \"b\"*");
  auto r = chat(*m, "Say something.", g);
  r.sampling.temperature = 1.0f;
  r.max_tokens = 12;
  Engine e(m, EngineConfig{});
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    r.sampling.seed = seed;
    GenerateResult res;
    e.add_request(r, {nullptr, [&](const GenerateResult& x) { res = x; }});
    e.run_until_idle();
    EXPECT_TRUE(res.stop_reason == "eos" || res.stop_reason == "length") << res.stop_reason;
    grammar::Matcher mm(g);
    ASSERT_TRUE(mm.advance(res.text)) << res.text;
    if (res.stop_reason == "eos") {
      EXPECT_TRUE(mm.can_end());
    }
  }
}

TEST(ConstrainedEngine, NoDraftsAndLogprobsOfTheModel) {
  auto m = default_model();
  if (!m) WICK_SKIP_OR_FAIL("default model missing (WICK_TEST_MODEL)");
  auto g = grammar::compile_gbnf("root ::= \"Paris\" | \"Lyon\"");
  auto r = chat(*m, "What is the capital of France?", g);
  r.sampling = SamplingParams::greedy();
  r.top_logprobs = 3;
  r.spec = SpecMethod::Ngram;
  auto free = r;
  free.grammar = nullptr;
  free.spec = SpecMethod::Off;
  free.max_tokens = 1;
  Engine e(m, EngineConfig{});
  GenerateResult got, unconstrained;
  e.add_request(r, {nullptr, [&](const GenerateResult& x) { got = x; }});
  e.add_request(free, {nullptr, [&](const GenerateResult& x) { unconstrained = x; }});
  e.run_until_idle();
  EXPECT_TRUE(got.text == "Paris" || got.text == "Lyon") << got.text;
  EXPECT_EQ(got.stop_reason, "stop");
  EXPECT_EQ(got.n_spec_proposed, 0);
  // the first token's top log-probabilities are the model's, mask or not
  ASSERT_FALSE(got.logprobs.empty());
  ASSERT_FALSE(unconstrained.logprobs.empty());
  ASSERT_EQ(got.logprobs[0].top.size(), unconstrained.logprobs[0].top.size());
  for (size_t i = 0; i < got.logprobs[0].top.size(); ++i) {
    EXPECT_EQ(got.logprobs[0].top[i].first, unconstrained.logprobs[0].top[i].first);
    EXPECT_NEAR(got.logprobs[0].top[i].second, unconstrained.logprobs[0].top[i].second, 1e-5);
  }
  EXPECT_LE(got.logprobs[0].logprob, 0.f);
}

}  // namespace
}  // namespace wick::test
