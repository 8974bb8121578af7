// A compiled PCRE2 pattern (UTF + Unicode properties, JIT where available).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace wick {

class Regex {
 public:
  explicit Regex(const std::string& pattern);  // throws std::runtime_error naming the pattern
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Non-overlapping matches in s as (begin, end) byte offsets; s must be valid UTF-8.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace wick
