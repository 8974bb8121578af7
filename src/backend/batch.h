// A flat batch of tokens from one or more sequences, built on the host once
// per step and handed to a backend as one block of integers.
//
// Each token's K/V goes to the cache slot of its position in its sequence's
// block table; attention of a token covers positions [0, pos] of its own
// sequence (or the sliding window). Tokens of different sequences may be
// interleaved in any order; `runs` records the stretches of consecutive
// tokens of one sequence at consecutive positions, which tiled kernels use.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace wick {

// The batch as kernels read it: every pointer is in the backend's memory.
struct BatchArgs {
  int32_t n_tokens = 0, n_seqs = 0, n_logits = 0, n_runs = 0;
  int32_t block_size = 0, max_blocks = 0;  // block table: [n_seqs, max_blocks]
  int32_t max_ctx = 0;                     // longest context of a sequence (last pos + 1)
  int32_t max_run = 0;                     // longest run
  const int32_t* token_ids = nullptr;      // [n_tokens]
  const int32_t* positions = nullptr;      // [n_tokens]
  const int32_t* seq_of = nullptr;         // [n_tokens] sequence of each token
  const int32_t* slots = nullptr;          // [n_tokens] KV slot each token writes
  const int32_t* block_table = nullptr;    // [n_seqs * max_blocks], -1 past a table's end
  // [n_seqs * max_blocks] the valid slots of each block, begin << 16 | end
  // (a block closed before a span or at a span's end holds fewer than
  // block_size; a span placed at an offset may start past slot 0), or null
  // when every block is full up to the sequence's positions.
  const int32_t* block_fill = nullptr;
  // With block_fill: [n_seqs * max_blocks] the holes before each block's
  // first valid slot. RoPE counts only filled slots, so a span layout's
  // tokens sit at the positions of the same prompt without holes: a key in
  // slot position j of block j / block_size is rotated by j - block_shift.
  const int32_t* block_shift = nullptr;
  const int32_t* rope_pos = nullptr;    // [n_tokens] positions minus holes (= positions without)
  const int32_t* logit_rows = nullptr;  // [n_logits] tokens whose logits are wanted
  const int32_t* runs = nullptr;        // [n_runs * 2] first token, token count
  // [n_tokens] the named LoRA adapter of each token's sequence (0: none), or
  // null when no sequence has one.
  const int32_t* adapter_of = nullptr;
};

class Batch {
 public:
  std::vector<int32_t> token_ids;                  // [n_tokens]
  std::vector<int32_t> positions;                  // [n_tokens]
  std::vector<int32_t> seq_of;                     // [n_tokens] index into block_tables
  std::vector<std::vector<int32_t>> block_tables;  // [n_seqs][blocks]
  // Optional, per sequence and block: the valid slots [begin, end) (empty: all full).
  std::vector<std::vector<std::pair<int32_t, int32_t>>> block_fills;
  std::vector<int32_t> logit_rows;  // tokens whose logits are wanted, in output order
  // Optional, per sequence: its named LoRA adapter (0: none; empty: none for all).
  std::vector<int32_t> adapters;

  int64_t n_tokens() const { return int64_t(token_ids.size()); }
  void add(int32_t token, int32_t pos, int32_t seq, bool want_logits) {
    if (want_logits) logit_rows.push_back(int32_t(token_ids.size()));
    token_ids.push_back(token);
    positions.push_back(pos);
    seq_of.push_back(seq);
  }
  void clear();  // keeps capacity

  // Derives slots, runs and the dense block table for blocks of block_size
  // tokens; throws std::invalid_argument when a position has no block.
  // table_width > 0 fixes the table's row length (at least the longest
  // table), and then max_ctx is the capacity table_width * block_size: the
  // packed layout and the launch shapes stay the same from step to step, as
  // a replayed CUDA graph needs.
  // ctx_round > 0 (with a fixed width): max_ctx is the longest context
  // rounded up to a multiple of it, so that a few launch shapes cover all steps.
  void finish(int32_t block_size, int32_t table_width = 0, int32_t ctx_round = 0);
  // All integers of the finished batch in one array, and the view of it
  // whose pointers start at `base` (a copy of packed() in backend memory).
  const std::vector<int32_t>& packed() const { return packed_; }
  BatchArgs args(const int32_t* base) const;

 private:
  std::vector<int32_t> packed_;
  BatchArgs shape_;  // the counts (pointers unset)
  // offsets into packed_ of: token_ids, positions, seq_of, slots, block_table, logit_rows, runs,
  // block_fill, block_shift, rope_pos, adapter_of
  size_t off_[11] = {};
  bool has_fill_ = false, has_adapters_ = false;
  bool finished_ = false;
};

}  // namespace wick
