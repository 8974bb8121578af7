#include "grammar/utf8_ranges.h"

#include <algorithm>

namespace wick::grammar {

namespace {

constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

int encoded_length(uint32_t cp) {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

uint32_t max_of_length(int n) {
  return n == 1 ? 0x7F : n == 2 ? 0x7FF : n == 3 ? 0xFFFF : kMaxCodePoint;
}

std::vector<uint8_t> encode(uint32_t cp) {
  std::vector<uint8_t> b;
  append_utf8(cp, b);
  return b;
}

}  // namespace

void append_utf8(uint32_t cp, std::vector<uint8_t>& out) {
  if (cp < 0x80) {
    out.push_back(uint8_t(cp));
  } else if (cp < 0x800) {
    out.push_back(uint8_t(0xC0 | (cp >> 6)));
    out.push_back(uint8_t(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(uint8_t(0xE0 | (cp >> 12)));
    out.push_back(uint8_t(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(uint8_t(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(uint8_t(0xF0 | (cp >> 18)));
    out.push_back(uint8_t(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(uint8_t(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(uint8_t(0x80 | (cp & 0x3F)));
  }
}

std::vector<std::pair<uint32_t, uint32_t>> normalize_ranges(
    std::vector<std::pair<uint32_t, uint32_t>> r) {
  std::vector<std::pair<uint32_t, uint32_t>> split;
  for (auto [lo, hi] : r) {
    hi = std::min(hi, kMaxCodePoint);
    if (lo > hi) continue;
    if (lo < kSurrogateLo && hi >= kSurrogateLo) {
      split.push_back({lo, kSurrogateLo - 1});
      if (hi > kSurrogateHi) split.push_back({kSurrogateHi + 1, hi});
    } else if (lo >= kSurrogateLo && lo <= kSurrogateHi) {
      if (hi > kSurrogateHi) split.push_back({kSurrogateHi + 1, hi});
    } else {
      split.push_back({lo, hi});
    }
  }
  std::sort(split.begin(), split.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto x : split) {
    if (!out.empty() && x.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}

std::vector<std::pair<uint32_t, uint32_t>> complement_ranges(
    const std::vector<std::pair<uint32_t, uint32_t>>& r) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return normalize_ranges(out);
}

// Splits until lo and hi have the same length and differ only where every
// byte in between is free (the scheme regex engines use for UTF-8 automata).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteSeq>& out) {
  if (lo > hi) return;
  for (int n = 1; n < 4; ++n) {
    const uint32_t m = max_of_length(n);
    if (lo <= m && hi > m) {
      utf8_sequences(lo, m, out);
      utf8_sequences(m + 1, hi, out);
      return;
    }
  }
  const int n = encoded_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;  // the low i continuation bytes
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const auto a = encode(lo), b = encode(hi);
  ByteSeq seq;
  for (size_t i = 0; i < a.size(); ++i) seq.push_back({a[i], b[i]});
  out.push_back(std::move(seq));
}

}  // namespace wick::grammar
