// JSON schema -> GBNF text. Each schema node becomes a GBNF expression,
// usually the name of a rule of its own (named after where it is, so that
// the grammar reads like the schema); shared primitives are emitted once.
#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <cctype>
#include <map>
#include <optional>
#include <set>

#include "grammar/utf8_ranges.h"

namespace wick::grammar {

namespace {

using json = nlohmann::ordered_json;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// A JSON value as it is written in the output (compact).
std::string json_literal(const json& v) {
  return gbnf_literal(v.dump(-1, ' ', false, json::error_handler_t::strict));
}

std::string class_bound(uint32_t cp) {
  return cp <= 0xFFFF ? fmt::format("\\u{:04X}", cp) : fmt::format("\\U{:08X}", cp);
}

// A GBNF character class for code point ranges (non-empty).
std::string char_class(const Ranges& r) {
  std::string out = "[";
  for (auto [lo, hi] : r) {
    out += class_bound(lo);
    if (hi != lo) {
      out += '-';
      out += class_bound(hi);
    }
  }
  return out + "]";
}

// Characters a JSON string may hold as they are (no escape needed).
const Ranges& json_plain_chars() {
  static const Ranges r =
      complement_ranges(normalize_ranges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}));
  return r;
}

Ranges intersect(const Ranges& a, const Ranges& b) {
  Ranges out;
  for (auto [alo, ahi] : a)
    for (auto [blo, bhi] : b) {
      const uint32_t lo = std::max(alo, blo), hi = std::min(ahi, bhi);
      if (lo <= hi) out.push_back({lo, hi});
    }
  return normalize_ranges(out);
}

// Characters of plain text (regex_to_gbnf): every code point but NUL and surrogates.
const Ranges& text_chars() {
  static const Ranges r = normalize_ranges({{1, 0xD7FF}, {0xE000, 0x10FFFF}});
  return r;
}

// A regex (the subset json_schema.h lists) -> a GBNF expression matching the
// strings it matches as a whole: in their JSON-encoded form (a schema's
// pattern, inside a JSON string), or as plain text.
class PatternCompiler {
 public:
  enum class Form { Json, Text };
  // context names the regex in errors ("JSON schema at /x: pattern")
  PatternCompiler(std::string_view re, std::string context, Form form = Form::Json)
      : re_(re), context_(std::move(context)), form_(form) {}

  std::string compile() {
    if (peek() == '^') ++pos_;
    std::string e = alternation();
    if (peek() == '$') ++pos_;
    if (pos_ != re_.size()) fail(fmt::format("unexpected '{}'", re_[pos_]));
    return e;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    throw GrammarError(
        fmt::format("{} \"{}\" (offset {}): {}", context_, std::string(re_), pos_, msg));
  }
  char peek() const { return pos_ < re_.size() ? re_[pos_] : '\0'; }
  bool at_end() const { return pos_ >= re_.size(); }

  std::string alternation() {
    std::vector<std::string> alts{concatenation()};
    while (peek() == '|') {
      ++pos_;
      alts.push_back(concatenation());
    }
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + ")";
  }

  std::string concatenation() {
    std::string out;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$' && pos_ + 1 == re_.size()) break;
      std::string a = atom();
      a = quantified(a);
      out += (out.empty() ? "" : " ") + a;
    }
    return out.empty() ? "\"\"" : "(" + out + ")";
  }

  std::string quantified(const std::string& a) {
    std::string q;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      q = std::string(1, c);
    } else if (c == '{') {
      const size_t close = re_.find('}', pos_);
      if (close == std::string_view::npos) fail("unterminated '{'");
      const std::string body(re_.substr(pos_ + 1, close - pos_ - 1));
      for (char k : body)
        if (!(k >= '0' && k <= '9') && k != ',') fail("bad repetition {" + body + "}");
      q = "{" + body + "}";
      pos_ = close + 1;
    } else {
      return a;
    }
    if (peek() == '?' || peek() == '+') ++pos_;  // lazy / possessive: the same strings
    return "(" + a + ")" + q;
  }

  std::string atom() {
    const char c = peek();
    if (c == '(') {
      if (++depth_ > 64) fail("groups nest deeper than 64 levels");
      ++pos_;
      if (peek() == '?') {
        if (re_.substr(pos_, 2) != "?:") fail("lookarounds and named groups are not supported");
        pos_ += 2;
      }
      std::string e = alternation();
      if (peek() != ')') fail("expected ')'");
      ++pos_;
      --depth_;
      return e;
    }
    if (c == '[') return char_class(class_ranges());
    if (c == '.') {  // any character but a newline
      ++pos_;
      return char_class(intersect(chars(), complement_ranges({{'\n', '\n'}})));
    }
    if (c == '\\') {
      ++pos_;
      Ranges r;
      if (escape_class(r)) return ranges_expr(r);
      return char_expr(escaped_char());
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("nothing to repeat");
    if (c == '^' || c == '$') fail("anchors are supported only at the start and the end");
    return char_expr(next_code_point());
  }

  // \d \w \s and their negations; false for another escape (pos_ unchanged).
  bool escape_class(Ranges& r) {
    const char e = peek();
    Ranges base;
    if (e == 'd' || e == 'D')
      base = {{'0', '9'}};
    else if (e == 'w' || e == 'W')
      base = normalize_ranges({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'_', '_'}});
    else if (e == 's' || e == 'S')
      base = normalize_ranges({{' ', ' '}, {'\t', '\r'}});
    else
      return false;
    ++pos_;
    r = (e >= 'A' && e <= 'Z') ? complement_ranges(base) : base;
    return true;
  }

  uint32_t escaped_char() {
    const char e = peek();
    ++pos_;
    switch (e) {
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      case 'u': {
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i) {
          const char h = peek();
          ++pos_;
          if (!std::isxdigit(static_cast<unsigned char>(h)))
            fail("expected 4 hex digits after \\u");
          v = v * 16 +
              uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 32) - 'a' + 10);
        }
        return v;
      }
      default:
        if (std::isalnum(static_cast<unsigned char>(e)))
          fail(fmt::format("escape \\{} is not supported", e));
        return uint32_t(static_cast<unsigned char>(e));
    }
  }

  uint32_t next_code_point() {
    const unsigned char c = static_cast<unsigned char>(re_[pos_]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n && pos_ + size_t(i) < re_.size(); ++i)
      cp = (cp << 6) | (static_cast<unsigned char>(re_[pos_ + size_t(i)]) & 0x3F);
    pos_ += size_t(n);
    return cp;
  }

  Ranges class_ranges() {
    ++pos_;  // [
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    Ranges r;
    bool first = true;
    for (;;) {
      if (at_end()) fail("unterminated '['");
      if (peek() == ']' && !first) break;
      first = false;
      uint32_t lo;
      if (peek() == '\\') {
        ++pos_;
        Ranges esc;
        if (escape_class(esc)) {
          r.insert(r.end(), esc.begin(), esc.end());
          continue;
        }
        lo = escaped_char();
      } else {
        lo = next_code_point();
      }
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < re_.size() && re_[pos_ + 1] != ']') {
        ++pos_;
        if (peek() == '\\') {
          ++pos_;
          hi = escaped_char();
        } else {
          hi = next_code_point();
        }
        if (hi < lo) fail("reversed range in a class");
      }
      r.push_back({lo, hi});
    }
    ++pos_;
    r = normalize_ranges(r);
    if (negated) r = complement_ranges(r);
    r = intersect(r, chars());  // in JSON, what needs an escape is left out (a subset)
    if (r.empty()) fail(no_char_error());
    return r;
  }

  std::string ranges_expr(const Ranges& r) {
    const Ranges safe = intersect(r, chars());
    if (safe.empty()) fail(no_char_error());
    return char_class(safe);
  }

  const Ranges& chars() const { return form_ == Form::Json ? json_plain_chars() : text_chars(); }
  std::string no_char_error() const {
    return form_ == Form::Json ? "the class matches no character that a JSON string holds unescaped"
                               : "the class matches no character";
  }

  // One character as the output writes it (a JSON string escapes some).
  std::string char_expr(uint32_t cp) {
    if (form_ == Form::Text && cp == 0) fail("NUL is not matched");
    if (form_ == Form::Json && cp == '"') return gbnf_literal("\\\"");
    if (form_ == Form::Json && cp == '\\') return gbnf_literal("\\\\");
    if (form_ == Form::Json && cp < 0x20) return gbnf_literal(fmt::format("\\u{:04x}", cp));
    std::vector<uint8_t> b;
    append_utf8(cp, b);
    return gbnf_literal(std::string(b.begin(), b.end()));
  }

  std::string_view re_;
  std::string context_;
  Form form_;
  size_t pos_ = 0;
  int depth_ = 0;  // open groups
};

constexpr int kMaxSchemaDepth = 128;

const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> k = {
      "title",    "description", "examples", "default",          "$schema",        "$id",
      "$comment", "deprecated",  "readOnly", "writeOnly",        "$defs",          "definitions",
      "strict",   "name",        "$anchor",  "contentMediaType", "contentEncoding"};
  return k;
}

const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> k = {
      "type",     "properties", "required",  "additionalProperties",
      "enum",     "const",      "items",     "prefixItems",
      "minItems", "maxItems",   "minLength", "maxLength",
      "pattern",  "format",     "anyOf",     "oneOf",
      "allOf",    "$ref"};
  return k;
}

std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s) {
    const char k = std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '-';
    if (k != '-' || out.empty() || out.back() != '-') out += k;  // a run of '-' as one
  }
  if (out.size() > 40) out.resize(40);
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "x" : out;
}

std::string escape_pointer(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, const SchemaOptions& opt) : root_(root), opt_(opt) {}

  std::string compile() {
    names_.insert(opt_.root_name);
    const std::string body = visit(root_, "", opt_.root_name);
    if (!unsupported_.empty()) {
      std::string list;
      for (size_t i = 0; i < unsupported_.size(); ++i) list += (i ? ", " : "") + unsupported_[i];
      throw GrammarError("unsupported JSON schema keywords: " + list);
    }
    std::string out = opt_.root_name + " ::= " + body + "\n";
    for (const auto& [name, rule] : rules_) out += name + " ::= " + rule + "\n";
    return out;
  }

  std::string any_object() {
    names_.insert(opt_.root_name);
    std::string out = opt_.root_name + " ::= " + prim("object") + "\n";
    for (const auto& [name, rule] : rules_) out += name + " ::= " + rule + "\n";
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& where, const std::string& msg) const {
    throw GrammarError(fmt::format("JSON schema at {}: {}", where.empty() ? "/" : where, msg));
  }

  std::string add_rule(const std::string& hint, const std::string& body) {
    std::string name = opt_.rule_prefix + sanitize(hint);
    for (int i = 2; names_.count(name); ++i)
      name = opt_.rule_prefix + sanitize(hint) + "-" + std::to_string(i);
    names_.insert(name);
    rules_.push_back({name, body});
    return name;
  }

  // The shared rules, emitted on first use.
  std::string prim(const std::string& what) {
    const std::string name = opt_.rule_prefix + "json-" + what;
    if (prims_.count(what)) return name;
    prims_.insert(what);
    names_.insert(name);
    const std::string ws = what == "ws" ? "" : prim("ws");
    std::string body;
    if (what == "ws") {
      body = "| \" \" | \"\\n\" [ \\t]{0,24}";
    } else if (what == "char") {
      body = "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})";
    } else if (what == "string") {
      body = "\"\\\"\" " + prim("char") + "* \"\\\"\"";
    } else if (what == "integer") {
      body = "\"-\"? (\"0\" | [1-9] [0-9]{0,15})";
    } else if (what == "number") {
      body = prim("integer") + " (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?";
    } else if (what == "boolean") {
      body = "\"true\" | \"false\"";
    } else if (what == "null") {
      body = "\"null\"";
    } else if (what == "value") {
      body = prim("object") + " | " + prim("array") + " | " + prim("string") + " | " +
             prim("number") + " | " + prim("boolean") + " | " + prim("null");
    } else if (what == "object") {
      const std::string kv =
          prim("string") + " " + ws + " \":\" " + ws + " " + prim("value") + " " + ws;
      body = "\"{\" " + ws + " (" + kv + " (\",\" " + ws + " " + kv + ")*)? \"}\"";
    } else if (what == "array") {
      const std::string item = prim("value") + " " + ws;
      body = "\"[\" " + ws + " (" + item + " (\",\" " + ws + " " + item + ")*)? \"]\"";
    }
    rules_.push_back({name, body});
    return name;
  }

  void check_keywords(const json& s, const std::string& where) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (!supported_keywords().count(k) && !annotation_keywords().count(k))
        unsupported_.push_back(fmt::format("{} (at {})", k, where.empty() ? "/" : where));
    }
  }

  std::optional<int64_t> count(const json& s, const char* key, const std::string& where) {
    auto it = s.find(key);
    if (it == s.end()) return std::nullopt;
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      fail(where + "/" + key, fmt::format("{} must be a non-negative integer", key));
    if (it->get<int64_t>() > 10000) fail(where + "/" + key, fmt::format("{} is above 10000", key));
    return it->get<int64_t>();
  }

  // Depth-guarded: $ref chains recurse too.
  std::string visit(const json& s, const std::string& where, const std::string& hint) {
    if (++depth_ > kMaxSchemaDepth)
      fail(where,
           fmt::format("the schema nests deeper than {} levels (counting $ref)", kMaxSchemaDepth));
    std::string out = visit_node(s, where, hint);
    --depth_;
    return out;
  }

  std::string visit_node(const json& s, const std::string& where, const std::string& hint) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(where, "the schema false matches nothing");
      return prim("value");
    }
    if (!s.is_object()) fail(where, "a schema must be an object or a boolean");
    check_keywords(s, where);
    if (auto it = s.find("$ref"); it != s.end()) return ref(*it, where);
    if (auto it = s.find("const"); it != s.end()) return json_literal(*it);
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) fail(where + "/enum", "enum must be a non-empty array");
      std::string body;
      for (size_t i = 0; i < it->size(); ++i) body += (i ? " | " : "") + json_literal((*it)[i]);
      return add_rule(hint, body);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto it = s.find(key); it != s.end()) {
        if (!it->is_array() || it->empty())
          fail(where + "/" + key, fmt::format("{} must be a non-empty array", key));
        std::string body;
        for (size_t i = 0; i < it->size(); ++i)
          body += (i ? " | " : "") + visit((*it)[i], fmt::format("{}/{}/{}", where, key, i),
                                           fmt::format("{}-{}", hint, i));
        return add_rule(hint, body);
      }
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->size() != 1) {
        unsupported_.push_back(
            fmt::format("allOf with more than one schema (at {})", where.empty() ? "/" : where));
        return prim("value");
      }
      return visit((*it)[0], where + "/allOf/0", hint);
    }
    auto type = s.find("type");
    if (type == s.end()) {
      if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required"))
        return object(s, where, hint);
      if (s.contains("items") || s.contains("prefixItems")) return array(s, where, hint);
      if (s.contains("pattern") || s.contains("format") || s.contains("minLength") ||
          s.contains("maxLength"))
        return string(s, where, hint);
      return prim("value");
    }
    if (type->is_array()) {
      if (type->empty()) fail(where + "/type", "type must not be an empty list");
      std::string body;
      for (size_t i = 0; i < type->size(); ++i) {
        if (!(*type)[i].is_string())
          fail(where + "/type", "type must be a string or a list of strings");
        body += (i ? " | " : "") + typed((*type)[i].get<std::string>(), s, where,
                                         hint + "-" + (*type)[i].get<std::string>());
      }
      return add_rule(hint, body);
    }
    if (!type->is_string()) fail(where + "/type", "type must be a string or a list of strings");
    return typed(type->get<std::string>(), s, where, hint);
  }

  std::string typed(const std::string& t, const json& s, const std::string& where,
                    const std::string& hint) {
    if (t == "object") return object(s, where, hint);
    if (t == "array") return array(s, where, hint);
    if (t == "string") return string(s, where, hint);
    if (t == "number" || t == "integer" || t == "boolean" || t == "null") return prim(t);
    fail(where + "/type", fmt::format("unknown type \"{}\"", t));
  }

  std::string ref(const json& r, const std::string& where) {
    if (!r.is_string()) fail(where + "/$ref", "$ref must be a string");
    const std::string target = r.get<std::string>();
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    std::string key;
    for (const char* prefix : {"#/$defs/", "#/definitions/"})
      if (target.rfind(prefix, 0) == 0) key = prefix;
    if (key.empty()) {
      unsupported_.push_back(
          fmt::format("$ref to \"{}\" (at {}; only #/$defs/... and #/definitions/...)", target,
                      where.empty() ? "/" : where));
      return prim("value");
    }
    const std::string section = key.substr(2, key.size() - 3);
    const std::string name = target.substr(key.size());
    auto sec = root_.find(section);
    if (sec == root_.end() || !sec->is_object() || !sec->contains(name))
      fail(where + "/$ref", fmt::format("\"{}\" is not defined", target));
    // reserve the rule first: a definition may refer to itself
    std::string rule = opt_.rule_prefix + "def-" + sanitize(name);
    for (int i = 2; names_.count(rule); ++i)
      rule = opt_.rule_prefix + "def-" + sanitize(name) + "-" + std::to_string(i);
    names_.insert(rule);
    refs_[target] = rule;
    const size_t slot = rules_.size();
    rules_.push_back({rule, ""});
    const std::string body =
        visit((*sec)[name], "/" + section + "/" + escape_pointer(name), "def-" + name);
    rules_[slot].second = body;
    return rule;
  }

  std::string object(const json& s, const std::string& where, const std::string& hint) {
    const std::string ws = prim("ws");
    std::vector<std::pair<std::string, std::string>> props;  // key literal, value expression
    std::vector<bool> required;
    std::set<std::string> req_names;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) fail(where + "/required", "required must be an array of strings");
      for (const auto& r : *it) {
        if (!r.is_string()) fail(where + "/required", "required must be an array of strings");
        req_names.insert(r.get<std::string>());
      }
    }
    std::set<std::string> declared;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) fail(where + "/properties", "properties must be an object");
      for (auto p = it->begin(); p != it->end(); ++p) {
        declared.insert(p.key());
        const std::string v = visit(p.value(), where + "/properties/" + escape_pointer(p.key()),
                                    hint + "-" + p.key());
        props.push_back({json_literal(json(p.key())), v});
        required.push_back(req_names.count(p.key()) > 0);
      }
    }
    for (const auto& r : req_names)  // required but not declared: any value
      if (!declared.count(r)) {
        props.push_back({json_literal(json(r)), prim("value")});
        required.push_back(true);
      }
    if (props.empty()) {
      // no properties: a map, its values from additionalProperties when it is a schema
      auto ap = s.find("additionalProperties");
      if (ap != s.end() && ap->is_boolean() && !ap->get<bool>())
        return gbnf_literal("{") + " " + ws + " " + gbnf_literal("}");
      std::string value = prim("value");
      if (ap != s.end() && ap->is_object())
        value = visit(*ap, where + "/additionalProperties", hint + "-value");
      const std::string kv = add_rule(
          hint + "-kv", prim("string") + " " + ws + " \":\" " + ws + " " + value + " " + ws);
      return add_rule(hint, "\"{\" " + ws + " (" + kv + " (\",\" " + ws + " " + kv + ")*)? \"}\"");
    }
    // tail[i]: properties i.. after one was written (each after a comma);
    // head[i]: properties i.. when none was written yet
    const size_t n = props.size();
    std::vector<std::string> kv(n), tail(n + 1), head(n + 1);
    for (size_t i = 0; i < n; ++i)
      kv[i] = add_rule(hint + "-kv", props[i].first + " " + ws + " \":\" " + ws + " " +
                                         props[i].second + " " + ws);
    tail[n] = "";
    for (size_t i = n; i-- > 0;) {
      const std::string item = "\",\" " + ws + " " + kv[i];
      const std::string rest = tail[i + 1].empty() ? "" : " " + tail[i + 1];
      const std::string body = required[i] ? item + rest : "(" + item + ")?" + rest;
      tail[i] = add_rule(hint + "-tail", body);
    }
    head[n] = "";
    for (size_t i = n; i-- > 0;) {
      const std::string with = kv[i] + (tail[i + 1].empty() ? "" : " " + tail[i + 1]);
      if (required[i])
        head[i] = with;
      else
        head[i] = "(" + with + (head[i + 1].empty() ? " | \"\"" : " | " + head[i + 1]) + ")";
      if (head[i].size() > 200) head[i] = add_rule(hint + "-head", head[i]);
    }
    return add_rule(hint, "\"{\" " + ws + " " + head[0] + " \"}\"");
  }

  std::string array(const json& s, const std::string& where, const std::string& hint) {
    const std::string ws = prim("ws");
    const auto lo = count(s, "minItems", where), hi = count(s, "maxItems", where);
    if (lo && hi && *hi < *lo) fail(where, "maxItems is below minItems");
    if (auto p = s.find("prefixItems"); p != s.end()) {
      if (lo || hi || s.contains("items")) {
        unsupported_.push_back(fmt::format("prefixItems with items, minItems or maxItems (at {})",
                                           where.empty() ? "/" : where));
        return prim("array");
      }
      if (!p->is_array() || p->empty())
        fail(where + "/prefixItems", "prefixItems must be a non-empty array");
      std::string body = "\"[\" " + ws;
      for (size_t i = 0; i < p->size(); ++i)
        body += (i ? " \",\" " + ws + " " : " ") +
                visit((*p)[i], fmt::format("{}/prefixItems/{}", where, i),
                      fmt::format("{}-{}", hint, i)) +
                " " + ws;
      return add_rule(hint, body + " \"]\"");
    }
    std::string item_expr = prim("value");
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_boolean() && !it->get<bool>())
        return gbnf_literal("[") + " " + ws + " " + gbnf_literal("]");
      item_expr = visit(*it, where + "/items", hint + "-item");
    }
    const std::string item = add_rule(hint + "-item-ws", item_expr + " " + ws);
    const std::string next = "(\",\" " + ws + " " + item + ")";
    const int64_t min = lo.value_or(0);
    if (hi && *hi == 0) return gbnf_literal("[") + " " + ws + " " + gbnf_literal("]");
    std::string more;  // items after the first: min - 1 up to max - 1
    const int64_t more_lo = std::max<int64_t>(min - 1, 0);
    if (!hi)
      more = more_lo == 0 ? next + "*" : fmt::format("{}{{{},}}", next, more_lo);
    else if (*hi - 1 == 0)
      more = "";
    else
      more = fmt::format("{}{{{},{}}}", next, more_lo, *hi - 1);
    const std::string items = item + (more.empty() ? "" : " " + more);
    const std::string body = min == 0 ? "\"[\" " + ws + " (" + items + ")? \"]\""
                                      : "\"[\" " + ws + " " + items + " \"]\"";
    return add_rule(hint, body);
  }

  std::string string(const json& s, const std::string& where, const std::string& hint) {
    const auto lo = count(s, "minLength", where), hi = count(s, "maxLength", where);
    if (lo && hi && *hi < *lo) fail(where, "maxLength is below minLength");
    const bool sized = lo || hi;
    std::string content;
    if (auto p = s.find("pattern"); p != s.end()) {
      if (!p->is_string()) fail(where + "/pattern", "pattern must be a string");
      if (sized)
        unsupported_.push_back(
            fmt::format("minLength/maxLength with pattern (at {})", where.empty() ? "/" : where));
      content = PatternCompiler(p->get<std::string>(),
                                fmt::format("JSON schema at {}: pattern", where + "/pattern"))
                    .compile();
    } else if (auto f = s.find("format"); f != s.end()) {
      if (!f->is_string()) fail(where + "/format", "format must be a string");
      if (sized)
        unsupported_.push_back(
            fmt::format("minLength/maxLength with format (at {})", where.empty() ? "/" : where));
      content = format(f->get<std::string>(), where);
    } else if (sized) {
      content = hi ? fmt::format("{}{{{},{}}}", prim("char"), lo.value_or(0), *hi)
                   : fmt::format("{}{{{},}}", prim("char"), *lo);
    } else {
      return prim("string");
    }
    return add_rule(hint, "\"\\\"\" " + content + " \"\\\"\"");
  }

  std::string format(const std::string& f, const std::string& where) {
    const std::string date =
        "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])";
    const std::string time =
        "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" "
        "| [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";
    if (f == "date") return date;
    if (f == "time") return time;
    if (f == "date-time") return date + " \"T\" " + time;
    if (f == "uuid")
      return "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}";
    if (f == "email")
      return "[a-zA-Z0-9._+-]{1,64} \"@\" [a-zA-Z0-9] [a-zA-Z0-9-]{0,62} (\".\" [a-zA-Z0-9] "
             "[a-zA-Z0-9-]{0,62}){0,4} \".\" [a-zA-Z]{2,24}";
    if (f == "ipv4") {
      const std::string octet =
          "(\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9])";
      return octet + " \".\" " + octet + " \".\" " + octet + " \".\" " + octet;
    }
    unsupported_.push_back(
        fmt::format("format \"{}\" (at {}; supported: date, time, date-time, uuid, email, ipv4)", f,
                    where.empty() ? "/" : where));
    return "\"\"";
  }

  const json& root_;
  SchemaOptions opt_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> names_, prims_;
  std::map<std::string, std::string> refs_;
  std::vector<std::string> unsupported_;
  int depth_ = 0;
};

}  // namespace

std::string json_schema_to_gbnf(const json& schema, const SchemaOptions& opt) {
  return SchemaCompiler(schema, opt).compile();
}

std::string json_object_gbnf(const SchemaOptions& opt) {
  return SchemaCompiler(json::object(), opt).any_object();
}

std::string regex_to_gbnf(std::string_view regex) {
  return "root ::= " + PatternCompiler(regex, "regex", PatternCompiler::Form::Text).compile() +
         "\n";
}

std::string choice_to_gbnf(const std::vector<std::string>& choices) {
  if (choices.empty()) throw GrammarError("no choices");
  std::string out = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) throw GrammarError(fmt::format("choice {} is empty", i));
    out += (i ? " | " : "") + gbnf_literal(choices[i]);
  }
  return out + "\n";
}

}  // namespace wick::grammar
