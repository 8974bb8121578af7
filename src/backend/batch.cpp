#include "backend/batch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace wick {

void Batch::clear() {
  token_ids.clear();
  positions.clear();
  seq_of.clear();
  block_tables.clear();
  block_fills.clear();
  logit_rows.clear();
  adapters.clear();
  finished_ = false;
}

void Batch::finish(int32_t block_size, int32_t table_width, int32_t ctx_round) {
  const int32_t n_tok = int32_t(token_ids.size()), n_seq = int32_t(block_tables.size());
  if (positions.size() != token_ids.size() || seq_of.size() != token_ids.size())
    throw std::invalid_argument("batch: token, position and sequence counts differ");
  if (block_size <= 0) throw std::invalid_argument("batch: block size must be positive");
  BatchArgs& a = shape_;
  a = BatchArgs{};
  a.n_tokens = n_tok;
  a.n_seqs = n_seq;
  a.n_logits = int32_t(logit_rows.size());
  a.block_size = block_size;
  for (auto& t : block_tables) a.max_blocks = std::max(a.max_blocks, int32_t(t.size()));
  if (table_width > 0) {
    if (a.max_blocks > table_width)
      throw std::invalid_argument("batch: a block table is longer than the fixed width");
    a.max_blocks = table_width;
  }

  packed_.clear();
  auto section = [&](int k, size_t n) {
    off_[k] = packed_.size();
    packed_.resize(packed_.size() + n);
    return packed_.data() + off_[k];
  };
  std::copy(token_ids.begin(), token_ids.end(), section(0, size_t(n_tok)));
  std::copy(positions.begin(), positions.end(), section(1, size_t(n_tok)));
  std::copy(seq_of.begin(), seq_of.end(), section(2, size_t(n_tok)));
  int32_t* slots = section(3, size_t(n_tok));
  for (int32_t t = 0; t < n_tok; ++t) {
    const int32_t s = seq_of[size_t(t)], pos = positions[size_t(t)];
    if (s < 0 || s >= n_seq) throw std::invalid_argument("batch: a token names no sequence");
    const auto& table = block_tables[size_t(s)];
    if (pos < 0 || size_t(pos / block_size) >= table.size())
      throw std::invalid_argument("batch: position " + std::to_string(pos) +
                                  " is past its sequence's block table");
    slots[t] = table[size_t(pos / block_size)] * block_size + pos % block_size;
    a.max_ctx = std::max(a.max_ctx, pos + 1);
  }
  int32_t* dense = section(4, size_t(n_seq) * size_t(a.max_blocks));
  for (int32_t s = 0; s < n_seq; ++s) {
    const auto& table = block_tables[size_t(s)];
    int32_t* row = dense + size_t(s) * size_t(a.max_blocks);
    std::fill(row, row + a.max_blocks, -1);
    std::copy(table.begin(), table.end(), row);
  }
  if (table_width > 0) {
    const int32_t cap = table_width * block_size;
    a.max_ctx =
        ctx_round > 0 ? std::min(cap, (a.max_ctx + ctx_round - 1) / ctx_round * ctx_round) : cap;
  }
  std::copy(logit_rows.begin(), logit_rows.end(), section(5, logit_rows.size()));
  for (int32_t r : logit_rows)
    if (r < 0 || r >= n_tok) throw std::invalid_argument("batch: a logit row names no token");
  // runs: consecutive tokens of one sequence at consecutive positions
  std::vector<int32_t> runs;
  for (int32_t t = 0; t < n_tok; ++t) {
    const bool extends = t > 0 && seq_of[size_t(t)] == seq_of[size_t(t - 1)] &&
                         positions[size_t(t)] == positions[size_t(t - 1)] + 1;
    if (extends) {
      ++runs.back();
    } else {
      runs.push_back(t);
      runs.push_back(1);
    }
  }
  a.n_runs = int32_t(runs.size() / 2);
  for (size_t r = 0; r < runs.size(); r += 2) a.max_run = std::max(a.max_run, runs[r + 1]);
  std::copy(runs.begin(), runs.end(), section(6, runs.size()));
  has_fill_ = false;
  for (auto& f : block_fills) has_fill_ |= !f.empty();
  if (has_fill_) {
    // All three sections before any pointer into them: each resize may move packed_.
    const size_t n_cells = size_t(n_seq) * size_t(a.max_blocks);
    section(7, n_cells);
    section(8, n_cells);
    section(9, size_t(n_tok));
    int32_t* fill = packed_.data() + off_[7];
    int32_t* shift = packed_.data() + off_[8];
    int32_t* rope_pos = packed_.data() + off_[9];
    for (int32_t s = 0; s < n_seq; ++s) {
      int32_t* row = fill + size_t(s) * size_t(a.max_blocks);
      std::fill(row, row + a.max_blocks, block_size);
      if (size_t(s) < block_fills.size()) {
        const auto& f = block_fills[size_t(s)];
        if (f.size() > block_tables[size_t(s)].size())
          throw std::invalid_argument("batch: more block fills than blocks");
        if (block_size >= (1 << 16)) throw std::invalid_argument("batch: block size too large");
        for (size_t i = 0; i < f.size(); ++i) {
          const auto [begin, end] = f[i];
          if (begin < 0 || end > block_size || begin > end)
            throw std::invalid_argument("batch: a block's valid slots outside [0, block size]");
          row[i] = begin << 16 | end;
        }
      }
    }
    for (size_t i = 0; i < n_cells; i += size_t(a.max_blocks))
      for (int32_t blk = 0, holes = 0; blk < a.max_blocks; ++blk) {
        const int32_t v = fill[i + size_t(blk)], begin = v >> 16, end = v & 0xffff;
        shift[i + size_t(blk)] = holes + begin;
        holes += block_size - (end - begin);
      }
    for (int32_t t = 0; t < n_tok; ++t) {  // a token must not land in a hole
      const int32_t pos = positions[size_t(t)], off = pos % block_size;
      const size_t at = size_t(seq_of[size_t(t)]) * size_t(a.max_blocks) + size_t(pos / block_size);
      if (off < (fill[at] >> 16) || off >= (fill[at] & 0xffff))
        throw std::invalid_argument("batch: position " + std::to_string(pos) + " is in a hole");
      rope_pos[t] = pos - shift[at];
    }
  }
  has_adapters_ = std::any_of(adapters.begin(), adapters.end(), [](int32_t a) { return a != 0; });
  if (has_adapters_) {
    if (adapters.size() > size_t(n_seq))
      throw std::invalid_argument("batch: more adapters than sequences");
    int32_t* of = section(10, size_t(n_tok));
    for (int32_t t = 0; t < n_tok; ++t) {
      const size_t s = size_t(seq_of[size_t(t)]);
      of[t] = s < adapters.size() ? adapters[s] : 0;
    }
  }
  finished_ = true;
}

BatchArgs Batch::args(const int32_t* base) const {
  if (!finished_) throw std::logic_error("batch: finish() before use");
  BatchArgs a = shape_;
  a.token_ids = base + off_[0];
  a.positions = base + off_[1];
  a.seq_of = base + off_[2];
  a.slots = base + off_[3];
  a.block_table = base + off_[4];
  a.logit_rows = base + off_[5];
  a.runs = base + off_[6];
  a.block_fill = has_fill_ ? base + off_[7] : nullptr;
  a.block_shift = has_fill_ ? base + off_[8] : nullptr;
  a.rope_pos = has_fill_ ? base + off_[9] : a.positions;
  a.adapter_of = has_adapters_ ? base + off_[10] : nullptr;
  return a;
}

}  // namespace wick
