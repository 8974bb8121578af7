#include "grammar/matcher.h"

#include <algorithm>

#include "grammar/plain_text.h"

namespace wick::grammar {

namespace {
// A request's grammar is user input: bound what one matcher keeps.
constexpr size_t kMaxStates = 8192;    // 8 MiB of transitions
constexpr size_t kMaxNodes = 1 << 20;  // interned stack nodes
constexpr size_t kMaxStacks = 1024;    // stacks in one state (an ambiguous grammar)
constexpr int kMaxExpandDepth = 4096;  // rules entered without a byte in between
constexpr size_t kMaxCachedMasks = 256;
// Product states plain_levels explores before it stops (inside a plain
// JSON string: the string state and about twenty mid-character states; in
// a string with a maxLength, about as many per character).
constexpr size_t kMaxPlainProbe = 512;

// The bytes the plain-text automaton takes from each of its states.
struct PlainBytes {
  std::array<std::vector<uint8_t>, kPlainStates> of;
  PlainBytes() {
    for (size_t u = 0; u < kPlainStates; ++u)
      for (unsigned b = 0; b < 256; ++b)
        if (kPlainTable[u][b] != kPlainInvalid) of[u].push_back(uint8_t(b));
  }
};
const PlainBytes& plain_bytes() {
  static const PlainBytes p;
  return p;
}
}  // namespace

size_t Matcher::VecHash::operator()(const std::vector<int32_t>& v) const {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ v.size();
  for (int32_t x : v) h = (h ^ uint32_t(x)) * 0x100000001B3ull + (h >> 29);
  return size_t(h);
}

Matcher::Matcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  nodes_.push_back({-1, -1});
  std::vector<int32_t> start;
  seen_.clear();
  for (int32_t a : g_->alts[size_t(g_->root)]) expand(a, 0, start, 0);
  state_ = intern_set(start);
}

int32_t Matcher::intern_node(int32_t pos, int32_t parent) {
  const uint64_t key = uint64_t(uint32_t(pos)) << 32 | uint32_t(parent);
  auto [it, fresh] = node_ids_.try_emplace(key, int32_t(nodes_.size()));
  if (fresh) nodes_.push_back({pos, parent});
  return it->second;
}

int32_t Matcher::intern_set(std::vector<int32_t>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.empty()) return kDead;
  // Sound when truncated: every stack kept is a valid parse, some are lost.
  if (stacks.size() > kMaxStacks) stacks.resize(kMaxStacks);
  auto [it, fresh] = set_ids_.try_emplace(stacks, int32_t(sets_.size()));
  if (fresh) {
    sets_.push_back(stacks);
    trans_.resize(trans_.size() + 256, kUnknown);
  }
  return it->second;
}

void Matcher::expand(int32_t pos, int32_t parent, std::vector<int32_t>& out, int depth) {
  if (depth > kMaxExpandDepth) return;  // see kMaxExpandDepth: sound, like the truncation
  if (!seen_.insert(uint64_t(uint32_t(pos)) << 32 | uint32_t(parent)).second) return;
  const Grammar::Elem& e = g_->elems[size_t(pos)];
  switch (e.kind) {
    case Grammar::Kind::Bytes:
      out.push_back(intern_node(pos, parent));
      return;
    case Grammar::Kind::End:
      if (parent == 0) {
        out.push_back(0);
      } else {
        const Node p = nodes_[size_t(parent)];
        expand(p.pos, p.parent, out, depth + 1);
      }
      return;
    case Grammar::Kind::Ref: {
      // the continuation after the rule; none when the rule ends this one
      // (a tail call: right recursion does not grow the stack)
      const int32_t cont = g_->elems[size_t(pos) + 1].kind == Grammar::Kind::End
                               ? parent
                               : intern_node(pos + 1, parent);
      for (int32_t a : g_->alts[size_t(e.arg)]) expand(a, cont, out, depth + 1);
      return;
    }
  }
}

int32_t Matcher::compute_step(int32_t state, uint8_t b) {
  std::vector<int32_t> next;
  seen_.clear();
  for (int32_t id : sets_[size_t(state)]) {
    if (id == 0) continue;
    const Node n = nodes_[size_t(id)];
    if (has_byte(g_->sets[size_t(g_->elems[size_t(n.pos)].arg)], b))
      expand(n.pos + 1, n.parent, next, 0);
  }
  const int32_t t = intern_set(next);
  // the same for every byte in the same sets
  int32_t* row = trans_.data() + size_t(state) * 256;
  for (uint8_t c : g_->class_bytes[g_->byte_class[b]]) row[c] = t;
  return t;
}

void Matcher::compact() {
  if (state_ == kDead) return;
  if (sets_.size() <= kMaxStates && nodes_.size() <= kMaxNodes) return;
  // the current stacks as element lists (top first), then everything anew
  std::vector<std::vector<int32_t>> stacks;
  for (int32_t id : sets_[size_t(state_)]) {
    std::vector<int32_t> s;
    for (int32_t n = id; n != 0; n = nodes_[size_t(n)].parent) s.push_back(nodes_[size_t(n)].pos);
    stacks.push_back(std::move(s));
  }
  nodes_.resize(1);
  node_ids_.clear();
  sets_.clear();
  set_ids_.clear();
  trans_.clear();
  plain_.clear();
  probe_mark_.clear();
  masks_.clear();
  std::vector<int32_t> ids;
  for (const auto& s : stacks) {
    int32_t parent = 0;
    for (auto it = s.rbegin(); it != s.rend(); ++it) parent = intern_node(*it, parent);
    ids.push_back(parent);
  }
  state_ = intern_set(ids);
}

bool Matcher::advance(std::string_view bytes) {
  if (state_ == kDead) return bytes.empty();
  compact();
  int32_t s = state_;
  for (char c : bytes) {
    s = step(s, uint8_t(c));
    if (s == kDead) return false;
  }
  state_ = s;
  return true;
}

bool Matcher::would_accept(std::string_view bytes) {
  if (state_ == kDead) return bytes.empty();
  compact();
  int32_t s = state_;
  for (char c : bytes)
    if ((s = step(s, uint8_t(c))) == kDead) return false;
  return true;
}

bool Matcher::can_end() const {
  if (state_ == kDead) return false;
  return sets_[size_t(state_)].front() == 0;  // sorted: the empty stack first
}

bool Matcher::must_end() const {
  if (state_ == kDead) return false;
  return sets_[size_t(state_)].size() == 1 && can_end();
}

void Matcher::fit_state_caches() {
  if (plain_.size() < sets_.size()) plain_.resize(sets_.size(), -1);
}

bool Matcher::loops_over(int32_t state, const ByteSet& bytes) {
  for (unsigned w = 0; w < 4; ++w)
    for (uint64_t bits = bytes[w]; bits; bits &= bits - 1)
      if (step(state, uint8_t(w * 64 + unsigned(__builtin_ctzll(bits)))) != state) return false;
  return true;
}

int Matcher::plain_levels(int32_t state) {
  fit_state_caches();
  if (plain_[size_t(state)] >= 0) return plain_[size_t(state)];
  // Level c: the grammar states after c whole characters. Expanding it over
  // the next character (its bytes through the mid-character product
  // states) either meets kDead (then exactly the strings of up to c
  // characters are known to live) or gives level c + 1: the states not met
  // before, since the continuations of one met before were expanded then.
  // No new state at all: every plain-text string lives.
  const PlainBytes& pb = plain_bytes();
  auto key = [](int32_t g, uint8_t u) { return uint64_t(uint32_t(g)) << 8 | u; };
  size_t n_met = 0;
  auto meet = [&](int32_t g, uint8_t u) {  // false when met before in this call
    const size_t i = size_t(g) * kPlainStates + u;
    if (probe_mark_.size() <= i) probe_mark_.resize(sets_.size() * kPlainStates, 0);
    if (probe_mark_[i] == probe_gen_) return false;
    probe_mark_[i] = probe_gen_;
    ++n_met;
    return true;
  };
  if (++probe_gen_ == 0) {  // wrapped: old marks could match
    std::fill(probe_mark_.begin(), probe_mark_.end(), 0);
    probe_gen_ = 1;
  }
  meet(state, kPlainStart);
  probe_level_.assign(1, state);
  int levels = 0;
  for (;; ++levels) {
    if (probe_level_.empty()) {
      levels = kAllPlain;
      break;
    }
    if (levels == TokenTrie::kPlainLevels) break;
    probe_next_.clear();
    probe_todo_.clear();
    for (int32_t g : probe_level_) probe_todo_.push_back(key(g, kPlainStart));
    bool alive = true;
    while (alive && !probe_todo_.empty()) {
      const int32_t g = int32_t(probe_todo_.back() >> 8);
      const uint8_t u = uint8_t(probe_todo_.back() & 0xFF);
      probe_todo_.pop_back();
      for (uint8_t b : pb.of[u]) {
        const int32_t t = step(g, b);
        const uint8_t v = kPlainTable[u][b];
        if (t == kDead || n_met >= kMaxPlainProbe) {
          alive = false;  // kDead; or unknown past the budget: the walk decides
          break;
        }
        if (!meet(t, v)) continue;
        if (v == kPlainStart)
          probe_next_.push_back(t);
        else
          probe_todo_.push_back(key(t, v));
      }
    }
    if (!alive) break;
    probe_level_.swap(probe_next_);
  }
  fit_state_caches();  // step() may have added states
  plain_[size_t(state)] = int16_t(levels);
  return levels;
}

void Matcher::walk(const TrieNodes& trie, int skip_chars) {
  walk_.resize(trie.max_depth + 1);
  walk_[0] = state_;
  const uint8_t* byte = trie.byte.data();
  const uint16_t* depth = trie.depth.data();
  const uint32_t* end = trie.end.data();
  const uint32_t* tok_begin = trie.tok_begin.data();
  const int32_t* tokens = trie.tokens.data();
  const int32_t* below = trie.below.data();
  const uint16_t* max_chars = skip_chars > 0 ? trie.max_chars.data() : nullptr;
  const uint32_t n = uint32_t(trie.n_nodes());
  for (uint32_t i = 1; i < n;) {
    if (max_chars && max_chars[i] <= skip_chars) {  // every token below is in mask_
      i = end[i];
      continue;
    }
    const uint16_t d = depth[i];
    const int32_t t = step(walk_[d - 1u], byte[i]);
    if (t == kDead) {  // no token below this prefix can follow
      i = end[i];
      continue;
    }
    walk_[d] = t;
    if (below[i] >= 0) {  // every token below loops on t: all allowed, none walked
      if (loops_over(t, trie.subtree_bytes[size_t(below[i])])) {
        for (uint32_t k = tok_begin[i]; k < tok_begin[end[i]]; ++k)
          mask_[size_t(tokens[k]) >> 6] |= uint64_t(1) << (tokens[k] & 63);
        i = end[i];
        continue;
      }
    }
    for (uint32_t k = tok_begin[i]; k < tok_begin[i + 1]; ++k)
      mask_[size_t(tokens[k]) >> 6] |= uint64_t(1) << (tokens[k] & 63);
    ++i;
  }
}

const std::vector<uint64_t>& Matcher::allowed(const TokenTrie& trie) {
  const size_t n_words = (size_t(trie.n_vocab()) + 63) / 64;
  if (state_ == kDead) {
    mask_.assign(n_words, 0);
    return mask_;
  }
  compact();
  if (auto it = masks_.find(state_); it != masks_.end() && it->second.size() == n_words)
    return it->second;
  const int levels = trie.n_plain() > 0 ? plain_levels(state_) : 0;
  if (levels == kAllPlain) {
    mask_ = trie.plain_mask();
    walk(trie.rest_nodes(), 0);
    ++n_plain_masks_;
  } else if (levels > 0) {
    mask_ = trie.plain_upto(levels);
    walk(trie.rest_nodes(), 0);
    walk(trie.plain_nodes(), levels);
    ++n_plain_masks_;
  } else {
    mask_.assign(n_words, 0);
    walk(trie.rest_nodes(), 0);
    walk(trie.plain_nodes(), 0);
  }
  if (masks_.size() >= kMaxCachedMasks) masks_.clear();
  return masks_[state_] = mask_;
}

}  // namespace wick::grammar
