// The vocabulary as a trie of each token's bytes, laid out in preorder so
// that a walk is a loop over arrays: a subtree the grammar rejects is
// skipped in one jump, and a prefix shared by many tokens is matched once.
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

class TokenTrie {
 public:
  // bytes[id]: what token id adds to the output; empty for tokens a grammar
  // never allows (special and control tokens).
  explicit TokenTrie(std::vector<std::string> bytes);
  // Every token's bytes as Tokenizer::token_bytes gives them; special tokens left out.
  static std::shared_ptr<const TokenTrie> from_tokenizer(const Tokenizer& tk);

  int32_t n_vocab() const { return int32_t(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  size_t n_nodes() const { return byte_.size(); }
  size_t max_depth() const { return max_depth_; }

  // Node i (0 is the root, the empty prefix): the byte on the edge from its
  // parent, its depth, the index after its subtree, and the tokens whose
  // bytes end there: tokens_[tok_begin_[i] .. tok_begin_[i + 1]).
  std::vector<uint8_t> byte_;
  std::vector<uint16_t> depth_;
  std::vector<uint32_t> end_;
  std::vector<uint32_t> tok_begin_;
  std::vector<int32_t> tokens_;
  // For nodes with a large subtree: every byte on an edge below the node
  // (subtree_bytes_[below_[i]]; below_[i] -1 for small subtrees). When all
  // of them loop on the walk's state there (a JSON string's plain
  // characters), every token below is allowed without walking it.
  std::vector<int32_t> below_;
  std::vector<ByteSet> subtree_bytes_;
  static constexpr uint32_t kMinSummarized = 16;  // subtree nodes

 private:
  std::vector<std::string> bytes_;
  size_t max_depth_ = 0;
};

}  // namespace wick::grammar
