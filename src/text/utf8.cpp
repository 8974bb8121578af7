#include "text/utf8.h"

namespace wick::utf8 {

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

uint32_t next(std::string_view s, size_t& i) {
  unsigned char c = s[i];
  int n = seq_len(c);
  uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
  for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3f);
  i += size_t(n);
  return cp;
}

namespace {
// Length of the valid sequence at s[i] (0 if invalid), and in `part` how many
// bytes form the maximal prefix of a valid sequence.
int valid_at(std::string_view s, size_t i, int& part) {
  const unsigned char c = s[i];
  part = 1;
  if (c < 0x80) return 1;
  int n;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf)
    n = 2;
  else if (c == 0xe0)
    n = 3, lo = 0xa0;
  else if (c >= 0xe1 && c <= 0xec)
    n = 3;
  else if (c == 0xed)
    n = 3, hi = 0x9f;
  else if (c >= 0xee && c <= 0xef)
    n = 3;
  else if (c == 0xf0)
    n = 4, lo = 0x90;
  else if (c >= 0xf1 && c <= 0xf3)
    n = 4;
  else if (c == 0xf4)
    n = 4, hi = 0x8f;
  else
    return 0;
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char d = s[i + k];
    if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xbf)) return 0;
    part = k + 1;
  }
  return n;
}
}  // namespace

size_t find_invalid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    int part;
    int n = valid_at(s, i, part);
    if (!n) return i;
    i += size_t(n);
  }
  return std::string_view::npos;
}

std::string lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    int part;
    int n = valid_at(s, i, part);
    if (n) {
      out.append(s.substr(i, size_t(n)));
      i += size_t(n);
    } else {
      out += "\xef\xbf\xbd";
      i += size_t(part);
    }
  }
  return out;
}

size_t incomplete_tail(std::string_view s) {
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const unsigned char c = s[s.size() - k];
    if ((c & 0xc0) == 0x80) continue;  // continuation byte: look further back
    const int n = seq_len(c);
    return n > int(k) ? k : 0;
  }
  return 0;
}

}  // namespace wick::utf8
