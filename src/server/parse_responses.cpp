#include "server/parse_responses.h"

#include <optional>

#include "server/parse_openai.h"

namespace wick::server {

namespace {

constexpr const char* kLogprobsInclude = "message.output_text.logprobs";
constexpr size_t kMaxMetadata = 16;  // OpenAI's: 16 pairs, keys <= 64 bytes, values <= 512

// The chat fields a Responses body shares with chat completions, under the
// same names (OpenAI's and wick's extras), handed to the chat parser as they are.
constexpr const char* kChatFields[] = {"model",
                                       "temperature",
                                       "top_p",
                                       "seed",
                                       "stop",
                                       "top_k",
                                       "min_p",
                                       "repeat_penalty",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "chat_template_kwargs",
                                       "spec",
                                       "draft_max",
                                       "grammar",
                                       "parallel_tool_calls",
                                       "logit_bias",
                                       "min_tokens",
                                       "ignore_eos",
                                       "guided_json",
                                       "guided_regex",
                                       "guided_choice",
                                       "guided_grammar",
                                       "structured_outputs"};

bool is_string(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string();
}

// obj[key] as a string, else a 400 naming p.key.
std::string required_string(const json& obj, const char* key, const std::string& p) {
  if (!is_string(obj, key))
    bad(p + "." + key, fmt::format("{}.{} must be a string", p, key), "invalid_type");
  return obj[key];
}

// A message's content: a string, or text parts (input_text, output_text,
// refusal) joined.
std::string content_text(const json& c, const std::string& p) {
  if (c.is_string()) return c;
  if (!c.is_array()) bad(p, p + " must be a string or an array of content parts", "invalid_type");
  std::string text;
  for (size_t j = 0; j < c.size(); ++j) {
    const std::string pj = fmt::format("{}[{}]", p, j);
    if (!c[j].is_object() || !is_string(c[j], "type"))
      bad(pj, pj + " must be an object with a string 'type'", "invalid_type");
    const std::string type = c[j]["type"];
    if (type == "input_text" || type == "output_text" || type == "text")
      text += required_string(c[j], "text", pj);
    else if (type == "refusal")
      text += required_string(c[j], "refusal", pj);
    else
      bad(pj + ".type",
          fmt::format("{}.type '{}' is not supported: wick's models read text (input_text, "
                      "output_text)",
                      pj, type),
          "unsupported_value");
  }
  return text;
}

// Appends input (a string, or an array of items) to conv as chat messages:
// function_call items join the assistant message before them (one turn),
// function_call_output items become tool messages, reasoning items are
// dropped (wick keeps no hidden reasoning to replay).
void append_input(const json& in, json& conv) {
  if (in.is_string()) {
    conv.push_back({{"role", "user"}, {"content", in}});
    return;
  }
  if (!in.is_array()) bad("input", "'input' must be a string or an array of items", "invalid_type");
  if (in.empty()) bad("input", "'input' must not be empty");
  if (in.size() > kMaxMessages)
    bad("input", fmt::format("'input' takes at most {} items", kMaxMessages));
  for (size_t i = 0; i < in.size(); ++i) {
    const json& it = in[i];
    const std::string p = fmt::format("input[{}]", i);
    if (!it.is_object()) bad(p, p + " must be an object", "invalid_type");
    if (it.contains("type") && !it["type"].is_string())
      bad(p + ".type", p + ".type must be a string", "invalid_type");
    const std::string type = it.value("type", "message");
    if (type == "message") {
      const std::string role = required_string(it, "role", p);
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        bad(p + ".role",
            fmt::format("{}.role '{}' is not one of user, assistant, system, developer", p, role));
      if (!it.contains("content")) bad(p + ".content", p + ".content is required", "missing_field");
      conv.push_back({{"role", role}, {"content", content_text(it["content"], p + ".content")}});
    } else if (type == "function_call") {
      json call = {{"id", required_string(it, "call_id", p)},
                   {"type", "function"},
                   {"function",
                    {{"name", required_string(it, "name", p)},
                     {"arguments", required_string(it, "arguments", p)}}}};
      if (!conv.empty() && conv.back()["role"] == "assistant") {
        if (!conv.back().contains("tool_calls")) conv.back()["tool_calls"] = json::array();
        conv.back()["tool_calls"].push_back(std::move(call));
      } else {
        conv.push_back(
            {{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}});
      }
    } else if (type == "function_call_output") {
      const std::string call_id = required_string(it, "call_id", p);
      if (!it.contains("output")) bad(p + ".output", p + ".output is required", "missing_field");
      json msg = {{"role", "tool"},
                  {"tool_call_id", call_id},
                  {"content", content_text(it["output"], p + ".output")}};
      // templates that name a result's function (Llama 3.1's, Mistral's) read "name"
      for (auto m = conv.rbegin(); m != conv.rend() && !msg.contains("name"); ++m)
        if (m->contains("tool_calls"))
          for (const json& c : (*m)["tool_calls"])
            if (c.value("id", "") == call_id) msg["name"] = c["function"].value("name", "");
      conv.push_back(std::move(msg));
    } else if (type != "reasoning") {
      bad(p + ".type",
          fmt::format("{}.type '{}' is not supported (message, function_call, "
                      "function_call_output)",
                      p, type),
          "unsupported_value");
    }
  }
}

// Function tools, {type, name, description, parameters, strict}, in chat's
// shape; null when none are offered.
json chat_tools(const json& b) {
  auto it = b.find("tools");
  if (it == b.end() || it->is_null()) return json();
  if (!it->is_array()) bad("tools", "'tools' must be an array", "invalid_type");
  if (it->size() > kMaxTools)
    bad("tools", fmt::format("'tools' takes at most {} tools", kMaxTools));
  json out = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string p = fmt::format("tools[{}]", i);
    if (!t.is_object()) bad(p, p + " must be an object", "invalid_type");
    const std::string type = required_string(t, "type", p);
    if (type != "function")
      bad(p + ".type",
          fmt::format("{}.type '{}' is not supported: wick calls function tools only", p, type),
          "unsupported_value");
    if (!is_string(t, "name") || t["name"].get_ref<const std::string&>().empty())
      bad(p + ".name", p + ".name must be a non-empty string", "invalid_type");
    json f = {{"name", t["name"]}};
    if (is_string(t, "description")) f["description"] = t["description"];
    if (t.contains("parameters") && !t["parameters"].is_null()) {
      if (!t["parameters"].is_object())
        bad(p + ".parameters", p + ".parameters must be an object", "invalid_type");
      f["parameters"] = t["parameters"];
    }
    out.push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  return out;
}

// tool_choice: a string, or {type: "function", name} in chat's shape.
json chat_tool_choice(const json& b) {
  auto it = b.find("tool_choice");
  if (it == b.end() || it->is_null()) return json();
  const std::string what =
      "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
      "\"name\": ...}";
  if (it->is_string()) {
    if (*it != "none" && *it != "auto" && *it != "required") bad("tool_choice", what);
    return *it;
  }
  if (it->is_object() && is_string(*it, "type") && (*it)["type"] == "function" &&
      is_string(*it, "name"))
    return {{"type", "function"}, {"function", {{"name", (*it)["name"]}}}};
  bad("tool_choice", what, "invalid_type");
}

// text.format as chat's response_format; null for plain text.
json chat_response_format(const json& b) {
  auto it = b.find("text");
  if (it == b.end() || it->is_null()) return json();
  if (!it->is_object()) bad("text", "'text' must be an object", "invalid_type");
  auto f = it->find("format");
  if (f == it->end() || f->is_null()) return json();
  if (!f->is_object() || !is_string(*f, "type"))
    bad("text.format", "text.format must be an object with a string 'type'", "invalid_type");
  const std::string type = (*f)["type"];
  if (type == "text") return json();
  if (type == "json_object") return {{"type", "json_object"}};
  if (type != "json_schema")
    bad("text.format.type",
        "text.format.type must be \"text\", \"json_object\" or \"json_schema\"");
  if (!f->contains("schema") || !(*f)["schema"].is_object())
    bad("text.format.schema", "text.format.schema must be an object", "invalid_type");
  json js = {{"name", f->value("name", json("response"))}, {"schema", (*f)["schema"]}};
  if (f->contains("strict")) js["strict"] = (*f)["strict"];
  return {{"type", "json_schema"}, {"json_schema", std::move(js)}};
}

// The engine's top_logprobs: on with include's "message.output_text.logprobs"
// or top_logprobs >= 1; -1 when off.
int32_t logprobs_asked(const json& b) {
  const auto n_top = field<int64_t>(b, "top_logprobs");
  if (n_top && (*n_top < 0 || *n_top > 20)) bad("top_logprobs", "top_logprobs must be in [0, 20]");
  bool asked = n_top.value_or(0) > 0;
  if (auto it = b.find("include"); it != b.end() && !it->is_null()) {
    if (!it->is_array()) bad("include", "'include' must be an array of strings", "invalid_type");
    for (const json& x : *it) {
      if (!x.is_string()) bad("include", "'include' must be an array of strings", "invalid_type");
      asked = asked || x == kLogprobsInclude;  // other includes name nothing wick produces
    }
  }
  return asked ? int32_t(n_top.value_or(0)) : -1;
}

json checked_metadata(const json& b) {
  auto it = b.find("metadata");
  if (it == b.end() || it->is_null()) return json::object();
  if (!it->is_object() || it->size() > kMaxMetadata)
    bad("metadata", fmt::format("'metadata' must be an object of at most {} pairs", kMaxMetadata),
        "invalid_type");
  for (auto& [k, v] : it->items())
    if (k.size() > 64 || !v.is_string() || v.get_ref<const std::string&>().size() > 512)
      bad("metadata", "metadata keys are at most 64 bytes and values strings of at most 512",
          "invalid_value");
  return *it;
}

// The chat parser's errors under the Responses API's names.
ApiError renamed(ApiError e) {
  auto starts = [&](const char* p) { return e.param.rfind(p, 0) == 0; };
  if (starts("messages"))
    e.param = "input";
  else if (starts("response_format.json_schema"))
    e.param = "text.format" + e.param.substr(std::string("response_format.json_schema").size());
  else if (starts("response_format"))
    e.param = "text.format";
  else if (e.param == "max_completion_tokens")
    e.param = "max_output_tokens";
  return e;
}

}  // namespace

std::string previous_response_id(const json& body) {
  return field<std::string>(body, "previous_response_id").value_or("");
}

ResponsesRequest parse_responses(const json& b, const ModelView& m, uint64_t random_seed,
                                 const json& previous) {
  ResponsesRequest r;
  // What wick does not do is a clear 400, not a silent difference.
  if (field<bool>(b, "background").value_or(false))
    bad("background", "background responses are not supported", "unsupported_value");
  if (b.contains("conversation") && !b["conversation"].is_null())
    bad("conversation",
        "conversations are not supported: chain responses with "
        "previous_response_id",
        "unsupported_value");
  if (b.contains("prompt") && !b["prompt"].is_null())
    bad("prompt", "prompt templates are not supported: send 'input'", "unsupported_value");
  const auto instructions = field<std::string>(b, "instructions");
  r.store = field<bool>(b, "store").value_or(true);
  const std::string truncation = field<std::string>(b, "truncation").value_or("disabled");
  if (truncation != "disabled" && truncation != "auto")
    bad("truncation", "truncation must be \"disabled\" or \"auto\"");
  const auto max_out = field<int64_t>(b, "max_output_tokens");
  if (max_out && (*max_out < 1 || *max_out > kMaxTokensAsked))
    bad("max_output_tokens", fmt::format("max_output_tokens must be in [1, {}]", kMaxTokensAsked));
  const int32_t top_logprobs = logprobs_asked(b);
  const json metadata = checked_metadata(b);
  const bool stream = field<bool>(b, "stream").value_or(false);
  const auto user = field<std::string>(b, "user");

  if (!b.contains("input") || b["input"].is_null())
    bad("input", "'input' is required", "missing_field");
  if (!previous.is_array()) throw std::logic_error("previous conversation is not an array");
  r.conversation = previous;
  append_input(b["input"], r.conversation);

  json cb = json::object();  // the chat completions body this request amounts to
  for (const char* k : kChatFields)
    if (b.contains(k)) cb[k] = b[k];
  const json tools = chat_tools(b), tool_choice = chat_tool_choice(b);
  if (!tools.is_null()) cb["tools"] = tools;
  if (!tool_choice.is_null()) cb["tool_choice"] = tool_choice;
  if (json format = chat_response_format(b); !format.is_null()) cb["response_format"] = format;
  if (max_out) cb["max_completion_tokens"] = *max_out;
  if (top_logprobs >= 0) cb["logprobs"] = true, cb["top_logprobs"] = top_logprobs;

  const json& conv = r.conversation;
  // The chat request over conv from message `from` on (a tool result never
  // leads: it would lose its call), after the instructions.
  auto parse_from = [&](size_t from) {
    while (from + 1 < conv.size() && conv[from]["role"] == "tool") ++from;
    json msgs = json::array();
    if (instructions) msgs.push_back({{"role", "system"}, {"content", *instructions}});
    for (size_t i = from; i < conv.size(); ++i) msgs.push_back(conv[i]);
    cb["messages"] = std::move(msgs);
    return parse_openai(cb, true, m, random_seed);
  };
  auto too_long = [](const ApiError& e) { return e.code == "context_length_exceeded"; };
  try {
    try {
      r.chat = parse_from(0);
    } catch (const ApiError& e) {
      if (truncation != "auto" || !too_long(e) || conv.size() < 2) throw;
      // truncation "auto": the fewest oldest messages dropped that make it
      // fit, found in log2(n) renders; the last message always stays
      std::optional<OpenAiRequest> fit;
      size_t lo = 1, hi = conv.size() - 1;
      while (lo <= hi) {
        const size_t mid = lo + (hi - lo) / 2;
        try {
          fit = parse_from(mid);
          hi = mid - 1;
        } catch (const ApiError& e2) {
          if (!too_long(e2)) throw;
          lo = mid + 1;
        }
      }
      if (!fit) throw;
      r.chat = std::move(*fit);
    }
  } catch (const ApiError& e) {
    throw renamed(e);
  }
  r.chat.stream = stream;

  auto given = [&](const char* key, json absent) {
    return b.contains(key) && !b[key].is_null() ? b[key] : absent;
  };
  r.echo = {{"instructions", instructions ? json(*instructions) : json()},
            {"max_output_tokens", max_out ? json(*max_out) : json()},
            {"metadata", metadata},
            {"parallel_tool_calls", r.chat.tools.parallel},
            {"previous_response_id", given("previous_response_id", json())},
            {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
            {"store", r.store},
            {"temperature", given("temperature", 1.0)},
            {"text", {{"format", {{"type", "text"}}}}},
            {"tool_choice", given("tool_choice", "auto")},
            {"tools", given("tools", json::array())},
            {"top_logprobs", top_logprobs > 0 ? top_logprobs : 0},
            {"top_p", given("top_p", 1.0)},
            {"truncation", truncation},
            {"user", user ? json(*user) : json()}};
  if (auto it = b.find("text");
      it != b.end() && it->is_object() && it->contains("format") && !(*it)["format"].is_null())
    r.echo["text"]["format"] = (*it)["format"];
  return r;
}

}  // namespace wick::server
