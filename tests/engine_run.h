// Helpers shared by the engine-level tests: running requests through an
// engine together, a greedy request.
#pragma once

#include <utility>
#include <vector>

#include "engine/engine.h"

namespace wick::test {

// The results in request order, once the engine is idle.
inline std::vector<GenerateResult> run_engine(Engine& e, const std::vector<GenerateRequest>& reqs) {
  std::vector<GenerateResult> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    e.add_request(reqs[i], {nullptr, [&out, i](const GenerateResult& r) { out[i] = r; }});
  e.run_until_idle();
  return out;
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

}  // namespace wick::test
