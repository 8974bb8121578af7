// The vocabulary as a trie of each token's bytes, laid out in preorder so
// that a walk is a loop over arrays: a subtree the grammar rejects is
// skipped in one jump, and a prefix shared by many tokens is matched once.
// Two tries: the plain-text tokens (grammar/plain_text.h), also kept as
// bitmasks, and every other token. Where a grammar state accepts all of
// plain text, the mask is that bitmask and a walk of the small trie; where
// it accepts all plain text up to k characters (a string with a
// maxLength), the bitmask of the plain tokens up to k characters, the small
// trie and the plain tokens' trie past k characters; elsewhere both tries.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace wick {
class Tokenizer;
}

namespace wick::grammar {

// One trie in preorder arrays. Node i (0 is the root, the empty prefix):
// the byte on the edge from its parent, its depth, the index after its
// subtree, and the tokens whose bytes end there: tokens[tok_begin[i] ..
// tok_begin[i + 1]).
struct TrieNodes {
  std::vector<uint8_t> byte;
  std::vector<uint16_t> depth;
  std::vector<uint32_t> end;
  std::vector<uint32_t> tok_begin;
  std::vector<int32_t> tokens;
  // For nodes with a large subtree: every byte on an edge below the node
  // (subtree_bytes[below[i]]; below[i] -1 for small subtrees). When all of
  // them loop on the walk's state there, every token below is allowed
  // without walking it.
  std::vector<int32_t> below;
  std::vector<ByteSet> subtree_bytes;
  // The plain-text tokens' trie only: the most characters a token below
  // node i starts (a token ending inside a character counts it).
  std::vector<uint16_t> max_chars;
  size_t max_depth = 0;
  size_t n_nodes() const { return byte.size(); }
  static constexpr uint32_t kMinSummarized = 16;  // subtree nodes
};

class TokenTrie {
 public:
  // bytes[id]: what token id adds to the output; empty for tokens a grammar
  // never allows (special and control tokens).
  explicit TokenTrie(std::vector<std::string> bytes);
  // Every token's bytes as Tokenizer::token_bytes gives them; special tokens left out.
  static std::shared_ptr<const TokenTrie> from_tokenizer(const Tokenizer& tk);

  int32_t n_vocab() const { return int32_t(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  // Nodes of both tries (every token with bytes is in one).
  size_t n_nodes() const { return plain_.n_nodes() + rest_.n_nodes(); }
  // Bit id set for each plain-text token (is_plain_text of its bytes).
  const std::vector<uint64_t>& plain_mask() const { return plain_mask_; }
  size_t n_plain() const { return n_plain_; }
  // The tokens with bytes that are not plain text.
  const TrieNodes& rest_nodes() const { return rest_; }
  // The plain-text tokens, with max_chars.
  const TrieNodes& plain_nodes() const { return plain_; }
  // Bit id set for each plain-text token of at most k characters, k in
  // [1, kPlainLevels].
  static constexpr int kPlainLevels = 16;
  const std::vector<uint64_t>& plain_upto(int k) const { return plain_upto_[size_t(k - 1)]; }

 private:
  std::vector<std::string> bytes_;
  TrieNodes rest_, plain_;
  std::vector<uint64_t> plain_mask_;
  std::vector<std::vector<uint64_t>> plain_upto_;
  size_t n_plain_ = 0;
};

}  // namespace wick::grammar
