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

// n token ids below n_vocab.
inline std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int64_t n_vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint32_t(n_vocab));
  return t;
}

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
