// The one thread that owns the engines (one per model) and their KV caches.
// HTTP threads submit jobs and read their channels; they never touch tensors.
// An engine lives while its model is in the pool or has requests: once the
// pool has evicted the model (or its keep-alive ran out: the loop expires
// the pool's models) and the engine is idle, the engine, its KV cache and the
// model's weights are freed. Embedding jobs run on the same engines between steps.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/channel.h"
#include "server/kv_events.h"
#include "server/metrics.h"

namespace wick::server {

class EngineLoop {
 public:
  // pool: whose models keep their engines (the server's: ModelPool::global()).
  // kv_events: where the engines' KV-cache events go (null: nowhere).
  EngineLoop(EngineConfig cfg, size_t max_queue, Metrics& metrics, ModelPool& pool,
             std::unique_ptr<KvEventPublisher> kv_events = nullptr);
  ~EngineLoop();
  // false when the queue is full (the caller answers 429)
  bool submit(std::shared_ptr<const LoadedModel> model, GenerateRequest req,
              std::shared_ptr<Channel> ch);
  void cancel(const std::shared_ptr<Channel>& ch);  // frees the request's blocks within one step
  // Queues embeddings of `inputs` on m's engine (Engine::embed); nullopt when
  // the queue is full (429). The future throws GenerateError for a bad input.
  std::optional<std::future<std::vector<Embedding>>> submit_embed(
      std::shared_ptr<const LoadedModel> m, std::vector<std::vector<int32_t>> inputs,
      Pooling pooling, int32_t adapter = 0);
  // Named LoRA adapters while serving (the pool's lora_modules; vLLM's
  // /v1/load_lora_adapter), changed between steps. load_adapter adds `name`
  // (`path`) to m, the model they attach to, under a number never given
  // before, and registers it; with `replace`, an adapter of that name gives
  // way as unload_adapter lets it. The future throws ModelError/IoError for
  // a file that does not fit, AdapterTaken for a name in use.
  struct AdapterTaken : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
  };
  std::future<void> load_adapter(std::shared_ptr<const LoadedModel> m, std::string name,
                                 std::string path, bool replace);
  // Unregisters `name`: requests from now on do not find it; requests with
  // it finish first, then its terms are freed. false: no adapter of that name.
  std::future<bool> unload_adapter(std::string name);
  bool alive() const { return alive_; }
  // The model (resolved path) whose engine gets the config's draft model;
  // other models' engines have none.
  void set_draft_target(const std::string& path);
  EngineGauges gauges() const;
  size_t n_engines() const;  // engines held (each with its KV cache)

 private:
  struct Job {
    std::shared_ptr<const LoadedModel> model;
    GenerateRequest req;
    std::shared_ptr<Channel> ch;
  };
  void run();
  Engine& engine_for(const std::shared_ptr<const LoadedModel>& m);
  void release_slot();  // one request in flight less
  void add_jobs(std::deque<Job>& jobs);
  struct EmbedJob {
    std::shared_ptr<const LoadedModel> model;
    std::vector<std::vector<int32_t>> inputs;
    Pooling pooling;
    int32_t adapter;  // GenerateRequest::adapter
    std::promise<std::vector<Embedding>> done;
  };
  void run_embeds(std::deque<EmbedJob>& jobs);
  // Runs op on this thread between steps; its result or exception reaches the future.
  template <typename T, typename F>
  std::future<T> between_steps(F op);
  void retire_adapter(int32_t adapter);  // from every model that has it, once unused
  void free_retired_adapters();
  void sync_adapters(const LoadedModel& m);  // a new engine's model: the pool's adapters
  void step_engines();
  void free_evicted_engines();
  void update_gauges();
  void publish_kv_events(const LoadedModel& m, Engine& e);

  EngineConfig cfg_;
  size_t max_queue_;
  Metrics& metrics_;
  ModelPool& pool_;
  std::unique_ptr<KvEventPublisher> kv_events_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::deque<EmbedJob> embeds_;
  std::vector<std::shared_ptr<Channel>> cancels_;
  std::deque<std::function<void()>> admin_;  // adapter changes, run between steps
  // named adapters unregistered while requests still use them: (engine's model, number)
  std::vector<std::pair<const LoadedModel*, int32_t>> retiring_;
  std::map<const LoadedModel*, std::unique_ptr<Engine>> engines_;  // the engine holds its model
  std::map<const Channel*, std::pair<Engine*, int64_t>> live_;     // engine thread only
  size_t n_in_flight_ = 0;
  size_t n_engines_ = 0;  // engines_.size(), for other threads
  std::string draft_target_;
  EngineGauges gauges_;
  bool stop_ = false;
  std::atomic<bool> alive_{false};
  std::thread thread_;
};

}  // namespace wick::server
