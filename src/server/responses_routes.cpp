// OpenAI's Responses API: POST /v1/responses (parse_responses.h reads it onto
// the chat path, write_responses.h answers it), GET and DELETE
// /v1/responses/ID on the store that previous_response_id reads.
#include <algorithm>
#include <cstdlib>
#include <random>

#include "server/model_lookup.h"
#include "server/parse_openai.h"
#include "server/parse_responses.h"
#include "server/response_store.h"
#include "server/routes.h"
#include "server/write_openai.h"
#include "server/write_responses.h"

namespace wick::server {

namespace {

constexpr const char* kEndpoint = "/v1/responses";

ApiError not_found(const std::string& id, const char* param = "") {
  return ApiError{404, fmt::format("Response with id '{}' not found.", id), "invalid_request_error",
                  param, param[0] ? "previous_response_not_found" : ""};
}

void create(RouteContext& ctx, Submitter& sub, ResponseStore& store, const httplib::Request& req,
            httplib::Response& res) {
  try {
    const json body = parse_body(req.body);
    const KeepAlive keep_alive = keep_alive_of(body, ctx.cfg.keep_alive);
    int32_t adapter = 0;
    auto m = find_model(openai_model_name(body), ctx.cfg.default_model, true, &adapter);
    std::shared_ptr<const json> previous;
    if (const std::string id = previous_response_id(body); !id.empty()) {
      previous = store.conversation(id);
      if (!previous) throw not_found(id, "previous_response_id");
    }
    ResponsesRequest r =
        parse_responses(body, model_view(*m, ctx.cfg.engine.n_ctx, ctx.cfg.split_reasoning),
                        std::random_device{}(), previous ? *previous : json::array());
    r.chat.gen.adapter = adapter;
    auto use = ctx.pool.use(m, keep_alive);
    const Channels chans = sub.submit(m, r.chat.gen, 1);
    auto builder = std::make_shared<ResponseBuilder>(
        r, new_response_id(), r.chat.model.empty() ? ctx.cfg.default_model : r.chat.model, m);
    // a finished response is kept, with the conversation it ends, when asked
    auto keep = [&store, conversation = r.store ? r.conversation : json(),
                 asked = r.store](const ResponseBuilder& b) {
      if (!asked) return;
      json conv = conversation;
      conv.push_back(b.assistant_message());
      store.put(b.response()["id"], b.response(), std::move(conv));
    };
    if (!r.chat.stream) {
      const GenerateResult g = sub.wait(chans).front();
      builder->text(g.text, g.logprobs);
      builder->finish(g);
      keep(*builder);
      reply_json(res, 200, builder->response());
      ctx.metrics.count_request(kEndpoint, 200);
      return;
    }
    ctx.metrics.count_request(kEndpoint, 200);
    res.set_header("Cache-Control", "no-cache");
    sub.respond(res, "text/event-stream", chans,
                std::make_shared<HeldStream>(std::make_shared<ResponsesStream>(builder, keep),
                                             std::move(use)));
  } catch (const ApiError& e) {
    ctx.metrics.count_request(kEndpoint, e.status);
    reply_json(res, e.status, openai_error(e));
  }
}

// GET /v1/responses/ID/input_items: a page of the items, newest first
// unless order=asc, after / before an item id, limit 1-100 (default 20).
void list_input_items(const ResponseStore& store, const httplib::Request& req,
                      httplib::Response& res) {
  try {
    const std::string id = req.matches[1];
    auto conv = store.conversation(id);
    if (!conv) throw not_found(id);
    json all = input_items(id, json(conv->begin(), conv->end() - (conv->empty() ? 0 : 1)));
    const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
    if (order != "asc" && order != "desc") bad("order", "order must be \"asc\" or \"desc\"");
    if (order == "desc") std::reverse(all.begin(), all.end());
    int64_t limit = 20;
    if (req.has_param("limit")) {
      const std::string v = req.get_param_value("limit");
      char* end = nullptr;
      limit = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end || limit < 1 || limit > 100)
        bad("limit", "limit must be an integer in [1, 100]");
    }
    // the page: after the 'after' item, before the 'before' item
    size_t first = 0, last = all.size();
    auto index_of = [&](const char* key) {
      const std::string item = req.get_param_value(key);
      for (size_t i = 0; i < all.size(); ++i)
        if (all[i]["id"] == item) return i;
      bad(key, fmt::format("no input item '{}' in response '{}'", item, id));
    };
    if (req.has_param("after")) first = index_of("after") + 1;
    if (req.has_param("before")) last = std::max(first, index_of("before"));
    const size_t end = std::min(last, first + size_t(limit));
    json data(all.begin() + ptrdiff_t(first), all.begin() + ptrdiff_t(end));
    reply_json(res, 200,
               {{"object", "list"},
                {"data", data},
                {"first_id", data.empty() ? json() : data.front()["id"]},
                {"last_id", data.empty() ? json() : data.back()["id"]},
                {"has_more", end < last}});
  } catch (const ApiError& e) {
    reply_json(res, e.status, openai_error(e));
  }
}

}  // namespace

void register_responses(httplib::Server& svr, RouteContext& ctx, Submitter& sub,
                        ResponseStore& store) {
  svr.Post(kEndpoint, [&ctx, &sub, &store](const httplib::Request& req, httplib::Response& res) {
    create(ctx, sub, store, req, res);
  });
  svr.Get(R"(/v1/responses/([^/]+))",
          [&store](const httplib::Request& req, httplib::Response& res) {
            const std::string id = req.matches[1];
            if (auto r = store.response(id))
              reply_json(res, 200, *r);
            else
              reply_json(res, 404, openai_error(not_found(id)));
          });
  svr.Get(R"(/v1/responses/([^/]+)/input_items)",
          [&store](const httplib::Request& req, httplib::Response& res) {
            list_input_items(store, req, res);
          });
  svr.Delete(R"(/v1/responses/([^/]+))",
             [&store](const httplib::Request& req, httplib::Response& res) {
               const std::string id = req.matches[1];
               if (store.erase(id))
                 reply_json(res, 200, {{"id", id}, {"object", "response"}, {"deleted", true}});
               else
                 reply_json(res, 404, openai_error(not_found(id)));
             });
}

}  // namespace wick::server
