#include "text/tool_calls.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "text/json_scan.h"

namespace wick {

namespace {

using json = nlohmann::ordered_json;
constexpr size_t npos = std::string::npos;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kToolCalls = "[TOOL_CALLS]";
constexpr std::string_view kArgs = "[ARGS]";
constexpr std::string_view kGraniteToolCall = "<|tool_call|>";

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

bool is_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

std::string_view trim_right(std::string_view s) {
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view trim(std::string_view s) {
  s = trim_right(s);
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  return s;
}

bool starts_with(std::string_view s, size_t at, std::string_view prefix) {
  return s.substr(at, prefix.size()) == prefix;
}

// Whether s[at..] is a proper prefix of `marker` (the marker may be arriving).
bool is_partial(std::string_view s, size_t at, std::string_view marker) {
  const std::string_view rest = s.substr(at);
  return rest.size() < marker.size() && marker.substr(0, rest.size()) == rest;
}

// The end (one past) of the JSON object or array that opens at s[at], or
// npos while it is unfinished. Strings are skipped, escapes honoured.
size_t json_end(std::string_view s, size_t at) {
  const size_t close = find_json_bracket(s, at, [](size_t, size_t depth) { return depth == 0; });
  return close == npos ? npos : close + 1;
}

std::optional<json> parse_json(std::string_view s) {
  json j = json::parse(s, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

std::string compact(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// A call's arguments as compact JSON: an object, or a string holding one.
std::optional<std::string> arguments_of(const json& a) {
  if (a.is_object()) return compact(a);
  if (a.is_string())
    if (auto inner = parse_json(a.get<std::string>()); inner && inner->is_object())
      return compact(*inner);
  return std::nullopt;
}

struct NameArgs {
  std::string name, arguments;
};

// {"name": N, <args_key>: {...}}; Llama 3 writes "parameters", the others
// "arguments". need_args: bare JSON (no markup) must carry its arguments to
// count as a call rather than an answer that happens to be JSON.
std::optional<NameArgs> call_of(const json& j, bool need_args) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty())
    return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end()) {
    if (need_args) return std::nullopt;
    return NameArgs{name->get<std::string>(), "{}"};
  }
  auto a = arguments_of(*args);
  if (!a) return std::nullopt;
  return NameArgs{name->get<std::string>(), *a};
}

std::string_view marker_of(ToolFormat f) {
  switch (f) {
    case ToolFormat::Hermes:
      return kHermesOpen;
    case ToolFormat::Llama3Json:
      return kPythonTag;
    case ToolFormat::Mistral:
    case ToolFormat::MistralArgs:
      return kToolCalls;
    case ToolFormat::Granite:
      return kGraniteToolCall;
    case ToolFormat::None:
      break;
  }
  return {};
}

}  // namespace

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::None:
      return "none";
    case ToolFormat::Hermes:
      return "hermes";
    case ToolFormat::Llama3Json:
      return "llama3_json";
    case ToolFormat::Mistral:
      return "mistral";
    case ToolFormat::MistralArgs:
      return "mistral_args";
    case ToolFormat::Granite:
      return "granite";
  }
  return "none";
}

ToolFormat detect_tool_format(std::string_view t) {
  // The markup each family's template writes for an assistant's calls.
  if (t.find(kToolCalls) != npos)
    return t.find(kArgs) != npos ? ToolFormat::MistralArgs : ToolFormat::Mistral;
  if (t.find(kGraniteToolCall) != npos) return ToolFormat::Granite;
  if (t.find(kHermesOpen) != npos) return ToolFormat::Hermes;
  // Llama 3.1+: tools as JSON with "parameters", <|python_tag|> for code.
  if (t.find(kPythonTag) != npos || (t.find("<|start_header_id|>") != npos &&
                                     t.find("parameters") != npos && t.find("tools") != npos))
    return ToolFormat::Llama3Json;
  return ToolFormat::None;
}

ToolCallParser::ToolCallParser(ToolFormat f, std::string id_prefix)
    : format_(f), id_prefix_(std::move(id_prefix)) {}

std::vector<ToolEvent> ToolCallParser::push(std::string_view text) {
  text_.append(text);
  std::vector<ToolEvent> out;
  while (step(false, out) == Step::Progress) {
  }
  return out;
}

std::vector<ToolEvent> ToolCallParser::finish() {
  std::vector<ToolEvent> out;
  while (pos_ < text_.size() && step(true, out) == Step::Progress) {
  }
  return out;
}

ToolCallParser::Step ToolCallParser::step(bool final, std::vector<ToolEvent>& out) {
  if (format_ == ToolFormat::None) {  // no parsing: all content
    if (pos_ == text_.size()) return Step::NeedMore;
    emit_content(std::string_view(text_).substr(pos_), out);
    pos_ = text_.size();
    return Step::Progress;
  }
  return in_call_ ? call_step(final, out) : content_step(final, out);
}

void ToolCallParser::emit_content(std::string_view s, std::vector<ToolEvent>& out) {
  if (s.empty()) return;
  if (!trim(s).empty()) at_slot_ = after_call_ = false;
  if (!out.empty() && !out.back().is_call)
    out.back().content.append(s);
  else
    out.push_back({.is_call = false, .content = std::string(s)});
}

void ToolCallParser::add_call(std::string name, std::string arguments,
                              std::vector<ToolEvent>& out) {
  const size_t index = calls_.size();
  calls_.push_back({id_prefix_ + std::to_string(index), std::move(name), std::move(arguments)});
  out.push_back({.is_call = true, .content = {}, .index = index});
  after_call_ = true;
  at_slot_ = true;
}

size_t ToolCallParser::find_call_start(bool final, bool* partial) const {
  const std::string_view s = text_;
  const std::string_view marker = marker_of(format_);
  size_t best = npos;
  *partial = false;
  auto consider = [&](size_t at, bool is_partial_here) {
    if (at < best) {
      best = at;
      *partial = is_partial_here;
    }
  };
  if (const size_t m = s.find(marker, pos_); m != npos) consider(m, false);
  if (!final) {  // a marker may be arriving: hold its first bytes
    const size_t from = s.size() > pos_ + marker.size() ? s.size() - marker.size() + 1 : pos_;
    for (size_t i = from; i < s.size(); ++i)
      if (is_partial(s, i, marker)) {
        consider(i, true);
        break;
      }
  }
  if (at_slot_ && format_ != ToolFormat::Hermes) {  // bare JSON where the answer starts
    const size_t f = skip_ws(s, pos_);
    if (f == s.size()) {
      if (!final) consider(f, true);
    } else if (s[f] == '{' && format_ == ToolFormat::Llama3Json) {
      consider(f, false);
    } else if (s[f] == '[' && format_ != ToolFormat::Llama3Json &&
               (format_ == ToolFormat::Granite ||
                (!is_partial(s, f, kToolCalls) && !starts_with(s, f, kToolCalls)))) {
      consider(f, false);
    } else if (format_ == ToolFormat::MistralArgs && is_ident(s[f])) {
      size_t e = f;
      while (e < s.size() && is_ident(s[e])) ++e;
      if (e == s.size() || is_partial(s, e, kArgs)) {
        if (!final) consider(f, true);
      } else if (s[e] == '{' || starts_with(s, e, kArgs)) {
        consider(f, false);
      }
    }
  }
  return best;
}

ToolCallParser::Step ToolCallParser::content_step(bool final, std::vector<ToolEvent>& out) {
  const std::string_view s = text_;
  if (after_call_ && format_ == ToolFormat::Llama3Json)  // ';' between calls
    while (pos_ < s.size() && (is_ws(s[pos_]) || s[pos_] == ';')) ++pos_;
  if (pos_ == s.size()) return Step::NeedMore;
  // Whitespace after a call is content only when text follows it.
  if (after_call_ && skip_ws(s, pos_) == s.size()) {
    if (!final) return Step::NeedMore;
    pos_ = s.size();
    return Step::Progress;
  }
  bool partial = false;
  const size_t q = find_call_start(final, &partial);
  if (q == npos) {  // content up to the end; trailing whitespace waits for what follows
    const std::string_view rest = s.substr(pos_);
    const std::string_view sure = final ? rest : trim_right(rest);
    if (sure.empty()) return Step::NeedMore;
    emit_content(sure, out);
    pos_ += sure.size();
    return Step::Progress;
  }
  // Whitespace right before a call is not content; before a maybe-call it waits.
  const std::string_view before = trim_right(s.substr(pos_, q - pos_));
  emit_content(before, out);
  const bool moved = !before.empty();
  if (partial) {
    pos_ += before.size();
    return moved ? Step::Progress : Step::NeedMore;
  }
  call_from_ = pos_ + before.size();
  pos_ = q;
  in_call_ = true;
  if (format_ == ToolFormat::Hermes) pos_ += kHermesOpen.size();
  return Step::Progress;
}

ToolCallParser::Step ToolCallParser::call_step(bool final, std::vector<ToolEvent>& out) {
  const std::string_view s = text_;
  // Text that turned out not to hold a call: content, markup and all.
  // The whitespace before it was held back as a call's; it is content again.
  auto as_content = [&](size_t end) {
    emit_content(s.substr(call_from_, end - call_from_), out);
    pos_ = end;
    in_call_ = false;
    at_slot_ = false;  // bare JSON counts only at the start
    return Step::Progress;
  };
  if (format_ == ToolFormat::Hermes) {
    const size_t close = s.find(kHermesClose, pos_);
    if (close == npos && !final) return Step::NeedMore;
    const size_t body_end = close == npos ? s.size() : close;
    const size_t end = close == npos ? s.size() : close + kHermesClose.size();
    auto j = parse_json(trim(s.substr(pos_, body_end - pos_)));
    auto call = j ? call_of(*j, false) : std::nullopt;
    if (!call) return as_content(end);
    in_call_ = false;
    pos_ = end;
    add_call(std::move(call->name), std::move(call->arguments), out);
    return Step::Progress;
  }
  const size_t start = pos_;
  size_t i = pos_;
  const std::string_view marker = marker_of(format_);
  const bool marked = starts_with(s, i, marker);
  if (marked) i = skip_ws(s, i + marker.size());
  if (i == s.size()) return final ? as_content(s.size()) : Step::NeedMore;
  // [TOOL_CALLS]name[ARGS]{...}: the name, then the arguments object
  std::string name;
  if (format_ == ToolFormat::MistralArgs && is_ident(s[i])) {
    size_t e = i;
    while (e < s.size() && is_ident(s[e])) ++e;
    if (e == s.size() || is_partial(s, e, kArgs))
      return final ? as_content(s.size()) : Step::NeedMore;
    name = std::string(s.substr(i, e - i));
    i = starts_with(s, e, kArgs) ? e + kArgs.size() : e;
    if (i == s.size()) return final ? as_content(s.size()) : Step::NeedMore;
  }
  const char open = s[i];
  const bool want_array = name.empty() && format_ != ToolFormat::Llama3Json;
  if (open != (want_array ? '[' : '{')) {
    if (format_ == ToolFormat::MistralArgs && open == '[' && name.empty()) {
      // the older array form under a newer template: read it too
    } else {
      return as_content(marked ? start + marker.size() : i + 1);
    }
  }
  const size_t end = json_end(s, i);
  if (end == npos) return final ? as_content(s.size()) : Step::NeedMore;
  auto j = parse_json(s.substr(i, end - i));
  std::vector<NameArgs> found;
  bool ok = j.has_value();
  if (ok && !name.empty()) {
    auto a = arguments_of(*j);
    ok = a.has_value();
    if (ok) found.push_back({name, *a});
  } else if (ok && j->is_array()) {
    ok = !j->empty();
    for (const auto& c : *j) {
      auto call = call_of(c, !marked);
      if (!call) {
        ok = false;
        break;
      }
      found.push_back(std::move(*call));
    }
  } else if (ok) {
    auto call = call_of(*j, true);
    ok = call.has_value();
    if (ok) found.push_back(std::move(*call));
  }
  if (!ok) return as_content(end);
  in_call_ = false;
  pos_ = end;
  for (auto& c : found) add_call(std::move(c.name), std::move(c.arguments), out);
  return Step::Progress;
}

ParsedOutput parse_tool_calls(ToolFormat f, std::string_view text, const std::string& id_prefix) {
  ToolCallParser p(f, id_prefix);
  ParsedOutput r;
  for (auto& e : p.push(text))
    if (!e.is_call) r.content += e.content;
  for (auto& e : p.finish())
    if (!e.is_call) r.content += e.content;
  r.calls = p.calls();
  return r;
}

}  // namespace wick
