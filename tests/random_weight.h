// Random weights of every stored type for the kernel tests: normal f32 and
// half values, random codes with sane f16 scales for the block types.
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "io/dtype.h"

namespace wick::test {

inline std::vector<uint8_t> random_weight(DType t, int64_t n_out, int64_t n_in, std::mt19937& rng) {
  const size_t rb = row_bytes(t, n_in);
  std::vector<uint8_t> w(size_t(n_out) * rb);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd(0.f, 1.f);
  if (t == DType::F32) {
    for (size_t i = 0; i < w.size() / 4; ++i) reinterpret_cast<float*>(w.data())[i] = nd(rng);
    return w;
  }
  for (auto& b : w) b = uint8_t(byte(rng));
  if (t == DType::F16 || t == DType::BF16) {
    auto* h = reinterpret_cast<uint16_t*>(w.data());
    for (size_t i = 0; i < w.size() / 2; ++i)
      h[i] = t == DType::F16 ? f32_to_f16(nd(rng)) : f32_to_bf16(nd(rng));
    return w;
  }
  // sane f16 scale fields, as in the GGUF fixture
  const size_t bb = traits(t).block_bytes;
  std::vector<size_t> offs =
      t == DType::Q6_K   ? std::vector<size_t>{208}
      : t == DType::Q2_K ? std::vector<size_t>{80, 82}
      : t == DType::Q3_K ? std::vector<size_t>{108}
      : (t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q5_K)
          ? std::vector<size_t>{0, 2}
          : std::vector<size_t>{0};
  for (size_t b = 0; b < w.size() / bb; ++b)
    for (size_t o : offs) {
      uint16_t d = f32_to_f16(nd(rng) * 0.1f);
      std::memcpy(w.data() + b * bb + o, &d, 2);
    }
  return w;
}

}  // namespace wick::test
