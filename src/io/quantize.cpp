#include "io/quantize.h"

#include <cstring>
#include <stdexcept>

namespace wick {

bool can_quantize(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
      return;
    case DType::Q4_0:
      return quantize_row_q4_0(src, dst, n);
    case DType::Q4_1:
      return quantize_row_q4_1(src, dst, n);
    case DType::Q5_0:
      return quantize_row_q5_0(src, dst, n);
    case DType::Q5_1:
      return quantize_row_q5_1(src, dst, n);
    case DType::Q8_0:
      return quantize_row_q8_0(src, dst, n);
    case DType::Q2_K:
      return quantize_row_q2_k(src, dst, n);
    case DType::Q3_K:
      return quantize_row_q3_k(src, dst, n);
    case DType::Q4_K:
      return quantize_row_q4_k(src, dst, n);
    case DType::Q5_K:
      return quantize_row_q5_k(src, dst, n);
    case DType::Q6_K:
      return quantize_row_q6_k(src, dst, n);
    case DType::IQ4_NL:
      return quantize_row_iq4_nl(src, dst, n);
    case DType::IQ4_XS:
      return quantize_row_iq4_xs(src, dst, n);
    default:
      throw std::runtime_error(std::string("quantize: cannot write type ") + dtype_name(t));
  }
}

}  // namespace wick
