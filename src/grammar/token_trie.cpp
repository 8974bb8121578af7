#include "grammar/token_trie.h"

#include <algorithm>
#include <numeric>

#include "text/tokenizer.h"

namespace wick::grammar {

namespace {
constexpr size_t kMaxTokenBytes = 65535;  // depth_ is 16 bits; longer tokens are left out
}

TokenTrie::TokenTrie(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  std::vector<int32_t> order;
  for (size_t id = 0; id < bytes_.size(); ++id)
    if (!bytes_[id].empty() && bytes_[id].size() <= kMaxTokenBytes) order.push_back(int32_t(id));
  // byte order (std::string compares chars as unsigned): prefixes first, so
  // that nodes are created in preorder
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] != bytes_[size_t(b)] ? bytes_[size_t(a)] < bytes_[size_t(b)] : a < b;
  });
  byte_.push_back(0);
  depth_.push_back(0);
  end_.push_back(0);
  std::vector<uint32_t> n_tok(1, 0);
  std::vector<uint32_t> path{0};  // path[d]: the node at depth d of the last token
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = bytes_[size_t(id)];
    size_t lcp = 0;
    if (prev)
      while (lcp < s.size() && lcp < prev->size() && s[lcp] == (*prev)[lcp]) ++lcp;
    while (path.size() > lcp + 1) {  // close the subtrees that s leaves
      end_[path.back()] = uint32_t(byte_.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < s.size(); ++d) {
      path.push_back(uint32_t(byte_.size()));
      byte_.push_back(uint8_t(s[d]));
      depth_.push_back(uint16_t(d + 1));
      end_.push_back(0);
      n_tok.push_back(0);
    }
    ++n_tok[path.back()];
    tokens_.push_back(id);
    max_depth_ = std::max(max_depth_, s.size());
    prev = &s;
  }
  while (!path.empty()) {
    end_[path.back()] = uint32_t(byte_.size());
    path.pop_back();
  }
  // tokens_ is in sorted order, which is the preorder of the nodes they end at
  tok_begin_.assign(n_tok.size() + 1, 0);
  std::partial_sum(n_tok.begin(), n_tok.end(), tok_begin_.begin() + 1);
  // subtree byte sets, children before parents (reverse preorder); kept for large subtrees
  const size_t n = byte_.size();
  std::vector<ByteSet> below(n, ByteSet{});
  below_.assign(n, -1);
  for (size_t i = n; i-- > 1;) {
    for (size_t c = i + 1; c < end_[i]; c = end_[c]) {
      for (size_t w = 0; w < 4; ++w) below[i][w] |= below[c][w];
      below[i][byte_[c] >> 6] |= uint64_t(1) << (byte_[c] & 63);
    }
    if (end_[i] - i >= kMinSummarized) {
      below_[i] = int32_t(subtree_bytes_.size());
      subtree_bytes_.push_back(below[i]);
    }
  }
}

std::shared_ptr<const TokenTrie> TokenTrie::from_tokenizer(const Tokenizer& tk) {
  std::vector<std::string> bytes(size_t(tk.n_vocab()));
  for (int32_t id = 0; id < tk.n_vocab(); ++id)
    if (!tk.is_special(id)) bytes[size_t(id)] = tk.token_bytes(id);
  return std::make_shared<TokenTrie>(std::move(bytes));
}

}  // namespace wick::grammar
