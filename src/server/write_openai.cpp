#include "server/write_openai.h"

#include <algorithm>
#include <chrono>

namespace wick::server {

namespace {

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

json usage_json(int64_t n_prompt, int64_t n_gen) {
  return {{"prompt_tokens", n_prompt},
          {"completion_tokens", n_gen},
          {"total_tokens", n_prompt + n_gen}};
}

// wick's extras for a request with spans (summed over its choices): the
// span cache's hits and misses and the span tokens reused and computed again.
void add_span_usage(json& usage, const std::vector<GenerateResult>& results) {
  int64_t hits = 0, misses = 0, reused = 0, recomputed = 0, cached = 0;
  for (const auto& g : results) {
    hits += g.n_span_hits, misses += g.n_span_misses;
    reused += g.n_span_reused, recomputed += g.n_span_recomputed;
    cached += g.n_reused;
  }
  if (hits + misses == 0) return;
  usage["prompt_tokens_details"] = {{"cached_tokens", cached}};
  usage["span_cache"] = {{"hits", hits},
                         {"misses", misses},
                         {"tokens_reused", reused},
                         {"tokens_recomputed", recomputed}};
}

}  // namespace

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json openai_error(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json() : json(e.param)},
            {"code", e.code.empty() ? json() : json(e.code)}}}};
}

json openai_models(const std::vector<std::string>& names) {
  json data = json::array();
  for (auto& n : names)
    data.push_back({{"id", n}, {"object", "model"}, {"created", 0}, {"owned_by", "wick"}});
  return {{"object", "list"}, {"data", data}};
}

json openai_response(const OpenAiRequest& r, const OpenAiMeta& meta,
                     const std::vector<GenerateResult>& results, const Tokenizer& tk) {
  json choices = json::array();
  int64_t n_prompt = 0, n_gen = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const GenerateResult& g = results[i];
    n_prompt = g.n_prompt;
    n_gen += int64_t(g.tokens.size());
    const json lp = r.gen.top_logprobs >= 0 ? logprobs_json(tk, g, r.chat) : json();
    if (r.chat)
      choices.push_back({{"index", i},
                         {"message", {{"role", "assistant"}, {"content", g.text}}},
                         {"logprobs", lp},
                         {"finish_reason", finish_reason(g.stop_reason)}});
    else
      choices.push_back({{"index", i},
                         {"text", g.text},
                         {"logprobs", lp},
                         {"finish_reason", finish_reason(g.stop_reason)}});
  }
  json usage = usage_json(n_prompt, n_gen);
  int64_t cached = 0;  // counted once, like the prompt
  for (const auto& g : results) cached = std::max<int64_t>(cached, g.n_reused);
  usage["prompt_tokens_details"] = {{"cached_tokens", cached}};
  add_span_usage(usage, results);
  SpecTotals spec;
  for (const auto& g : results) spec.add(g);
  if (auto s = spec.to_json(); !s.is_null()) usage["speculative"] = s;
  return {{"id", meta.id},           {"object", r.chat ? "chat.completion" : "text_completion"},
          {"created", meta.created}, {"model", meta.model},
          {"choices", choices},      {"usage", usage}};
}

OpenAiStream::OpenAiStream(const OpenAiRequest& r, OpenAiMeta meta)
    : chat_(r.chat),
      usage_in_stream_(r.usage_in_stream),
      meta_(std::move(meta)),
      started_(size_t(r.n_choices) * (r.more_prompts.size() + 1), false) {}

std::string OpenAiStream::chunk(size_t i, const json& delta_or_text, const json& finish) const {
  json c = {{"id", meta_.id},
            {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
            {"created", meta_.created},
            {"model", meta_.model}};
  c["choices"] = json::array({{{"index", i},
                               {chat_ ? "delta" : "text", delta_or_text},
                               {"logprobs", nullptr},
                               {"finish_reason", finish}}});
  return "data: " + c.dump() + "\n\n";
}

std::string OpenAiStream::text(size_t i, const std::string& piece) {
  std::string out;
  if (chat_ && !started_[i]) {
    started_[i] = true;
    out += chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr);
  }
  return out + chunk(i, chat_ ? json{{"content", piece}} : json(piece), nullptr);
}

std::string OpenAiStream::done(size_t i, const GenerateResult& r) {
  n_prompt_ = r.n_prompt;
  n_gen_ += int64_t(r.tokens.size());
  spec_.add(r);
  n_cached_ = std::max<int64_t>(n_cached_, r.n_reused);
  std::string out;
  if (chat_ && !started_[i]) out += chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr);
  if (r.stop_reason.rfind("error", 0) == 0)
    return out + "data: " +
           json{{"error",
                 {{"message", r.stop_reason},
                  {"type", "server_error"},
                  {"param", nullptr},
                  {"code", nullptr}}}}
               .dump() +
           "\n\n";
  return out + chunk(i, chat_ ? json::object() : json(""), finish_reason(r.stop_reason));
}

std::string OpenAiStream::end() {
  std::string tail;
  json usage = usage_json(n_prompt_, n_gen_);
  usage["prompt_tokens_details"] = {{"cached_tokens", n_cached_}};
  if (auto s = spec_.to_json(); !s.is_null()) usage["speculative"] = s;
  if (usage_in_stream_)
    tail += "data: " +
            json{{"id", meta_.id},
                 {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                 {"created", meta_.created},
                 {"model", meta_.model},
                 {"choices", json::array()},
                 {"usage", usage}}
                .dump() +
            "\n\n";
  return tail + "data: [DONE]\n\n";
}

}  // namespace wick::server
