// The one path from a parsed request to the engine loop and back, for both
// APIs: submit its choices (429 when the queue is full), then wait for the
// results or stream each event through an API's StreamWriter, cancelling
// every choice when the client goes away.
#pragma once

#include <httplib.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/engine_loop.h"
#include "server/parse_common.h"

namespace wick::server {

using Channels = std::vector<std::shared_ptr<Channel>>;

// An API's streamed response: the bytes for each event of choice i.
class StreamWriter {
 public:
  virtual ~StreamWriter() = default;
  // logprobs: those of the tokens computed since the last event (with logprobs on).
  virtual std::string text(size_t i, const std::string& piece,
                           const std::vector<TokenLogprob>& logprobs) = 0;
  // The last event of choice i; r.stop_reason starts with "error" when it failed.
  virtual std::string done(size_t i, const GenerateResult& r) = 0;
  virtual std::string end() = 0;  // after every choice is done
};

// The APIs' finish reason for an engine stop reason.
std::string finish_reason(const std::string& stop_reason);

// Speculative decoding's counts over a request's results (wick's usage extra).
struct SpecTotals {
  int64_t proposed = 0, accepted = 0, tokens = 0, forwards = 0;
  void add(const GenerateResult& r);
  // {proposed, accepted, acceptance_rate, forwards, tokens_per_forward};
  // null when no draft was proposed.
  json to_json() const;
};

class Submitter {
 public:
  // client_gone: whether the client of the calling HTTP thread hung up.
  Submitter(EngineLoop& loop, std::function<bool()> client_gone)
      : loop_(loop), client_gone_(std::move(client_gone)) {}
  // Queues n_choices copies of r, choice i seeded r.sampling.seed + i. All or
  // none: a full queue cancels those already queued and throws a 429.
  Channels submit(std::shared_ptr<const LoadedModel> m, const GenerateRequest& r,
                  int32_t n_choices);
  // Each choice's result, in order; ApiError when the engine refused one
  // (400), failed it (500) or stopped (503), or when the client hung up
  // (499, never sent); the other choices are then cancelled.
  std::vector<GenerateResult> wait(const Channels& chans);
  // Answers res with a chunked stream of the writer's output for chans.
  void respond(httplib::Response& res, const char* content_type, const Channels& chans,
               std::shared_ptr<StreamWriter> writer);
  void cancel(const Channels& chans);

 private:
  GenerateResult wait_one(const std::shared_ptr<Channel>& ch);
  // Writes every event until all choices are done; false when the client went away.
  bool pump(const Channels& chans, StreamWriter& writer, httplib::DataSink& sink);

  EngineLoop& loop_;
  std::function<bool()> client_gone_;
};

}  // namespace wick::server
