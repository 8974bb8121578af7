// Embeddings: POST /v1/embeddings (OpenAI), POST /api/embed and the older
// POST /api/embeddings (Ollama). Each input is tokenized, the batch runs on
// the model's engine (Engine::embed) and comes back pooled and normalised.
#include <cstring>
#include <string_view>

#include "server/model_lookup.h"
#include "server/parse_ollama.h"
#include "server/routes.h"
#include "server/write_ollama.h"
#include "server/write_openai.h"

namespace wick::server {

namespace {

constexpr size_t kMaxInputs = 2048;  // OpenAI's limit of inputs per request

// The inputs of `key`: a string, an array of strings, an array of token ids
// (one input), or an array of such arrays. Each is tokenized (BOS and EOS as
// the tokenizer adds them); an input longer than n_ctx is a 400 unless
// truncate keeps its first n_ctx tokens.
std::vector<std::vector<int32_t>> parse_inputs(const json& body, const char* key,
                                               const Tokenizer& tk, int32_t n_ctx, bool truncate) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null())
    bad(key, fmt::format("'{}' is required", key), "missing_field");
  const json& in = *it;
  const std::string type_error = fmt::format(
      "'{}' must be a string, an array of strings, an array of token ids or an array of "
      "arrays of token ids",
      key);
  auto ids_of = [&](const json& a, const std::string& where) {
    std::vector<int32_t> ids;
    for (auto& x : a) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
        bad(where, fmt::format("'{}' must hold token ids (non-negative integers)", where),
            "invalid_type");
      ids.push_back(int32_t(x.get<int64_t>()));
    }
    return ids;
  };
  std::vector<std::vector<int32_t>> out;
  auto add_text = [&](const json& s, const std::string& where) {
    if (!s.is_string()) bad(key, type_error, "invalid_type");
    if (s.get_ref<const std::string&>().empty())
      bad(where, fmt::format("'{}' must not be an empty string", where));
    try {
      out.push_back(tk.encode(s.get<std::string>(), {.add_special = true}));
    } catch (const TextError& e) {
      bad(where, e.what());
    }
  };
  if (in.is_string()) {
    add_text(in, key);
  } else if (in.is_array()) {
    if (in.empty()) bad(key, fmt::format("'{}' must not be empty", key));
    if (in.size() > kMaxInputs && !in[0].is_number())
      bad(key, fmt::format("'{}' takes at most {} inputs", key, kMaxInputs));
    if (in[0].is_number()) {
      out.push_back(ids_of(in, key));
    } else {
      for (size_t i = 0; i < in.size(); ++i) {
        const std::string where = fmt::format("{}[{}]", key, i);
        if (in[i].is_array()) {
          if (in[i].empty()) bad(where, fmt::format("'{}' must not be empty", where));
          out.push_back(ids_of(in[i], where));
        } else {
          add_text(in[i], where);
        }
      }
    }
  } else {
    bad(key, type_error, "invalid_type");
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (int64_t(out[i].size()) > n_ctx) {
      if (truncate) {
        out[i].resize(size_t(n_ctx));
        continue;
      }
      throw ApiError{
          400,
          fmt::format("input {} has {} tokens but the context holds {}", i, out[i].size(), n_ctx),
          "invalid_request_error", key, "context_length_exceeded"};
    }
  return out;
}

// The engine's embeddings for inputs, or the API error: 400 for a bad input,
// 429 with the queue full, 503 with the KV cache full, 500 otherwise.
std::vector<Embedding> run_embed(RouteContext& ctx, const std::shared_ptr<const LoadedModel>& m,
                                 std::vector<std::vector<int32_t>> inputs, int32_t adapter) {
  auto f = ctx.loop.submit_embed(m, std::move(inputs), ctx.cfg.pooling, adapter);
  if (!f)
    throw ApiError{429, "the server is at its limit of requests in flight; retry later",
                   "rate_limit_error", "", "queue_full"};
  try {
    return f->get();
  } catch (const GenerateError& e) {
    bad("input", e.what());
  } catch (const std::runtime_error& e) {
    throw ApiError{503, e.what(), "server_error", "", "kv_cache_full"};
  }
}

int64_t n_tokens(const std::vector<Embedding>& es) {
  int64_t n = 0;
  for (auto& e : es) n += e.n_tokens;
  return n;
}

std::string base64(std::string_view bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 2]));
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

// OpenAI's base64: the float32 values' little-endian bytes.
std::string floats_base64(const std::vector<float>& v) {
  std::string bytes(v.size() * 4, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + size_t(b)] = char((u >> (8 * b)) & 0xff);
  }
  return base64(bytes);
}

void openai_embeddings(RouteContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = "/v1/embeddings";
  try {
    const json body = parse_body(req.body);
    const std::string name = field<std::string>(body, "model").value_or("");
    const KeepAlive keep_alive = keep_alive_of(body, ctx.cfg.keep_alive);  // wick's extra
    int32_t adapter = 0;
    auto m = find_model(name, ctx.cfg.default_model, true, &adapter);
    const std::string format = field<std::string>(body, "encoding_format").value_or("float");
    if (format != "float" && format != "base64")
      bad("encoding_format", "encoding_format must be \"float\" or \"base64\"");
    const int64_t dim = m->config().n_embd;
    if (auto d = field<int64_t>(body, "dimensions"); d && *d != dim)
      bad("dimensions",
          fmt::format("this model's embeddings have {} dimensions; other sizes are not supported",
                      dim));
    auto inputs =
        parse_inputs(body, "input", *m->tokenizer, request_n_ctx(*m, ctx.cfg.engine.n_ctx), false);
    auto use = ctx.pool.use(m, keep_alive);
    const auto es = run_embed(ctx, m, std::move(inputs), adapter);
    json data = json::array();
    for (size_t i = 0; i < es.size(); ++i)
      data.push_back({{"object", "embedding"},
                      {"index", i},
                      {"embedding", format == "float" ? json(es[i].values)
                                                      : json(floats_base64(es[i].values))}});
    const int64_t n = n_tokens(es);
    reply_json(res, 200,
               {{"object", "list"},
                {"data", data},
                {"model", name.empty() ? ctx.cfg.default_model : name},
                {"usage", {{"prompt_tokens", n}, {"total_tokens", n}}}});
    ctx.metrics.count_request(endpoint, 200);
  } catch (const ApiError& e) {
    ctx.metrics.count_request(endpoint, e.status);
    reply_json(res, e.status, openai_error(e));
  }
}

// /api/embed (input, truncate) and the older /api/embeddings (prompt, one vector).
void ollama_embed(RouteContext& ctx, bool legacy, const httplib::Request& req,
                  httplib::Response& res) {
  const std::string endpoint = legacy ? "/api/embeddings" : "/api/embed";
  try {
    const auto t0 = Clock::now();
    const json body = parse_body(req.body);
    const std::string name = ollama_model_name(body);
    const KeepAlive keep_alive = keep_alive_of(body, ctx.cfg.keep_alive);
    int32_t adapter = 0;
    auto m = find_model(name, ctx.cfg.default_model, true, &adapter);
    const bool truncate = field<bool>(body, "truncate").value_or(true);
    if (auto d = field<int64_t>(body, "dimensions"); d && *d != m->config().n_embd)
      bad("dimensions",
          fmt::format("this model's embeddings have {} dimensions; other sizes are not supported",
                      m->config().n_embd));
    const int32_t n_ctx = request_n_ctx(*m, ctx.cfg.engine.n_ctx);
    if (legacy && !body.contains("prompt")) {  // Ollama answers an empty vector
      reply_json(res, 200, {{"embedding", json::array()}});
      return;
    }
    auto inputs =
        parse_inputs(body, legacy ? "prompt" : "input", *m->tokenizer, n_ctx, legacy || truncate);
    auto use = ctx.pool.use(m, keep_alive);
    const double load_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const auto es = run_embed(ctx, m, std::move(inputs), adapter);
    if (legacy) {
      reply_json(res, 200, {{"embedding", es[0].values}});
    } else {
      json vs = json::array();
      for (auto& e : es) vs.push_back(e.values);
      const double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      reply_json(res, 200,
                 {{"model", name},
                  {"embeddings", vs},
                  {"total_duration", int64_t(total_ms * 1e6)},
                  {"load_duration", int64_t(load_ms * 1e6)},
                  {"prompt_eval_count", n_tokens(es)}});
    }
    ctx.metrics.count_request(endpoint, 200);
  } catch (const ApiError& e) {
    ctx.metrics.count_request(endpoint, e.status);
    reply_json(res, e.status, ollama_error(e));
  }
}

}  // namespace

void register_embeddings(httplib::Server& svr, RouteContext& ctx) {
  svr.Post("/v1/embeddings", [&ctx](const httplib::Request& req, httplib::Response& res) {
    openai_embeddings(ctx, req, res);
  });
  svr.Post("/api/embed", [&ctx](const httplib::Request& req, httplib::Response& res) {
    ollama_embed(ctx, false, req, res);
  });
  svr.Post("/api/embeddings", [&ctx](const httplib::Request& req, httplib::Response& res) {
    ollama_embed(ctx, true, req, res);
  });
}

}  // namespace wick::server
