// JSON text walked for its nesting without parsing it: brackets outside
// strings (escapes honoured), with the depth each one leaves.
#pragma once

#include <cstddef>
#include <string_view>

namespace wick {

// From s[from]: calls f(i, depth) at each '[' or '{' (depth after opening)
// and each ']' or '}' that closes one (depth after closing) outside
// strings; returns the first i for which f returns true, or npos.
template <typename F>
size_t find_json_bracket(std::string_view s, size_t from, F&& f) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = from; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (f(i, ++depth)) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      if (f(i, --depth)) return i;
    }
  }
  return std::string_view::npos;
}

}  // namespace wick
