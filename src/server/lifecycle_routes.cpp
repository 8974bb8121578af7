// Model lifecycle: Ollama's load / unload requests, GET /api/ps,
// DELETE /api/delete, POST /api/copy, and /api/pull and /api/create, which
// say how to add a model (wick has no network). Names resolve inside the
// model store only (model_store.h), for every endpoint here.
#include <fmt/chrono.h>

#include "engine/model_store.h"
#include "io/error.h"
#include "server/model_lookup.h"
#include "server/parse_ollama.h"
#include "server/routes.h"
#include "server/write_ollama.h"

namespace wick::server {

namespace {

std::string without_latest(std::string n) {
  if (n.size() > 7 && n.compare(n.size() - 7, 7, ":latest") == 0) n.resize(n.size() - 7);
  return n;
}

std::string iso_time(std::chrono::system_clock::time_point t) {
  const auto secs = std::chrono::time_point_cast<std::chrono::seconds>(t);
  const auto frac = std::chrono::duration_cast<std::chrono::microseconds>(t - secs).count();
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:06d}Z",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(t)), frac);
}

// How a client sees a model's name: a stored name as Ollama tags it, the
// operator's path as given.
std::string shown_name(const std::string& n) {
  return n.find('/') == std::string::npos ? n + ":latest" : n;
}

json ps_entry(const ModelPool::Loaded& l, int32_t server_n_ctx) {
  const LoadedModel& m = *l.model;
  const auto& c = m.config();
  std::string types;
  for (auto& [t, n] : m.model->n_params_by_dtype) types += (types.empty() ? "" : ",") + t;
  const bool gpu = m.backend().device() == Device::Cuda;
  return {{"name", shown_name(m.name)},
          {"model", shown_name(m.name)},
          {"size", m.bytes()},
          {"digest", ""},
          {"details",
           {{"parent_model", ""},
            {"format", m.model->format == ModelFormat::Gguf ? "gguf" : "safetensors"},
            {"family", arch_name(c.arch)},
            {"families", json::array({arch_name(c.arch)})},
            {"parameter_size", fmt::format("{:.1f}M", double(m.model->n_params) / 1e6)},
            {"quantization_level", types}}},
          // never: far in the future, as Ollama shows a negative keep_alive
          {"expires_at", l.expires_at ? iso_time(*l.expires_at) : "9999-12-31T23:59:59.000000Z"},
          {"size_vram", gpu ? m.bytes() : 0},
          {"context_length", request_n_ctx(m, server_n_ctx)},
          {"wick", {{"requests", l.n_uses}, {"path", m.path}}}};
}

void error(httplib::Response& res, const ApiError& e) {
  reply_json(res, e.status, ollama_error(e));
}

// The store name a lifecycle body names ("model", or the older "name"), 400 when missing.
std::string body_name(const json& body, const char* key, const char* alt) {
  auto n = field<std::string>(body, key);
  if (!n && alt) n = field<std::string>(body, alt);
  if (!n || n->empty()) bad(key, fmt::format("'{}' is required", key), "missing_field");
  return without_latest(*n);
}

ApiError store_error(const ModelError& e, const std::string& name) {
  const std::string msg = e.what();
  if (msg.rfind("unknown model", 0) == 0)
    return ApiError{404, fmt::format("model '{}' not found in the model store", name),
                    "invalid_request_error", "model", "model_not_found"};
  if (msg.find("already exists") != std::string::npos)
    return ApiError{409, msg, "invalid_request_error", "destination", "model_exists"};
  return ApiError{400, msg, "invalid_request_error", "destination", "invalid_value"};
}

std::string how_to_add(const std::string& name) {
  return fmt::format(
      "wick has no network and does not download models: copy a GGUF file into the model "
      "store as {}/{}.gguf (or a Hugging Face folder as {}/{}); POST /api/copy can then give "
      "it another name",
      model_store_dir(), name.empty() ? "NAME" : name, model_store_dir(),
      name.empty() ? "NAME" : name);
}

}  // namespace

void reply_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

std::string model_path_for(const std::string& name, const std::string& default_model) {
  const std::string n = without_latest(name.empty() ? default_model : name);
  try {
    return n == default_model ? resolve_model(n) : resolve_model_name(n);
  } catch (const ModelError&) {
    throw ApiError{404, fmt::format("The model '{}' does not exist", n), "invalid_request_error",
                   "model", "model_not_found"};
  }
}

bool answer_load_request(RouteContext& ctx, const json& body, bool chat, KeepAlive keep_alive,
                         httplib::Response& res) {
  if (chat) {
    auto it = body.find("messages");
    if (it != body.end() && !it->is_null() && !(it->is_array() && it->empty())) return false;
  } else if (!field<std::string>(body, "prompt").value_or("").empty() ||
             !field<std::string>(body, "suffix").value_or("").empty()) {
    return false;
  }
  const std::string name = ollama_model_name(body);
  json o = {{"model", name}, {"created_at", iso_now()}};
  if (chat)
    o["message"] = {{"role", "assistant"}, {"content", ""}};
  else
    o["response"] = "";
  o["done"] = true;
  if (keep_alive.count() == 0) {
    // unload without loading: a model not loaded is already unloaded
    ctx.pool.unload(model_path_for(name, ctx.cfg.default_model));
    o["done_reason"] = "unload";
  } else {
    auto m = find_model(name, ctx.cfg.default_model, true);
    ctx.pool.use(m, keep_alive);  // the hold ends at once: the keep-alive counts from now
    o["done_reason"] = "load";
  }
  reply_json(res, 200, o);
  return true;
}

void register_lifecycle(httplib::Server& svr, RouteContext& ctx) {
  svr.Get("/api/ps", [&ctx](const httplib::Request&, httplib::Response& res) {
    json models = json::array();
    for (auto& l : ctx.pool.loaded()) models.push_back(ps_entry(l, ctx.cfg.engine.n_ctx));
    reply_json(res, 200, {{"models", models}});
  });
  svr.Delete("/api/delete", [&ctx](const httplib::Request& req, httplib::Response& res) {
    try {
      const std::string name = body_name(parse_body(req.body), "model", "name");
      if (name == ctx.cfg.default_model)
        throw ApiError{400,
                       fmt::format("model '{}' is the server's default model (--model) and "
                                   "cannot be deleted while it serves",
                                   name),
                       "invalid_request_error", "model", "model_in_use"};
      try {
        // Unloaded first: requests running on it finish on their own reference.
        ctx.pool.unload(resolve_model_name(name));
        delete_stored_model(name);
      } catch (const ModelError& e) {
        throw store_error(e, name);
      }
      res.status = 200;
    } catch (const ApiError& e) {
      error(res, e);
    }
  });
  svr.Post("/api/copy", [&ctx](const httplib::Request& req, httplib::Response& res) {
    try {
      const json body = parse_body(req.body);
      const std::string from = body_name(body, "source", nullptr);
      const std::string to = body_name(body, "destination", nullptr);
      if (adapter_named(without_latest(to)))
        throw ApiError{
            409,
            fmt::format("'{}' names a LoRA adapter the server serves: choose another name", to),
            "invalid_request_error", "destination", "model_exists"};
      try {
        copy_stored_model(from, to);
      } catch (const ModelError& e) {
        throw store_error(e, from);
      } catch (const std::filesystem::filesystem_error& e) {
        throw ApiError{500, fmt::format("copying '{}' to '{}' failed: {}", from, to, e.what()),
                       "server_error", "destination", "copy_failed"};
      }
      res.status = 200;
    } catch (const ApiError& e) {
      error(res, e);
    }
  });
  // A name already in the store "pulls" at once (clients pull before use);
  // anything else gets the way to add it.
  svr.Post("/api/pull", [&ctx](const httplib::Request& req, httplib::Response& res) {
    try {
      const std::string name = body_name(parse_body(req.body), "model", "name");
      if (stored_model_entry(name).empty() && name != ctx.cfg.default_model)
        throw ApiError{
            404, fmt::format("model '{}' is not in the model store; {}", name, how_to_add(name)),
            "invalid_request_error", "model", "no_network"};
      reply_json(res, 200, {{"status", "success"}});
    } catch (const ApiError& e) {
      error(res, e);
    }
  });
  svr.Post("/api/create", [](const httplib::Request& req, httplib::Response& res) {
    try {
      const json body = parse_body(req.body);
      const std::string name =
          field<std::string>(body, "model").value_or(field<std::string>(body, "name").value_or(""));
      throw ApiError{501,
                     fmt::format("wick does not create models from a Modelfile or blobs; {}",
                                 how_to_add(without_latest(name))),
                     "invalid_request_error", "model", "not_supported"};
    } catch (const ApiError& e) {
      error(res, e);
    }
  });
}

}  // namespace wick::server
