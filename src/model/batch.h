// A flat batch of tokens from one or more sequences, at given positions.
// Each token's K/V goes to its sequence's slot for its position; attention of
// a token covers positions [0, pos] of its own sequence (or the sliding
// window), read through the sequence's block table.
#pragma once

#include <cstdint>
#include <vector>

namespace wick {

struct Batch {
  std::vector<int32_t> token_ids;                  // [n_tokens]
  std::vector<int32_t> positions;                  // [n_tokens]
  std::vector<int32_t> seq_of;                     // [n_tokens] index into block_tables
  std::vector<std::vector<int32_t>> block_tables;  // [n_seqs][blocks]
  std::vector<int32_t> logit_rows;  // tokens whose logits are wanted, in output order

  int64_t n_tokens() const { return int64_t(token_ids.size()); }
  void add(int32_t token, int32_t pos, int32_t seq, bool want_logits) {
    if (want_logits) logit_rows.push_back(int32_t(token_ids.size()));
    token_ids.push_back(token);
    positions.push_back(pos);
    seq_of.push_back(seq);
  }
};

}  // namespace wick
