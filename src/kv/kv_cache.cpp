#include "kv/kv_cache.h"

namespace wick {

KvCache::KvCache(int64_t n_layer_, int64_t n_blocks, int64_t block_size_, int64_t kv_dim_)
    : n_layer(n_layer_), n_slots(n_blocks * block_size_), kv_dim(kv_dim_), block_size(block_size_) {
  k.assign(size_t(n_layer * n_slots * kv_dim), 0.f);
  v.assign(size_t(n_layer * n_slots * kv_dim), 0.f);
}

}  // namespace wick
