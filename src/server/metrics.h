// Server metrics in the Prometheus text format.
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace wick::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  std::string render(const std::string& name, const std::string& help) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t n_ = 0;
};

struct EngineGauges {
  int64_t running = 0, waiting = 0, blocks_used = 0, blocks_free = 0;
  double hit_rate = 0;
  uint64_t preemptions = 0;
  int64_t engines = 0;  // engines held, each with its KV cache
};

class Metrics {
 public:
  void count_request(const std::string& endpoint, int status);
  void add_tokens(uint64_t prompt, uint64_t generated);
  // The span cache's counts of one finished request.
  void add_spans(uint64_t hits, uint64_t misses, uint64_t reused, uint64_t recomputed);
  // Speculative decoding's counts of one finished request that proposed drafts.
  void add_spec(uint64_t proposed, uint64_t accepted, uint64_t tokens, uint64_t forwards);
  Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram inter_token{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};
  // model: the served model, the label of the vLLM-named gauges.
  std::string render(const EngineGauges& g, const std::string& model) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::atomic<uint64_t> prompt_tokens_{0}, generated_tokens_{0};
  std::atomic<uint64_t> span_hits_{0}, span_misses_{0}, span_reused_{0}, span_recomputed_{0};
  std::atomic<uint64_t> spec_proposed_{0}, spec_accepted_{0}, spec_tokens_{0}, spec_forwards_{0};
};

}  // namespace wick::server
