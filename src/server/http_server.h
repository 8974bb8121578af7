// wick serve: OpenAI- and Ollama-compatible HTTP API over the engine.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/span_markers.h"

namespace wick::server {

// The Responses API's store keeps at most this much JSON in all.
inline constexpr size_t kResponseStoreBytes = size_t(128) << 20;

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;  // non-empty: every API call needs "Authorization: Bearer KEY"
  // Host header values answered besides loopback names ("*": any); on a
  // loopback host only those are answered (against DNS rebinding).
  std::vector<std::string> allowed_hosts;
  // Browser pages' origins answered besides loopback ones ("*": any); a
  // request from another page's origin gets 403 (OriginFilter).
  std::vector<std::string> allowed_origins;
  std::string default_model = "smollm2";  // the operator's: a path or a stored name
  size_t max_body_bytes = 8u << 20;
  size_t max_header_bytes = 64u << 10;  // request line and headers
  size_t max_queue = 256;               // requests in flight before 429
  int n_http_threads = 128;
  // KV-cache events (vLLM's format over ZMQ): an address to bind, e.g.
  // tcp://*:5557; empty: off.
  std::string kv_events;
  std::string kv_events_topic = "kv-events";
  // The Responses API's store (previous_response_id, GET /v1/responses/ID):
  // at most this many responses, and kResponseStoreBytes of JSON; 0: none kept.
  size_t n_responses_stored = 1024;
  // --reasoning-format: "auto" splits <think> reasoning out of the answers of
  // models whose chat template names it; "none" leaves it in the content.
  bool split_reasoning = true;
  // How long a model stays loaded after a request that sets no keep_alive
  // (Ollama's, default 5 minutes; negative: forever, 0: unload at once).
  std::chrono::milliseconds keep_alive{5 * 60 * 1000};
  Pooling pooling = Pooling::Mean;  // embeddings: how hidden states pool
  EngineConfig engine;
  // spnl's marker layout (--span-markers): span queries are laid out with
  // the markers, and token-id prompts get the spans their markers lay out.
  SpanMarkers span_markers;
  // --lora-modules (vLLM's): LoRA adapters of the default model, (name,
  // path); a request naming one runs on the default model with it.
  std::vector<std::pair<std::string, std::string>> lora_modules;
  // --allow-runtime-lora: /v1/load_lora_adapter and /v1/unload_lora_adapter
  // (vLLM's) add and remove adapters of the default model while serving;
  // off, they answer 403 (they read files the server can read).
  bool runtime_lora = false;
};

// Serves until SIGINT/SIGTERM; returns the process exit code.
int serve(const ServerConfig& cfg);

}  // namespace wick::server
