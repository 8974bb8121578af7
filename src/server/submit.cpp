#include "server/submit.h"

namespace wick::server {

std::string finish_reason(const std::string& stop) {
  if (stop == "eos" || stop == "stop") return "stop";
  if (stop == "length" || stop == "context") return "length";
  return stop;
}

void SpecTotals::add(const GenerateResult& r) {
  proposed += r.n_spec_proposed;
  accepted += r.n_spec_accepted;
  tokens += int64_t(r.tokens.size());
  forwards += r.n_forwards;
}

json SpecTotals::to_json() const {
  if (proposed == 0) return nullptr;
  return {{"proposed", proposed},
          {"accepted", accepted},
          {"acceptance_rate", double(accepted) / double(proposed)},
          {"forwards", forwards},
          {"tokens_per_forward", forwards ? double(tokens) / double(forwards) : 0.0}};
}

Channels Submitter::submit(std::shared_ptr<const LoadedModel> m, const GenerateRequest& r,
                           int32_t n_choices) {
  Channels chans;
  for (int32_t i = 0; i < n_choices; ++i) {
    GenerateRequest choice = r;
    choice.sampling.seed = r.sampling.seed + uint64_t(i);
    auto ch = std::make_shared<Channel>();
    if (!loop_.submit(m, std::move(choice), ch)) {
      cancel(chans);
      throw ApiError{429, "the server is busy: too many requests in flight; retry later",
                     "rate_limit_exceeded", "", "queue_full"};
    }
    chans.push_back(ch);
  }
  return chans;
}

GenerateResult Submitter::wait_one(const std::shared_ptr<Channel>& ch) {
  using Clock = std::chrono::steady_clock;
  auto next_check = Clock::now();
  while (true) {
    auto e = ch->pop(std::chrono::milliseconds(200));
    // every 200 ms, tokens or not: is anyone still waiting for the answer?
    if (Clock::now() >= next_check) {
      next_check = Clock::now() + std::chrono::milliseconds(200);
      if (!loop_.alive())
        throw ApiError{503, "the engine stopped", "server_error", "", "engine_down"};
      // 499 as nginx logs it: nobody reads the answer, so stop generating it
      if (client_gone_ && client_gone_())
        throw ApiError{499, "the client closed the connection", "", "", "client_closed"};
    }
    if (!e) continue;
    if (!e->error.empty()) {
      if (e->done && e->done->internal_error)
        throw ApiError{500, e->error, "server_error", "", "internal_error"};
      throw ApiError{400, e->error, "invalid_request_error", "", "generation_failed"};
    }
    if (e->done) return *e->done;
  }
}

std::vector<GenerateResult> Submitter::wait(const Channels& chans) {
  std::vector<GenerateResult> results;
  try {
    for (auto& ch : chans) results.push_back(wait_one(ch));
  } catch (const ApiError&) {
    cancel(chans);
    throw;
  }
  return results;
}

void Submitter::cancel(const Channels& chans) {
  for (auto& ch : chans) loop_.cancel(ch);
}

bool Submitter::pump(const Channels& chans, StreamWriter& writer, httplib::DataSink& sink) {
  std::vector<bool> done(chans.size(), false);
  size_t n_done = 0;
  // One choice waits longer per poll; several take turns quickly.
  const auto poll = std::chrono::milliseconds(chans.size() == 1 ? 200 : 20);
  while (n_done < chans.size()) {
    for (size_t i = 0; i < chans.size(); ++i) {
      if (done[i]) continue;
      auto e = chans[i]->pop(poll);
      if (!sink.is_writable() || (client_gone_ && client_gone_())) {
        cancel(chans);
        return false;
      }
      if (!e) continue;
      std::string out;
      if (e->done)  // a failed result's stop reason already reads "error: ..."
        out = writer.done(i, *e->done);
      else if (!e->error.empty())
        out = writer.done(i, GenerateResult{.stop_reason = "error: " + e->error});
      else
        out = writer.text(i, e->text, e->logprobs);
      if (!out.empty() && !sink.write(out.data(), out.size())) {
        cancel(chans);
        return false;
      }
      if (e->done || !e->error.empty()) {
        done[i] = true;
        ++n_done;
      }
    }
  }
  return true;
}

void Submitter::respond(httplib::Response& res, const char* content_type, const Channels& chans,
                        std::shared_ptr<StreamWriter> writer) {
  res.set_chunked_content_provider(
      content_type,
      [this, chans, writer](size_t, httplib::DataSink& sink) {
        if (!pump(chans, *writer, sink)) return false;
        const std::string tail = writer->end();
        if (!tail.empty()) sink.write(tail.data(), tail.size());
        sink.done();
        return true;
      },
      [this, chans](bool success) {
        if (!success) cancel(chans);
      });
}

}  // namespace wick::server
