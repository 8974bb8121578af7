#include "server/logprob_json.h"

#include <vector>

namespace wick::server {

std::string token_text(const Tokenizer& tk, int32_t id) {
  if (id < 0 || id >= tk.n_vocab()) return "";
  return tk.decode(std::vector<int32_t>{id}, false);
}

json logprob_entries(const Tokenizer& tk, std::span<const TokenLogprob> lps) {
  auto bytes_of = [](const std::string& t) {
    json b = json::array();
    for (unsigned char c : t) b.push_back(int(c));
    return b;
  };
  json out = json::array();
  for (auto& t : lps) {
    json top = json::array();
    for (auto& [id, lp] : t.top) {
      const std::string s = token_text(tk, id);
      top.push_back({{"token", s}, {"logprob", lp}, {"bytes", bytes_of(s)}});
    }
    const std::string s = token_text(tk, t.id);
    out.push_back(
        {{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return out;
}

}  // namespace wick::server
