// Weights as a backend holds them: the stored element type, the shape, and
// the bytes in the backend's memory (host memory for the CPU, device memory
// for CUDA). Linear weights are [n_out, n_in], one contiguous row per output.
#pragma once

#include <cstdint>

#include "io/dtype.h"

namespace wick {

struct LoraDelta;

struct Weight {
  DType dtype = DType::F32;
  int64_t n_out = 0;  // rows (1 for vectors)
  int64_t n_in = 0;   // elements per row
  const void* data = nullptr;
  const void* aux = nullptr;        // a backend's own descriptor of its layout (CUDA), else null
  const LoraDelta* lora = nullptr;  // adapters' low-rank term added to this product, else null

  bool empty() const { return data == nullptr; }
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + size_t(r) * row_bytes(dtype, n_in);
  }
  const float* f32() const { return static_cast<const float*>(data); }  // vectors only
};

// The low-rank term of LoRA adapters on one linear weight:
// y += b (scale * (a x)), a [rank, n_in] and b [n_out, rank] f16 where the
// adapter's values are all f16 (half the bytes read per token), else f32;
// scale [rank] f32, each rank row's adapter scale; several adapters on one
// weight stacked along the rank.
// A weight's terms form a list: the one for every row (adapter 0, first)
// and one per named adapter it has, added only to the rows of the requests
// that chose it (BatchArgs::adapter_of).
struct LoraDelta {
  Weight a;
  Weight b;
  Weight scale;
  int32_t adapter = 0;              // 0: every row; k: rows whose adapter_of is k
  const LoraDelta* next = nullptr;  // the weight's next term
};

// Takes named adapter `adapter`'s terms out of w's list (they stay where they are stored).
inline void unlink_lora(Weight& w, int32_t adapter) {
  for (const LoraDelta** at = &w.lora; *at;) {
    if ((*at)->adapter == adapter)
      *at = (*at)->next;
    else
      at = const_cast<const LoraDelta**>(&(*at)->next);
  }
}

// One expert of a mixture-of-experts layer.
struct ExpertWeights {
  Weight gate;  // [n_ff_expert, n_embd]
  Weight up;    // [n_ff_expert, n_embd]
  Weight down;  // [n_embd, n_ff_expert]
};

}  // namespace wick
