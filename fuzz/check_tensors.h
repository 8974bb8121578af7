// The invariant every reader must keep for each tensor it returns: shape x
// dtype is exactly its byte count (computed here without overflow), and its
// first and last bytes can be read (a range past the mapping faults). A
// reader that breaks it aborts the fuzz run.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "io/safetensors.h"

namespace wick::fuzz {

inline void check_tensors(const TensorSet& ts) {
  for (const auto& [name, t] : ts.all()) {
    const DTypeTraits& tr = traits(t.dtype);
    unsigned __int128 numel = 1;
    bool bad = false;
    for (int64_t d : t.shape) {
      if (d < 0) bad = true;
      numel *= uint64_t(d);
      if (numel > (unsigned __int128)1 << 64) bad = true;
    }
    if (!bad && numel % uint64_t(tr.block_size)) bad = true;
    unsigned __int128 n_bytes = numel / uint64_t(tr.block_size) * tr.block_bytes;
    if (bad || n_bytes != t.n_bytes) {
      std::fprintf(stderr, "tensor '%s': its shape and dtype do not make its %zu bytes\n",
                   name.c_str(), t.n_bytes);
      std::abort();
    }
    if (t.n_bytes) {
      auto* p = static_cast<const volatile uint8_t*>(t.data);
      (void)p[0];
      (void)p[t.n_bytes - 1];
    }
  }
}

}  // namespace wick::fuzz
