// A view of a stored tensor: type, shape and bytes. Shapes are written
// outermost first, as in PyTorch / safetensors: a linear weight is [n_out, n_in]
// and each of its n_out rows is contiguous (GGUF's ne[] is the reverse).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/dtype.h"

namespace wick {

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // outermost first
  const void* data = nullptr;
  size_t n_bytes = 0;
  std::string file;  // where it came from, for error messages

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[64, 128]"

}  // namespace wick
