// Routing, listening, auth and body limits; each API handler is
// parse -> look up the model -> submit -> write.
#include "server/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <functional>
#include <random>
#include <set>

#include "engine/model_store.h"
#include "server/access.h"
#include "server/connection.h"
#include "server/engine_loop.h"
#include "server/llamacpp_api.h"
#include "server/model_lookup.h"
#include "server/parse_ollama.h"
#include "server/parse_openai.h"
#include "server/response_store.h"
#include "server/routes.h"
#include "server/span_query.h"
#include "server/submit.h"
#include "server/write_ollama.h"
#include "server/write_openai.h"

namespace wick::server {

namespace {

struct Api {
  explicit Api(const ServerConfig& c)
      : cfg(c),
        loop(c.engine, c.max_queue, metrics, ModelPool::global(),
             c.kv_events.empty()
                 ? nullptr
                 : std::make_unique<KvEventPublisher>(c.kv_events, c.kv_events_topic)),
        sub(loop, &GuardedServer::client_gone),
        routes{cfg, loop, metrics, ModelPool::global()},
        responses(c.n_responses_stored, kResponseStoreBytes) {}

  ModelView view(const LoadedModel& m) const {
    return model_view(m, cfg.engine.n_ctx, cfg.split_reasoning);
  }

  ServerConfig cfg;
  Metrics metrics;
  EngineLoop loop;
  Submitter sub;
  RouteContext routes;
  ResponseStore responses;
  std::atomic<uint64_t> next_id{1};
};

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  // replace: a message quoting bad input never turns into a serialization error
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// Host check (403), the Origin check (403; an allowed page's request gets
// the CORS headers, its preflight is answered here, before the key), then
// the API key (401); /health needs no key.
httplib::Server::HandlerResponse check_access(const ServerConfig& cfg, const HostFilter& hosts,
                                              const OriginFilter& origins,
                                              const httplib::Request& req, httplib::Response& res) {
  const std::string host = req.get_header_value("Host");
  if (!hosts.allows(host)) {
    send_json(res, 403,
              openai_error(ApiError{403,
                                    fmt::format("Host '{}' is not allowed: this server answers "
                                                "loopback names only (see --allowed-hosts)",
                                                host),
                                    "permission_error", "", "host_not_allowed"}));
    return httplib::Server::HandlerResponse::Handled;
  }
  const std::string origin = req.get_header_value("Origin");
  if (!origins.allows(origin)) {
    send_json(res, 403,
              openai_error(ApiError{403,
                                    fmt::format("Origin '{}' is not allowed: this server answers "
                                                "pages of loopback origins only (see "
                                                "--allowed-origins)",
                                                origin),
                                    "permission_error", "", "origin_not_allowed"}));
    return httplib::Server::HandlerResponse::Handled;
  }
  if (!origin.empty()) {
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Vary", "Origin");
    if (req.method == "OPTIONS") {  // a preflight: carries no key
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      res.set_header("Access-Control-Allow-Headers",
                     asked.empty() ? "Authorization, Content-Type" : asked);
      res.set_header("Access-Control-Max-Age", "600");
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
  }
  if (cfg.api_key.empty() || req.path == "/health")
    return httplib::Server::HandlerResponse::Unhandled;
  if (constant_time_equal("Bearer " + cfg.api_key, req.get_header_value("Authorization")))
    return httplib::Server::HandlerResponse::Unhandled;
  send_json(res, 401,
            openai_error(ApiError{401, "missing or wrong API key (Authorization: Bearer ...)",
                                  "authentication_error", "", "invalid_api_key"}));
  return httplib::Server::HandlerResponse::Handled;
}

// r's choices, prompt by prompt (a completions request may carry several);
// all or none: a 429 on one prompt cancels the choices already queued.
Channels submit_all(Api& api, const std::shared_ptr<const LoadedModel>& m, const OpenAiRequest& r) {
  // with --span-markers, ids the client laid out get the spans their markers lay out
  const bool marked = api.cfg.span_markers.enabled() && r.token_prompts;
  auto with_spans = [&](GenerateRequest g) {
    if (marked && g.spans.empty()) g.spans = marker_spans(g.prompt, api.cfg.span_markers);
    return g;
  };
  Channels chans = api.sub.submit(m, with_spans(r.gen), r.n_choices);
  const int32_t n_ctx = api.view(*m).n_ctx;
  for (const auto& prompt : r.more_prompts) {
    GenerateRequest g = r.gen;
    g.prompt = prompt;
    g = with_spans(std::move(g));
    g.max_tokens = std::min<int64_t>(g.max_tokens, int64_t(n_ctx) - int64_t(prompt.size()));
    try {
      for (auto& c : api.sub.submit(m, g, r.n_choices)) chans.push_back(c);
    } catch (const ApiError&) {
      api.sub.cancel(chans);
      throw;
    }
  }
  return chans;
}

// A generation's answer, counted 200: whole (the results once every choice
// is done), or streamed through the writer, the model held while it runs.
void answer(Api& api, httplib::Response& res, const std::string& endpoint, const Channels& chans,
            bool stream, const std::function<json(const std::vector<GenerateResult>&)>& whole,
            const char* content_type, std::shared_ptr<StreamWriter> writer, ModelPool::Use use) {
  if (!stream) {
    send_json(res, 200, whole(api.sub.wait(chans)));
    api.metrics.count_request(endpoint, 200);
    return;
  }
  api.metrics.count_request(endpoint, 200);
  res.set_header("Cache-Control", "no-cache");
  api.sub.respond(res, content_type, chans,
                  std::make_shared<HeldStream>(std::move(writer), std::move(use)));
}

void openai_completion(Api& api, bool chat, const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  try {
    const json body = parse_body(req.body);
    const KeepAlive keep_alive = keep_alive_of(body, api.cfg.keep_alive);  // wick's extra
    // NAME:latest as on Ollama's endpoints (spnl's ollama/NAME sends it)
    int32_t adapter = 0;
    auto m = find_model(openai_model_name(body), api.cfg.default_model, true, &adapter);
    OpenAiRequest r = parse_openai(body, chat, api.view(*m), std::random_device{}());
    r.gen.adapter = adapter;
    auto use = api.routes.pool.use(m, keep_alive);
    const Channels chans = submit_all(api, m, r);
    const OpenAiMeta meta{fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", api.next_id++),
                          unix_now(), r.model.empty() ? api.cfg.default_model : r.model};
    answer(
        api, res, endpoint, chans, r.stream,
        [&](const auto& results) { return openai_response(r, meta, results, *m->tokenizer); },
        "text/event-stream", std::make_shared<OpenAiStream>(r, meta, m), std::move(use));
  } catch (const ApiError& e) {
    api.metrics.count_request(endpoint, e.status);
    send_json(res, e.status, openai_error(e));
  }
}

// spnl's span query (POST /v1/query/execute?stream=): g and repeat answer a
// ChatCompletion, map a Completion; streams are completion chunks either way.
OpenAiRequest span_request(const SpanQuery& q, const ModelView& view, bool stream, bool span_cache,
                           const SpanMarkers& markers) {
  OpenAiRequest r;
  r.chat = q.top != SpanQuery::Top::Map;
  r.model = q.g.model;
  r.stream = stream;
  r.n_choices = q.top == SpanQuery::Top::Repeat ? q.n : 1;
  GenerateRequest& g = r.gen;
  g.sampling = kOpenAiSampling.defaults;
  g.sampling.temperature = q.g.temperature;
  g.sampling.seed = std::random_device{}();
  auto fit = [&](std::vector<int32_t> ids) {
    if (int64_t(ids.size()) >= view.n_ctx)
      bad("input",
          fmt::format("the query has {} tokens; the context holds {}", ids.size(), view.n_ctx));
    return ids;
  };
  r.token_prompts = markers.enabled();
  if (q.top == SpanQuery::Top::Map) {
    for (size_t i = 0; i < q.inputs.size(); ++i) {
      auto ids = fit(markers.enabled() ? marker_map_prompt(view, q.inputs[i], markers)
                                       : view.tokenizer.encode(q.inputs[i], {.add_special = true}));
      if (i == 0)
        g.prompt = std::move(ids);
      else
        r.more_prompts.push_back(std::move(ids));
    }
  } else {
    std::vector<std::pair<int32_t, int32_t>> spans;
    if (markers.enabled()) {
      if (q.g.continue_final)
        bad("g.continue_final_message",
            "continue_final_message does not combine with the marker layout (--span-markers)");
      g.prompt = fit(marker_prompt(view, q.g.input, markers));
      spans = marker_spans(g.prompt, markers);
    } else {
      g.prompt = fit(span_prompt(view, flatten(q.g.input), spans, q.g.continue_final));
    }
    // with the span cache, each plus child is a span whose KV is reused anywhere
    if (span_cache)
      for (auto [b, e] : spans) g.spans.push_back({b, e});
    g.span_recompute = q.g.repair.span_recompute;
    g.span_blend = q.g.repair.span_blend;
    // the context: everything before the first span (the system messages)
    if (q.g.span_context && !g.spans.empty())
      g.span_context = *q.g.span_context ? g.spans.front().first : 0;
  }
  g.prompt_logprobs = q.g.repair.prompt_logprobs;
  g.max_tokens = int32_t(std::min<int64_t>(q.g.max_tokens, view.n_ctx - int64_t(g.prompt.size())));
  return r;
}

// spnl's prepare (POST /v1/query/prepare, `spnl --prepare`): the query's
// prompt computed into the prefix and span caches with one greedy token, and
// an answer with no choices but the usage (what was cached and reused).
void send_prepared(Api& api, const OpenAiRequest& r, const OpenAiMeta& meta, const Channels& chans,
                   const LoadedModel& m, bool stream, httplib::Response& res) {
  json out = openai_response(r, meta, api.sub.wait(chans), *m.tokenizer);
  out["choices"] = json::array();
  if (!stream) {
    send_json(res, 200, out);
    return;
  }
  out["object"] = r.chat ? "chat.completion.chunk" : "text_completion";
  res.set_header("Cache-Control", "no-cache");
  res.set_content("data: " + out.dump() + "\n\ndata: [DONE]\n\n", "text/event-stream");
}

// spnl's span queries: /v1/query/execute answers them, /v1/query/prepare
// only computes what they would reuse.
void span_query(Api& api, bool prepare, const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = prepare ? "/v1/query/prepare" : "/v1/query/execute";
  try {
    const SpanQuery q = parse_span_query(parse_body(req.body));  // text/plain or JSON
    int32_t adapter = 0;
    auto m = find_model(q.g.model, api.cfg.default_model, true, &adapter);
    const std::string stream = req.get_param_value("stream");
    if (!stream.empty() && stream != "true" && stream != "false")
      bad("stream", "stream must be true or false");
    if (stream == "true" && q.g.repair.prompt_logprobs >= 0)
      bad("g.prompt_logprobs",
          "prompt_logprobs is answered in a whole response: it needs stream=false");
    OpenAiRequest r = span_request(q, api.view(*m), stream == "true" && !prepare,
                                   api.cfg.engine.span_cache, api.cfg.span_markers);
    r.gen.adapter = adapter;
    if (prepare) {  // one sample of one greedy token: the prompt is what gets computed
      r.n_choices = 1;
      r.gen.max_tokens = 1;
      r.gen.sampling.temperature = 0;
      r.gen.prompt_logprobs = -1;
    }
    const Channels chans = submit_all(api, m, r);
    const OpenAiMeta meta{fmt::format("{}-{}", r.chat ? "chatcmpl" : "cmpl", api.next_id++),
                          unix_now(), q.g.model};
    api.metrics.count_request(endpoint, 200);
    if (prepare) {
      send_prepared(api, r, meta, chans, *m, stream == "true", res);
      return;
    }
    if (!r.stream) {
      send_json(res, 200, openai_response(r, meta, api.sub.wait(chans), *m->tokenizer));
      return;
    }
    OpenAiRequest as_completion = r;
    as_completion.chat = false;
    res.set_header("Cache-Control", "no-cache");
    api.sub.respond(res, "text/event-stream", chans,
                    std::make_shared<OpenAiStream>(as_completion, meta, m));
  } catch (const ApiError& e) {
    api.metrics.count_request(endpoint, e.status);
    send_json(res, e.status, openai_error(e));
  }
}

void ollama_generate(Api& api, bool chat, const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = chat ? "/api/chat" : "/api/generate";
  try {
    const json body = parse_body(req.body);
    const KeepAlive keep_alive = keep_alive_of(body, api.cfg.keep_alive);
    if (answer_load_request(api.routes, body, chat, keep_alive, res)) {
      api.metrics.count_request(endpoint, 200);
      return;
    }
    int32_t adapter = 0;
    auto m = find_model(ollama_model_name(body), api.cfg.default_model, true, &adapter);
    OllamaRequest r = parse_ollama(body, chat, api.view(*m), std::random_device{}());
    r.gen.adapter = adapter;
    const auto t0 = Clock::now();
    auto use = api.routes.pool.use(m, keep_alive);
    const Channels chans = api.sub.submit(m, r.gen, 1);
    answer(
        api, res, endpoint, chans, r.stream,
        [&](const auto& results) { return ollama_response(r, *m->tokenizer, t0, results[0]); },
        "application/x-ndjson", std::make_shared<OllamaStream>(r, m, t0), std::move(use));
  } catch (const ApiError& e) {
    api.metrics.count_request(endpoint, e.status);
    send_json(res, e.status, ollama_error(e));
  }
}

// llama.cpp's /completion and /infill; errors in OpenAI's shape, as llama.cpp's are.
void llamacpp_generate(Api& api, bool infill, const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = infill ? "/infill" : "/completion";
  try {
    const json body = parse_body(req.body);
    int32_t adapter = 0;
    auto m = find_model(openai_model_name(body), api.cfg.default_model, true, &adapter);
    LlamaCppRequest r = parse_llamacpp(body, infill, api.view(*m), std::random_device{}());
    r.gen.adapter = adapter;
    const auto t0 = Clock::now();
    auto use = api.routes.pool.use(m, keep_alive_of(body, api.cfg.keep_alive));
    const Channels chans = api.sub.submit(m, r.gen, 1);
    const std::string model = r.model.empty() ? api.cfg.default_model : r.model;
    answer(
        api, res, endpoint, chans, r.stream,
        [&](const auto& results) {
          return llamacpp_final(model, t0, results[0], true, *m->tokenizer);
        },
        "text/event-stream", std::make_shared<LlamaCppStream>(model, t0, m), std::move(use));
  } catch (const ApiError& e) {
    api.metrics.count_request(endpoint, e.status);
    send_json(res, e.status, openai_error(e));
  }
}

void register_openai(httplib::Server& svr, Api& api) {
  auto served_names = [&api] {
    std::set<std::string> names{api.cfg.default_model};
    for (auto& n : stored_model_names()) names.insert(n);
    return names;
  };
  // the named adapters as vLLM lists them: parent, the base model; root, the adapter
  auto adapter_model = [&api](const std::string& name) -> std::optional<json> {
    for (const auto& [n, path] : api.routes.pool.lora_modules())
      if (!n.empty() && n == name) {
        json m = openai_model(name);
        m["parent"] = api.cfg.default_model;
        m["root"] = path;
        return m;
      }
    return std::nullopt;
  };
  svr.Get("/v1/models",
          [served_names, adapter_model, &api](const httplib::Request&, httplib::Response& res) {
            const auto names = served_names();
            json out = openai_models({names.begin(), names.end()});
            for (const auto& [name, path] : api.routes.pool.lora_modules())
              if (!name.empty()) out["data"].push_back(*adapter_model(name));
            send_json(res, 200, out);
          });
  // one of the list (the SDKs' models.retrieve), without loading it
  svr.Get(R"(/v1/models/(.+))",
          [served_names, adapter_model](const httplib::Request& req, httplib::Response& res) {
            const std::string name = req.matches[1];
            if (auto m = adapter_model(name)) return send_json(res, 200, *m);
            if (served_names().count(name)) return send_json(res, 200, openai_model(name));
            send_json(res, 404,
                      openai_error(ApiError{404, fmt::format("The model '{}' does not exist", name),
                                            "invalid_request_error", "model", "model_not_found"}));
          });
  svr.Post("/v1/chat/completions", [&api](const httplib::Request& req, httplib::Response& res) {
    openai_completion(api, true, req, res);
  });
  svr.Post("/v1/completions", [&api](const httplib::Request& req, httplib::Response& res) {
    openai_completion(api, false, req, res);
  });
  svr.Post("/v1/query/execute", [&api](const httplib::Request& req, httplib::Response& res) {
    span_query(api, false, req, res);
  });
  svr.Post("/v1/query/prepare", [&api](const httplib::Request& req, httplib::Response& res) {
    span_query(api, true, req, res);
  });
}

void register_ollama(httplib::Server& svr, Api& api) {
  svr.Get("/api/version", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, ollama_version());
  });
  svr.Get("/api/tags", [&api](const httplib::Request&, httplib::Response& res) {
    std::vector<std::pair<std::string, int64_t>> models;
    for (auto& n : stored_model_names()) models.emplace_back(n, stored_model_bytes(n));
    for (const auto& [name, path] : api.routes.pool.lora_modules())  // adapters: models too
      if (!name.empty()) models.emplace_back(name, int64_t(path_bytes(path)));
    send_json(res, 200, ollama_tags(models));
  });
  svr.Post("/api/show", [&api](const httplib::Request& req, httplib::Response& res) {
    try {
      const json body = parse_body(req.body);
      json show =
          ollama_show(*find_model(ollama_show_model_name(body), api.cfg.default_model, true));
      show["model_info"]["wick.pooling"] = pooling_name(api.cfg.pooling);  // of embeddings
      send_json(res, 200, show);
    } catch (const ApiError& e) {
      send_json(res, e.status, ollama_error(e));
    }
  });
  svr.Post("/api/generate", [&api](const httplib::Request& req, httplib::Response& res) {
    ollama_generate(api, false, req, res);
  });
  svr.Post("/api/chat", [&api](const httplib::Request& req, httplib::Response& res) {
    ollama_generate(api, true, req, res);
  });
}

// What a cache-aware gateway reads of a worker (the SGLang Model Gateway's
// regular HTTP workers): the served model, and the load.
void register_worker(httplib::Server& svr, Api& api) {
  svr.Get("/get_model_info", [&api](const httplib::Request&, httplib::Response& res) {
    auto m = find_model(api.cfg.default_model, api.cfg.default_model, false);
    const Tokenizer* tk = m->tokenizer.get();
    json eos = json::array();
    for (int32_t id : m->eog_ids) eos.push_back(id);
    const int32_t n_ctx = api.view(*m).n_ctx;
    send_json(res, 200,
              {{"model_path", api.cfg.default_model},
               {"tokenizer_path", api.cfg.default_model},
               {"served_model_name", api.cfg.default_model},
               {"is_generation", true},
               {"supports_vision", false},
               {"max_context_length", n_ctx},
               {"max_req_input_len", n_ctx - 1},
               {"vocab_size", m->config().n_vocab},
               {"eos_token_ids", eos},
               {"bos_token_id", tk && tk->bos_id ? json(*tk->bos_id) : json()},
               {"pad_token_id", tk && tk->pad_id ? json(*tk->pad_id) : json()},
               {"model_type", arch_name(m->config().arch)},
               {"weight_version", "default"}});
  });
  auto load = [&api] {
    const EngineGauges g = api.loop.gauges();
    return json{{"num_reqs", g.running + g.waiting},
                {"num_running_reqs", g.running},
                {"num_waiting_reqs", g.waiting},
                {"kv_blocks_used", g.blocks_used},
                {"kv_blocks_free", g.blocks_free}};
  };
  svr.Get("/get_load",
          [load](const httplib::Request&, httplib::Response& res) { send_json(res, 200, load()); });
  svr.Get("/get_server_info", [&api, load](const httplib::Request&, httplib::Response& res) {
    auto m = find_model(api.cfg.default_model, api.cfg.default_model, false);
    send_json(res, 200,
              {{"model_path", api.cfg.default_model},
               {"served_model_name", api.cfg.default_model},
               {"max_batch_tokens", step_tokens(api.cfg.engine, m->backend())},
               {"max_running_requests", api.cfg.engine.max_seqs},
               {"max_queue", api.cfg.max_queue},
               {"span_cache", api.cfg.engine.span_cache},
               {"span_markers", api.cfg.span_markers.enabled()
                                    ? json{{"plus", api.cfg.span_markers.plus},
                                           {"cross", api.cfg.span_markers.cross},
                                           {"pad", api.cfg.span_markers.pad},
                                           {"block_size", api.cfg.span_markers.block_size}}
                                    : json()},
               {"load", load()}});
  });
}

httplib::Server* g_server = nullptr;
void on_signal(int) {
  if (g_server) g_server->stop();
}

}  // namespace

int serve(const ServerConfig& cfg) {
  ModelPool::global().set_default_keep_alive(cfg.keep_alive);
  Api api(cfg);
  // Load the default model up front: /health reports ready once it is in
  // (and stays ready when its keep-alive unloads it: a request loads it again).
  auto def = find_model(cfg.default_model, cfg.default_model, false);
  if (cfg.engine.spec.draft) {  // a draft of another vocabulary is the operator's error: no start
    check_same_vocab(*def, *cfg.engine.spec.draft);
    api.loop.set_draft_target(def->path);
  }
  if (const SpanMarkers& mk = cfg.span_markers; mk.enabled())  // the operator's error: no start
    for (int32_t id : {mk.plus, mk.cross, mk.pad})
      if (int64_t(id) >= int64_t(def->config().n_vocab))
        throw std::runtime_error(
            fmt::format("--span-markers: id {} is outside {}'s vocabulary "
                        "of {} tokens",
                        id, cfg.default_model, def->config().n_vocab));
  def.reset();  // the pool holds it: its keep-alive decides when it goes
  GuardedServer svr(cfg.max_header_bytes);
  const HostFilter hosts(cfg.host, cfg.allowed_hosts);
  const OriginFilter origins(cfg.allowed_origins);
  svr.new_task_queue = [n = cfg.n_http_threads] { return new httplib::ThreadPool(size_t(n)); };
  svr.set_payload_max_length(cfg.max_body_bytes);
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);
  svr.set_pre_routing_handler(
      [&cfg, &hosts, &origins](const httplib::Request& req, httplib::Response& res) {
        return check_access(cfg, hosts, origins, req, res);
      });
  svr.set_exception_handler(
      [&api](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string msg = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          msg = e.what();
        } catch (...) {
        }
        spdlog::error("{} {}: {}", req.method, req.path, msg);
        api.metrics.count_request(req.path, 500);
        send_json(res, 500, openai_error(ApiError{500, msg, "server_error", "", "internal_error"}));
      });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (GuardedServer::headers_too_large())
      send_json(res, 431,
                openai_error(ApiError{431, "the request line and headers are too large or too slow",
                                      "invalid_request_error", "", "headers_too_large"}));
    else if (res.status == 404 && res.body.empty())
      send_json(res, 404,
                openai_error(ApiError{404, "no such endpoint: " + req.method + " " + req.path,
                                      "invalid_request_error", "", "not_found"}));
    else if (res.status == 413)
      send_json(res, 413,
                openai_error(ApiError{413, "the request body is too large", "invalid_request_error",
                                      "", "payload_too_large"}));
  });
  svr.Get("/health", [&api](const httplib::Request&, httplib::Response& res) {
    // The default model loaded before listening; a model unloaded by keep_alive
    // is still servable, one whose file broke since is not.
    const bool ok = api.loop.alive() && !default_model_failed();
    send_json(res, ok ? 200 : 503, {{"status", ok ? "ok" : "unavailable"}});
  });
  svr.Get("/metrics", [&api](const httplib::Request&, httplib::Response& res) {
    res.set_content(api.metrics.render(api.loop.gauges(), api.cfg.default_model),
                    "text/plain; version=0.0.4");
  });
  register_worker(svr, api);
  register_openai(svr, api);
  register_ollama(svr, api);
  svr.Post("/completion", [&api](const httplib::Request& req, httplib::Response& res) {
    llamacpp_generate(api, false, req, res);
  });
  svr.Post("/infill", [&api](const httplib::Request& req, httplib::Response& res) {
    llamacpp_generate(api, true, req, res);
  });
  // llama.cpp's: ?model= picks one, as its router does (default: the served one)
  svr.Get("/props", [&api](const httplib::Request& req, httplib::Response& res) {
    try {
      auto m = find_model(req.get_param_value("model"), api.cfg.default_model, true);
      send_json(res, 200, llamacpp_props(*m, m->path, api.view(*m).n_ctx, api.cfg.engine.max_seqs));
    } catch (const ApiError& e) {
      send_json(res, e.status, openai_error(e));
    }
  });
  svr.Post("/props", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 501,
              openai_error(ApiError{501, "wick has no global properties to change",
                                    "not_supported_error", "", "not_supported"}));
  });
  register_responses(svr, api.routes, api.sub, api.responses);
  register_lifecycle(svr, api.routes);
  register_lora(svr, api.routes);
  register_embeddings(svr, api.routes);
  register_token_utils(svr, api.routes);
  g_server = &svr;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  spdlog::info("wick serve: {} on http://{}:{}", cfg.default_model, cfg.host, cfg.port);
  if (!svr.listen(cfg.host, cfg.port)) {
    spdlog::error("cannot listen on {}:{}", cfg.host, cfg.port);
    return 1;
  }
  return 0;
}

}  // namespace wick::server
