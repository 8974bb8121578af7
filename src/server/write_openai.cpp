#include "server/write_openai.h"

#include <algorithm>
#include <chrono>
#include <span>

#include "server/answer_parser.h"
#include "server/tool_output.h"

namespace wick::server {

namespace {

std::string token_text(const Tokenizer& tk, int32_t id) {
  return tk.decode(std::vector<int32_t>{id}, false);
}

// OpenAI's logprobs objects: chat {"content": [...]}, completions {tokens,
// token_logprobs, top_logprobs, text_offset}; offset: the text before lps
// (streamed chunks go on from it).
json logprobs_json(const Tokenizer& tk, std::span<const TokenLogprob> lps, bool chat,
                   size_t& offset) {
  if (chat) return {{"content", logprob_entries(tk, lps)}, {"refusal", nullptr}};
  auto text_of = [&](int32_t id) { return token_text(tk, id); };
  json tokens = json::array(), values = json::array(), tops = json::array(), offs = json::array();
  for (auto& t : lps) {
    const std::string s = text_of(t.id);
    tokens.push_back(s);
    values.push_back(t.logprob);
    json top = json::object();
    for (auto& [id, lp] : t.top) top[text_of(id)] = lp;
    tops.push_back(top);
    offs.push_back(offset);
    offset += s.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", values},
          {"top_logprobs", tops},
          {"text_offset", offs}};
}

// vLLM's prompt_logprobs: per prompt token null (the first; one taken from
// the span cache) or {"<id>": {logprob, rank, decoded_token}} for the token
// and its top alternatives.
json prompt_logprobs_json(const Tokenizer& tk, const GenerateResult& g) {
  json out = json::array();
  auto entry = [&](int32_t id, float lp, json rank) {
    return json{{"logprob", lp},
                {"rank", rank},
                {"decoded_token", tk.decode(std::vector<int32_t>{id}, false)}};
  };
  for (const auto& t : g.prompt_logprobs) {
    if (!t) {
      out.push_back(nullptr);
      continue;
    }
    json e = json::object();
    for (size_t j = 0; j < t->top.size(); ++j)
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

json logprob_entries(const Tokenizer& tk, std::span<const TokenLogprob> lps) {
  auto bytes_of = [](const std::string& t) {
    json b = json::array();
    for (unsigned char c : t) b.push_back(int(c));
    return b;
  };
  json out = json::array();
  for (auto& t : lps) {
    json top = json::array();
    for (auto& [id, lp] : t.top) {
      const std::string s = token_text(tk, id);
      top.push_back({{"token", s}, {"logprob", lp}, {"bytes", bytes_of(s)}});
    }
    const std::string s = token_text(tk, t.id);
    out.push_back(
        {{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return out;
}

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
    size_t offset = 0;
    const json lp =
        r.gen.top_logprobs >= 0 ? logprobs_json(tk, g.logprobs, r.chat, offset) : json();
    std::string finish = finish_reason(g.stop_reason);
    if (r.chat) {
      const ParsedAnswer p = parse_answer(r.reasoning, r.tools, g.text, call_id_prefix(meta, i));
      json message = {{"role", "assistant"}, {"content", p.content}};
      if (!p.reasoning.empty()) message["reasoning_content"] = p.reasoning;
      if (!p.calls.empty()) {  // content null when the answer is only calls
        if (p.content.empty()) message["content"] = nullptr;
        message["tool_calls"] = json::array();
        for (const auto& c : p.calls) message["tool_calls"].push_back(openai_tool_call(c));
        if (finish == "stop") finish = "tool_calls";
      }
      choices.push_back(
          {{"index", i}, {"message", message}, {"logprobs", lp}, {"finish_reason", finish}});
    } else
      choices.push_back({{"index", i},
                         {"text", g.text},
                         {"logprobs", lp},
                         {"finish_reason", finish_reason(g.stop_reason)}});
    if (!r.chat && r.gen.prompt_logprobs >= 0)  // each choice its prompt (vLLM's place)
      choices.back()["prompt_logprobs"] = prompt_logprobs_json(tk, g);
  }
  json usage = usage_json(n_prompt, n_gen);
  int64_t cached = 0;  // counted once, like the prompt
  for (const auto& g : results) cached = std::max<int64_t>(cached, g.n_reused);
  usage["prompt_tokens_details"] = {{"cached_tokens", cached}};
  add_span_usage(usage, results);
  SpecTotals spec;
  for (const auto& g : results) spec.add(g);
  if (auto s = spec.to_json(); !s.is_null()) usage["speculative"] = s;
  json out = {{"id", meta.id},           {"object", r.chat ? "chat.completion" : "text_completion"},
              {"created", meta.created}, {"model", meta.model},
              {"choices", choices},      {"usage", usage}};
  if (r.chat && r.gen.prompt_logprobs >= 0 && !results.empty())  // one prompt: at the top
    out["prompt_logprobs"] = prompt_logprobs_json(tk, results.front());
  return out;
}

OpenAiStream::OpenAiStream(const OpenAiRequest& r, OpenAiMeta meta,
                           std::shared_ptr<const LoadedModel> model)
    : chat_(r.chat),
      usage_in_stream_(r.usage_in_stream),
      logprobs_(r.gen.top_logprobs >= 0),
      tools_(r.chat ? r.tools : ToolSetup{}),
      meta_(std::move(meta)),
      model_(std::move(model)),
      choices_(size_t(r.n_choices) * (r.more_prompts.size() + 1)) {
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
  if (c.parser) return out + events(i, c.parser->push(piece));
  return out + events(i, {AnswerEvent{.kind = AnswerEvent::Kind::Content, .text = piece}});
}

std::string OpenAiStream::done(size_t i, const GenerateResult& r) {
  Choice& c = choices_[i];
  n_prompt_ = r.n_prompt;
  n_gen_ += int64_t(r.tokens.size());
  spec_.add(r);
  n_cached_ = std::max<int64_t>(n_cached_, r.n_reused);
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
  if (c.parser) out += events(i, c.parser->finish());
  // tokens whose text never came (an end-of-generation token, a stop string)
  for (size_t k = c.n_logprobs_seen; k < r.logprobs.size(); ++k) c.pending.push_back(r.logprobs[k]);
  std::string finish = finish_reason(r.stop_reason);
  if (c.n_calls > 0 && finish == "stop") finish = "tool_calls";
  return out + chunk(i, chat_ ? json::object() : json(""), finish, take_logprobs(i));
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
