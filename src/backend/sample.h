// Sampling on a backend, for backends that keep logits in device memory:
// one row of parameters per logits row, so that only the chosen ids cross
// to the host. Semantics (order of the processors, tie rules) are those of
// sampling/sampler.h; the random draw is counter-based: the u in [0, 1) of
// a step is sample_uniform(seed, counter), counter being the number of
// tokens the sequence generated before this one.
#pragma once

#include <cstdint>

namespace wick {

struct SampleRow {
  float temperature = 0.f;  // 0 = greedy (argmax, ties to the lowest id)
  int32_t top_k = 0;        // 0 = off
  float top_p = 1.f;        // 1 = off
  float min_p = 0.f;        // 0 = off
  float repeat_penalty = 1.f, presence_penalty = 0.f, frequency_penalty = 0.f;
  int32_t penalty_first = 0;  // this row's (token, count) pairs in the pairs array
  int32_t n_penalty = 0;
  uint64_t seed = 0, counter = 0;
};

// splitmix64-based: the same value on the host and the device.
inline uint64_t sample_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline double sample_uniform(uint64_t seed, uint64_t counter) {
  return double(sample_mix(seed ^ sample_mix(counter)) >> 11) * 0x1.0p-53;
}

}  // namespace wick
