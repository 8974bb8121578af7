// A compiled PCRE2 pattern (UTF + Unicode properties, JIT where available).
// Patterns come from tokenizer files, so every match runs under PCRE2's
// match, depth and heap limits: a pattern that backtracks without end fails
// with an error naming it instead of hanging the thread.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace wick {

// A pattern that does not compile, or a match past a limit; names the pattern.
struct RegexError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RegexLimits {
  uint32_t match = 10'000'000;   // backtracking steps of one match
  uint32_t depth = 100'000;      // nested backtracking points
  uint32_t heap_kib = 64 << 10;  // backtracking memory
};

class Regex {
 public:
  // throws RegexError naming the pattern
  explicit Regex(const std::string& pattern, RegexLimits limits = {});
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Non-overlapping matches in s as (begin, end) byte offsets; s must be
  // valid UTF-8. Throws RegexError when a limit is hit.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::string pattern_;
  RegexLimits limits_;
  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace wick
