// Quantize-on-load (--quantize T): a model's f32/f16/bf16 matrices replaced
// in memory by quantized copies, each tensor's type chosen by the same plan
// as `wick quantize` writes (so a quantized load runs what the file would).
#pragma once

#include "model/model.h"
#include "model/quant_plan.h"

namespace wick {

// Quantizes every matrix of `m` (rows in parallel); throws ModelError when a
// matrix is already quantized (quantize such a model with `wick quantize`).
// The loader's own copies of the matrices it replaces (an FP8 checkpoint's
// bf16, a GGUF's reordered q/k rows) are freed. Returns the number of
// matrices converted.
int64_t quantize_weights(Model& m, const QuantPlan& plan);

}  // namespace wick
