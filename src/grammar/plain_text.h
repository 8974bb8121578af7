// "Plain text": the characters that appear as they are in most text a
// grammar lets through (inside a JSON string, a GBNF [^"\\] class): every
// code point from U+0020 up except '"' and '\\', surrogates excluded, in
// shortest-form UTF-8 (what grammar/utf8_ranges.h generates). A small byte
// automaton over it: a token is plain text when its bytes follow it from
// kPlainStart without an invalid byte, ending anywhere (a token may end
// inside a character). The mask uses it to take every plain-text token at
// once when a grammar state accepts all of plain text (matcher.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace wick::grammar {

// Between characters, then inside one: the continuation bytes still
// expected (Tail1..3 take 80-BF) or the restricted second byte after E0
// (A0-BF, not overlong), ED (80-9F, no surrogates), F0 (90-BF, not
// overlong) and F4 (80-8F, up to U+10FFFF).
enum PlainState : uint8_t {
  kPlainStart,
  kPlainTail1,
  kPlainTail2,
  kPlainTail3,
  kPlainAfterE0,
  kPlainAfterED,
  kPlainAfterF0,
  kPlainAfterF4,
  kPlainStates,
  kPlainInvalid = 0xFF,
};

using PlainTable = std::array<std::array<uint8_t, 256>, kPlainStates>;

constexpr PlainTable make_plain_table() {
  PlainTable t{};
  for (auto& row : t)
    for (auto& x : row) x = kPlainInvalid;
  auto set = [&](int from, int lo, int hi, uint8_t to) {
    for (int b = lo; b <= hi; ++b) t[size_t(from)][size_t(b)] = to;
  };
  set(kPlainStart, 0x20, 0x7F, kPlainStart);
  t[kPlainStart]['"'] = kPlainInvalid;
  t[kPlainStart]['\\'] = kPlainInvalid;
  set(kPlainStart, 0xC2, 0xDF, kPlainTail1);
  set(kPlainStart, 0xE0, 0xE0, kPlainAfterE0);
  set(kPlainStart, 0xE1, 0xEC, kPlainTail2);
  set(kPlainStart, 0xED, 0xED, kPlainAfterED);
  set(kPlainStart, 0xEE, 0xEF, kPlainTail2);
  set(kPlainStart, 0xF0, 0xF0, kPlainAfterF0);
  set(kPlainStart, 0xF1, 0xF3, kPlainTail3);
  set(kPlainStart, 0xF4, 0xF4, kPlainAfterF4);
  set(kPlainTail1, 0x80, 0xBF, kPlainStart);
  set(kPlainTail2, 0x80, 0xBF, kPlainTail1);
  set(kPlainTail3, 0x80, 0xBF, kPlainTail2);
  set(kPlainAfterE0, 0xA0, 0xBF, kPlainTail1);
  set(kPlainAfterED, 0x80, 0x9F, kPlainTail1);
  set(kPlainAfterF0, 0x90, 0xBF, kPlainTail2);
  set(kPlainAfterF4, 0x80, 0x8F, kPlainTail2);
  return t;
}

inline constexpr PlainTable kPlainTable = make_plain_table();

// Whether bytes (non-empty) follow the automaton from kPlainStart.
inline bool is_plain_text(std::string_view bytes) {
  if (bytes.empty()) return false;
  uint8_t s = kPlainStart;
  for (char c : bytes)
    if ((s = kPlainTable[s][uint8_t(c)]) == kPlainInvalid) return false;
  return true;
}

}  // namespace wick::grammar
