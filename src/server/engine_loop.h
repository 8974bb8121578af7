// The one thread that owns the engines (one per model) and their KV caches.
// HTTP threads submit jobs and read their channels; they never touch tensors.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/channel.h"
#include "server/metrics.h"

namespace wick::server {

class EngineLoop {
 public:
  EngineLoop(EngineConfig cfg, size_t max_queue, Metrics& metrics);
  ~EngineLoop();
  // false when the queue is full (the caller answers 429)
  bool submit(std::shared_ptr<const LoadedModel> model, GenerateRequest req,
              std::shared_ptr<Channel> ch);
  void cancel(const std::shared_ptr<Channel>& ch);  // frees the request's blocks within one step
  bool alive() const { return alive_; }
  EngineGauges gauges() const;

 private:
  struct Job {
    std::shared_ptr<const LoadedModel> model;
    GenerateRequest req;
    std::shared_ptr<Channel> ch;
  };
  void run();
  Engine& engine_for(const std::shared_ptr<const LoadedModel>& m);

  EngineConfig cfg_;
  size_t max_queue_;
  Metrics& metrics_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::vector<std::shared_ptr<Channel>> cancels_;
  std::map<const LoadedModel*,
           std::pair<std::shared_ptr<const LoadedModel>, std::unique_ptr<Engine>>>
      engines_;
  std::map<const Channel*, std::pair<Engine*, int64_t>> live_;  // engine thread only
  size_t n_in_flight_ = 0;
  EngineGauges gauges_;
  bool stop_ = false;
  std::atomic<bool> alive_{false};
  std::thread thread_;
};

}  // namespace wick::server
