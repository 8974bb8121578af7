#include "server/engine_loop.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include "engine/runtime_lora.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace wick::server {

EngineLoop::EngineLoop(EngineConfig cfg, size_t max_queue, Metrics& metrics, ModelPool& pool,
                       std::unique_ptr<KvEventPublisher> kv_events)
    : cfg_(cfg),
      max_queue_(max_queue),
      metrics_(metrics),
      pool_(pool),
      kv_events_(std::move(kv_events)) {
  cfg_.kv_events = kv_events_ != nullptr;
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool EngineLoop::submit(std::shared_ptr<const LoadedModel> model, GenerateRequest req,
                        std::shared_ptr<Channel> ch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (n_in_flight_ >= max_queue_) return false;
    ++n_in_flight_;
    jobs_.push_back({std::move(model), std::move(req), std::move(ch)});
  }
  cv_.notify_all();
  return true;
}

std::optional<std::future<std::vector<Embedding>>> EngineLoop::submit_embed(
    std::shared_ptr<const LoadedModel> m, std::vector<std::vector<int32_t>> inputs, Pooling pooling,
    int32_t adapter) {
  std::future<std::vector<Embedding>> f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (n_in_flight_ >= max_queue_) return std::nullopt;
    ++n_in_flight_;
    embeds_.push_back({std::move(m), std::move(inputs), pooling, adapter, {}});
    f = embeds_.back().done.get_future();
  }
  cv_.notify_all();
  return f;
}

void EngineLoop::run_embeds(std::deque<EmbedJob>& jobs) {
  for (auto& j : jobs) {
    try {
      j.done.set_value(engine_for(j.model).embed(j.inputs, j.pooling, j.adapter));
    } catch (...) {
      j.done.set_exception(std::current_exception());
    }
    release_slot();
  }
}

namespace {

// The number of the registered adapter named `name` (ModelPool::lora_modules), or 0.
int32_t adapter_named(const std::vector<std::pair<std::string, std::string>>& mods,
                      const std::string& name) {
  for (size_t k = 0; k < mods.size(); ++k)
    if (mods[k].first == name) return int32_t(k + 1);
  return 0;
}

}  // namespace

template <typename T, typename F>
std::future<T> EngineLoop::between_steps(F op) {
  auto done = std::make_shared<std::promise<T>>();
  auto f = done->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    admin_.push_back([done, op = std::move(op)]() mutable {
      try {
        if constexpr (std::is_void_v<T>) {
          op();
          done->set_value();
        } else {
          done->set_value(op());
        }
      } catch (...) {
        done->set_exception(std::current_exception());
      }
    });
  }
  cv_.notify_all();
  return f;
}

std::future<void> EngineLoop::load_adapter(std::shared_ptr<const LoadedModel> m, std::string name,
                                           std::string path, bool replace) {
  return between_steps<void>([this, m, name, path, replace] {
    const auto mods = pool_.lora_modules();
    const int32_t old = adapter_named(mods, name);
    if (old && !replace)
      throw AdapterTaken(fmt::format("The lora adapter '{}' has already been loaded.", name));
    auto& names = m->model->adapter_names;
    std::string hidden;  // the adapter it replaces gives up its name while this one loads
    if (old && old <= int32_t(names.size())) hidden = std::exchange(names[size_t(old - 1)], "");
    const int32_t adapter = int32_t(mods.size()) + 1;
    try {
      add_serving_adapter(*m, name, path, adapter);
    } catch (...) {
      if (!hidden.empty()) names[size_t(old - 1)] = hidden;
      throw;
    }
    pool_.set_lora_module(adapter, name, path);
    if (old) {
      pool_.set_lora_module(old, "", "");
      retire_adapter(old);
    }
    spdlog::info("LoRA adapter '{}' loaded from {} (adapter {})", name, path, adapter);
  });
}

std::future<bool> EngineLoop::unload_adapter(std::string name) {
  return between_steps<bool>([this, name] {
    const int32_t adapter = adapter_named(pool_.lora_modules(), name);
    if (!adapter) return false;
    pool_.set_lora_module(adapter, "", "");
    retire_adapter(adapter);
    spdlog::info("LoRA adapter '{}' unloaded (adapter {})", name, adapter);
    return true;
  });
}

void EngineLoop::retire_adapter(int32_t adapter) {
  std::map<const LoadedModel*, std::shared_ptr<const LoadedModel>> models;
  for (const auto& l : pool_.loaded()) models[l.model.get()] = l.model;
  for (const auto& [m, e] : engines_) models.emplace(m, nullptr);
  for (const auto& [m, held] : models) {
    if (adapter > int32_t(m->model->adapter_names.size())) continue;
    auto e = engines_.find(m);
    if (e != engines_.end() && e->second->uses_adapter(adapter)) {
      m->model->adapter_names[size_t(adapter - 1)].clear();  // no new request finds it
      retiring_.emplace_back(m, adapter);
    } else {
      remove_serving_adapter(*m, adapter);
    }
  }
}

void EngineLoop::free_retired_adapters() {
  std::erase_if(retiring_, [&](const auto& r) {
    auto e = engines_.find(r.first);
    if (e == engines_.end()) return true;  // the engine and its model are gone
    if (e->second->uses_adapter(r.second)) return false;
    remove_serving_adapter(*r.first, r.second);
    return true;
  });
}

void EngineLoop::sync_adapters(const LoadedModel& m) {
  if (!pool_.owns_adapters(m)) return;
  const auto mods = pool_.lora_modules();
  auto& names = m.model->adapter_names;
  for (size_t k = 0; k < std::max(mods.size(), names.size()); ++k) {
    const std::string want = k < mods.size() ? mods[k].first : "";
    const std::string have = k < names.size() ? names[k] : "";
    if (!want.empty() && want == have) continue;
    try {
      // gone, or retired while an engine it had is freed: its terms too (idempotent)
      if (k < names.size()) remove_serving_adapter(m, int32_t(k + 1));
      if (!want.empty()) add_serving_adapter(m, want, mods[k].second, int32_t(k + 1));
    } catch (const std::exception& ex) {  // its requests get "unknown adapter"
      spdlog::error("LoRA adapter '{}': {}", want, ex.what());
    }
  }
}

void EngineLoop::cancel(const std::shared_ptr<Channel>& ch) {
  ch->cancelled = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(ch);
  }
  cv_.notify_all();
}

EngineGauges EngineLoop::gauges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gauges_;
}

size_t EngineLoop::n_engines() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_engines_;
}

Engine& EngineLoop::engine_for(const std::shared_ptr<const LoadedModel>& m) {
  auto it = engines_.find(m.get());
  if (it != engines_.end()) return *it->second;
  EngineConfig c = cfg_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (c.spec.draft && m->path != draft_target_) {  // the draft is the default model's
      c.spec.draft = nullptr;
      if (c.spec.method == SpecMethod::Draft) c.spec.method = SpecMethod::Off;
    }
  }
  sync_adapters(*m);  // loaded while the pool's adapters changed
  return *engines_.emplace(m.get(), std::make_unique<Engine>(m, c)).first->second;
}

void EngineLoop::set_draft_target(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  draft_target_ = path;
}

void EngineLoop::release_slot() {
  std::lock_guard<std::mutex> lock(mu_);
  --n_in_flight_;
}

void EngineLoop::add_jobs(std::deque<Job>& jobs) {
  for (auto& j : jobs) {
    auto ch = j.ch;
    auto start = std::chrono::steady_clock::now();
    auto last = std::make_shared<std::chrono::steady_clock::time_point>(start);
    auto lps = std::make_shared<std::vector<TokenLogprob>>();  // since the last text event
    StreamCallbacks cb;
    cb.on_text = [this, ch, last, lps](std::string_view t) {
      auto now = std::chrono::steady_clock::now();
      metrics_.inter_token.observe(std::chrono::duration<double>(now - *last).count());
      *last = now;
      ch->push(Event{std::string(t), std::nullopt, "", std::move(*lps)});
      lps->clear();
      return !ch->cancelled.load();
    };
    cb.on_logprob = [lps](const TokenLogprob& lp) { lps->push_back(lp); };
    cb.on_done = [this, ch](const GenerateResult& r) {
      metrics_.add_tokens(uint64_t(r.n_prompt), r.tokens.size());
      metrics_.add_spans(uint64_t(r.n_span_hits), uint64_t(r.n_span_misses),
                         uint64_t(r.n_span_reused), uint64_t(r.n_span_recomputed));
      if (r.n_spec_proposed > 0)
        metrics_.add_spec(uint64_t(r.n_spec_proposed), uint64_t(r.n_spec_accepted), r.tokens.size(),
                          uint64_t(r.n_forwards));
      if (!r.tokens.empty()) metrics_.ttft.observe(r.ttft_ms / 1e3);
      live_.erase(ch.get());
      ch->finished = true;
      release_slot();
      ch->push(Event{"", r, r.stop_reason.rfind("error", 0) == 0 ? r.stop_reason : ""});
    };
    try {
      Engine& e = engine_for(j.model);
      const int64_t id = e.add_request(j.req, cb);
      if (!ch->finished) live_[ch.get()] = {&e, id};
      if (ch->cancelled) e.cancel(id);
    } catch (const GenerateError& ex) {  // the request's fault: a 400
      release_slot();
      ch->push(Event{"", std::nullopt, ex.what()});
    } catch (const std::exception& ex) {  // wick's (an engine that cannot start): a 500
      release_slot();
      GenerateResult r{.stop_reason = std::string("error: ") + ex.what(), .internal_error = true};
      ch->push(Event{"", r, r.stop_reason});
    }
  }
}

void EngineLoop::step_engines() {
  for (auto& [k, e] : engines_) {
    try {
      e->step();  // a failing forward pass fails its own requests inside
    } catch (const std::exception& ex) {
      // The step failed outside them (in scheduling): nothing says which
      // request caused it, and a retry would fail alike, so end them all.
      spdlog::error("engine step failed: {}", ex.what());
      e->abort_all(std::string("engine step failed: ") + ex.what());
    }
    publish_kv_events(*k, *e);
  }
}

void EngineLoop::publish_kv_events(const LoadedModel& m, Engine& e) {
  if (!kv_events_) return;
  const auto events = e.take_kv_events();
  const std::string medium = m.backend().device() == Device::Cuda ? "GPU" : "CPU";
  try {
    kv_events_->publish(events, e.config().block_size, medium);
  } catch (const std::exception& ex) {  // routers lose precision, requests go on
    spdlog::warn("kv events: {}", ex.what());
  }
}

void EngineLoop::free_evicted_engines() {
  const size_t n_before = engines_.size();
  for (auto it = engines_.begin(); it != engines_.end();) {
    Engine& e = *it->second;
    if (e.n_running() + e.n_waiting() == 0 && !pool_.holds(*it->first)) {
      std::erase_if(retiring_, [&](const auto& r) { return r.first == it->first; });
      if (kv_events_) {  // its cached blocks go with it
        e.drop_cached_blocks();
        publish_kv_events(*it->first, e);
      }
      it = engines_.erase(it);  // the last reference to the model's weights goes with it
    } else {
      ++it;
    }
  }
#ifdef __GLIBC__
  // Weights and buffers below malloc's mmap threshold went back to its heaps;
  // give those pages back to the system, so that an unload shows in RSS.
  if (engines_.size() < n_before) malloc_trim(0);
#endif
}

void EngineLoop::update_gauges() {
  EngineGauges g;
  for (auto& [k, e] : engines_) {
    g.running += e->n_running();
    g.waiting += e->n_waiting();
    g.blocks_used += e->blocks().n_used();
    g.blocks_free += e->blocks().n_free();
    g.hit_rate = e->blocks().hit_rate();
    g.preemptions += e->n_preemptions();
  }
  std::lock_guard<std::mutex> lock(mu_);
  g.waiting += int64_t(jobs_.size());
  g.engines = int64_t(engines_.size());
  gauges_ = g;
  n_engines_ = engines_.size();
}

void EngineLoop::run() {
  alive_ = true;
  while (true) {
    std::deque<Job> jobs;
    std::deque<EmbedJob> embeds;
    std::vector<std::shared_ptr<Channel>> cancels;
    std::deque<std::function<void()>> admin;
    {
      std::unique_lock<std::mutex> lock(mu_);
      bool busy = false;
      for (auto& [k, e] : engines_) busy |= e->n_running() + e->n_waiting() > 0;
      if (!busy)
        cv_.wait_for(lock, std::chrono::milliseconds(200), [&] {
          return stop_ || !jobs_.empty() || !embeds_.empty() || !cancels_.empty() ||
                 !admin_.empty();
        });
      if (stop_) break;
      jobs.swap(jobs_);
      embeds.swap(embeds_);
      cancels.swap(cancels_);
      admin.swap(admin_);
    }
    add_jobs(jobs);  // before adapter changes: a job queued first sees the adapters it asked for
    jobs.clear();    // the jobs' references to their models
    for (auto& op : admin) op();
    admin.clear();
    run_embeds(embeds);
    embeds.clear();
    for (auto& ch : cancels)
      if (auto it = live_.find(ch.get()); it != live_.end())
        it->second.first->cancel(it->second.second);
    step_engines();
    free_retired_adapters();
    pool_.expire();  // models past their keep-alive leave the pool; their idle engines go next
    free_evicted_engines();
    update_gauges();
  }
  alive_ = false;
}

}  // namespace wick::server
