#include "server/metrics.h"

#include <fmt/format.h>

namespace wick::server {

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++n_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, n_, name, sum_,
                     name, n_);
  return out;
}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::add_tokens(uint64_t prompt, uint64_t generated) {
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void Metrics::add_spans(uint64_t hits, uint64_t misses, uint64_t reused, uint64_t recomputed) {
  span_hits_ += hits;
  span_misses_ += misses;
  span_reused_ += reused;
  span_recomputed_ += recomputed;
}

void Metrics::add_spec(uint64_t proposed, uint64_t accepted, uint64_t tokens, uint64_t forwards) {
  spec_proposed_ += proposed;
  spec_accepted_ += accepted;
  spec_tokens_ += tokens;
  spec_forwards_ += forwards;
}

std::string Metrics::render(const EngineGauges& g, const std::string& model) const {
  std::string out =
      "# HELP wick_requests_total HTTP requests by endpoint and status.\n# TYPE "
      "wick_requests_total counter\n";
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [k, n] : requests_)
      out += fmt::format("wick_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", k.first,
                         k.second, n);
  }
  out += ttft.render("wick_time_to_first_token_seconds",
                     "Time from request arrival to its first token.");
  out += inter_token.render("wick_inter_token_latency_seconds",
                            "Time between consecutive streamed tokens.");
  out += fmt::format(
      "# HELP wick_prompt_tokens_total Prompt tokens of finished requests.\n# TYPE "
      "wick_prompt_tokens_total counter\n"
      "wick_prompt_tokens_total {}\n"
      "# HELP wick_generated_tokens_total Generated tokens of finished requests.\n# TYPE "
      "wick_generated_tokens_total counter\n"
      "wick_generated_tokens_total {}\n"
      "# HELP wick_running_sequences Sequences being computed.\n# TYPE wick_running_sequences "
      "gauge\nwick_running_sequences {}\n"
      "# HELP wick_waiting_sequences Sequences queued.\n# TYPE wick_waiting_sequences "
      "gauge\nwick_waiting_sequences {}\n"
      "# HELP wick_kv_blocks_used KV blocks referenced by sequences.\n# TYPE wick_kv_blocks_used "
      "gauge\nwick_kv_blocks_used {}\n"
      "# HELP wick_kv_blocks_free KV blocks free (cached ones included).\n# TYPE "
      "wick_kv_blocks_free gauge\nwick_kv_blocks_free {}\n"
      "# HELP wick_prefix_cache_hit_rate Prompt tokens served from the prefix cache, over all "
      "prompt tokens.\n"
      "# TYPE wick_prefix_cache_hit_rate gauge\nwick_prefix_cache_hit_rate {}\n"
      "# HELP wick_preemptions_total Sequences preempted for KV blocks.\n# TYPE "
      "wick_preemptions_total counter\nwick_preemptions_total {}\n"
      "# HELP wick_engines Engines held, one per model in use, each with its KV cache.\n# TYPE "
      "wick_engines gauge\nwick_engines {}\n",
      prompt_tokens_.load(), generated_tokens_.load(), g.running, g.waiting, g.blocks_used,
      g.blocks_free, g.hit_rate, g.preemptions, g.engines);
  out += fmt::format(
      "# HELP wick_span_cache_hits_total Spans found in the span cache.\n# TYPE "
      "wick_span_cache_hits_total counter\nwick_span_cache_hits_total {}\n"
      "# HELP wick_span_cache_misses_total Spans computed by a span job.\n# TYPE "
      "wick_span_cache_misses_total counter\nwick_span_cache_misses_total {}\n"
      "# HELP wick_span_tokens_reused_total Span tokens whose K/V came from the span cache.\n# "
      "TYPE wick_span_tokens_reused_total counter\nwick_span_tokens_reused_total {}\n"
      "# HELP wick_span_tokens_recomputed_total Span tokens computed again with full attention "
      "(the repair).\n# TYPE wick_span_tokens_recomputed_total counter\n"
      "wick_span_tokens_recomputed_total {}\n",
      span_hits_.load(), span_misses_.load(), span_reused_.load(), span_recomputed_.load());
  out += fmt::format(
      "# HELP wick_spec_draft_tokens_total Draft tokens proposed and verified (speculative "
      "decoding).\n# TYPE wick_spec_draft_tokens_total counter\nwick_spec_draft_tokens_total {}\n"
      "# HELP wick_spec_accepted_tokens_total Draft tokens the target accepted.\n# TYPE "
      "wick_spec_accepted_tokens_total counter\nwick_spec_accepted_tokens_total {}\n"
      "# HELP wick_spec_generated_tokens_total Tokens generated by requests that speculated.\n"
      "# TYPE wick_spec_generated_tokens_total counter\nwick_spec_generated_tokens_total {}\n"
      "# HELP wick_spec_forwards_total Target forward passes that gave those tokens (tokens per "
      "forward = generated / forwards).\n# TYPE wick_spec_forwards_total counter\n"
      "wick_spec_forwards_total {}\n",
      spec_proposed_.load(), spec_accepted_.load(), spec_tokens_.load(), spec_forwards_.load());
  // The same gauges under vLLM's names, as the Gateway API Inference
  // Extension's model-server protocol and llm-d's scheduler read them.
  const double kv_usage = g.blocks_used + g.blocks_free > 0
                              ? double(g.blocks_used) / double(g.blocks_used + g.blocks_free)
                              : 0.0;
  std::string label = model;
  for (char& ch : label)
    if (ch == '"' || ch == '\\' || ch == '\n') ch = '_';
  out += fmt::format(
      "# HELP vllm:num_requests_running Requests being computed (wick_running_sequences).\n"
      "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"{0}\"}} "
      "{1}\n"
      "# HELP vllm:num_requests_waiting Requests queued (wick_waiting_sequences).\n"
      "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"{0}\"}} "
      "{2}\n"
      "# HELP vllm:gpu_cache_usage_perc KV-cache blocks in use, 0 to 1 (on the CPU too).\n"
      "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{{model_name=\"{0}\"}} "
      "{3}\n"
      "# HELP vllm:kv_cache_usage_perc KV-cache blocks in use, 0 to 1.\n"
      "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{model_name=\"{0}\"}} {3}\n"
      "# HELP vllm:spec_decode_num_draft_tokens_total Draft tokens proposed "
      "(wick_spec_draft_tokens_total).\n# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
      "vllm:spec_decode_num_draft_tokens_total{{model_name=\"{0}\"}} {4}\n"
      "# HELP vllm:spec_decode_num_accepted_tokens_total Draft tokens accepted "
      "(wick_spec_accepted_tokens_total).\n"
      "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
      "vllm:spec_decode_num_accepted_tokens_total{{model_name=\"{0}\"}} {5}\n",
      label, g.running, g.waiting, kv_usage, spec_proposed_.load(), spec_accepted_.load());
  return out;
}

}  // namespace wick::server
