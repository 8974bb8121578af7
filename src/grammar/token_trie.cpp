#include "grammar/token_trie.h"

#include <algorithm>
#include <numeric>

#include "grammar/plain_text.h"
#include "text/tokenizer.h"

namespace wick::grammar {

namespace {

constexpr size_t kMaxTokenBytes = 65535;  // depth is 16 bits; longer tokens are left out

// The trie of the tokens ids (each with non-empty bytes).
TrieNodes build_nodes(const std::vector<std::string>& bytes, std::vector<int32_t> order) {
  TrieNodes t;
  // byte order (std::string compares chars as unsigned): prefixes first, so
  // that nodes are created in preorder
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes[size_t(a)] != bytes[size_t(b)] ? bytes[size_t(a)] < bytes[size_t(b)] : a < b;
  });
  t.byte.push_back(0);
  t.depth.push_back(0);
  t.end.push_back(0);
  std::vector<uint32_t> n_tok(1, 0);
  std::vector<uint32_t> path{0};  // path[d]: the node at depth d of the last token
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = bytes[size_t(id)];
    size_t lcp = 0;
    if (prev)
      while (lcp < s.size() && lcp < prev->size() && s[lcp] == (*prev)[lcp]) ++lcp;
    while (path.size() > lcp + 1) {  // close the subtrees that s leaves
      t.end[path.back()] = uint32_t(t.byte.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < s.size(); ++d) {
      path.push_back(uint32_t(t.byte.size()));
      t.byte.push_back(uint8_t(s[d]));
      t.depth.push_back(uint16_t(d + 1));
      t.end.push_back(0);
      n_tok.push_back(0);
    }
    ++n_tok[path.back()];
    t.tokens.push_back(id);
    t.max_depth = std::max(t.max_depth, s.size());
    prev = &s;
  }
  while (!path.empty()) {
    t.end[path.back()] = uint32_t(t.byte.size());
    path.pop_back();
  }
  // tokens is in sorted order, which is the preorder of the nodes they end at
  t.tok_begin.assign(n_tok.size() + 1, 0);
  std::partial_sum(n_tok.begin(), n_tok.end(), t.tok_begin.begin() + 1);
  // subtree byte sets, children before parents (reverse preorder); kept for large subtrees
  const size_t n = t.byte.size();
  std::vector<ByteSet> below(n, ByteSet{});
  t.below.assign(n, -1);
  for (size_t i = n; i-- > 1;) {
    for (size_t c = i + 1; c < t.end[i]; c = t.end[c]) {
      for (size_t w = 0; w < 4; ++w) below[i][w] |= below[c][w];
      below[i][t.byte[c] >> 6] |= uint64_t(1) << (t.byte[c] & 63);
    }
    if (t.end[i] - i >= TrieNodes::kMinSummarized) {
      t.below[i] = int32_t(t.subtree_bytes.size());
      t.subtree_bytes.push_back(below[i]);
    }
  }
  return t;
}

// Characters a plain-text token starts: its bytes that are not continuation bytes.
uint16_t n_chars(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
  return uint16_t(std::min<size_t>(n, 0xFFFF));
}

// t.max_chars for a trie of plain-text tokens.
void set_max_chars(TrieNodes& t, const std::vector<std::string>& bytes) {
  const size_t n = t.n_nodes();
  t.max_chars.assign(n, 0);
  for (size_t i = n; i-- > 0;) {  // children before parents
    uint16_t m = 0;
    for (uint32_t k = t.tok_begin[i]; k < t.tok_begin[i + 1]; ++k)
      m = std::max(m, n_chars(bytes[size_t(t.tokens[k])]));
    for (size_t c = i + 1; c < t.end[i]; c = t.end[c]) m = std::max(m, t.max_chars[c]);
    t.max_chars[i] = m;
  }
}

}  // namespace

TokenTrie::TokenTrie(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  std::vector<int32_t> rest, plain;
  const size_t n_words = (bytes_.size() + 63) / 64;
  plain_mask_.assign(n_words, 0);
  plain_upto_.assign(size_t(kPlainLevels), std::vector<uint64_t>(n_words, 0));
  for (size_t id = 0; id < bytes_.size(); ++id) {
    const std::string& s = bytes_[id];
    if (s.empty() || s.size() > kMaxTokenBytes) continue;
    if (is_plain_text(s)) {
      plain_mask_[id >> 6] |= uint64_t(1) << (id & 63);
      for (int k = n_chars(s); k <= kPlainLevels; ++k)
        plain_upto_[size_t(k - 1)][id >> 6] |= uint64_t(1) << (id & 63);
      plain.push_back(int32_t(id));
      ++n_plain_;
    } else {
      rest.push_back(int32_t(id));
    }
  }
  rest_ = build_nodes(bytes_, std::move(rest));
  plain_ = build_nodes(bytes_, std::move(plain));
  set_max_chars(plain_, bytes_);
}

std::shared_ptr<const TokenTrie> TokenTrie::from_tokenizer(const Tokenizer& tk) {
  std::vector<std::string> bytes(size_t(tk.n_vocab()));
  for (int32_t id = 0; id < tk.n_vocab(); ++id)
    if (!tk.is_special(id)) bytes[size_t(id)] = tk.token_bytes(id);
  return std::make_shared<TokenTrie>(std::move(bytes));
}

}  // namespace wick::grammar
