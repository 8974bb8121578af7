// Runs requests through an engine together until it is idle; the results in
// request order (shared by the engine-level tests).
#pragma once

#include <vector>

#include "engine/engine.h"

namespace wick::test {

inline std::vector<GenerateResult> run_engine(Engine& e, const std::vector<GenerateRequest>& reqs) {
  std::vector<GenerateResult> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    e.add_request(reqs[i], {nullptr, [&out, i](const GenerateResult& r) { out[i] = r; }});
  e.run_until_idle();
  return out;
}

}  // namespace wick::test
