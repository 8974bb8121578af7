// Fixed-size KV blocks shared by all sequences, with a prefix cache: every
// full block is keyed by a chained hash of (parent hash, its tokens, model
// identity, LoRA adapter) and keeps its tokens, so a hit is verified token by
// token. `adapter` (a request's named LoRA adapter, 0: none) is part of every
// key: K/V computed with one adapter is never found for another. Blocks
// are reference-counted; unreferenced cached blocks stay findable until they
// are evicted, least recently used first.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace wick {

class BlockPool {
 public:
  BlockPool(int32_t n_blocks, int32_t block_size, uint64_t model_id, bool prefix_cache = true);

  int32_t block_size() const { return block_size_; }
  int32_t n_blocks() const { return int32_t(blocks_.size()); }
  int32_t n_free() const { return int32_t(free_.size()); }  // unreferenced (cached ones included)
  int32_t n_used() const { return n_blocks() - n_free(); }
  int32_t n_cached() const { return int32_t(by_hash_.size()); }

  // The longest chain of cached full blocks equal to the start of `tokens`;
  // each returned block gains a reference. Counts a query and its hit tokens.
  std::vector<int32_t> match_prefix(std::span<const int32_t> tokens, int32_t adapter = 0);
  // A free block with one reference (evicting the least recently used cached
  // block when needed), or -1 when every block is referenced.
  int32_t allocate();
  void release(int32_t block);  // drops a reference; at zero it becomes free (still cached)
  // Registers a block that just became full: block_index is its place in the
  // sequence, tokens its block_size tokens, parent the hash of the block before.
  uint64_t commit(int32_t block, uint64_t parent, std::span<const int32_t> tokens,
                  int32_t adapter = 0);
  uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens, int32_t adapter = 0) const;

  // The span cache: a span's blocks chain from a root of their own (no
  // parent), so the span is found wherever it appears; its last block may
  // hold fewer than block_size tokens. match_span returns all of the span's
  // blocks, each with a new reference, or none; both verify token by token.
  // A span computed after context tokens (GenerateRequest::span_context)
  // chains from a root that hashes them, and its first block keeps them for
  // verification: it is found only after the same context.
  std::vector<int32_t> match_span(std::span<const int32_t> tokens,
                                  std::span<const int32_t> context = {}, int32_t adapter = 0);
  void commit_span(std::span<const int32_t> blocks, std::span<const int32_t> tokens,
                   std::span<const int32_t> context = {}, int32_t adapter = 0);
  // The span's cached blocks as match_span finds them, without references
  // or counting (empty: not cached).
  std::vector<int32_t> find_span(std::span<const int32_t> tokens,
                                 std::span<const int32_t> context = {}, int32_t adapter = 0) const;

  // KV-cache events, for routers that track which blocks each replica holds
  // (vLLM's BlockStored / BlockRemoved): appended to `log` while it is set.
  struct Event {
    bool stored = false;  // else removed
    uint64_t hash = 0;
    std::optional<uint64_t> parent;  // the block before (none: a sequence's or span's first)
    std::vector<int32_t> tokens;     // stored blocks: the tokens they hold
    int32_t adapter = 0;             // stored blocks: the LoRA adapter of their K/V (0: none)
  };
  void set_event_log(std::vector<Event>* log) { events_ = log; }
  // Forgets every cached block's content (each a removed event).
  void drop_cached();

  // counters
  uint64_t n_queries = 0, n_query_tokens = 0, n_hit_tokens = 0;
  uint64_t n_span_queries = 0, n_span_hits = 0;
  double hit_rate() const {
    return n_query_tokens ? double(n_hit_tokens) / double(n_query_tokens) : 0.0;
  }

 private:
  struct Block {
    int32_t ref = 0;
    bool hashed = false;
    uint64_t hash = 0;
    int32_t adapter = 0;           // the LoRA adapter its K/V was computed with
    std::vector<int32_t> tokens;   // the tokens it holds, for verification
    std::vector<int32_t> context;  // a span's first block: the context it was computed after
    std::list<int32_t>::iterator free_it;
  };
  void unhash(int32_t b);
  // Registers a block under hash h (parent: the hash before it, none for
  // a sequence's or a span's first block) with its tokens; false when h is taken.
  bool store(int32_t id, uint64_t h, std::optional<uint64_t> parent,
             std::span<const int32_t> tokens, int32_t adapter);
  static constexpr uint64_t kSpanRoot = 0x5350414e524f4f54ull;  // "SPANROOT"
  uint64_t span_root(std::span<const int32_t> context, int32_t adapter) const;

  int32_t block_size_;
  uint64_t model_id_;
  bool prefix_cache_;
  std::vector<Block> blocks_;
  std::list<int32_t> free_;  // front = least recently freed
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::vector<Event>* events_ = nullptr;
};

}  // namespace wick
