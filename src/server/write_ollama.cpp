#include "server/write_ollama.h"

#include <fmt/chrono.h>

#include <algorithm>
#include <filesystem>

#include "server/answer_parser.h"
#include "server/tool_output.h"
#include "server/write_openai.h"
#include "text/reasoning.h"

namespace wick::server {

namespace {

int64_t ns(double ms) {
  return int64_t(ms * 1e6);
}

json tag_entry(const std::string& name, int64_t n_bytes) {
  return {{"name", name + ":latest"},
          {"model", name + ":latest"},
          {"modified_at", iso_now()},
          {"size", n_bytes},
          {"digest", ""},
          {"details",
           {{"format", "gguf"},
            {"family", ""},
            {"families", json::array()},
            {"parameter_size", ""},
            {"quantization_level", ""}}}};
}

// The reply's first keys; text goes under message.content (chat) or response.
json head(bool chat, const std::string& model, const std::string& text) {
  json o = {{"model", model}, {"created_at", iso_now()}};
  if (chat)
    o["message"] = {{"role", "assistant"}, {"content", text}};
  else
    o["response"] = text;
  return o;
}

// Ollama's logprobs: chat completions' entries, at the top level, without
// top_logprobs when none were asked (Go's omitempty).
json ollama_logprobs(const Tokenizer& tk, std::span<const TokenLogprob> lps) {
  json out = logprob_entries(tk, lps);
  for (json& e : out)
    if (e["top_logprobs"].empty()) e.erase("top_logprobs");
  return out;
}

}  // namespace

std::string iso_now() {
  auto now = std::chrono::system_clock::now();
  auto secs = std::chrono::time_point_cast<std::chrono::seconds>(now);
  auto frac = std::chrono::duration_cast<std::chrono::microseconds>(now - secs).count();
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:06d}Z",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(now)), frac);
}

json ollama_error(const ApiError& e) {
  return {{"error", e.message}};
}

json ollama_version() {
  return {{"version", "0.1.0"}};
}

json ollama_tags(const std::vector<std::pair<std::string, int64_t>>& models) {
  json out = json::array();
  for (auto& [name, n_bytes] : models) out.push_back(tag_entry(name, n_bytes));
  return {{"models", out}};
}

json ollama_show(const LoadedModel& m) {
  const auto& c = m.model->config;
  std::string types;
  for (auto& [t, n] : m.model->n_params_by_dtype) types += (types.empty() ? "" : ",") + t;
  // as Ollama lists them: "tools" when the chat template renders tool markup
  json caps = json::array({"completion"});
  if (m.tool_format != ToolFormat::None) caps.push_back("tools");
  if (template_has_reasoning(m.tokenizer->chat_template)) caps.push_back("thinking");
  json show = {{"modelfile", ""},
               {"parameters", ""},
               {"template", m.tokenizer->chat_template},
               {"details",
                {{"format", m.model->format == ModelFormat::Gguf ? "gguf" : "safetensors"},
                 {"family", arch_name(c.arch)},
                 {"families", json::array({arch_name(c.arch)})},
                 {"parameter_size", fmt::format("{:.1f}M", double(m.model->n_params) / 1e6)},
                 {"quantization_level", types}}},
               {"model_info",
                {{"general.architecture", arch_name(c.arch)},
                 {"general.parameter_count", m.model->n_params},
                 {"context_length", c.n_ctx_train},
                 {"embedding_length", c.n_embd},
                 {"block_count", c.n_layer}}},
               {"capabilities", caps},
               {"tool_format", tool_format_name(m.tool_format)}};  // wick's: the markup found
  if (!m.model->adapters.empty()) {  // file names only: the server's paths stay its own
    json names = json::array();
    for (const auto& a : m.model->adapters)
      names.push_back(std::filesystem::path(a).filename().string());
    show["model_info"]["wick.lora_adapters"] = names;
  }
  return show;
}

json ollama_final(const OllamaRequest& r, Clock::time_point t0, const GenerateResult& g,
                  bool with_text) {
  const double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  json o;
  const ToolSetup tools = r.chat ? r.tools : ToolSetup{};
  if (with_text && (tools.format != ToolFormat::None || r.reasoning.split)) {
    const ParsedAnswer p = parse_answer(r.reasoning, tools, g.text, "call_");
    o = head(r.chat, r.model, p.content);
    if (!p.reasoning.empty()) (r.chat ? o["message"]["thinking"] : o["thinking"]) = p.reasoning;
    if (!p.calls.empty()) {
      json calls = json::array();
      for (const auto& c : p.calls) calls.push_back(ollama_tool_call(c));
      o["message"]["tool_calls"] = calls;
    }
  } else {
    o = head(r.chat, r.model, with_text ? g.text : "");
  }
  o["done"] = true;
  o["done_reason"] = finish_reason(g.stop_reason);
  o["total_duration"] = ns(total_ms);
  o["load_duration"] = 0;
  o["prompt_eval_count"] = g.n_prompt;
  o["prompt_eval_duration"] = ns(g.ttft_ms);
  o["eval_count"] = g.tokens.size();
  o["eval_duration"] = ns(std::max(0.0, total_ms - g.ttft_ms));
  SpecTotals spec;  // wick's extra
  spec.add(g);
  if (auto s = spec.to_json(); !s.is_null()) o["speculative"] = s;
  return o;
}

json ollama_response(const OllamaRequest& r, const Tokenizer& tk, Clock::time_point t0,
                     const GenerateResult& g) {
  json o = ollama_final(r, t0, g, true);
  if (r.gen.top_logprobs >= 0) o["logprobs"] = ollama_logprobs(tk, g.logprobs);
  return o;
}

OllamaStream::OllamaStream(const OllamaRequest& r, std::shared_ptr<const LoadedModel> model,
                           Clock::time_point t0)
    : req_(r), model_(std::move(model)), t0_(t0) {
  req_.gen.prompt.clear();
  const ToolSetup tools = r.chat ? r.tools : ToolSetup{};
  if (tools.format != ToolFormat::None || r.reasoning.split)
    parser_ = std::make_unique<AnswerParser>(r.reasoning, tools, "call_");
}

void OllamaStream::take_logprobs(json& o) {
  if (req_.gen.top_logprobs < 0 || pending_.empty()) return;
  o["logprobs"] = ollama_logprobs(*model_->tokenizer, pending_);
  pending_.clear();
}

std::string OllamaStream::lines(const std::vector<AnswerEvent>& evs) {
  std::string out;
  for (const AnswerEvent& e : evs) {
    json o;
    if (e.kind == AnswerEvent::Kind::Reasoning) {
      o = head(req_.chat, req_.model, "");
      (req_.chat ? o["message"]["thinking"] : o["thinking"]) = e.text;
    } else if (e.kind == AnswerEvent::Kind::Content) {
      o = head(req_.chat, req_.model, e.text);
    } else {
      if (!req_.tools.parallel && e.index > 0) continue;
      o = head(true, req_.model, "");
      o["message"]["tool_calls"] = json::array({ollama_tool_call(parser_->calls()[e.index])});
      ++n_calls_;
    }
    take_logprobs(o);
    o["done"] = false;
    out += o.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  }
  return out;
}

std::string OllamaStream::text(size_t, const std::string& piece,
                               const std::vector<TokenLogprob>& logprobs) {
  pending_.insert(pending_.end(), logprobs.begin(), logprobs.end());
  n_logprobs_seen_ += logprobs.size();
  if (parser_) return lines(parser_->push(piece));
  return lines({AnswerEvent{.kind = AnswerEvent::Kind::Content, .text = piece}});
}

std::string OllamaStream::done(size_t, const GenerateResult& g) {
  if (g.stop_reason.rfind("error", 0) == 0) return json{{"error", g.stop_reason}}.dump() + "\n";
  std::string out = parser_ ? lines(parser_->finish()) : "";
  // tokens whose text never came (an end-of-generation token, a stop string)
  for (size_t k = n_logprobs_seen_; k < g.logprobs.size(); ++k) pending_.push_back(g.logprobs[k]);
  json last = ollama_final(req_, t0_, g, false);
  take_logprobs(last);
  return out + last.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace wick::server
