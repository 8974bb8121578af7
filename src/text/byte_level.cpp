#include "text/byte_level.h"

#include "text/utf8.h"

namespace wick::byte_level {

namespace {
struct Tables {
  std::array<std::string, 256> to_utf8;
  int from_cp[512];
  Tables() {
    for (int& x : from_cp) x = -1;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t cp = keep ? uint32_t(b) : uint32_t(256 + n++);
      utf8::append(to_utf8[b], cp);
      from_cp[cp] = b;
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}
}  // namespace

const std::array<std::string, 256>& byte_to_utf8() {
  return tables().to_utf8;
}

int char_to_byte(uint32_t cp) {
  return cp < 512 ? tables().from_cp[cp] : -1;
}

}  // namespace wick::byte_level
