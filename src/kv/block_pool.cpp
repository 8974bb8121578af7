#include "kv/block_pool.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace wick {

BlockPool::BlockPool(int32_t n_blocks, int32_t block_size, uint64_t model_id, bool prefix_cache)
    : block_size_(block_size),
      model_id_(model_id),
      prefix_cache_(prefix_cache),
      blocks_(size_t(n_blocks)) {
  for (int32_t b = 0; b < n_blocks; ++b) blocks_[size_t(b)].free_it = free_.insert(free_.end(), b);
}

uint64_t BlockPool::chain_hash(uint64_t parent, std::span<const int32_t> tokens,
                               int32_t adapter) const {
  thread_local std::vector<uint8_t> buf;
  buf.resize(sizeof parent + tokens.size_bytes());
  std::memcpy(buf.data(), &parent, sizeof parent);
  std::memcpy(buf.data() + sizeof parent, tokens.data(), tokens.size_bytes());
  // adapter 0 keeps the hashes of before adapters
  const uint64_t seed = model_id_ ^ (uint64_t(uint32_t(adapter)) * 0x9e3779b97f4a7c15ull);
  return XXH3_64bits_withSeed(buf.data(), buf.size(), seed);
}

std::vector<int32_t> BlockPool::match_prefix(std::span<const int32_t> tokens, int32_t adapter) {
  std::vector<int32_t> out;
  ++n_queries;
  n_query_tokens += tokens.size();
  if (!prefix_cache_) return out;
  uint64_t parent = 0;
  for (size_t start = 0; start + size_t(block_size_) <= tokens.size();
       start += size_t(block_size_)) {
    auto chunk = tokens.subspan(start, size_t(block_size_));
    const uint64_t h = chain_hash(parent, chunk, adapter);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    Block& b = blocks_[size_t(it->second)];
    if (b.adapter != adapter ||
        !std::equal(chunk.begin(), chunk.end(), b.tokens.begin(), b.tokens.end()))
      break;  // a collision: not a hit
    if (b.ref++ == 0) free_.erase(b.free_it);
    out.push_back(it->second);
    parent = h;
  }
  n_hit_tokens += out.size() * size_t(block_size_);
  return out;
}

void BlockPool::unhash(int32_t id) {
  Block& b = blocks_[size_t(id)];
  if (!b.hashed) return;
  auto it = by_hash_.find(b.hash);
  if (it != by_hash_.end() && it->second == id) by_hash_.erase(it);
  if (events_) events_->push_back({false, b.hash, std::nullopt, {}});
  b.hashed = false;
  b.tokens.clear();
  b.context.clear();
}

void BlockPool::drop_cached() {
  for (int32_t id = 0; id < n_blocks(); ++id) unhash(id);
}

int32_t BlockPool::allocate() {
  if (free_.empty()) return -1;
  const int32_t id = free_.front();
  free_.pop_front();
  unhash(id);  // evicts its cached content, if any
  blocks_[size_t(id)].ref = 1;
  return id;
}

void BlockPool::release(int32_t id) {
  Block& b = blocks_[size_t(id)];
  if (b.ref <= 0) throw std::logic_error("BlockPool::release: block is not referenced");
  if (--b.ref == 0) {
    // Uncached blocks go to the front (reused first); cached ones to the back,
    // so the least recently used cached content is evicted first.
    b.free_it = b.hashed ? free_.insert(free_.end(), id) : free_.insert(free_.begin(), id);
  }
}

bool BlockPool::store(int32_t id, uint64_t h, std::optional<uint64_t> parent,
                      std::span<const int32_t> tokens, int32_t adapter) {
  Block& b = blocks_[size_t(id)];
  if (b.hashed || by_hash_.count(h)) return false;  // an identical block is already cached
  b.hashed = true;
  b.hash = h;
  b.adapter = adapter;
  b.tokens.assign(tokens.begin(), tokens.end());
  by_hash_[h] = id;
  if (events_) events_->push_back({true, h, parent, b.tokens, adapter});
  return true;
}

uint64_t BlockPool::commit(int32_t id, uint64_t parent, std::span<const int32_t> tokens,
                           int32_t adapter) {
  const uint64_t h = chain_hash(parent, tokens, adapter);
  if (!prefix_cache_) return h;
  const Block& b = blocks_[size_t(id)];
  if (b.hashed) return b.hash;
  store(id, h, parent ? std::optional<uint64_t>(parent) : std::nullopt, tokens, adapter);
  return h;
}

// No context: the fixed root, as before contexts existed (same hashes).
uint64_t BlockPool::span_root(std::span<const int32_t> context, int32_t adapter) const {
  return context.empty() ? kSpanRoot : chain_hash(kSpanRoot, context, adapter);
}

std::vector<int32_t> BlockPool::find_span(std::span<const int32_t> tokens,
                                          std::span<const int32_t> context, int32_t adapter) const {
  std::vector<int32_t> out;
  uint64_t parent = span_root(context, adapter);
  for (size_t start = 0; start < tokens.size(); start += size_t(block_size_)) {
    auto chunk = tokens.subspan(start, std::min(size_t(block_size_), tokens.size() - start));
    const uint64_t h = chain_hash(parent, chunk, adapter);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) return {};
    const Block& b = blocks_[size_t(it->second)];
    // verified token by token; the first block also by its context (a
    // block that chains from another block has no context)
    const auto ctx = start == 0 ? context : std::span<const int32_t>{};
    if (b.adapter != adapter ||
        !std::equal(chunk.begin(), chunk.end(), b.tokens.begin(), b.tokens.end()) ||
        !std::equal(ctx.begin(), ctx.end(), b.context.begin(), b.context.end()))
      return {};
    out.push_back(it->second);
    parent = h;
  }
  return out;
}

std::vector<int32_t> BlockPool::match_span(std::span<const int32_t> tokens,
                                           std::span<const int32_t> context, int32_t adapter) {
  ++n_span_queries;
  std::vector<int32_t> out = find_span(tokens, context, adapter);
  if (out.empty()) return out;  // all or nothing
  for (int32_t id : out) {
    Block& b = blocks_[size_t(id)];
    if (b.ref++ == 0) free_.erase(b.free_it);
  }
  ++n_span_hits;
  return out;
}

void BlockPool::commit_span(std::span<const int32_t> blocks, std::span<const int32_t> tokens,
                            std::span<const int32_t> context, int32_t adapter) {
  uint64_t parent = span_root(context, adapter);
  for (size_t i = 0, start = 0; start < tokens.size(); ++i, start += size_t(block_size_)) {
    auto chunk = tokens.subspan(start, std::min(size_t(block_size_), tokens.size() - start));
    const uint64_t h = chain_hash(parent, chunk, adapter);
    // a span's first block has no parent block (its root is no block)
    if (store(blocks[i], h, i == 0 ? std::nullopt : std::optional<uint64_t>(parent), chunk,
              adapter) &&
        i == 0)
      blocks_[size_t(blocks[i])].context.assign(context.begin(), context.end());
    parent = h;
  }
}

}  // namespace wick
