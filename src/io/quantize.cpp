#include "io/quantize.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "io/quantize_kernels.h"

namespace wick {

namespace quant_generic {
extern const QuantKernels kQuantKernels;
}
namespace quant_avx2 {
extern const QuantKernels kQuantKernels;
}
namespace quant_avx512 {
extern const QuantKernels kQuantKernels;
}

const QuantKernels* quant_kernels_for(const char* isa) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!std::strcmp(isa, "generic")) return &quant_generic::kQuantKernels;
  if (!std::strcmp(isa, "avx2")) return avx2 ? &quant_avx2::kQuantKernels : nullptr;
  if (!std::strcmp(isa, "avx512") || !std::strcmp(isa, "avx512bf16") || !std::strcmp(isa, "amx"))
    return avx512 ? &quant_avx512::kQuantKernels : nullptr;
  return nullptr;
}

const QuantKernels& quant_kernels() {
  static const QuantKernels* chosen = [] {
    // An unknown or unsupported WICK_ISA is not an error here (the CPU kernels report it): the
    // writers run inside parallel loops, and every set writes the same bytes.
    if (const char* want = std::getenv("WICK_ISA"); want && *want)
      if (const QuantKernels* k = quant_kernels_for(want)) return k;
    for (const char* isa : {"avx512", "avx2"})
      if (const QuantKernels* k = quant_kernels_for(isa)) return k;
    return &quant_generic::kQuantKernels;
  }();
  return *chosen;
}

void quantize_row_q2_k(const float* src, void* dst, int64_t n) {
  quant_kernels().q2_k(src, dst, n);
}
void quantize_row_q3_k(const float* src, void* dst, int64_t n) {
  quant_kernels().q3_k(src, dst, n);
}
void quantize_row_q4_k(const float* src, void* dst, int64_t n) {
  quant_kernels().q4_k(src, dst, n);
}
void quantize_row_q5_k(const float* src, void* dst, int64_t n) {
  quant_kernels().q5_k(src, dst, n);
}
void quantize_row_q6_k(const float* src, void* dst, int64_t n) {
  quant_kernels().q6_k(src, dst, n);
}
void quantize_row_iq4_nl(const float* src, void* dst, int64_t n) {
  quant_kernels().iq4_nl(src, dst, n);
}
void quantize_row_iq4_xs(const float* src, void* dst, int64_t n) {
  quant_kernels().iq4_xs(src, dst, n);
}

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
