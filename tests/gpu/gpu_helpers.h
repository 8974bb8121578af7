// Helpers for the GPU tests: skip without a GPU, a CUDA backend, random data.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace wick::test {

#define WICK_REQUIRE_GPU()                                                     \
  do {                                                                         \
    if (::wick::cuda_device_count() == 0)                                      \
      GTEST_SKIP() << "no CUDA GPU visible (" << ::wick::cuda_status() << ")"; \
  } while (0)

// The CUDA device with half its memory; gpu_f32 keeps f32 weights, K/V and
// attention (no CUDA graphs then), else bf16 weights and f16 K/V as served.
inline BackendOptions cuda_opts(bool gpu_f32) {
  BackendOptions o;
  o.device = Device::Cuda;
  o.gpu_f32 = gpu_f32;
  o.gpu_memory_fraction = 0.5;
  return o;
}

inline std::unique_ptr<Backend> cuda_backend(bool gpu_f32 = false) {
  return make_backend(cuda_opts(gpu_f32));
}

// A host vector copied to a new device buffer, and back.
inline Buffer to_device(Backend& be, const void* p, size_t bytes) {
  Buffer b = be.alloc(bytes);
  be.copy_to_device(b.data(), p, bytes);
  return b;
}
template <typename T>
std::vector<T> to_host(Backend& be, const Buffer& b, size_t n) {
  std::vector<T> v(n);
  be.copy_to_host(v.data(), b.data(), n * sizeof(T));
  return v;
}

inline std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace wick::test
