// Random-weight models with the exact shapes of real ones, made in memory,
// for speed work: `shaped:SHAPE:TYPE` wherever a model path is taken, e.g.
// shaped:qwen2.5-0.5b:bf16 (SHAPE: smollm2-135m, qwen2.5-0.5b, qwen3-0.6b,
// llama3.2-1b, granite3-2b, llama3.2-3b, llama3.1-8b; TYPE: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k,
// q6_k). Speed does not depend on the weight values; they are random, never zero.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"

namespace wick {

bool is_shaped_name(const std::string& path);
std::unique_ptr<Model> make_shaped_model(const std::string& name);  // throws ModelError
// n_out rows of n_in random values stored as `t` (the shaped models' weights;
// the same seed gives the same bytes)
void fill_random_weight(DType t, int64_t n_out, int64_t n_in, uint8_t* dst, uint64_t seed);

}  // namespace wick
