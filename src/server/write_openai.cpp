#include "server/write_openai.h"

#include <algorithm>
#include <chrono>
#include <span>

#include "server/answer_parser.h"
#include "server/tool_output.h"

namespace wick::server {

namespace {

// Completions' logprobs object {tokens, token_logprobs, top_logprobs,
// text_offset}, a token at a time; offset: the text before the next token.
struct CompletionLogprobs {
  json tokens = json::array(), values = json::array(), tops = json::array(),
       offsets = json::array();
  // t null: a token with none (echo's first prompt token, or one taken from the span cache)
  void add(const Tokenizer& tk, int32_t id, const TokenLogprob* t, size_t n_top, size_t& offset) {
    const std::string s = token_text(tk, id);
    tokens.push_back(s);
    values.push_back(t ? json(t->logprob) : json());
    json top = t ? json::object() : json();
    if (t)
      for (size_t j = 0; j < std::min(n_top, t->top.size()); ++j)
        top[token_text(tk, t->top[j].first)] = t->top[j].second;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += s.size();
  }
  json to_json() const {
    return {{"tokens", tokens},
            {"token_logprobs", values},
            {"top_logprobs", tops},
            {"text_offset", offsets}};
  }
};

// OpenAI's logprobs objects: chat {"content": [...]}, completions {tokens,
// token_logprobs, top_logprobs, text_offset}; offset: the text before lps
// (streamed chunks go on from it).
json logprobs_json(const Tokenizer& tk, std::span<const TokenLogprob> lps, bool chat,
                   size_t& offset) {
  if (chat) return {{"content", logprob_entries(tk, lps)}, {"refusal", nullptr}};
  CompletionLogprobs out;
  for (const auto& t : lps) out.add(tk, t.id, &t, t.top.size(), offset);
  return out.to_json();
}

// An echoed completion's logprobs: the prompt's tokens (from the prompt
// logprobs; the first has none), then the generated ones unless the
// prompt alone was asked for. Offsets index the echoed text.
json echo_logprobs_json(const Tokenizer& tk, const OpenAiRequest& r,
                        std::span<const int32_t> prompt, const std::string& echo_text,
                        const GenerateResult& g) {
  CompletionLogprobs out;
  const size_t n_top = size_t(std::max(r.gen.top_logprobs, 0));
  size_t offset = 0;
  for (size_t j = 0; j < prompt.size(); ++j) {
    const bool has = j < g.prompt_logprobs.size() && g.prompt_logprobs[j];
    out.add(tk, prompt[j], has ? &*g.prompt_logprobs[j] : nullptr, n_top, offset);
  }
  offset = echo_text.size();
  if (!r.echo.prompt_only)
    for (const auto& t : g.logprobs) out.add(tk, t.id, &t, t.top.size(), offset);
  return out.to_json();
}

// vLLM's prompt_logprobs: per prompt token null (the first; one taken from
// the span cache) or {"<id>": {logprob, rank, decoded_token}} for the token
// and its top alternatives.
json prompt_logprobs_json(const Tokenizer& tk, const GenerateResult& g, size_t n_top) {
  json out = json::array();
  auto entry = [&](int32_t id, float lp, json rank) {
    return json{{"logprob", lp}, {"rank", rank}, {"decoded_token", token_text(tk, id)}};
  };
  for (const auto& t : g.prompt_logprobs) {
    if (!t) {
      out.push_back(nullptr);
      continue;
    }
    json e = json::object();
    for (size_t j = 0; j < std::min(n_top, t->top.size()); ++j)
      e[std::to_string(t->top[j].first)] = entry(t->top[j].first, t->top[j].second, j + 1);
    e[std::to_string(t->id)] = entry(t->id, t->logprob, t->rank);
    out.push_back(std::move(e));
  }
  return out;
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

std::string call_id_prefix(const OpenAiMeta& meta, size_t choice) {
  return fmt::format("call_{}_{}_", meta.id.substr(meta.id.find('-') + 1), choice);
}

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

json openai_model(const std::string& name) {
  return {{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "wick"}};
}

json openai_models(const std::vector<std::string>& names) {
  json data = json::array();
  for (auto& n : names) data.push_back(openai_model(n));
  return {{"object", "list"}, {"data", data}};
}

json openai_response(const OpenAiRequest& r, const OpenAiMeta& meta,
                     const std::vector<GenerateResult>& results, const Tokenizer& tk) {
  json choices = json::array();
  int64_t n_gen = 0;
  // the prompt_logprobs field as asked (echo may have the engine compute more)
  const int32_t n_prompt_top =
      !r.chat && r.echo.on() ? r.echo.prompt_logprobs : r.gen.prompt_logprobs;
  for (size_t i = 0; i < results.size(); ++i) {
    const GenerateResult& g = results[i];
    n_gen += r.echo.prompt_only ? 0 : int64_t(g.tokens.size());
    size_t offset = 0;
    json lp = r.gen.top_logprobs >= 0 ? logprobs_json(tk, g.logprobs, r.chat, offset) : json();
    std::string finish = finish_reason(g.stop_reason);
    if (r.chat) {
      const ParsedAnswer p = parse_answer(r.reasoning, r.tools, g.text, call_id_prefix(meta, i));
      const std::string content = (r.echo.on() ? r.echo.texts[0] : "") + p.content;
      json message = {{"role", "assistant"}, {"content", content}};
      if (!p.reasoning.empty()) message["reasoning_content"] = p.reasoning;
      if (!p.calls.empty()) {  // content null when the answer is only calls
        if (content.empty()) message["content"] = nullptr;
        message["tool_calls"] = json::array();
        for (const auto& c : p.calls) message["tool_calls"].push_back(openai_tool_call(c));
        if (finish == "stop") finish = "tool_calls";
      }
      choices.push_back(
          {{"index", i}, {"message", message}, {"logprobs", lp}, {"finish_reason", finish}});
    } else {
      std::string text = g.text;
      if (r.echo.on()) {  // each choice after its own prompt
        const size_t k = i / size_t(r.n_choices);
        const std::vector<int32_t>& prompt = k == 0 ? r.gen.prompt : r.more_prompts[k - 1];
        text = r.echo.texts[k] + (r.echo.prompt_only ? "" : g.text);
        if (r.gen.top_logprobs >= 0) lp = echo_logprobs_json(tk, r, prompt, r.echo.texts[k], g);
        if (r.echo.prompt_only) finish = "length";
      }
      choices.push_back(
          {{"index", i}, {"text", text}, {"logprobs", lp}, {"finish_reason", finish}});
    }
    if (!r.chat && n_prompt_top >= 0)  // each choice its prompt (vLLM's place)
      choices.back()["prompt_logprobs"] = prompt_logprobs_json(tk, g, size_t(n_prompt_top));
  }
  // each prompt counted once (its choices share it), every prompt of a list
  std::vector<int64_t> prompt_tokens(r.more_prompts.size() + 1), cached(prompt_tokens.size());
  for (size_t i = 0; i < results.size(); ++i) {
    const size_t k = std::min(i / size_t(r.n_choices), prompt_tokens.size() - 1);
    prompt_tokens[k] = results[i].n_prompt;
    cached[k] = std::max<int64_t>(cached[k], results[i].n_reused);
  }
  int64_t n_prompt = 0, n_cached = 0;
  for (size_t k = 0; k < prompt_tokens.size(); ++k)
    n_prompt += prompt_tokens[k], n_cached += cached[k];
  json usage = usage_json(n_prompt, n_gen);
  usage["prompt_tokens_details"] = {{"cached_tokens", n_cached}};
  add_span_usage(usage, results);
  SpecTotals spec;
  for (const auto& g : results) spec.add(g);
  if (auto s = spec.to_json(); !s.is_null()) usage["speculative"] = s;
  json out = {{"id", meta.id},           {"object", r.chat ? "chat.completion" : "text_completion"},
              {"created", meta.created}, {"model", meta.model},
              {"choices", choices},      {"usage", usage}};
  if (r.chat && n_prompt_top >= 0 && !results.empty())  // one prompt: at the top
    out["prompt_logprobs"] = prompt_logprobs_json(tk, results.front(), size_t(n_prompt_top));
  return out;
}

OpenAiStream::OpenAiStream(const OpenAiRequest& r, OpenAiMeta meta,
                           std::shared_ptr<const LoadedModel> model)
    : chat_(r.chat),
      usage_in_stream_(r.usage_in_stream),
      logprobs_(r.gen.top_logprobs >= 0),
      tools_(r.chat ? r.tools : ToolSetup{}),
      echo_(r.echo),
      n_choices_(r.n_choices),
      meta_(std::move(meta)),
      model_(std::move(model)),
      choices_(size_t(r.n_choices) * (r.more_prompts.size() + 1)),
      prompt_tokens_(r.more_prompts.size() + 1),
      cached_(r.more_prompts.size() + 1) {
  const ReasoningSetup reasoning = r.chat ? r.reasoning : ReasoningSetup{};
  if (tools_.format != ToolFormat::None || reasoning.split)
    for (size_t i = 0; i < choices_.size(); ++i)
      choices_[i].parser =
          std::make_unique<AnswerParser>(reasoning, tools_, call_id_prefix(meta_, i));
}

std::string OpenAiStream::chunk(size_t i, const json& delta_or_text, const json& finish,
                                const json& logprobs) const {
  json c = {{"id", meta_.id},
            {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
            {"created", meta_.created},
            {"model", meta_.model}};
  c["choices"] = json::array({{{"index", i},
                               {chat_ ? "delta" : "text", delta_or_text},
                               {"logprobs", logprobs},
                               {"finish_reason", finish}}});
  return "data: " + c.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string OpenAiStream::echo_chunk(size_t i) {
  Choice& c = choices_[i];
  if (!echo_.on() || c.echoed) return "";
  c.echoed = true;
  const std::string& text = echo_.texts[chat_ ? 0 : i / size_t(n_choices_)];
  return chunk(i, chat_ ? json{{"content", text}} : json(text), nullptr);
}

json OpenAiStream::take_logprobs(size_t i) {
  Choice& c = choices_[i];
  if (!logprobs_ || c.pending.empty()) return nullptr;
  json lp = logprobs_json(*model_->tokenizer, c.pending, chat_, c.text_offset);
  c.pending.clear();
  return lp;
}

std::string OpenAiStream::events(size_t i, const std::vector<AnswerEvent>& evs) {
  Choice& c = choices_[i];
  std::string out;
  for (const AnswerEvent& e : evs) {
    if (e.kind == AnswerEvent::Kind::Reasoning) {
      out += chunk(i, {{"reasoning_content", e.text}}, nullptr, take_logprobs(i));
      continue;
    }
    if (e.kind == AnswerEvent::Kind::Content) {
      out += chunk(i, chat_ ? json{{"content", e.text}} : json(e.text), nullptr, take_logprobs(i));
      continue;
    }
    if (!tools_.parallel && e.index > 0) continue;  // parallel_tool_calls: false
    const ToolCall& call = c.parser->calls()[e.index];
    out += chunk(i, {{"tool_calls", json::array({openai_call_start(call, c.n_calls)})}}, nullptr,
                 take_logprobs(i));
    out +=
        chunk(i, {{"tool_calls", json::array({openai_call_arguments(call, c.n_calls)})}}, nullptr);
    ++c.n_calls;
  }
  return out;
}

std::string OpenAiStream::text(size_t i, const std::string& piece,
                               const std::vector<TokenLogprob>& logprobs) {
  Choice& c = choices_[i];
  c.pending.insert(c.pending.end(), logprobs.begin(), logprobs.end());
  c.n_logprobs_seen += logprobs.size();
  std::string out;
  if (chat_ && !c.started) {
    c.started = true;
    out += chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr);
  }
  out += echo_chunk(i);
  if (echo_.prompt_only) return out;  // the engine's one token is not the answer's
  if (c.parser) return out + events(i, c.parser->push(piece));
  return out + events(i, {AnswerEvent{.kind = AnswerEvent::Kind::Content, .text = piece}});
}

std::string OpenAiStream::done(size_t i, const GenerateResult& r) {
  Choice& c = choices_[i];
  const size_t k = std::min(i / size_t(n_choices_), prompt_tokens_.size() - 1);
  prompt_tokens_[k] = r.n_prompt;
  cached_[k] = std::max<int64_t>(cached_[k], r.n_reused);
  n_gen_ += echo_.prompt_only ? 0 : int64_t(r.tokens.size());
  spec_.add(r);
  std::string out;
  if (chat_ && !c.started) out += chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr);
  if (r.stop_reason.rfind("error", 0) == 0)
    return out + "data: " +
           json{{"error",
                 {{"message", r.stop_reason},
                  {"type", "server_error"},
                  {"param", nullptr},
                  {"code", nullptr}}}}
               .dump() +
           "\n\n";
  out += echo_chunk(i);
  if (c.parser) out += events(i, c.parser->finish());
  // tokens whose text never came (an end-of-generation token, a stop string)
  for (size_t k = c.n_logprobs_seen; k < r.logprobs.size(); ++k) c.pending.push_back(r.logprobs[k]);
  std::string finish = echo_.prompt_only ? "length" : finish_reason(r.stop_reason);
  if (c.n_calls > 0 && finish == "stop") finish = "tool_calls";
  return out + chunk(i, chat_ ? json::object() : json(""), finish, take_logprobs(i));
}

std::string OpenAiStream::end() {
  std::string tail;
  int64_t n_prompt = 0, n_cached = 0;
  for (size_t k = 0; k < prompt_tokens_.size(); ++k)
    n_prompt += prompt_tokens_[k], n_cached += cached_[k];
  json usage = usage_json(n_prompt, n_gen_);
  usage["prompt_tokens_details"] = {{"cached_tokens", n_cached}};
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
