#include "backend/cpu/simd.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace wick::cpu {

namespace generic {
extern const SimdKernels kKernels;
}
namespace avx2 {
extern const SimdKernels kKernels;
}
namespace avx512 {
extern const SimdKernels kKernels;
}
namespace avx512bf16 {
extern const SimdKernels kKernels;
}

namespace {
bool has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
}  // namespace

const SimdKernels* simd_for(const char* isa) {
  __builtin_cpu_init();
  if (!std::strcmp(isa, "generic")) return &generic::kKernels;
  if (!std::strcmp(isa, "avx2"))
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &avx2::kKernels
                                                                           : nullptr;
  if (!std::strcmp(isa, "avx512")) return has_avx512() ? &avx512::kKernels : nullptr;
  if (!std::strcmp(isa, "avx512bf16"))
    return has_avx512() && __builtin_cpu_supports("avx512vnni") &&
                   __builtin_cpu_supports("avx512bf16")
               ? &avx512bf16::kKernels
               : nullptr;
  return nullptr;
}

const bool sw_prefetch = [] {
  const char* e = std::getenv("WICK_CPU_PREFETCH");
  const std::string v = e ? e : "";
  return v == "1" || v == "true" || v == "on";
}();

const SimdKernels& simd() {
  static const SimdKernels* chosen = [] {
    if (const char* want = std::getenv("WICK_ISA"); want && *want) {
      const SimdKernels* k = simd_for(want);
      if (!k)
        throw std::runtime_error(
            std::string("WICK_ISA=") + want +
            ": not one of generic, avx2, avx512, avx512bf16 supported by this CPU");
      return k;
    }
    for (const char* isa : {"avx512bf16", "avx512", "avx2"})
      if (const SimdKernels* k = simd_for(isa)) return k;
    return &generic::kKernels;
  }();
  return *chosen;
}

}  // namespace wick::cpu
