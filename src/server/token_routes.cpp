// Token utilities as llama.cpp's server names them: POST /tokenize,
// POST /detokenize, POST /apply-template; "model" picks the model (default
// the served one).
#include "server/chat_prompt.h"
#include "server/model_lookup.h"
#include "server/routes.h"
#include "server/write_openai.h"

namespace wick::server {

namespace {

constexpr size_t kMaxDetokenize = 1u << 20;  // ids per /detokenize request

std::shared_ptr<const LoadedModel> model_of(RouteContext& ctx, const json& body) {
  return find_model(field<std::string>(body, "model").value_or(""), ctx.cfg.default_model, true);
}

template <typename F>
void handle(RouteContext& ctx, const char* endpoint, const httplib::Request& req,
            httplib::Response& res, F&& answer) {
  try {
    reply_json(res, 200, answer(parse_body(req.body)));
    ctx.metrics.count_request(endpoint, 200);
  } catch (const ApiError& e) {
    ctx.metrics.count_request(endpoint, e.status);
    reply_json(res, e.status, openai_error(e));
  }
}

// content -> ids; add_special: BOS/EOS as the tokenizer adds them (default
// false); parse_special: special-token text becomes its id (default true);
// with_pieces: each id with its text.
json tokenize(RouteContext& ctx, const json& body) {
  auto m = model_of(ctx, body);
  const auto content = field<std::string>(body, "content");
  if (!content) bad("content", "'content' is required", "missing_field");
  const bool add_special = field<bool>(body, "add_special").value_or(false);
  const bool parse_special = field<bool>(body, "parse_special").value_or(true);
  const bool with_pieces = field<bool>(body, "with_pieces").value_or(false);
  const Tokenizer& tk = *m->tokenizer;
  std::vector<int32_t> ids;
  try {
    ids = tk.encode(*content, {.add_special = add_special, .parse_special = parse_special});
  } catch (const TextError& e) {
    bad("content", e.what());
  }
  json tokens = json::array();
  for (int32_t id : ids) {
    if (!with_pieces) {
      tokens.push_back(id);
      continue;
    }
    // a piece that is part of a UTF-8 character shows U+FFFD
    const int32_t one[1] = {id};
    tokens.push_back({{"id", id}, {"piece", tk.decode(one, false)}});
  }
  return {{"tokens", tokens}};
}

json detokenize(RouteContext& ctx, const json& body) {
  auto m = model_of(ctx, body);
  auto it = body.find("tokens");
  if (it == body.end() || it->is_null()) bad("tokens", "'tokens' is required", "missing_field");
  if (!it->is_array()) bad("tokens", "'tokens' must be an array of token ids", "invalid_type");
  if (it->size() > kMaxDetokenize)
    bad("tokens", fmt::format("'tokens' takes at most {} ids", kMaxDetokenize));
  const std::vector<int32_t> ids = parse_token_ids(*it, model_view(*m, ctx.cfg.engine.n_ctx),
                                                   "tokens", "'tokens' must hold integers");
  // special tokens kept, as llama.cpp's server gives them back
  return {{"content", m->tokenizer->decode(ids, false)}};
}

json apply_template(RouteContext& ctx, const json& body) {
  auto m = model_of(ctx, body);
  if (!body.contains("messages")) bad("messages", "'messages' is required", "missing_field");
  const json extra = body.value("chat_template_kwargs", json());
  return {{"prompt", chat_prompt_text(model_view(*m, ctx.cfg.engine.n_ctx), body["messages"],
                                      body.value("tools", json()), extra, prompt_end(body))}};
}

}  // namespace

void register_token_utils(httplib::Server& svr, RouteContext& ctx) {
  svr.Post("/tokenize", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle(ctx, "/tokenize", req, res, [&](const json& b) { return tokenize(ctx, b); });
  });
  svr.Post("/detokenize", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle(ctx, "/detokenize", req, res, [&](const json& b) { return detokenize(ctx, b); });
  });
  svr.Post("/apply-template", [&ctx](const httplib::Request& req, httplib::Response& res) {
    handle(ctx, "/apply-template", req, res, [&](const json& b) { return apply_template(ctx, b); });
  });
}

}  // namespace wick::server
