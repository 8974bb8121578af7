#include "server/http_server.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/model_pool.h"
#include "engine/model_store.h"
#include "io/error.h"
#include "server/engine_loop.h"
#include "text/chat_template.h"

namespace wick::server {

namespace {

using json = nlohmann::ordered_json;
using clk = std::chrono::steady_clock;

struct ApiError {
  int status;
  std::string message, type = "invalid_request_error", param, code;
};

[[noreturn]] void bad(const std::string& param, const std::string& msg,
                      const std::string& code = "invalid_value") {
  throw ApiError{400, msg, "invalid_request_error", param, code};
}

// Typed optional field access; a wrong type is a 400 naming the field.
template <typename T>
std::optional<T> field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) bad(key, fmt::format("'{}' must be a boolean", key), "invalid_type");
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) bad(key, fmt::format("'{}' must be a string", key), "invalid_type");
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer())
      bad(key, fmt::format("'{}' must be an integer", key), "invalid_type");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) bad(key, fmt::format("'{}' must be a number", key), "invalid_type");
  }
  return it->get<T>();
}

std::string iso_now() {
  auto now = std::chrono::system_clock::now();
  auto secs = std::chrono::time_point_cast<std::chrono::seconds>(now);
  auto frac = std::chrono::duration_cast<std::chrono::microseconds>(now - secs).count();
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:06d}Z",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(now)), frac);
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string finish_reason(const std::string& stop) {
  if (stop == "eos" || stop == "stop") return "stop";
  if (stop == "length" || stop == "context") return "length";
  return stop;
}

class Api {
 public:
  explicit Api(const ServerConfig& cfg) : cfg_(cfg), loop_(cfg.engine, cfg.max_queue, metrics_) {}

  std::shared_ptr<const LoadedModel> model(const std::string& name, bool ollama = false) {
    std::string n = name.empty() ? cfg_.default_model : name;
    if (ollama && n.size() > 7 && n.compare(n.size() - 7, 7, ":latest") == 0)
      n.resize(n.size() - 7);
    try {
      auto m = ModelPool::global().get(n);
      if (!m->tokenizer)
        throw ApiError{400, fmt::format("model '{}' has no tokenizer", n), "invalid_request_error",
                       "model", "model_without_tokenizer"};
      return m;
    } catch (const ModelError& e) {
      if (std::string(e.what()).rfind("unknown model", 0) == 0)
        throw ApiError{404, fmt::format("The model '{}' does not exist", n),
                       "invalid_request_error", "model", "model_not_found"};
      throw ApiError{500, e.what(), "server_error", "model", "model_load_failed"};
    } catch (const IoError& e) {
      throw ApiError{500, e.what(), "server_error", "model", "model_load_failed"};
    }
  }

  int32_t n_ctx(const LoadedModel& m) const {
    return std::min<int32_t>(cfg_.engine.n_ctx, int32_t(m.model->config.n_ctx_train));
  }

  std::vector<int32_t> chat_prompt(const LoadedModel& m, const json& messages, const json& tools,
                                   const json& extra) {
    if (!messages.is_array()) bad("messages", "'messages' must be an array", "invalid_type");
    if (messages.empty()) bad("messages", "'messages' must not be empty");
    for (size_t i = 0; i < messages.size(); ++i) {
      const json& msg = messages[i];
      const std::string p = fmt::format("messages[{}]", i);
      if (!msg.is_object()) bad(p, p + " must be an object", "invalid_type");
      if (!msg.contains("role") || !msg["role"].is_string())
        bad(p + ".role", p + ".role must be a string", "invalid_type");
      const std::string role = msg["role"];
      if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
          role != "developer")
        bad(p + ".role",
            fmt::format("{}.role '{}' is not one of system, user, assistant, tool", p, role));
      if (msg.contains("content") && !msg["content"].is_null() && !msg["content"].is_string() &&
          !msg["content"].is_array())
        bad(p + ".content", p + ".content must be a string or an array of parts", "invalid_type");
    }
    // content parts [{"type": "text", "text": ...}] are joined to a string
    json msgs = messages;
    for (auto& msg : msgs) {
      if (msg.contains("content") && msg["content"].is_array()) {
        std::string text;
        for (auto& part : msg["content"])
          if (part.is_object() && part.value("type", "") == "text" && part.contains("text") &&
              part["text"].is_string())
            text += part["text"].get<std::string>();
          else
            bad("messages", "only text content parts are supported");
        msg["content"] = text;
      }
      if (!msg.contains("content") || msg["content"].is_null()) msg["content"] = "";
      if (msg["role"] == "developer") msg["role"] = "system";
    }
    const Tokenizer& tk = *m.tokenizer;
    if (tk.chat_template.empty())
      bad("messages", "this model has no chat template; use the completions endpoint");
    json vars = {{"messages", msgs},
                 {"add_generation_prompt", true},
                 {"bos_token", tk.bos_token},
                 {"eos_token", tk.eos_token}};
    if (!tools.is_null()) {
      if (!tools.is_array()) bad("tools", "'tools' must be an array", "invalid_type");
      vars["tools"] = tools;
    }
    if (extra.is_object())
      for (auto& [k, v] : extra.items()) vars[k] = v;
    std::string text;
    try {
      text = ChatTemplate(tk.chat_template, m.name).render(vars);
    } catch (const jinja::TemplateError& e) {
      bad("messages", e.what(), "template_error");
    }
    return tk.encode(text, {.add_special = false, .parse_special = true});
  }

  void check_fits(const LoadedModel& m, size_t n_prompt, const char* param) {
    if (int64_t(n_prompt) >= n_ctx(m))
      throw ApiError{
          400,
          fmt::format("This model's maximum context length is {} tokens; the prompt has {} tokens",
                      n_ctx(m), n_prompt),
          "invalid_request_error", param, "context_length_exceeded"};
  }

  // OpenAI sampling fields; defaults are OpenAI's (plain sampling at temperature 1).
  void openai_sampling(const json& b, GenerateRequest& r, const LoadedModel& m, size_t n_prompt) {
    SamplingParams& s = r.sampling;
    s.temperature = float(field<double>(b, "temperature").value_or(1.0));
    s.top_p = float(field<double>(b, "top_p").value_or(1.0));
    s.top_k = int32_t(field<int64_t>(b, "top_k").value_or(0));
    s.min_p = float(field<double>(b, "min_p").value_or(0.0));
    s.repeat_penalty = float(field<double>(b, "repeat_penalty").value_or(1.0));
    s.presence_penalty = float(field<double>(b, "presence_penalty").value_or(0.0));
    s.frequency_penalty = float(field<double>(b, "frequency_penalty").value_or(0.0));
    s.repeat_last_n = 0;
    if (auto seed = field<int64_t>(b, "seed"))
      s.seed = uint64_t(*seed);
    else
      s.seed = std::random_device{}();
    if (s.temperature > 2) bad("temperature", "temperature must be in [0, 2]");
    if (s.presence_penalty < -2 || s.presence_penalty > 2)
      bad("presence_penalty", "presence_penalty must be in [-2, 2]");
    if (s.frequency_penalty < -2 || s.frequency_penalty > 2)
      bad("frequency_penalty", "frequency_penalty must be in [-2, 2]");
    if (auto err = s.validate(); !err.empty()) bad(err.substr(0, err.find(' ')), err);
    auto mt = field<int64_t>(b, "max_completion_tokens");
    if (!mt) mt = field<int64_t>(b, "max_tokens");
    const int64_t room = n_ctx(m) - int64_t(n_prompt);
    if (mt && (*mt < 1 || *mt > (1 << 24)))
      bad(b.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
          "max_tokens must be in [1, 16777216]");
    r.max_tokens = int32_t(std::min<int64_t>(mt.value_or(room), room));
    r.stop = stops(b, "stop", 4);
  }

  static std::vector<std::string> stops(const json& b, const char* key, size_t max_n) {
    std::vector<std::string> out;
    if (!b.contains(key) || b[key].is_null()) return out;
    const json& s = b[key];
    if (s.is_string())
      out.push_back(s);
    else if (s.is_array()) {
      for (auto& x : s) {
        if (!x.is_string())
          bad(key, fmt::format("'{}' must be a string or an array of strings", key),
              "invalid_type");
        out.push_back(x);
      }
    } else
      bad(key, fmt::format("'{}' must be a string or an array of strings", key), "invalid_type");
    if (out.size() > max_n) bad(key, fmt::format("'{}' takes at most {} strings", key, max_n));
    for (auto& x : out)
      if (x.empty()) bad(key, "stop strings must not be empty");
    return out;
  }

  std::shared_ptr<Channel> start(std::shared_ptr<const LoadedModel> m, GenerateRequest r) {
    auto ch = std::make_shared<Channel>();
    if (!loop_.submit(std::move(m), std::move(r), ch))
      throw ApiError{429, "the server is busy: too many requests in flight; retry later",
                     "rate_limit_exceeded", "", "queue_full"};
    return ch;
  }

  // Waits for a request's end; text is accumulated by the engine.
  GenerateResult wait(const std::shared_ptr<Channel>& ch) {
    while (true) {
      auto e = ch->pop(std::chrono::milliseconds(1000));
      if (!e) {
        if (!loop_.alive())
          throw ApiError{503, "the engine stopped", "server_error", "", "engine_down"};
        continue;
      }
      if (!e->error.empty())
        throw ApiError{400, e->error, "invalid_request_error", "", "generation_failed"};
      if (e->done) return *e->done;
    }
  }

  ServerConfig cfg_;
  Metrics metrics_;
  EngineLoop loop_;
  std::atomic<uint64_t> next_id_{1};
};

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(j.dump(), "application/json");
}

json openai_error(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json() : json(e.param)},
            {"code", e.code.empty() ? json() : json(e.code)}}}};
}

json parse_body(const httplib::Request& req) {
  try {
    json j = json::parse(req.body);
    if (!j.is_object()) bad("", "the request body must be a JSON object", "invalid_json");
    return j;
  } catch (const json::parse_error& e) {
    bad("", std::string("the request body is not valid JSON: ") + e.what(), "invalid_json");
  }
}

// Streams events of n channels as `write(chunk)` calls until all are done;
// returns false when the client went away (the requests are cancelled).
template <typename OnText, typename OnDone>
bool pump(Api& api, std::vector<std::shared_ptr<Channel>>& chans, httplib::DataSink& sink,
          OnText on_text, OnDone on_done) {
  std::vector<bool> done(chans.size(), false);
  size_t n_done = 0;
  while (n_done < chans.size()) {
    for (size_t i = 0; i < chans.size(); ++i) {
      if (done[i]) continue;
      auto e = chans[i]->pop(std::chrono::milliseconds(chans.size() == 1 ? 200 : 20));
      if (!sink.is_writable()) {
        for (auto& c : chans) api.loop_.cancel(c);
        return false;
      }
      if (!e) continue;
      std::string out = e->error.empty()
                            ? (e->done ? on_done(i, *e->done) : on_text(i, e->text))
                            : on_done(i, GenerateResult{.stop_reason = "error: " + e->error});
      if (!out.empty() && !sink.write(out.data(), out.size())) {
        for (auto& c : chans) api.loop_.cancel(c);
        return false;
      }
      if (e->done || !e->error.empty()) {
        done[i] = true;
        ++n_done;
      }
    }
  }
  return true;
}

// OpenAI's logprobs objects: chat {"content": [{token, logprob, bytes,
// top_logprobs}]}, completions {tokens, token_logprobs, top_logprobs, text_offset}.
json logprobs_json(const Tokenizer& tk, const GenerateResult& r, bool chat) {
  auto text_of = [&](int32_t id) { return tk.decode(std::vector<int32_t>{id}, false); };
  auto bytes_of = [](const std::string& t) {
    json b = json::array();
    for (unsigned char c : t) b.push_back(int(c));
    return b;
  };
  if (chat) {
    json content = json::array();
    for (auto& t : r.logprobs) {
      json top = json::array();
      for (auto& [id, lp] : t.top) {
        const std::string s = text_of(id);
        top.push_back({{"token", s}, {"logprob", lp}, {"bytes", bytes_of(s)}});
      }
      const std::string s = text_of(t.id);
      content.push_back(
          {{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  size_t off = 0;
  for (auto& t : r.logprobs) {
    const std::string s = text_of(t.id);
    tokens.push_back(s);
    lps.push_back(t.logprob);
    json top = json::object();
    for (auto& [id, lp] : t.top) top[text_of(id)] = lp;
    tops.push_back(top);
    offs.push_back(off);
    off += s.size();
  }
  return {
      {"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

void register_openai(httplib::Server& svr, Api& api) {
  svr.Get("/v1/models", [&api](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    std::error_code ec;
    std::set<std::string> names{api.cfg_.default_model};
    for (auto& e : std::filesystem::directory_iterator(model_store_dir(), ec)) {
      auto n = e.path().filename();
      names.insert(n.extension() == ".gguf" ? n.stem().string() : n.string());
    }
    for (auto& n : names)
      data.push_back({{"id", n}, {"object", "model"}, {"created", 0}, {"owned_by", "wick"}});
    send_json(res, 200, {{"object", "list"}, {"data", data}});
  });

  auto completion = [&api](bool chat) {
    return [&api, chat](const httplib::Request& req, httplib::Response& res) {
      const std::string endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
      try {
        json b = parse_body(req);
        auto model_name = field<std::string>(b, "model").value_or("");
        auto m = api.model(model_name);
        std::vector<int32_t> prompt;
        if (chat) {
          if (!b.contains("messages")) bad("messages", "'messages' is required", "missing_field");
          json extra = b.value("chat_template_kwargs", json());
          prompt = api.chat_prompt(*m, b["messages"], b.value("tools", json()), extra);
        } else {
          if (!b.contains("prompt")) bad("prompt", "'prompt' is required", "missing_field");
          if (b["prompt"].is_string())
            prompt = m->tokenizer->encode(b["prompt"].get<std::string>(), {.add_special = true});
          else if (b["prompt"].is_array() && !b["prompt"].empty() &&
                   b["prompt"][0].is_number_integer())
            prompt = b["prompt"].get<std::vector<int32_t>>();
          else
            bad("prompt", "'prompt' must be a string or an array of token ids", "invalid_type");
          if (prompt.empty()) bad("prompt", "'prompt' is empty");
          for (int32_t id : prompt)
            if (id < 0 || id >= m->tokenizer->n_vocab())
              bad("prompt", fmt::format("token id {} is outside the vocabulary", id));
        }
        api.check_fits(*m, prompt.size(), chat ? "messages" : "prompt");
        GenerateRequest base;
        base.prompt = prompt;
        api.openai_sampling(b, base, *m, prompt.size());
        const int64_t n = field<int64_t>(b, "n").value_or(1);
        if (n < 1 || n > 8) bad("n", "'n' must be in [1, 8]");
        const bool stream = field<bool>(b, "stream").value_or(false);
        const bool usage_in_stream = b.contains("stream_options") &&
                                     b["stream_options"].is_object() &&
                                     b["stream_options"].value("include_usage", false);
        // logprobs: chat takes a boolean and top_logprobs (0-20); completions an integer (0-5)
        int32_t n_top = -1;
        if (chat) {
          const auto tl = field<int64_t>(b, "top_logprobs");
          if (tl && (*tl < 0 || *tl > 20)) bad("top_logprobs", "top_logprobs must be in [0, 20]");
          if (field<bool>(b, "logprobs").value_or(false))
            n_top = int32_t(tl.value_or(0));
          else if (tl)
            bad("top_logprobs", "top_logprobs needs logprobs: true");
        } else if (auto lp = field<int64_t>(b, "logprobs")) {
          if (*lp < 0 || *lp > 5) bad("logprobs", "logprobs must be in [0, 5]");
          n_top = int32_t(*lp);
        }
        if (n_top >= 0 && stream)
          bad("logprobs", "logprobs with stream are not supported yet", "unsupported_parameter");
        base.top_logprobs = n_top;
        std::vector<std::shared_ptr<Channel>> chans;
        for (int64_t i = 0; i < n; ++i) {
          GenerateRequest r = base;
          r.sampling.seed = base.sampling.seed + uint64_t(i);
          chans.push_back(api.start(m, r));
        }
        const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", api.next_id_++);
        const int64_t created = unix_now();
        const std::string model_id = model_name.empty() ? api.cfg_.default_model : model_name;
        if (!stream) {
          json choices = json::array();
          int64_t n_prompt = 0, n_gen = 0;
          for (size_t i = 0; i < chans.size(); ++i) {
            auto r = api.wait(chans[i]);
            n_prompt = r.n_prompt;
            n_gen += int64_t(r.tokens.size());
            const json lp = base.top_logprobs >= 0 ? logprobs_json(*m->tokenizer, r, chat) : json();
            if (chat)
              choices.push_back({{"index", i},
                                 {"message", {{"role", "assistant"}, {"content", r.text}}},
                                 {"logprobs", lp},
                                 {"finish_reason", finish_reason(r.stop_reason)}});
            else
              choices.push_back({{"index", i},
                                 {"text", r.text},
                                 {"logprobs", lp},
                                 {"finish_reason", finish_reason(r.stop_reason)}});
          }
          send_json(res, 200,
                    {{"id", id},
                     {"object", chat ? "chat.completion" : "text_completion"},
                     {"created", created},
                     {"model", model_id},
                     {"choices", choices},
                     {"usage",
                      {{"prompt_tokens", n_prompt},
                       {"completion_tokens", n_gen},
                       {"total_tokens", n_prompt + n_gen}}}});
          api.metrics_.count_request(endpoint, 200);
          return;
        }
        api.metrics_.count_request(endpoint, 200);
        auto chunk = [id, created, model_id, chat](size_t i, const json& delta_or_text,
                                                   const json& finish) {
          json c = {{"id", id},
                    {"object", chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", created},
                    {"model", model_id}};
          if (chat)
            c["choices"] = json::array({{{"index", i},
                                         {"delta", delta_or_text},
                                         {"logprobs", nullptr},
                                         {"finish_reason", finish}}});
          else
            c["choices"] = json::array({{{"index", i},
                                         {"text", delta_or_text},
                                         {"logprobs", nullptr},
                                         {"finish_reason", finish}}});
          return "data: " + c.dump() + "\n\n";
        };
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider(
            "text/event-stream",
            [&api, chans, chunk, chat, usage_in_stream, id, created, model_id](
                size_t, httplib::DataSink& sink) mutable {
              std::vector<bool> started(chans.size(), false);
              int64_t n_prompt = 0, n_gen = 0;
              auto on_text = [&](size_t i, const std::string& t) {
                std::string out;
                if (chat && !started[i]) {
                  started[i] = true;
                  out += chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr);
                }
                return out + chunk(i, chat ? json{{"content", t}} : json(t), nullptr);
              };
              auto on_done = [&](size_t i, const GenerateResult& r) {
                n_prompt = r.n_prompt;
                n_gen += int64_t(r.tokens.size());
                std::string out;
                if (chat && !started[i])
                  out += chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr);
                if (r.stop_reason.rfind("error", 0) == 0)
                  return out + "data: " +
                         json{{"error",
                               {{"message", r.stop_reason},
                                {"type", "server_error"},
                                {"param", nullptr},
                                {"code", nullptr}}}}
                             .dump() +
                         "\n\n";
                return out +
                       chunk(i, chat ? json::object() : json(""), finish_reason(r.stop_reason));
              };
              if (!pump(api, chans, sink, on_text, on_done)) return false;
              std::string tail;
              if (usage_in_stream)
                tail += "data: " +
                        json{{"id", id},
                             {"object", chat ? "chat.completion.chunk" : "text_completion"},
                             {"created", created},
                             {"model", model_id},
                             {"choices", json::array()},
                             {"usage",
                              {{"prompt_tokens", n_prompt},
                               {"completion_tokens", n_gen},
                               {"total_tokens", n_prompt + n_gen}}}}
                            .dump() +
                        "\n\n";
              tail += "data: [DONE]\n\n";
              sink.write(tail.data(), tail.size());
              sink.done();
              return true;
            },
            [&api, chans](bool success) {
              if (!success)
                for (auto& c : chans) api.loop_.cancel(c);
            });
      } catch (const ApiError& e) {
        api.metrics_.count_request(endpoint, e.status);
        send_json(res, e.status, openai_error(e));
      }
    };
  };
  svr.Post("/v1/chat/completions", completion(true));
  svr.Post("/v1/completions", completion(false));
}

// Ollama options -> sampling; defaults are Ollama's.
void ollama_options(const json& b, GenerateRequest& r, Api& api, const LoadedModel& m,
                    size_t n_prompt) {
  json o = b.value("options", json::object());
  if (!o.is_object()) bad("options", "'options' must be an object", "invalid_type");
  SamplingParams& s = r.sampling;
  s.temperature = float(field<double>(o, "temperature").value_or(0.8));
  s.top_k = int32_t(field<int64_t>(o, "top_k").value_or(40));
  s.top_p = float(field<double>(o, "top_p").value_or(0.9));
  s.min_p = float(field<double>(o, "min_p").value_or(0.0));
  s.repeat_penalty = float(field<double>(o, "repeat_penalty").value_or(1.1));
  s.repeat_last_n = int32_t(field<int64_t>(o, "repeat_last_n").value_or(64));
  s.presence_penalty = float(field<double>(o, "presence_penalty").value_or(0.0));
  s.frequency_penalty = float(field<double>(o, "frequency_penalty").value_or(0.0));
  if (auto seed = field<int64_t>(o, "seed"))
    s.seed = uint64_t(*seed);
  else
    s.seed = std::random_device{}();
  if (s.repeat_last_n == -1) s.repeat_last_n = 0;
  if (auto err = s.validate(); !err.empty()) bad("options." + err.substr(0, err.find(' ')), err);
  const int64_t num_ctx = field<int64_t>(o, "num_ctx").value_or(api.n_ctx(m));
  if (num_ctx < 1) bad("options.num_ctx", "num_ctx must be positive");
  const int64_t ctx = std::min<int64_t>(num_ctx, api.n_ctx(m));
  if (int64_t(n_prompt) >= ctx)
    throw ApiError{400,
                   fmt::format("the prompt has {} tokens but the context holds {}", n_prompt, ctx),
                   "invalid_request_error", "options.num_ctx", "context_length_exceeded"};
  const int64_t np = field<int64_t>(o, "num_predict").value_or(-1);
  if (np < -2 || np == 0 || np > (1 << 24))
    bad("options.num_predict", "num_predict must be -1 (no limit) or in [1, 16777216]");
  r.max_tokens =
      int32_t(np < 0 ? ctx - int64_t(n_prompt) : std::min<int64_t>(np, ctx - int64_t(n_prompt)));
  r.stop = Api::stops(o, "stop", 16);
}

void register_ollama(httplib::Server& svr, Api& api) {
  svr.Get("/api/version", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"version", "0.1.0"}});
  });
  auto model_entry = [&api](const std::string& name) {
    json e = {{"name", name + ":latest"},
              {"model", name + ":latest"},
              {"modified_at", iso_now()},
              {"size", 0},
              {"digest", ""},
              {"details",
               {{"format", "gguf"},
                {"family", ""},
                {"families", json::array()},
                {"parameter_size", ""},
                {"quantization_level", ""}}}};
    try {
      std::string path = resolve_model(name);
      std::error_code ec;
      if (!std::filesystem::is_directory(path))
        e["size"] = int64_t(std::filesystem::file_size(path, ec));
    } catch (...) {
    }
    return e;
  };
  svr.Get("/api/tags", [model_entry](const httplib::Request&, httplib::Response& res) {
    json models = json::array();
    std::error_code ec;
    for (auto& e : std::filesystem::directory_iterator(model_store_dir(), ec)) {
      auto n = e.path().filename();
      models.push_back(model_entry(n.extension() == ".gguf" ? n.stem().string() : n.string()));
    }
    send_json(res, 200, {{"models", models}});
  });
  svr.Post("/api/show", [&api](const httplib::Request& req, httplib::Response& res) {
    try {
      json b = parse_body(req);
      auto name = field<std::string>(b, "model");
      if (!name) name = field<std::string>(b, "name");
      if (!name) bad("model", "'model' is required", "missing_field");
      auto m = api.model(*name, true);
      const auto& c = m->model->config;
      std::string types;
      for (auto& [t, n] : m->model->n_params_by_dtype) types += (types.empty() ? "" : ",") + t;
      send_json(res, 200,
                {{"modelfile", ""},
                 {"parameters", ""},
                 {"template", m->tokenizer->chat_template},
                 {"details",
                  {{"format", m->model->format == ModelFormat::Gguf ? "gguf" : "safetensors"},
                   {"family", arch_name(c.arch)},
                   {"families", json::array({arch_name(c.arch)})},
                   {"parameter_size", fmt::format("{:.1f}M", double(m->model->n_params) / 1e6)},
                   {"quantization_level", types}}},
                 {"model_info",
                  {{"general.architecture", arch_name(c.arch)},
                   {"general.parameter_count", m->model->n_params},
                   {"context_length", c.n_ctx_train},
                   {"embedding_length", c.n_embd},
                   {"block_count", c.n_layer}}}});
    } catch (const ApiError& e) {
      send_json(res, e.status, {{"error", e.message}});
    }
  });
  auto generate = [&api](bool chat) {
    return [&api, chat](const httplib::Request& req, httplib::Response& res) {
      const std::string endpoint = chat ? "/api/chat" : "/api/generate";
      try {
        json b = parse_body(req);
        auto name = field<std::string>(b, "model");
        if (!name) bad("model", "'model' is required", "missing_field");
        auto m = api.model(*name, true);
        std::vector<int32_t> prompt;
        if (chat) {
          if (!b.contains("messages")) bad("messages", "'messages' is required", "missing_field");
          prompt = api.chat_prompt(*m, b["messages"], b.value("tools", json()), json());
        } else {
          const std::string p = field<std::string>(b, "prompt").value_or("");
          if (p.empty()) bad("prompt", "'prompt' is required");
          if (field<bool>(b, "raw").value_or(false)) {
            prompt = m->tokenizer->encode(p, {.add_special = true});
          } else {
            json msgs = json::array();
            if (auto sys = field<std::string>(b, "system"))
              msgs.push_back({{"role", "system"}, {"content", *sys}});
            msgs.push_back({{"role", "user"}, {"content", p}});
            prompt = api.chat_prompt(*m, msgs, json(), json());
          }
        }
        GenerateRequest r;
        r.prompt = prompt;
        ollama_options(b, r, api, *m, prompt.size());
        const bool stream = field<bool>(b, "stream").value_or(true);
        const auto t0 = clk::now();
        auto ch = api.start(m, r);
        auto ns = [](double ms) { return int64_t(ms * 1e6); };
        auto final_obj = [=](const GenerateResult& g) {
          const double total_ms =
              std::chrono::duration<double, std::milli>(clk::now() - t0).count();
          json o = {{"model", *name}, {"created_at", iso_now()}};
          if (chat)
            o["message"] = {{"role", "assistant"}, {"content", ""}};
          else
            o["response"] = "";
          o["done"] = true;
          o["done_reason"] = finish_reason(g.stop_reason);
          o["total_duration"] = ns(total_ms);
          o["load_duration"] = 0;
          o["prompt_eval_count"] = g.n_prompt;
          o["prompt_eval_duration"] = ns(g.ttft_ms);
          o["eval_count"] = g.tokens.size();
          o["eval_duration"] = ns(std::max(0.0, total_ms - g.ttft_ms));
          return o;
        };
        if (!stream) {
          auto g = api.wait(ch);
          json o = final_obj(g);
          if (chat)
            o["message"]["content"] = g.text;
          else
            o["response"] = g.text;
          send_json(res, 200, o);
          api.metrics_.count_request(endpoint, 200);
          return;
        }
        api.metrics_.count_request(endpoint, 200);
        const std::string model_name = *name;
        res.set_chunked_content_provider(
            "application/x-ndjson",
            [&api, ch, chat, final_obj, model_name](size_t, httplib::DataSink& sink) {
              std::vector<std::shared_ptr<Channel>> chans{ch};
              auto on_text = [&](size_t, const std::string& t) {
                json o = {{"model", model_name}, {"created_at", iso_now()}};
                if (chat)
                  o["message"] = {{"role", "assistant"}, {"content", t}};
                else
                  o["response"] = t;
                o["done"] = false;
                return o.dump() + "\n";
              };
              auto on_done = [&](size_t, const GenerateResult& g) {
                if (g.stop_reason.rfind("error", 0) == 0)
                  return json{{"error", g.stop_reason}}.dump() + "\n";
                return final_obj(g).dump() + "\n";
              };
              if (!pump(api, chans, sink, on_text, on_done)) return false;
              sink.done();
              return true;
            },
            [&api, ch](bool success) {
              if (!success) api.loop_.cancel(ch);
            });
      } catch (const ApiError& e) {
        api.metrics_.count_request(endpoint, e.status);
        send_json(res, e.status, {{"error", e.message}});
      }
    };
  };
  svr.Post("/api/generate", generate(false));
  svr.Post("/api/chat", generate(true));
}

httplib::Server* g_server = nullptr;
void on_signal(int) {
  if (g_server) g_server->stop();
}

}  // namespace

int serve(const ServerConfig& cfg) {
  Api api(cfg);
  // Load the default model up front: /health reports ready once it is in.
  api.model(cfg.default_model);
  httplib::Server svr;
  svr.new_task_queue = [n = cfg.n_http_threads] { return new httplib::ThreadPool(size_t(n)); };
  svr.set_payload_max_length(cfg.max_body_bytes);
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);
  svr.set_pre_routing_handler([&cfg](const httplib::Request& req, httplib::Response& res) {
    if (cfg.api_key.empty() || req.path == "/health")
      return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + cfg.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_json(res, 401,
              openai_error(ApiError{401, "missing or wrong API key (Authorization: Bearer ...)",
                                    "authentication_error", "", "invalid_api_key"}));
    return httplib::Server::HandlerResponse::Handled;
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
        api.metrics_.count_request(req.path, 500);
        send_json(res, 500, openai_error(ApiError{500, msg, "server_error", "", "internal_error"}));
      });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404 && res.body.empty())
      send_json(res, 404,
                openai_error(ApiError{404, "no such endpoint: " + req.method + " " + req.path,
                                      "invalid_request_error", "", "not_found"}));
    else if (res.status == 413)
      send_json(res, 413,
                openai_error(ApiError{413, "the request body is too large", "invalid_request_error",
                                      "", "payload_too_large"}));
  });
  svr.Get("/health", [&api](const httplib::Request&, httplib::Response& res) {
    const bool ok = api.loop_.alive() && ModelPool::global().n_loaded() > 0;
    send_json(res, ok ? 200 : 503, {{"status", ok ? "ok" : "unavailable"}});
  });
  svr.Get("/metrics", [&api](const httplib::Request&, httplib::Response& res) {
    res.set_content(api.metrics_.render(api.loop_.gauges()), "text/plain; version=0.0.4");
  });
  register_openai(svr, api);
  register_ollama(svr, api);
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
