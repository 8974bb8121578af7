// KV storage for every layer, addressed by slot: slot s of layer l holds the
// key and value rows (kv_dim floats each) of one token of one sequence.
// Sequences map positions to slots through block tables of block_size tokens;
// a contiguous per-sequence cache is one block of n_ctx tokens per sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace wick {

struct KvCache {
  int64_t n_layer = 0;
  int64_t n_slots = 0;
  int64_t kv_dim = 0;
  int64_t block_size = 0;
  std::vector<float> k;  // [n_layer][n_slots][kv_dim]
  std::vector<float> v;  // [n_layer][n_slots][kv_dim]

  KvCache(int64_t n_layer, int64_t n_blocks, int64_t block_size, int64_t kv_dim);
  int64_t n_blocks() const { return n_slots / block_size; }
  float* k_layer(int64_t il) { return k.data() + il * n_slots * kv_dim; }
  float* v_layer(int64_t il) { return v.data() + il * n_slots * kv_dim; }
};

// Slot of position `pos` in a sequence with this block table.
inline int64_t kv_slot(const int32_t* block_table, int64_t block_size, int64_t pos) {
  return int64_t(block_table[pos / block_size]) * block_size + pos % block_size;
}

}  // namespace wick
