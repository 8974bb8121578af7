// The endpoints beyond generation, each group in its own file: model
// lifecycle (keep-alive, /api/ps, delete, copy, pull, create), embeddings,
// and token utilities. They share what the server holds.
#pragma once

#include <httplib.h>

#include <memory>
#include <string>

#include "engine/model_pool.h"
#include "server/engine_loop.h"
#include "server/http_server.h"
#include "server/keep_alive.h"
#include "server/metrics.h"
#include "server/parse_common.h"
#include "server/submit.h"

namespace wick::server {

struct RouteContext {
  const ServerConfig& cfg;
  EngineLoop& loop;
  Metrics& metrics;
  ModelPool& pool;
};

void reply_json(httplib::Response& res, int status, const json& j);

// The model a client names resolved to its path, without loading it: the
// default model for an empty name or the operator's; else a stored name
// (":latest" dropped). 404 for an unknown one.
std::string model_path_for(const std::string& name, const std::string& default_model);

// Holds a model for the length of a streamed answer: the Use ends with the
// stream (the writer is freed when the response is done or the client left).
class HeldStream : public StreamWriter {
 public:
  HeldStream(std::shared_ptr<StreamWriter> inner, ModelPool::Use use)
      : inner_(std::move(inner)), use_(std::move(use)) {}
  std::string text(size_t i, const std::string& piece,
                   const std::vector<TokenLogprob>& logprobs) override {
    return inner_->text(i, piece, logprobs);
  }
  std::string done(size_t i, const GenerateResult& r) override { return inner_->done(i, r); }
  std::string end() override { return inner_->end(); }

 private:
  std::shared_ptr<StreamWriter> inner_;
  ModelPool::Use use_;
};

// An Ollama /api/generate or /api/chat body without a prompt (or with empty
// messages) loads the model, or with keep_alive 0 unloads it; answers it and
// returns true. false: a generation request.
bool answer_load_request(RouteContext& ctx, const json& body, bool chat, KeepAlive keep_alive,
                         httplib::Response& res);

class ResponseStore;
void register_responses(httplib::Server& svr, RouteContext& ctx, Submitter& sub,
                        ResponseStore& store);                       // responses_routes.cpp
void register_lifecycle(httplib::Server& svr, RouteContext& ctx);    // lifecycle_routes.cpp
void register_embeddings(httplib::Server& svr, RouteContext& ctx);   // embed_routes.cpp
void register_token_utils(httplib::Server& svr, RouteContext& ctx);  // token_routes.cpp
void register_lora(httplib::Server& svr, RouteContext& ctx);         // lora_routes.cpp

}  // namespace wick::server
