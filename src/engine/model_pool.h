// A process-wide pool of loaded models: each model is loaded once and shared
// by every request that names it; the least recently used are unloaded past
// a count (WICK_MAX_LOADED_MODELS, default 2) or byte budget
// (WICK_MAX_MODEL_BYTES, default 0 = no limit). Two threads asking for the
// same model wait for one load.
//
// Keep-alive (Ollama's): a model unused for its keep-alive is unloaded by
// expire(); each request holds a Use while it runs and sets the keep-alive,
// which counts from when the last Use ends. Negative: forever (the default
// for pools made here; the server sets its --keep-alive).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/forward.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "text/tool_calls.h"

namespace wick {

inline BackendOptions cpu_options() {
  BackendOptions o;
  o.device = Device::Cpu;
  return o;
}

struct LoadedModel {
  std::string name;  // as asked for
  std::string path;  // resolved
  std::unique_ptr<Model> model;
  std::unique_ptr<DeviceModel> device;        // the weights on the backend that runs them
  std::unique_ptr<Tokenizer> tokenizer;       // null when the model has none (test fixtures)
  std::vector<int32_t> eog_ids;               // ids that end a generation
  ToolFormat tool_format = ToolFormat::None;  // the tool-call markup its chat template teaches
  size_t n_bytes = 0;                         // file bytes mapped or copied: the model's, --lora's
  // Named adapters' file bytes (--lora-modules, and adapters loaded while
  // serving) by number: changed on the engine thread, their sum read anywhere.
  mutable std::map<int32_t, size_t> adapter_file_bytes;
  mutable std::atomic<size_t> n_adapter_bytes{0};

  // What the pool's byte budget and /api/ps count: the files it holds.
  size_t bytes() const { return n_bytes + n_adapter_bytes.load(); }
  void count_adapter(int32_t adapter, size_t n) const;
  void uncount_adapter(int32_t adapter) const;

  bool is_eog(int32_t id) const;
  Backend& backend() const { return *device->backend; }
  const ModelConfig& config() const { return model->config; }
};

// Loads model and tokenizer from a MODEL argument (resolve_model: a path or
// a stored name; no pool); `progress` gets 0..1. `opt` picks the backend
// (the CPU unless it says otherwise).
std::shared_ptr<LoadedModel> load_model_and_tokenizer(
    const std::string& name, const std::function<void(float)>& progress = {},
    const BackendOptions& opt = cpu_options());
// The same for a path already resolved, loaded as `name`.
std::shared_ptr<LoadedModel> load_model_at(const std::string& name, const std::string& path,
                                           const std::function<void(float)>& progress,
                                           const BackendOptions& opt);

// The bytes of a model or adapter: a file's size, or a folder's safetensors'.
size_t path_bytes(const std::string& path);

class ModelPool {
 public:
  using Duration = std::chrono::milliseconds;
  using Clock = std::chrono::steady_clock;

  // A request's hold on a loaded model: while any Use lives the model does
  // not expire; when the last one ends its keep-alive starts counting.
  class Use {
   public:
    Use() = default;
    Use(ModelPool* pool, std::shared_ptr<const LoadedModel> m)
        : pool_(pool), model_(std::move(m)) {}
    Use(Use&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), model_(std::move(o.model_)) {}
    Use& operator=(Use&& o) noexcept;
    ~Use() { release(); }
    void release();

   private:
    ModelPool* pool_ = nullptr;
    std::shared_ptr<const LoadedModel> model_;
  };

  // What GET /api/ps lists of a loaded model.
  struct Loaded {
    std::shared_ptr<const LoadedModel> model;
    int32_t n_uses = 0;  // requests holding it
    // When it unloads (system clock); nullopt: never (a negative keep-alive).
    std::optional<std::chrono::system_clock::time_point> expires_at;
  };

  ModelPool(size_t max_models, size_t max_bytes, BackendOptions opt = cpu_options())
      : max_models_(max_models), max_bytes_(max_bytes), opt_(opt) {}
  static ModelPool& global();  // limits from the environment (throws on invalid values)
  void set_backend(const BackendOptions& opt);  // for models loaded from now on
  // The named adapters (BackendOptions::lora_modules: adapter k at k - 1, ""
  // where one was removed), and a change of adapter k (k: at most one past
  // the last), for the model loaded next; owns_adapters: whether m is the
  // model they attach to (BackendOptions::lora_modules_model).
  std::vector<std::pair<std::string, std::string>> lora_modules() const;
  void set_lora_module(int32_t adapter, std::string name, std::string path);
  bool owns_adapters(const LoadedModel& m) const;

  // A MODEL argument as the operator gives it: a path or a stored name.
  std::shared_ptr<const LoadedModel> get(const std::string& name);
  // A name only, resolved inside the model store (what a server's clients may ask for).
  std::shared_ptr<const LoadedModel> get_stored(const std::string& name);
  size_t n_loaded() const;
  // Whether m is one of the pool's models (not yet evicted).
  bool holds(const LoadedModel& m) const;
  size_t n_loads() const { return n_loads_; }  // how many loads ran (for tests)

  // The keep-alive of models loaded from now on until a Use sets theirs.
  void set_default_keep_alive(Duration d);
  Duration default_keep_alive() const;
  // Holds m (a model this pool gave out) with keep_alive for when the hold
  // ends. A model evicted or expired meanwhile is put back: the request
  // that holds it keeps it loaded rather than loading a second copy.
  Use use(const std::shared_ptr<const LoadedModel>& m, Duration keep_alive);
  // Unloads the model at `path` now (requests running on it finish first:
  // they keep their reference); false when it was not loaded.
  bool unload(const std::string& path);
  // Unloads every model whose keep-alive ran out with no Use; how many.
  size_t expire(Clock::time_point now = Clock::now());
  // The model loaded from `path`, or null (never loads).
  std::shared_ptr<const LoadedModel> find_loaded(const std::string& path) const;
  // The loaded models, most recently used first.
  std::vector<Loaded> loaded() const;

 private:
  struct Entry {
    std::shared_future<std::shared_ptr<LoadedModel>> ready;
    uint64_t last_used = 0;
    int32_t n_uses = 0;
    Duration keep_alive{-1};
    Clock::time_point idle_since = Clock::now();
    std::shared_ptr<const LoadedModel> ready_model() const;  // null while loading or failed
    bool expired(Clock::time_point now) const;
  };
  void end_use(const std::shared_ptr<const LoadedModel>& m);
  static std::string key_of(const std::string& path);
  static std::string owner_key(const std::string& model);
  std::shared_ptr<const LoadedModel> get_at(const std::string& name, const std::string& path);
  void evict_locked(const std::string& keep);

  size_t max_models_, max_bytes_;
  BackendOptions opt_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;  // by resolved path
  uint64_t clock_ = 0;
  size_t n_loads_ = 0;
  Duration default_keep_alive_{-1};
};

}  // namespace wick
