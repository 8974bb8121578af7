#include "server/llamacpp_api.h"

#include <algorithm>

#include "server/logprob_json.h"

namespace wick::server {

namespace {

constexpr size_t kMaxInfillFiles = 256;  // input_extra entries
constexpr int64_t kMaxProbs = 100;       // n_probs

const SamplingSpec kLlamaCppSampling = {
    .param_prefix = "",
    .defaults = {.temperature = 0.8f,
                 .top_k = 40,
                 .top_p = 0.95f,
                 .min_p = 0.05f,
                 .repeat_penalty = 1.0f,
                 .repeat_last_n = 64,
                 .presence_penalty = 0.0f,
                 .frequency_penalty = 0.0f},
    .has_repeat_last_n = true,
    .max_tokens_keys = {"n_predict"},
    .negative_max_tokens_is_no_limit = true,
    .max_tokens_error = "n_predict must be -1 (no limit) or in [1, 16777216]",
    .stop_key = "stop",
    .n_stop_max = 16,
};

std::string string_field(const json& b, const char* key) {
  if (!b.contains(key) || b[key].is_null()) return "";
  if (!b[key].is_string()) bad(key, fmt::format("'{}' must be a string", key), "invalid_type");
  return b[key].get<std::string>();
}

// /completion's prompt: text (special-token text parsed, as llama.cpp does) or token ids.
std::vector<int32_t> completion_prompt(const json& b, const ModelView& m) {
  if (!b.contains("prompt")) bad("prompt", "'prompt' is required", "missing_field");
  const json& p = b["prompt"];
  const std::vector<int32_t> ids =
      p.is_string()
          ? m.tokenizer.encode(p.get<std::string>(), {.add_special = true, .parse_special = true})
          : parse_token_ids(p, m, "prompt", "'prompt' must be a string or an array of token ids");
  if (ids.empty()) bad("prompt", "'prompt' is empty");
  return ids;
}

// /infill's: [files] PRE input_prefix SUF input_suffix MID prompt.
std::vector<int32_t> infill_prompt(const json& b, const ModelView& m) {
  std::vector<InfillFile> files;
  if (b.contains("input_extra") && !b["input_extra"].is_null()) {
    const json& extra = b["input_extra"];
    if (!extra.is_array() || extra.size() > kMaxInfillFiles)
      bad("input_extra",
          fmt::format("'input_extra' must be an array of at most {} {{filename, text}} objects",
                      kMaxInfillFiles),
          "invalid_type");
    for (size_t i = 0; i < extra.size(); ++i) {
      const std::string p = fmt::format("input_extra[{}]", i);
      if (!extra[i].is_object()) bad(p, p + " must be an object", "invalid_type");
      files.push_back({string_field(extra[i], "filename"), string_field(extra[i], "text")});
    }
  }
  return fim_prompt(m, "input_prefix", string_field(b, "input_prefix"),
                    string_field(b, "input_suffix"), string_field(b, "prompt"), files);
}

std::string stop_type(const std::string& stop_reason) {
  if (stop_reason == "eos") return "eos";
  if (stop_reason == "stop") return "word";
  if (stop_reason == "length" || stop_reason == "context") return "limit";
  return "none";
}

}  // namespace

LlamaCppRequest parse_llamacpp(const json& b, bool infill, const ModelView& m,
                               uint64_t random_seed) {
  LlamaCppRequest r;
  r.model = field<std::string>(b, "model").value_or("");
  r.stream = field<bool>(b, "stream").value_or(false);
  GenerateRequest& g = r.gen;
  const int64_t n_probs = field<int64_t>(b, "n_probs").value_or(0);
  if (n_probs < 0 || n_probs > kMaxProbs)
    bad("n_probs", fmt::format("n_probs must be in [0, {}]", kMaxProbs));
  if (n_probs > 0 && field<bool>(b, "post_sampling_probs").value_or(false))
    bad("post_sampling_probs",
        "post_sampling_probs is not answered: n_probs gives the model's log-probabilities "
        "before the samplers");
  if (n_probs > 0) g.top_logprobs = int32_t(n_probs);
  g.sampling = parse_sampling(b, kLlamaCppSampling, random_seed);
  g.prompt = infill ? infill_prompt(b, m) : completion_prompt(b, m);
  if (int64_t(g.prompt.size()) >= m.n_ctx)
    bad(infill ? "input_prefix" : "prompt",
        fmt::format("the prompt has {} tokens but the context holds {}", g.prompt.size(), m.n_ctx));
  parse_limits(b, kLlamaCppSampling, int64_t(m.n_ctx) - int64_t(g.prompt.size()), g);
  parse_token_controls(b, m, g);
  g.grammar = parse_grammar(b, FormatField::LlamaCppJsonSchema);
  return r;
}

json llamacpp_props(const LoadedModel& m, const std::string& model_path, int32_t n_ctx,
                    int32_t n_slots) {
  const SamplingParams& d = kLlamaCppSampling.defaults;
  const json params = {{"n_predict", -1},
                       {"temperature", d.temperature},
                       {"top_k", d.top_k},
                       {"top_p", d.top_p},
                       {"min_p", d.min_p},
                       {"repeat_last_n", d.repeat_last_n},
                       {"repeat_penalty", d.repeat_penalty},
                       {"presence_penalty", d.presence_penalty},
                       {"frequency_penalty", d.frequency_penalty},
                       {"stop", json::array()},
                       {"max_tokens", -1},
                       {"ignore_eos", false},
                       {"stream", true},
                       {"n_probs", 0},
                       {"grammar", ""},
                       {"samplers", {"penalties", "top_k", "top_p", "min_p", "temperature"}}};
  return {{"default_generation_settings",
           {{"id", 0},
            {"id_task", -1},
            {"n_ctx", n_ctx},
            {"is_processing", false},
            {"params", params}}},
          {"total_slots", n_slots},
          {"model_path", model_path},
          {"chat_template", m.tokenizer ? m.tokenizer->chat_template : ""},
          {"modalities", {{"vision", false}, {"audio", false}}},
          {"build_info", "wick 0.1.0"},
          {"is_sleeping", false}};
}

json llamacpp_probs(const Tokenizer& tk, std::span<const TokenLogprob> lps) {
  json out = logprob_entries(tk, lps);  // OpenAI's entries, with ids
  for (size_t i = 0; i < lps.size(); ++i) {
    out[i]["id"] = lps[i].id;
    for (size_t k = 0; k < lps[i].top.size(); ++k)
      out[i]["top_logprobs"][k]["id"] = lps[i].top[k].first;
  }
  return out;
}

json llamacpp_final(const std::string& model, std::chrono::steady_clock::time_point t0,
                    const GenerateResult& g, bool with_text, const Tokenizer& tk,
                    size_t first_prob) {
  const double total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const double prompt_ms = g.ttft_ms, predicted_ms = std::max(0.0, total_ms - g.ttft_ms);
  const auto n_predicted = int64_t(g.tokens.size());
  auto per_second = [](int64_t n, double ms) { return ms > 0 ? double(n) / ms * 1e3 : 0.0; };
  json o = {{"content", with_text ? g.text : ""},
            {"id_slot", 0},
            {"stop", true},
            {"model", model},
            {"tokens_predicted", n_predicted},
            {"tokens_evaluated", g.n_prompt},
            {"tokens_cached", g.n_reused},
            {"truncated", false},
            {"stop_type", stop_type(g.stop_reason)},
            {"stopping_word", ""},
            {"timings",
             {{"prompt_n", g.n_prefilled},
              {"prompt_ms", prompt_ms},
              {"prompt_per_second", per_second(g.n_prefilled, prompt_ms)},
              {"predicted_n", n_predicted},
              {"predicted_ms", predicted_ms},
              {"predicted_per_second", per_second(n_predicted, predicted_ms)}}}};
  if (first_prob < g.logprobs.size())  // n_probs was asked (a stream: tokens no text carried)
    o["completion_probabilities"] = llamacpp_probs(tk, std::span(g.logprobs).subspan(first_prob));
  return o;
}

std::string LlamaCppStream::text(size_t, const std::string& piece,
                                 const std::vector<TokenLogprob>& logprobs) {
  json o = {{"content", piece}, {"id_slot", 0}, {"stop", false}};
  if (!logprobs.empty()) {
    o["completion_probabilities"] = llamacpp_probs(*m_->tokenizer, logprobs);
    n_probs_sent_ += logprobs.size();
  }
  return "data: " + o.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string LlamaCppStream::done(size_t, const GenerateResult& g) {
  if (g.stop_reason.rfind("error", 0) == 0)
    return "data: " +
           json{{"error", {{"code", 500}, {"message", g.stop_reason}, {"type", "server_error"}}}}
               .dump() +
           "\n\n";
  return "data: " +
         llamacpp_final(model_, t0_, g, false, *m_->tokenizer, n_probs_sent_)
             .dump(-1, ' ', false, json::error_handler_t::replace) +
         "\n\n";
}

}  // namespace wick::server
