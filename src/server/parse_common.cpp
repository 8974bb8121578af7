#include "server/parse_common.h"

#include <algorithm>
#include <cmath>

#include "grammar/json_schema.h"
#include "text/json_scan.h"
#include "text/reasoning.h"
#include "text/utf8.h"

namespace wick::server {

namespace {

// Offset of the first '[' or '{' nested deeper than max_depth (strings
// skipped), or npos: checked before parsing, so no deep tree is ever built.
size_t find_too_deep(std::string_view s, size_t max_depth) {
  return find_json_bracket(s, 0, [&](size_t i, size_t depth) {
    return (s[i] == '[' || s[i] == '{') && depth > max_depth;
  });
}

}  // namespace

void bad(const std::string& param, const std::string& msg, const std::string& code) {
  throw ApiError{400, msg, "invalid_request_error", param, code};
}

json parse_body(std::string_view body) {
  if (const size_t at = utf8::find_invalid(body); at != std::string_view::npos)
    bad("", fmt::format("the request body is not valid UTF-8 (byte offset {})", at),
        "invalid_utf8");
  if (const size_t at = find_too_deep(body, kMaxJsonDepth); at != std::string_view::npos)
    bad("",
        fmt::format("the request body nests deeper than {} levels (byte offset {})", kMaxJsonDepth,
                    at),
        "json_too_deep");
  try {
    json j = json::parse(body);
    if (!j.is_object()) bad("", "the request body must be a JSON object", "invalid_json");
    return j;
  } catch (const json::exception& e) {  // a syntax error, or a number past a double (out_of_range)
    bad("", std::string("the request body is not valid JSON: ") + e.what(), "invalid_json");
  }
}

SamplingParams parse_sampling(const json& obj, const SamplingSpec& spec, uint64_t random_seed) {
  const SamplingParams& d = spec.defaults;
  SamplingParams s;
  s.temperature = float(field<double>(obj, "temperature").value_or(d.temperature));
  s.top_p = float(field<double>(obj, "top_p").value_or(d.top_p));
  s.top_k = int32_t(field<int64_t>(obj, "top_k").value_or(d.top_k));
  s.min_p = float(field<double>(obj, "min_p").value_or(d.min_p));
  s.repeat_penalty = float(field<double>(obj, "repeat_penalty").value_or(d.repeat_penalty));
  s.repeat_last_n = d.repeat_last_n;
  if (spec.has_repeat_last_n)
    s.repeat_last_n = int32_t(field<int64_t>(obj, "repeat_last_n").value_or(d.repeat_last_n));
  s.presence_penalty = float(field<double>(obj, "presence_penalty").value_or(d.presence_penalty));
  s.frequency_penalty =
      float(field<double>(obj, "frequency_penalty").value_or(d.frequency_penalty));
  const auto seed = field<int64_t>(obj, "seed");
  s.seed = seed ? uint64_t(*seed) : random_seed;
  if (s.repeat_last_n == -1) s.repeat_last_n = 0;  // Ollama's "the whole history"
  const std::string& pre = spec.param_prefix;
  if (s.temperature > spec.max_temperature)
    bad(pre + "temperature", fmt::format("temperature must be in [0, {}]", spec.max_temperature));
  const float pen = spec.max_abs_penalty;
  if (std::fabs(s.presence_penalty) > pen)
    bad(pre + "presence_penalty", fmt::format("presence_penalty must be in [{}, {}]", -pen, pen));
  if (std::fabs(s.frequency_penalty) > pen)
    bad(pre + "frequency_penalty", fmt::format("frequency_penalty must be in [{}, {}]", -pen, pen));
  if (auto err = s.validate(); !err.empty()) bad(pre + err.substr(0, err.find(' ')), err);
  return s;
}

void parse_limits(const json& obj, const SamplingSpec& spec, int64_t room, GenerateRequest& r) {
  std::optional<int64_t> asked;
  for (const char* key : spec.max_tokens_keys)
    if ((asked = field<int64_t>(obj, key))) break;
  // The error names the first key the body has (even as null), as clients sent it.
  const char* key = spec.max_tokens_keys.back();
  for (const char* k : spec.max_tokens_keys)
    if (obj.contains(k)) {
      key = k;
      break;
    }
  const int64_t lowest = spec.negative_max_tokens_is_no_limit ? -2 : 1;
  if (asked && (*asked < lowest || *asked == 0 || *asked > kMaxTokensAsked))
    bad(spec.param_prefix + key, spec.max_tokens_error);
  const bool no_limit = !asked || *asked < 0;
  r.max_tokens = int32_t(no_limit ? room : std::min<int64_t>(*asked, room));
  r.stop = parse_stop(obj, spec.stop_key, spec.n_stop_max);
}

std::vector<int32_t> parse_token_ids(const json& arr, const ModelView& m, const std::string& param,
                                     const std::string& type_error) {
  if (!arr.is_array()) bad(param, type_error, "invalid_type");
  const int32_t n_vocab = m.tokenizer.n_vocab();
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const json& x : arr) {
    // Checked one by one: a float or a string is a 400, not a conversion error.
    if (!x.is_number_integer()) bad(param, type_error, "invalid_type");
    const int64_t id = x.get<int64_t>();
    if (id < 0 || id >= n_vocab)
      bad(param, fmt::format("token id {} is outside the vocabulary [0, {})", id, n_vocab));
    ids.push_back(int32_t(id));
  }
  return ids;
}

std::vector<int32_t> fim_prompt(const ModelView& m, const std::string& param,
                                const std::string& prefix, const std::string& suffix,
                                const std::string& middle, const std::vector<InfillFile>& files) {
  const auto fim = find_fim_tokens(m.tokenizer);
  if (!fim)
    bad(param,
        fmt::format("'{}' has no fill-in-the-middle tokens (a code model's "
                    "<|fim_prefix|>, <fim_prefix>, ...) to write between a prefix and a suffix",
                    m.name));
  return infill_prompt(m.tokenizer, *fim, prefix, suffix, middle, files);
}

int32_t parse_top_logprobs(const json& obj) {
  const auto n_top = field<int64_t>(obj, "top_logprobs");
  if (n_top && (*n_top < 0 || *n_top > 20)) bad("top_logprobs", "top_logprobs must be in [0, 20]");
  if (field<bool>(obj, "logprobs").value_or(false)) return int32_t(n_top.value_or(0));
  if (n_top) bad("top_logprobs", "top_logprobs needs logprobs: true");
  return -1;
}

void parse_spec(const json& obj, const std::string& param_prefix, GenerateRequest& r) {
  if (auto m = field<std::string>(obj, "spec")) {
    auto method = spec_method_from_name(*m);
    if (!method || *method == SpecMethod::Default)
      bad(param_prefix + "spec", "spec must be \"off\", \"ngram\" or \"draft\"");
    r.spec = *method;
  }
  if (auto k = field<int64_t>(obj, "draft_max")) {
    if (*k < 0 || *k > kMaxDraft)
      bad(param_prefix + "draft_max", fmt::format("draft_max must be in [0, {}]", kMaxDraft));
    r.draft_max = int32_t(*k);
  }
}

void parse_token_controls(const json& obj, const ModelView& m, GenerateRequest& r) {
  if (auto it = obj.find("logit_bias"); it != obj.end() && !it->is_null()) {
    if (!it->is_object())
      bad("logit_bias", "'logit_bias' must be an object of token ids to biases", "invalid_type");
    for (const auto& [key, value] : it->items()) {
      // a decimal id as OpenAI's keys are: no sign, no spaces, no leading zeros
      const bool digits = !key.empty() && key.size() <= 9 &&
                          key.find_first_not_of("0123456789") == std::string::npos &&
                          (key == "0" || key[0] != '0');
      if (!digits)
        bad("logit_bias", fmt::format("logit_bias key '{}' is not a token id", key),
            "invalid_type");
      const int64_t id = std::stoll(key);
      if (id >= m.tokenizer.n_vocab())
        bad("logit_bias", fmt::format("logit_bias token id {} is outside the vocabulary", id));
      if (!value.is_number())
        bad("logit_bias", fmt::format("logit_bias[\"{}\"] must be a number", key), "invalid_type");
      const double bias = value.get<double>();
      if (!(bias >= -100 && bias <= 100))
        bad("logit_bias", fmt::format("logit_bias[\"{}\"] must be in [-100, 100]", key));
      r.sampling.logit_bias.emplace_back(int32_t(id), float(bias));
    }
  }
  if (auto n = field<int64_t>(obj, "min_tokens")) {
    if (*n < 0 || *n > r.max_tokens)
      bad("min_tokens",
          fmt::format("min_tokens must be in [0, {}]: at most max_tokens, or the context left "
                      "after the prompt",
                      r.max_tokens));
    r.min_tokens = int32_t(*n);
  }
  if (auto e = field<bool>(obj, "ignore_eos")) r.ignore_eos = *e;
}

ReasoningSetup reasoning_setup(const ModelView& m, const std::vector<int32_t>& prompt) {
  if (!m.reasoning) return {};
  // the prompt's last few tokens are enough to see an open <think> at its end
  const size_t n_tail = std::min<size_t>(prompt.size(), 8);
  const std::vector<int32_t> tail(prompt.end() - ptrdiff_t(n_tail), prompt.end());
  return {.split = true, .open = prompt_opens_reasoning(m.tokenizer.decode(tail, false))};
}

void parse_span_repair(const json& obj, const std::string& param_prefix, GenerateRequest& r) {
  if (auto k = field<int64_t>(obj, "span_recompute")) {
    if (*k < 0 || *k > (1 << 24))
      bad(param_prefix + "span_recompute", "span_recompute must be in [0, 16777216]");
    r.span_recompute = int32_t(*k);
  }
  if (auto f = field<double>(obj, "span_blend")) {
    if (!(*f >= 0 && *f <= 1)) bad(param_prefix + "span_blend", "span_blend must be in [0, 1]");
    r.span_blend = float(*f);
  }
}

void parse_prompt_logprobs(const json& obj, const std::string& param_prefix, bool stream,
                           GenerateRequest& r) {
  const auto n = field<int64_t>(obj, "prompt_logprobs");
  if (!n) return;
  if (*n < 0 || *n > kMaxPromptLogprobs)
    bad(param_prefix + "prompt_logprobs",
        fmt::format("prompt_logprobs must be in [0, {}]", kMaxPromptLogprobs));
  if (stream)
    bad(param_prefix + "prompt_logprobs",
        "prompt_logprobs is answered in a whole response: it needs stream false");
  r.prompt_logprobs = int32_t(*n);
}

namespace {

// A JSON schema's GBNF; a keyword outside the supported subset is a 400 naming param.
std::string schema_gbnf(const json& schema, const std::string& param) {
  try {
    return grammar::json_schema_to_gbnf(schema);
  } catch (const grammar::GrammarError& e) {
    bad(param, e.what(), "unsupported_schema");
  }
}

// GBNF text for OpenAI's response_format; empty for plain text.
std::string response_format_gbnf(const json& rf) {
  if (!rf.is_object())
    bad("response_format", "'response_format' must be an object", "invalid_type");
  const std::string type = field<std::string>(rf, "type").value_or("");
  if (type == "text") return "";
  if (type == "json_object") return grammar::json_object_gbnf();
  if (type != "json_schema")
    bad("response_format.type",
        "response_format.type must be \"text\", \"json_object\" or \"json_schema\"");
  auto js = rf.find("json_schema");
  if (js == rf.end() || !js->is_object())
    bad("response_format.json_schema", "response_format.json_schema must be an object",
        "missing_field");
  field<std::string>(*js, "name");  // type-checked; a label only
  field<bool>(*js, "strict");       // objects never get undeclared properties either way
  auto schema = js->find("schema");
  if (schema == js->end() || !(schema->is_object() || schema->is_boolean()))
    bad("response_format.json_schema.schema",
        "response_format.json_schema.schema must be a JSON schema object", "missing_field");
  return schema_gbnf(*schema, "response_format.json_schema.schema");
}

// GBNF text for Ollama's format; empty for none.
std::string ollama_format_gbnf(const json& f) {
  if (f.is_string()) {
    if (f.get<std::string>().empty()) return "";
    if (f.get<std::string>() == "json") return grammar::json_object_gbnf();
    bad("format", "'format' must be \"json\" or a JSON schema object");
  }
  if (!f.is_object())
    bad("format", "'format' must be \"json\" or a JSON schema object", "invalid_type");
  return schema_gbnf(f, "format");
}

// llama.cpp's json_schema: a schema object ({} takes any JSON value).
std::string json_schema_gbnf(const json& schema) {
  if (!schema.is_object() && !schema.is_boolean())
    bad("json_schema", "'json_schema' must be a JSON schema object", "invalid_type");
  return schema_gbnf(schema, "json_schema");
}

}  // namespace

namespace {

// One output format a body asks for: the field naming it and its GBNF text.
struct FormatAsk {
  std::string param;
  std::string gbnf;
};

// vLLM's structured outputs, under its older names (guided_json,
// guided_regex, guided_choice, guided_grammar) or in its structured_outputs
// object ({json | regex | choice | grammar}).
void vllm_formats(const json& obj, std::vector<FormatAsk>& out) {
  auto add = [&](const std::string& param, const std::string& kind, const json& v) {
    if (v.is_null()) return;
    try {
      if (kind == "json") {
        // a schema object, or its JSON text
        json schema = v;
        if (v.is_string()) {
          schema = json::parse(v.get<std::string>(), nullptr, false);
          if (schema.is_discarded())
            bad(param, "'" + param + "' is not valid JSON", "invalid_type");
        }
        if (!schema.is_object() && !schema.is_boolean())
          bad(param, "'" + param + "' must be a JSON schema", "invalid_type");
        out.push_back({param, grammar::json_schema_to_gbnf(schema)});
      } else if (kind == "regex") {
        if (!v.is_string()) bad(param, "'" + param + "' must be a string", "invalid_type");
        out.push_back({param, grammar::regex_to_gbnf(v.get<std::string>())});
      } else if (kind == "choice") {
        const bool strings =
            v.is_array() && !v.empty() && v.size() <= kMaxChoicesOfFormat &&
            std::all_of(v.begin(), v.end(), [](const json& c) { return c.is_string(); });
        if (!strings)
          bad(param,
              fmt::format("'{}' must be an array of 1 to {} strings", param, kMaxChoicesOfFormat),
              "invalid_type");
        const std::vector<std::string> choices = v.get<std::vector<std::string>>();
        out.push_back({param, grammar::choice_to_gbnf(choices)});
      } else {  // grammar: GBNF
        if (!v.is_string() || v.get<std::string>().empty())
          bad(param, "'" + param + "' must be a non-empty string of GBNF", "invalid_type");
        out.push_back({param, v.get<std::string>()});
      }
    } catch (const grammar::GrammarError& e) {
      bad(param, e.what(), kind == "json" ? "unsupported_schema" : "invalid_grammar");
    }
  };
  static const char* const kKinds[] = {"json", "regex", "choice", "grammar"};
  for (const char* kind : kKinds)
    if (auto it = obj.find(std::string("guided_") + kind); it != obj.end())
      add(std::string("guided_") + kind, kind, *it);
  auto so = obj.find("structured_outputs");
  if (so == obj.end() || so->is_null()) return;
  if (!so->is_object())
    bad("structured_outputs", "'structured_outputs' must be an object", "invalid_type");
  for (const char* kind : kKinds)
    if (auto it = so->find(kind); it != so->end())
      add(std::string("structured_outputs.") + kind, kind, *it);
  if (field<bool>(*so, "json_object").value_or(false))
    out.push_back({"structured_outputs.json_object", grammar::json_object_gbnf()});
}

}  // namespace

std::shared_ptr<const grammar::Grammar> parse_grammar(const json& obj, FormatField which) {
  const char* key = which == FormatField::OllamaFormat         ? "format"
                    : which == FormatField::LlamaCppJsonSchema ? "json_schema"
                                                               : "response_format";
  std::vector<FormatAsk> asks;
  if (auto it = obj.find(key); it != obj.end() && !it->is_null()) {
    std::string gbnf = which == FormatField::OllamaFormat         ? ollama_format_gbnf(*it)
                       : which == FormatField::LlamaCppJsonSchema ? json_schema_gbnf(*it)
                                                                  : response_format_gbnf(*it);
    if (!gbnf.empty()) asks.push_back({key, std::move(gbnf)});
  }
  if (auto text = field<std::string>(obj, "grammar")) {
    if (text->empty()) bad("grammar", "'grammar' is empty");
    asks.push_back({"grammar", *text});
  }
  if (which == FormatField::OpenAiResponseFormat) vllm_formats(obj, asks);
  if (asks.size() > 1)
    bad(asks[1].param,
        fmt::format("use either '{}' or '{}', not both", asks[1].param, asks[0].param));
  if (asks.empty()) return nullptr;
  try {
    return grammar::compile_gbnf(asks[0].gbnf);
  } catch (const grammar::GrammarError& e) {
    // a schema's grammar failing is wick's bug, but the client still learns which field
    bad(asks[0].param, e.what(), "invalid_grammar");
  }
}

std::vector<std::string> parse_stop(const json& obj, const char* key, size_t max_n) {
  std::vector<std::string> out;
  if (!obj.contains(key) || obj[key].is_null()) return out;
  const json& s = obj[key];
  const std::string type_error = fmt::format("'{}' must be a string or an array of strings", key);
  if (s.is_string()) {
    out.push_back(s);
  } else if (s.is_array()) {
    if (s.size() > max_n) bad(key, fmt::format("'{}' takes at most {} strings", key, max_n));
    for (auto& x : s) {
      if (!x.is_string()) bad(key, type_error, "invalid_type");
      out.push_back(x);
    }
  } else {
    bad(key, type_error, "invalid_type");
  }
  for (auto& x : out) {
    if (x.empty()) bad(key, "stop strings must not be empty");
    if (x.size() > kMaxStopBytes)
      bad(key, fmt::format("stop strings take at most {} bytes", kMaxStopBytes));
  }
  return out;
}

}  // namespace wick::server
