// The update part of an engine step: turns the logits rows of the sequences
// that sample into tokens (log-probabilities, sampling on the backend when
// it can, else with the host Sampler), streams their text through the
// detokenizer and the stop strings, decides which sequences end, and
// completes their results.
//
// At the context limit a sequence ends with "context" once its prompt and
// generated tokens together number n_ctx: the last generated token is not
// fed back, so the KV cache never holds more than n_ctx - 1 of them.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model_pool.h"
#include "engine/model_runner.h"
#include "engine/sequence.h"

namespace wick {

class OutputProcessor {
 public:
  OutputProcessor(std::shared_ptr<const LoadedModel> model, int32_t n_ctx)
      : model_(std::move(model)), n_ctx_(n_ctx) {}

  // Readies a new sequence: its sampler, detokenizer, stop filter, clock.
  void start(Sequence& s) const;
  // One token for each sequence of `sampling` (logits row r of the runner's
  // last step is sampling[r]); returns those that ended, stop_reason set.
  std::vector<Sequence*> update(std::span<Sequence* const> sampling, ModelRunner& runner);
  // Completes the result and calls on_done (once per sequence).
  void finish(Sequence& s, const std::string& reason) const;

 private:
  int32_t sample_on_host(Sequence& s, std::span<float> row);
  bool append(Sequence& s, int32_t id);  // false when the sequence ends

  std::shared_ptr<const LoadedModel> model_;
  int32_t n_ctx_;
  std::vector<int32_t> order_;  // scratch for top log-probabilities
};

}  // namespace wick
