// GPT-2's byte-to-character table: every byte maps to a printable code point
// (printable Latin-1 bytes to themselves, the rest to U+0100 onwards).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace wick::byte_level {

const std::array<std::string, 256>& byte_to_utf8();
// The byte a code point stands for, or -1 when it is not in the table.
int char_to_byte(uint32_t cp);

}  // namespace wick::byte_level
