// Follows a Grammar byte by byte: the state is the set of pushdown stacks
// (what each way of parsing the text so far still expects). Stacks are
// interned as linked nodes (element, parent), so that equal stacks are one
// id and a stack set is a sorted id list, itself interned as a state; the
// transitions state x byte -> state are computed once and kept, a DFA built
// lazily over the states this request visits. The allowed-token mask walks
// the vocabulary's trie with those transitions, and masks are cached by
// state (inside a JSON string, every token starts from the same state).
// A state that accepts every plain-text string (grammar/plain_text.h; what
// a JSON string's characters are) takes the trie's plain-text tokens as
// one bitmask and walks only the small trie of the others.
//
// One matcher per sequence; it is not thread-safe and allocates only when
// it meets a state or transition for the first time.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/token_trie.h"

namespace wick::grammar {

class Matcher {
 public:
  // A grammar whose start expands past the limits (4096 rules
  // entered without a byte) matches nothing: every token is masked.
  explicit Matcher(std::shared_ptr<const Grammar> g);

  // Advances over the bytes when the text stays a prefix of a match, else
  // returns false and leaves the state as it was.
  bool advance(std::string_view bytes);
  bool accept_token(const TokenTrie& trie, int32_t id) { return advance(trie.bytes(id)); }
  // Whether advance(bytes) would succeed; the state stays as it is.
  bool would_accept(std::string_view bytes);
  // The text so far is a whole match (an end-of-generation token may come).
  bool can_end() const;
  // A whole match that nothing may extend: the generation is over.
  bool must_end() const;
  // Bit id set for each token of the trie whose bytes keep the text a
  // prefix of a match (end-of-generation tokens are the caller's: can_end()).
  // Valid until the next call on this matcher.
  const std::vector<uint64_t>& allowed(const TokenTrie& trie);

  // counters, for tests and benchmarks
  size_t n_states() const { return sets_.size(); }
  size_t n_nodes() const { return nodes_.size(); }
  // masks that took plain-text tokens as a bitmask (plain_levels > 0)
  size_t n_plain_masks() const { return n_plain_masks_; }
  // Forget cached masks and plain-text verdicts (a benchmark measuring the
  // mask's computation itself).
  void drop_mask_cache() {
    masks_.clear();
    plain_.clear();
  }

 private:
  struct Node {
    int32_t pos;     // the element this stack expects next (a Bytes element)
    int32_t parent;  // the stack below: where to go after this rule ends (0: nothing)
  };
  int32_t intern_node(int32_t pos, int32_t parent);
  int32_t intern_set(std::vector<int32_t>& stacks);  // sorts; -1 when empty
  // Stacks whose top is a Bytes element (or 0: the whole match ended)
  // reached from expecting elems[pos] with parent below. Each (pos, parent)
  // is expanded once per step (seen_), so alternatives that meet again cost
  // nothing more.
  void expand(int32_t pos, int32_t parent, std::vector<int32_t>& out, int depth);
  int32_t compute_step(int32_t state, uint8_t b);
  int32_t step(int32_t state, uint8_t b) {
    const int32_t t = trans_[size_t(state) * 256 + b];
    return t != kUnknown ? t : compute_step(state, b);
  }
  // Whether every byte of bytes leads from state back to itself (computes
  // transitions only up to the first that does not: in most states one).
  bool loops_over(int32_t state, const ByteSet& bytes);
  // How many characters of plain text state accepts, whatever they are:
  // kAllPlain when every plain-text string keeps it alive (then every
  // plain-text token is allowed), else k when every one of up to k
  // characters does (0 to TokenTrie::kPlainLevels; a string with a
  // maxLength, say). Explores the product of the transitions with the
  // plain-text automaton from (state, kPlainStart) a character at a time,
  // within a budget of product states.
  int plain_levels(int32_t state);
  static constexpr int kAllPlain = 0x7FFF;
  // Sets the bits of the tokens of t allowed from state_ in mask_; with
  // skip_chars > 0, t is the plain-text tokens' trie and subtrees of tokens
  // of at most skip_chars characters are skipped (already in mask_).
  void walk(const TrieNodes& t, int skip_chars);
  // Grows the per-state caches to the number of states.
  void fit_state_caches();
  // Past the cache limits: keep the current stacks, forget the rest.
  void compact();

  static constexpr int32_t kUnknown = -2, kDead = -1;
  std::shared_ptr<const Grammar> g_;
  std::vector<Node> nodes_;  // nodes_[0]: the empty stack
  std::unordered_map<uint64_t, int32_t> node_ids_;
  struct VecHash {
    size_t operator()(const std::vector<int32_t>& v) const;
  };
  std::vector<std::vector<int32_t>> sets_;  // state -> sorted stack ids
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> set_ids_;
  std::vector<int32_t> trans_;  // state * 256 + byte -> state, kDead or kUnknown
  int32_t state_ = -1;
  std::unordered_set<uint64_t> seen_;  // (pos, parent) expanded in this step already
  std::vector<int32_t> walk_;          // trie walk: the state at each depth
  std::vector<int16_t> plain_;         // by state: plain_levels, -1 unknown
  // plain_levels: probe_mark_[state * kPlainStates + plain state] is
  // probe_gen_ for the product states met in this call
  std::vector<uint32_t> probe_mark_;
  uint32_t probe_gen_ = 0;
  std::vector<uint64_t> probe_todo_;
  std::vector<int32_t> probe_level_, probe_next_;
  std::unordered_map<int32_t, std::vector<uint64_t>> masks_;
  std::vector<uint64_t> mask_;
  size_t n_plain_masks_ = 0;
};

}  // namespace wick::grammar
