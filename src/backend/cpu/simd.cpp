#include "backend/cpu/simd.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace wick::cpu {

// Each ISA's set (simd_impl.inc); the ASan tree also has each one built without sanitizers.
#define WICK_DECLARE_KERNEL_SETS     \
  namespace generic {                \
  extern const SimdKernels kKernels; \
  }                                  \
  namespace avx2 {                   \
  extern const SimdKernels kKernels; \
  }                                  \
  namespace avx512 {                 \
  extern const SimdKernels kKernels; \
  }                                  \
  namespace avx512bf16 {             \
  extern const SimdKernels kKernels; \
  }
WICK_DECLARE_KERNEL_SETS
#ifdef WICK_SIMD_UNCHECKED_COPIES
namespace unchecked {
WICK_DECLARE_KERNEL_SETS
}  // namespace unchecked
#endif
#undef WICK_DECLARE_KERNEL_SETS

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

namespace {
const SimdKernels* pick() {
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
}

// The set the model runs. In the ASan tree the sets simd_for() names are built with
// ASan and UBSan, and the kernel tests call them on odd shapes; the model runs the same
// source built without sanitizers (the same bits), since at -O1 under ASan the kernels
// were 90 % of a default-model test's time (docs/security.md, "CI time").
const SimdKernels* for_the_model(const SimdKernels* k) {
#ifdef WICK_SIMD_UNCHECKED_COPIES
  if (k == &generic::kKernels) return &unchecked::generic::kKernels;
  if (k == &avx2::kKernels) return &unchecked::avx2::kKernels;
  if (k == &avx512::kKernels) return &unchecked::avx512::kKernels;
  if (k == &avx512bf16::kKernels) return &unchecked::avx512bf16::kKernels;
#endif
  return k;
}
}  // namespace

const SimdKernels& simd() {
  static const SimdKernels* chosen = for_the_model(pick());
  return *chosen;
}

}  // namespace wick::cpu
