// A request's results, passed from the engine thread to its HTTP thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/session.h"

namespace wick::server {

struct Event {
  std::string text;                    // a piece of output text
  std::optional<GenerateResult> done;  // set on the last event
  std::string error;                   // set when the request failed in the engine
  // With logprobs: the tokens computed since the last event (the text may
  // lag behind them: held-back UTF-8 or stop-string bytes).
  std::vector<TokenLogprob> logprobs;
};

class Channel {
 public:
  void push(Event e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(e));
    }
    cv_.notify_all();
  }
  // Waits up to `timeout` for the next event.
  std::optional<Event> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !q_.empty(); })) return std::nullopt;
    Event e = std::move(q_.front());
    q_.pop_front();
    return e;
  }
  std::atomic<bool> cancelled{false};
  std::atomic<bool> finished{false};  // set by the engine thread with the last event
  int64_t engine_id = 0;              // set by the engine thread

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> q_;
};

}  // namespace wick::server
