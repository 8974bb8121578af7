// Helpers shared by the engine-level tests: running requests through an
// engine together, a greedy request, random prompts, span requests.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/model_pool.h"
#include "engine/session.h"
#include "helpers.h"

namespace wick::test {

// The results in request order, once the engine is idle.
inline std::vector<GenerateResult> run_engine(Engine& e, const std::vector<GenerateRequest>& reqs) {
  std::vector<GenerateResult> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    e.add_request(reqs[i], {nullptr, [&out, i](const GenerateResult& r) { out[i] = r; }});
  e.run_until_idle();
  return out;
}

inline GenerateResult run_one(Engine& e, const GenerateRequest& r) {
  return run_engine(e, {r})[0];
}

// Each request alone, one after another, through one engine of cfg.
inline std::vector<GenerateResult> run_one_by_one(std::shared_ptr<const LoadedModel> m,
                                                  const EngineConfig& cfg,
                                                  const std::vector<GenerateRequest>& reqs) {
  Engine e(std::move(m), cfg);
  std::vector<GenerateResult> out;
  for (const auto& r : reqs) out.push_back(run_one(e, r));
  return out;
}

// The default model (WICK_TEST_MODEL) from the process's pool, or nullptr.
inline std::shared_ptr<const LoadedModel> default_model() {
  const char* p = std::getenv("WICK_TEST_MODEL");
  if (!p || !std::filesystem::exists(p)) return nullptr;
  return ModelPool::global().get(p);
}

// Greedy decoding of max_tokens tokens, end-of-generation ids ignored.
inline GenerateRequest greedy_request(std::vector<int32_t> prompt, int32_t max_tokens = 1) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.sampling = SamplingParams::greedy();
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// Greedy continuations of dir's reference.json prompts, prefilled in one pass
// and in chunks of 3, equal transformers' and stop at their length.
inline void expect_reference_greedy(const std::shared_ptr<const LoadedModel>& m,
                                    const std::string& dir, const std::string& label) {
  auto ref = read_json(dir + "/reference.json");
  for (auto& p : ref["prompts"]) {
    auto want = p["greedy_continuation"].get<std::vector<int32_t>>();
    for (int32_t chunk : {0, 3}) {
      Session s(m, 256);
      GenerateRequest req =
          greedy_request(p["ids"].get<std::vector<int32_t>>(), int32_t(want.size()));
      req.prefill_chunk = chunk;
      auto res = s.generate(req);
      EXPECT_EQ(res.tokens, want) << label << " chunk " << chunk;
      EXPECT_EQ(res.stop_reason, "length") << label;
    }
  }
}

// n_reqs random greedy requests (3-62 prompt tokens, 4-19 generated, every
// third prefilled in chunks of 5) through one engine of cfg give the tokens
// each gives alone in a session: a token's results do not depend on its batch.
inline void expect_engine_equals_sessions(const std::shared_ptr<const LoadedModel>& m,
                                          uint32_t seed, int n_reqs, const EngineConfig& cfg) {
  std::mt19937 rng(seed);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < n_reqs; ++i) {
    std::vector<int32_t> prompt;
    for (int k = 0, n = 3 + int(rng() % 60); k < n; ++k)
      prompt.push_back(int32_t(rng() % uint32_t(m->model->config.n_vocab)));
    auto r = greedy_request(prompt, 4 + int(rng() % 16));
    r.prefill_chunk = i % 3 == 0 ? 5 : 0;
    reqs.push_back(r);
  }
  std::vector<GenerateResult> want;
  for (auto& r : reqs) want.push_back(Session(m, 512).generate(r));
  Engine e(m, cfg);
  auto got = run_engine(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].tokens.size(), size_t(reqs[i].max_tokens));
  }
}

// n token ids below n_vocab.
inline std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int64_t n_vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint32_t(n_vocab));
  return t;
}

// Greedy requests with random prompts (vocabulary 512), each choosing named
// LoRA adapter i % 3 and min_tokens + [0, spread) tokens, every third
// prefilled in chunks of 5, the first step's logits kept.
inline std::vector<GenerateRequest> adapter_requests(uint32_t seed, int n, int min_tokens = 3,
                                                     int spread = 8) {
  std::mt19937 rng(seed);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < n; ++i) {
    auto r = greedy_request(random_tokens(rng, 3 + int(rng() % 40), 512),
                            min_tokens + int(rng() % uint32_t(spread)));
    r.prefill_chunk = i % 3 == 0 ? 5 : 0;
    r.keep_first_logits = true;
    r.adapter = i % 3;
    reqs.push_back(r);
  }
  return reqs;
}

// The same tokens and, bit for bit, the same first-step logits.
inline void expect_same_result(const GenerateResult& got, const GenerateResult& want, size_t i) {
  EXPECT_EQ(got.tokens, want.tokens) << "request " << i;
  EXPECT_EQ(got.first_logits, want.first_logits) << "request " << i;
}

// Runs reqs (each naming a LoRA adapter 0-2) batched in e, and expects each
// to give the bits of alone[its adapter] (that adapter on every row)
// answering it by itself; returns e's results.
inline std::vector<GenerateResult> expect_batched_equal_alone(
    Engine& e, const std::vector<GenerateRequest>& reqs,
    const std::shared_ptr<const LoadedModel> (&alone)[3]) {
  const auto got = run_engine(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    GenerateRequest plain = reqs[i];
    plain.adapter = 0;
    expect_same_result(got[i], Session(alone[reqs[i].adapter], 512).generate(plain), i);
  }
  return got;
}

// A tiny fixture model per architecture (the test's parameter) and random
// prompts from a generator seeded alike for every test.
class TinyArchTest : public ::testing::TestWithParam<std::string> {
 protected:
  explicit TinyArchTest(uint32_t seed) : rng_(seed) {}
  void SetUp() override {
    if (!std::filesystem::exists(tiny_dir(GetParam())))
      WICK_SKIP_OR_FAIL("../shared/fixtures not found at " << shared_dir());
    m_ = load_model_and_tokenizer(tiny_dir(GetParam()));
  }
  std::vector<int32_t> random(int n) { return random_tokens(rng_, n, m_->config().n_vocab); }

  std::shared_ptr<const LoadedModel> m_;
  std::mt19937 rng_;
};

// prefix, the documents as spans, then the question: greedy, the first
// step's logits kept; the span settings (recompute, blend, context) are the
// engine's until the caller sets them.
inline GenerateRequest request_with_spans(const std::vector<int32_t>& prefix,
                                          const std::vector<std::vector<int32_t>>& docs,
                                          const std::vector<int32_t>& question,
                                          int32_t max_tokens) {
  GenerateRequest r = greedy_request(prefix, max_tokens);
  for (const auto& d : docs) {
    const int32_t begin = int32_t(r.prompt.size());
    r.prompt.insert(r.prompt.end(), d.begin(), d.end());
    r.spans.push_back({begin, int32_t(r.prompt.size())});
  }
  r.prompt.insert(r.prompt.end(), question.begin(), question.end());
  r.keep_first_logits = true;
  return r;
}

}  // namespace wick::test
