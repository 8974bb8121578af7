// Code point ranges as UTF-8 byte sequences, so that a grammar over
// characters can be matched one byte at a time (a token may end inside a
// character). Each code point range becomes a few sequences of byte ranges,
// each byte position one range: [0x400-0x4FF] is [D0-D3][80-BF].
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace wick::grammar {

struct ByteRange {
  uint8_t lo, hi;
};
using ByteSeq = std::vector<ByteRange>;  // one range per byte of the encoding

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Sorted, merged code point ranges with the surrogates [D800, DFFF] removed.
std::vector<std::pair<uint32_t, uint32_t>> normalize_ranges(
    std::vector<std::pair<uint32_t, uint32_t>> r);
// The complement of normalized ranges within [0, kMaxCodePoint], surrogates excluded.
std::vector<std::pair<uint32_t, uint32_t>> complement_ranges(
    const std::vector<std::pair<uint32_t, uint32_t>>& r);
// The byte sequences matching exactly the code points of [lo, hi] (no surrogates inside).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteSeq>& out);
// The UTF-8 encoding of one code point.
void append_utf8(uint32_t cp, std::vector<uint8_t>& out);

}  // namespace wick::grammar
