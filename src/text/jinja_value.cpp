// Values of the Jinja subset: conversion from JSON and Python's str()/json.dumps.
#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "text/jinja.h"
#include "text/utf8.h"

namespace wick::jinja {

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return integer(int64_t(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return real(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array xs;
      for (auto& x : j) xs.push_back(from_json(x));
      return array(std::move(xs));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object xs;
      for (auto& [k, v] : j.items()) xs.emplace_back(k, from_json(v));
      return object(std::move(xs));
    }
    default:
      return Value{};
  }
}

const Value* Value::find(const std::string& key) const {
  if (kind != Dict) return nullptr;
  for (auto& [k, v] : *dict)
    if (k == key) return &v;
  return nullptr;
}

void Value::set(const std::string& key, Value v) {
  for (auto& [k, x] : *dict)
    if (k == key) {
      x = std::move(v);
      return;
    }
  dict->emplace_back(key, std::move(v));
}

namespace {

// Python's repr() of a float: the shortest digits that round-trip, fixed
// notation for exponents in [-4, 16), else d.ddde+XX.
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (int(digits.size()) <= exp + 1)
        out = digits + std::string(size_t(exp + 1 - int(digits.size())), '0') + ".0";
      else
        out = digits.substr(0, size_t(exp + 1)) + "." + digits.substr(size_t(exp + 1));
    } else {
      out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "") +
          fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  }
  return neg ? "-" + out : out;
}

std::string py_repr_str(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = uint8_t(s[i]);
    if (c == '\\')
      out += "\\\\";
    else if (c == uint8_t(q))
      out += std::string("\\") + char(q);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else {
      const size_t n = size_t(utf8::seq_len(c));
      out.append(s, i, n);
      i += n;
      continue;
    }
    ++i;
  }
  return out + q;
}

std::string repr(const Value& v) {
  return v.kind == Value::String ? py_repr_str(v.s) : to_str(v);
}

void json_str(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04x}", c);
        else
          out += char(c);
    }
  }
  out += '"';
}

constexpr int kMaxJsonDepth = 256;

void json_dump(std::string& out, const Value& v, int indent, bool sort_keys,
               const std::string& item_sep, const std::string& key_sep, int depth,
               size_t max_bytes) {
  if (depth > kMaxJsonDepth)
    throw TemplateError(fmt::format("tojson: nesting deeper than {} levels", kMaxJsonDepth));
  if (out.size() > max_bytes)
    throw TemplateError(fmt::format("tojson: the text would pass {} bytes", max_bytes));
  auto newline = [&](int d) {
    if (indent >= 0) out.append(1, '\n').append(size_t(indent) * size_t(d), ' ');
  };
  switch (v.kind) {
    case Value::Undefined:
    case Value::None:
      out += "null";
      break;
    case Value::Bool:
      out += v.b ? "true" : "false";
      break;
    case Value::Int:
      out += std::to_string(v.i);
      break;
    case Value::Float:
      out += std::isnan(v.f)   ? "NaN"
             : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity")
                               : float_repr(v.f);
      break;
    case Value::String:
      json_str(out, v.s);
      break;
    case Value::List:
      if (v.list->empty()) {
        out += "[]";
        break;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_dump(out, (*v.list)[k], indent, sort_keys, item_sep, key_sep, depth + 1, max_bytes);
      }
      newline(depth);
      out += ']';
      break;
    case Value::Dict: {
      if (v.dict->empty()) {
        out += "{}";
        break;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (auto& kv : *v.dict) items.push_back(&kv);
      if (sort_keys)
        std::sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_str(out, items[k]->first);
        out += key_sep;
        json_dump(out, items[k]->second, indent, sort_keys, item_sep, key_sep, depth + 1,
                  max_bytes);
      }
      newline(depth);
      out += '}';
      break;
    }
    case Value::Callable:
      throw TemplateError("tojson: a function cannot be serialized");
  }
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Undefined:
      return "";
    case Value::None:
      return "None";
    case Value::Bool:
      return v.b ? "True" : "False";
    case Value::Int:
      return std::to_string(v.i);
    case Value::Float:
      return float_repr(v.f);
    case Value::String:
      return v.s;
    case Value::List: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
      return out + "]";
    }
    case Value::Dict: {
      if (v.is_namespace) return "<Namespace>";
      std::string out = "{";
      size_t k = 0;
      for (auto& [key, x] : *v.dict) out += (k++ ? ", " : "") + py_repr_str(key) + ": " + repr(x);
      return out + "}";
    }
    case Value::Callable:
      return "<function>";
  }
  return "";
}

std::string to_json(const Value& v, int indent, bool sort_keys, const std::string& item_sep,
                    const std::string& key_sep, size_t max_bytes) {
  std::string out;
  json_dump(out, v, indent, sort_keys, item_sep.empty() ? (indent >= 0 ? "," : ", ") : item_sep,
            key_sep, 0, max_bytes);
  if (out.size() > max_bytes)
    throw TemplateError(fmt::format("tojson: the text would pass {} bytes", max_bytes));
  return out;
}

}  // namespace wick::jinja
