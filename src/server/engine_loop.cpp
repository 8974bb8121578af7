#include "server/engine_loop.h"

#include <spdlog/spdlog.h>

namespace wick::server {

EngineLoop::EngineLoop(EngineConfig cfg, size_t max_queue, Metrics& metrics)
    : cfg_(cfg), max_queue_(max_queue), metrics_(metrics) {
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

Engine& EngineLoop::engine_for(const std::shared_ptr<const LoadedModel>& m) {
  auto it = engines_.find(m.get());
  if (it == engines_.end())
    it = engines_.emplace(m.get(), std::make_pair(m, std::make_unique<Engine>(m, cfg_))).first;
  return *it->second.second;
}

void EngineLoop::run() {
  alive_ = true;
  while (true) {
    std::deque<Job> jobs;
    std::vector<std::shared_ptr<Channel>> cancels;
    {
      std::unique_lock<std::mutex> lock(mu_);
      bool busy = false;
      for (auto& [k, e] : engines_) busy |= e.second->n_running() + e.second->n_waiting() > 0;
      if (!busy)
        cv_.wait_for(lock, std::chrono::milliseconds(200),
                     [&] { return stop_ || !jobs_.empty() || !cancels_.empty(); });
      if (stop_) break;
      jobs.swap(jobs_);
      cancels.swap(cancels_);
    }
    for (auto& j : jobs) {
      auto ch = j.ch;
      auto start = std::chrono::steady_clock::now();
      auto last = std::make_shared<std::chrono::steady_clock::time_point>(start);
      StreamCallbacks cb;
      cb.on_text = [this, ch, last](std::string_view t) {
        auto now = std::chrono::steady_clock::now();
        metrics_.inter_token.observe(std::chrono::duration<double>(now - *last).count());
        *last = now;
        ch->push(Event{std::string(t), std::nullopt, ""});
        return !ch->cancelled.load();
      };
      cb.on_done = [this, ch](const GenerateResult& r) {
        metrics_.add_tokens(uint64_t(r.n_prompt), r.tokens.size());
        if (!r.tokens.empty()) metrics_.ttft.observe(r.ttft_ms / 1e3);
        live_.erase(ch.get());
        ch->finished = true;
        {
          std::lock_guard<std::mutex> lock(mu_);
          --n_in_flight_;
        }
        ch->push(Event{"", r, r.stop_reason.rfind("error", 0) == 0 ? r.stop_reason : ""});
      };
      try {
        Engine& e = engine_for(j.model);
        const int64_t id = e.add_request(j.req, cb);
        if (!ch->finished) live_[ch.get()] = {&e, id};
        if (ch->cancelled) e.cancel(id);
      } catch (const std::exception& ex) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          --n_in_flight_;
        }
        ch->push(Event{"", std::nullopt, ex.what()});
      }
    }
    for (auto& ch : cancels)
      if (auto it = live_.find(ch.get()); it != live_.end())
        it->second.first->cancel(it->second.second);
    for (auto& [k, e] : engines_) {
      try {
        e.second->step();
      } catch (const std::exception& ex) {
        spdlog::error("engine step failed: {}", ex.what());  // a programming error; keep serving
      }
    }
    EngineGauges g;
    for (auto& [k, e] : engines_) {
      g.running += e.second->n_running();
      g.waiting += e.second->n_waiting();
      g.blocks_used += e.second->blocks().n_used();
      g.blocks_free += e.second->blocks().n_free();
      g.hit_rate = e.second->blocks().hit_rate();
      g.preemptions += e.second->n_preemptions();
    }
    std::lock_guard<std::mutex> lock(mu_);
    g.waiting += int64_t(jobs_.size());
    gauges_ = g;
  }
  alive_ = false;
}

}  // namespace wick::server
