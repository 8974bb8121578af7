// Error checks for CUDA runtime calls (host code).
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace wick::cuda {

[[noreturn]] inline void fail(cudaError_t e, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error in ") + what + " (" + file + ":" +
                           std::to_string(line) + "): " + cudaGetErrorString(e));
}

#define WICK_CUDA_CHECK(call)                                                 \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) ::wick::cuda::fail(e_, #call, __FILE__, __LINE__); \
  } while (0)
// After a launch: a bad configuration shows up here, not at the next sync.
#define WICK_CUDA_LAUNCHED() WICK_CUDA_CHECK(cudaGetLastError())

inline int ceil_div(int64_t a, int64_t b) {
  return int((a + b - 1) / b);
}

}  // namespace wick::cuda
