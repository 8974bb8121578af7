// UTF-8 helpers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace wick::utf8 {

// Length of the UTF-8 sequence starting with lead byte c (1 for invalid).
inline int seq_len(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
}
void append(std::string& out, uint32_t cp);
// Decodes the code point at s[i] (valid UTF-8 assumed) and advances i.
uint32_t next(std::string_view s, size_t& i);
// Offset of the first invalid byte, or npos when s is valid UTF-8.
size_t find_invalid(std::string_view s);
// Replaces each maximal ill-formed subsequence with U+FFFD (as Rust's
// String::from_utf8_lossy and Python's errors="replace" do).
std::string lossy(std::string_view s);
// Bytes at the end of s that start a UTF-8 sequence not yet complete (0..3).
size_t incomplete_tail(std::string_view s);

}  // namespace wick::utf8
