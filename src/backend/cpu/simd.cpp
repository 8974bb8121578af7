#include "backend/cpu/simd.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace wick::cpu {

// Each ISA's set (simd_impl.inc); the ASan tree also has each one built without sanitizers.
#ifdef WICK_HAVE_AMX
#define WICK_DECLARE_AMX extern const SimdKernels kKernelsAmx;
#else
#define WICK_DECLARE_AMX
#endif
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
  WICK_DECLARE_AMX                   \
  }
WICK_DECLARE_KERNEL_SETS
#ifdef WICK_SIMD_UNCHECKED_COPIES
namespace unchecked {
WICK_DECLARE_KERNEL_SETS
}  // namespace unchecked
#endif
#undef WICK_DECLARE_KERNEL_SETS
#undef WICK_DECLARE_AMX

namespace {
bool has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
bool has_avx512bf16() {
  return has_avx512() && __builtin_cpu_supports("avx512vnni") &&
         __builtin_cpu_supports("avx512bf16");
}
#ifdef WICK_HAVE_AMX
// AMX's tile data is off for a process until it asks Linux for it (arch_prctl
// ARCH_REQ_XCOMP_PERM for XTILEDATA, feature 18); asked once, for every thread.
bool has_amx() {
  static const bool ok = [] {
    __builtin_cpu_init();
    if (!has_avx512bf16() || !__builtin_cpu_supports("amx-tile") ||
        !__builtin_cpu_supports("amx-bf16"))
      return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}
#endif
}  // namespace

const SimdKernels* simd_for(const char* isa) {
  __builtin_cpu_init();
  if (!std::strcmp(isa, "generic")) return &generic::kKernels;
  if (!std::strcmp(isa, "avx2"))
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &avx2::kKernels
                                                                           : nullptr;
  if (!std::strcmp(isa, "avx512")) return has_avx512() ? &avx512::kKernels : nullptr;
  if (!std::strcmp(isa, "avx512bf16")) return has_avx512bf16() ? &avx512bf16::kKernels : nullptr;
#ifdef WICK_HAVE_AMX
  if (!std::strcmp(isa, "amx")) return has_amx() ? &avx512bf16::kKernelsAmx : nullptr;
#endif
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
          ": not one of generic, avx2, avx512, avx512bf16, amx supported by this CPU");
    return k;
  }
  for (const char* isa : {"amx", "avx512bf16", "avx512", "avx2"})
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
#ifdef WICK_HAVE_AMX
  if (k == &avx512bf16::kKernelsAmx) return &unchecked::avx512bf16::kKernelsAmx;
#endif
#endif
  return k;
}
}  // namespace

const SimdKernels& simd() {
  static const SimdKernels* chosen = for_the_model(pick());
  return *chosen;
}

}  // namespace wick::cpu
