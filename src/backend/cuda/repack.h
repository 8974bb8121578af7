// Host-side conversion of a stored weight into the CUDA layouts of
// gpu_weight.h. Plain C++ (no CUDA), so that CPU-only builds test it.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/gpu_weight.h"
#include "backend/weight.h"

namespace wick::cuda {

struct Repacked {
  Fmt fmt = Fmt::BF16;
  int32_t n_out = 0, n_in = 0, k_pad = 0, group = 0;
  std::vector<uint8_t> q;    // [n_out][k_pad] elements of fmt
  std::vector<float> scale;  // I8/U4: [n_out][k_pad / group]
  std::vector<float> min;    // I8/U4, or empty when every min is zero or min8
  bool min8 = false;         // every min is 8 times its scale (Q4_0's): min not stored
};

// keep_f32: f32 stays f32 (else it becomes bf16). Throws std::invalid_argument
// for a type with no CUDA layout.
Repacked repack(const Weight& w, bool keep_f32);
// Element i of row r as the kernels compute it before rounding to bf16.
float repacked_value(const Repacked& r, int64_t row, int64_t i);

}  // namespace wick::cuda
