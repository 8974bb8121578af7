#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>

namespace wick {

namespace {

std::string error_message(int err) {
  PCRE2_UCHAR msg[256];
  pcre2_get_error_message(err, msg, sizeof msg);
  return reinterpret_cast<char*>(msg);
}

// One thread's match data, context and JIT stack: made on the thread's first
// match, freed when the thread ends (the server's HTTP workers come and go).
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = nullptr;
  MatchState() = default;
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
  ~MatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
  }
};

}  // namespace

Regex::Regex(const std::string& pattern, RegexLimits limits) : pattern_(pattern), limits_(limits) {
  int err = 0;
  PCRE2_SIZE off = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
  if (!code_)
    throw RegexError("regex '" + pattern + "' at offset " + std::to_string(off) + ": " +
                     error_message(err));
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
}

Regex::~Regex() {
  pcre2_code_free(code_);
}

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  thread_local MatchState state;
  pcre2_match_data* md = state.md;
  pcre2_match_context* mc = state.mc;
  // JIT code ignores the depth and heap limits: its stack is its bound
  if (!state.jit_stack)
    state.jit_stack = pcre2_jit_stack_create(32 << 10, size_t(limits_.heap_kib) << 10, nullptr);
  if (!md || !mc)  // a missing JIT stack is fine: no JIT, or its small default
    throw RegexError("regex '" + pattern_ + "': out of memory for the match state");
  pcre2_jit_stack_assign(mc, nullptr, state.jit_stack);
  pcre2_set_match_limit(mc, limits_.match);
  pcre2_set_depth_limit(mc, limits_.depth);
  pcre2_set_heap_limit(mc, limits_.heap_kib);
  auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t start = 0;
  while (start <= s.size()) {
    int rc = pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK, md, mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)  // a limit, or a bad subject: never a silent end of the matches
      throw RegexError("regex '" + pattern_ + "' on " + std::to_string(s.size()) +
                       " bytes: " + error_message(rc));
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (e == b) {  // empty match: step one character on
      if (b >= s.size()) break;
      start = b + 1;
      while (start < s.size() && (uint8_t(s[start]) & 0xc0) == 0x80) ++start;
      continue;
    }
    out.emplace_back(b, e);
    start = e;
  }
}

}  // namespace wick
