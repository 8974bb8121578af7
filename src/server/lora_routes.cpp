// vLLM's runtime LoRA updating: POST /v1/load_lora_adapter {lora_name,
// lora_path[, load_inplace]} and POST /v1/unload_lora_adapter {lora_name}.
// An adapter loaded here is a model name like one of --lora-modules (the
// default model with it). The paths are the server's files: these answer
// 403 unless the operator started the server with --allow-runtime-lora.
#include <filesystem>

#include "engine/model_store.h"
#include "io/error.h"
#include "server/model_lookup.h"
#include "server/routes.h"
#include "server/write_openai.h"

namespace wick::server {

namespace {

void check_enabled(const RouteContext& ctx) {
  if (!ctx.cfg.runtime_lora)
    throw ApiError{403,
                   "loading and unloading LoRA adapters while serving is off: start wick serve "
                   "with --allow-runtime-lora",
                   "invalid_request_error", "", "runtime_lora_disabled"};
}

std::string required(const json& body, const char* key) {
  auto v = field<std::string>(body, key);
  if (!v || v->empty()) bad(key, fmt::format("'{}' must be provided", key), "missing_field");
  return *v;
}

std::string load(RouteContext& ctx, const json& body) {
  const std::string name = required(body, "lora_name"), path = required(body, "lora_path");
  const bool inplace = field<bool>(body, "load_inplace").value_or(false);
  if (name == ctx.cfg.default_model)
    bad("lora_name", fmt::format("'{}' cannot name an adapter: it names a model", name));
  if (!stored_model_entry(name).empty())
    bad("lora_name",
        fmt::format("'{}' cannot name an adapter: it names a model in the store", name));
  if (!std::filesystem::exists(path))
    throw ApiError{404, fmt::format("{}: no such adapter file or folder", path),
                   "invalid_request_error", "lora_path", "adapter_not_found"};
  auto m = find_model(ctx.cfg.default_model, ctx.cfg.default_model, false);
  auto use = ctx.pool.use(m, ctx.cfg.keep_alive);  // the model stays while it changes
  try {
    ctx.loop.load_adapter(m, name, path, inplace).get();
  } catch (const EngineLoop::AdapterTaken& e) {
    bad("lora_name", e.what(), "adapter_exists");
  } catch (const ModelError& e) {
    bad("lora_path", e.what(), "invalid_adapter");
  } catch (const IoError& e) {
    bad("lora_path", e.what(), "invalid_adapter");
  }
  return fmt::format("Success: LoRA adapter '{}' added successfully.", name);
}

std::string unload(RouteContext& ctx, const json& body) {
  const std::string name = required(body, "lora_name");
  if (!ctx.loop.unload_adapter(name).get())
    throw ApiError{404, fmt::format("The lora adapter '{}' cannot be found.", name),
                   "invalid_request_error", "lora_name", "adapter_not_found"};
  return fmt::format("Success: LoRA adapter '{}' removed successfully.", name);
}

template <typename F>
void handle_lora(RouteContext& ctx, const char* endpoint, const httplib::Request& req,
                 httplib::Response& res, F&& answer) {
  try {
    check_enabled(ctx);
    res.set_content(answer(ctx, parse_body(req.body)), "text/plain; charset=utf-8");
    res.status = 200;
    ctx.metrics.count_request(endpoint, 200);
  } catch (const ApiError& e) {
    ctx.metrics.count_request(endpoint, e.status);
    reply_json(res, e.status, openai_error(e));
  }
}

}  // namespace

void register_lora(httplib::Server& svr, RouteContext& ctx) {
  svr.Post("/v1/load_lora_adapter", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_lora(ctx, "/v1/load_lora_adapter", req, res, load);
  });
  svr.Post("/v1/unload_lora_adapter", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle_lora(ctx, "/v1/unload_lora_adapter", req, res, unload);
  });
}

}  // namespace wick::server
